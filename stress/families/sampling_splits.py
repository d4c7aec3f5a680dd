"""Case family for the vocab split of Gumbel-max sampling: rows whose vocabulary is cut between programs.

The launcher cuts a row's tiles into splits from the shapes alone (``kernels.sampling.vocab_splits``), so these
cases pick the row count and tile count that give each kind of cut: one tile a split in a count that is not a
power of two, splits of several tiles whose last is shorter than the rest, and more rows than the launch aims
programs at (one split each). Each row's maximum is a spike placed in the first or the last tile (or tied
across splits), with a height of its own, so a split read from another row, a tile left out or a split
combined wrongly changes the token.
"""

import torch

from kernels.sampling import PROGRAMS_WANTED
from stress.core.types import Family
from stress.families.common import pick
from stress.families.sampling import _case, random_logits

MAX_DEFAULT_TILE = 1024  # the launcher's own tile for every vocabulary past one tile


def _geometry(rng, kind: str) -> tuple[int, int]:
    """(rows, tiles) whose cut is ``kind``, with the fewest rows that give it: a row's tile costs ~20 ms under
    the interpreter, and a cut of several tiles a split needs more tiles in all than PROGRAMS_WANTED."""
    if kind == "one tile a split":
        return int(rng.integers(2, 5)), pick(rng, (3, 5, 6, 7))
    if kind == "short last split":  # PROGRAMS_WANTED // rows == width splits of two tiles, the last of one
        width = pick(rng, (2, 3))
        return PROGRAMS_WANTED // (width + 1) + int(rng.integers(1, 5)), 2 * width - 1
    return PROGRAMS_WANTED + int(rng.integers(1, 5)), 1  # "more rows than programs"


def _spikes(rng, logits: torch.Tensor, tile: int) -> None:
    """In place: each row's maximum raised to a height of its own at a token of its first or last tile, or at
    a random one; a third of the rows tie it at a second token (the lower one must win when greedy)."""
    rows, vocab = logits.shape
    for row in range(rows):
        first = int(rng.integers(min(tile, vocab)))
        last = int(rng.integers((vocab - 1) // tile * tile, vocab))
        token = pick(rng, (first, last, int(rng.integers(vocab))))
        height = float(logits[row].max()) + rng.uniform(1.0, 30.0)
        logits[row, token] = height
        if rng.random() < 1 / 3:
            logits[row, int(rng.integers(vocab))] = height


def vocab_splits(rng, device, launch, kind):
    """Rows cut into vocab splits as ``kind`` says: one tile a split in a count that is not a power of two (3, 5,
    6, 7), splits of two tiles whose last holds one (just over PROGRAMS_WANTED / 3 or / 4 rows), or more rows
    than PROGRAMS_WANTED (one split each); each row's maximum a spike of its own height in its first or last
    tile, a third tied across splits; greedy and sampled rows, an inert one sometimes, the logits cache on."""
    rows, tiles = _geometry(rng, kind)
    tile = launch.get("block_v", MAX_DEFAULT_TILE)
    vocab = (tiles - 1) * tile + int(rng.integers(1, tile + 1)) if tiles > 1 else int(rng.integers(2, 64))
    pad = int(rng.integers(0, 2))  # the last row inert: its splits are combined like a live row's
    logits = random_logits(rng, (rows, vocab))
    _spikes(rng, logits, tile)
    return _case(rng, rows=rows - pad, pad_rows=pad, vocab=vocab, logits=logits, greedy_share=0.6,
                 note=f"{kind}: {rows} rows, {tiles} tiles of {tile}, vocab {vocab}")


def _family(kind: str, share: float) -> Family:
    def build(rng, device, launch):
        return vocab_splits(rng, device, launch, kind)
    build.__doc__ = f"vocab_splits with kind={kind!r}: {vocab_splits.__doc__}"
    return Family(build, iteration_share=share)


def no_rows(rng, device, launch):
    """No rows at all over a vocabulary of 1 to 31 tokens, every case (``zero_width`` draws that in about a third of
    its cases): there is no row to divide the programs among, so nothing may size the splits."""
    return _case(rng, rows=0, vocab=int(rng.integers(1, 32)), note="no rows")


# The cheap cut runs every iteration; the two that need over PROGRAMS_WANTED row tiles (~10 s a case on the
# CPU, twice that traced) run in a fifth of them each.
FAMILIES = {"vocab_splits_one_tile": _family("one tile a split", 1.0),
            "vocab_splits_short_last": _family("short last split", 0.2),
            "vocab_splits_many_rows": _family("more rows than programs", 0.2),
            "vocab_splits_no_rows": no_rows}
