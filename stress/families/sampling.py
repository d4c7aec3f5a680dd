"""Case families for Gumbel-max sampling: mixed greedy/sampled rows, inert padding, nonfinite
logits, long vocabularies, exact ties, no rows at all, strided views, extreme temperatures, seeds and
positions, vocab tile boundaries, and no logits cache; with the helpers verification shares."""

import numpy as np
import torch

import reference.philox
import reference.sampling
from stress.core.types import Case
from stress.families.common import (
    big,
    laid_out,
    offset_reach,
    one_per_value,
    own_launch,
    pick,
    slots_for,
    spread,
    tile_boundary_sizes,
)

SENTINEL_LOGIT = -7777.0  # pre-filled cache entries no row may write


def sampling_sweep(device: str) -> list[dict]:
    """Vocab tiles (the running max crosses tiles) and warps; CPU keeps few tiles (slow interpreter). The
    launcher's own tile (a compile per vocab power of two) is reached on the CPU and, on the GPU, through
    engine.step."""
    if device == "cuda":
        return [{"block_v": b, "num_warps": w} for b in (128, 1024, 4096) for w in (1, 4, 8)]
    return [{}, {"block_v": 128}]


def temperatures(rng, num_slots: int, greedy_share: float) -> torch.Tensor:
    """Per slot: 0 (greedy) with probability ``greedy_share``, else in [0.25, 2)."""
    temps = rng.uniform(0.25, 2.0, num_slots)
    temps[rng.random(num_slots) < greedy_share] = 0.0
    return torch.from_numpy(temps.astype(np.float32))


def seeds(rng, num_slots: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, num_slots, dtype=np.int64))


NEAR_ZERO_TEMPERATURES = (1e-30, 1e-20, 1e-6, 1e-3)  # all mass on the row max: every other p is exactly 0
LONG_VOCABS = (151936, 256000, 262144)


HUGE_VOCAB = 2**20 + 1  # one past Triton's largest tile (2^20 elements): a launcher must cap its own tile


def extreme_keys(rng, temperature: torch.Tensor, seeds_: torch.Tensor, count: int) -> torch.Tensor:
    """Pushes the noise keys to their limits: some sampled slots get a temperature near 0 and some seeds
    the int64 limits (both in place); returns ``count`` positions near 2^62 (drafting adds 2^30)."""
    near_zero = torch.from_numpy(rng.random(temperature.numel()) < 0.4) & (temperature > 0)
    temperature[near_zero] = torch.tensor([pick(rng, NEAR_ZERO_TEMPERATURES) for _ in range(int(near_zero.sum()))],
                                          dtype=torch.float32)
    seeds_[torch.from_numpy(rng.random(seeds_.numel()) < 0.3)] = pick(rng, (-(2**63), 2**63 - 1, 0))
    return torch.from_numpy(rng.integers(2**62 - 2**20, 2**62, count, dtype=np.int64))


def default_block_v(vocab: int) -> int:
    """The vocab tile the launchers use when the launch shape names none: the vocab rounded up to a power
    of two, at most 1024."""
    return min(1024, 1 << max(0, vocab - 1).bit_length())


def tile_vocab(rng, device, launch) -> tuple[int, int]:
    """(vocab, tile): a vocabulary one below, at or one above one or two tiles of the launch shape."""
    if "block_v" in launch:
        return pick(rng, tile_boundary_sizes(launch["block_v"])), launch["block_v"]
    vocab = pick(rng, tile_boundary_sizes(pick(rng, (256, 1024) if big(device) else (16, 32))))
    return vocab, default_block_v(vocab)


def tie_at_tile_edges(rng, logits: torch.Tensor, tile: int) -> None:
    """In place: each row's maximum, raised by 1, tied exactly at two tokens among the first and last
    lane of the first two tiles, the last token and one random token (inside a tile or across tiles)."""
    vocab = logits.shape[-1]
    edges = {t for t in (0, tile - 1, tile, 2 * tile - 1, vocab - 1) if 0 <= t < vocab}
    for row in logits.view(-1, vocab):
        tied = rng.choice(sorted(edges | {int(rng.integers(vocab))}), 2, replace=False)
        row[torch.from_numpy(tied)] = row.max() + 1


def random_logits(rng, shape, scale: float | None = None) -> torch.Tensor:
    scale = rng.uniform(0.5, 6.0) if scale is None else scale
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def _case(rng, *, rows, vocab, pad_rows=0, greedy_share=0.3, logits=None, note="") -> Case:
    """``rows`` live rows on distinct slots, then ``pad_rows`` inert ones (slot -1, stale logits).

    The cache is pre-filled with a sentinel: only ``[slot, col]`` of live rows may change.
    """
    idx_mapping, num_slots = slots_for(rng, rows, int(rng.integers(1, 4)))
    idx_mapping = torch.cat([idx_mapping, torch.full((pad_rows,), -1, dtype=torch.int32)])
    total = rows + pad_rows
    depth = int(rng.integers(1, 4))
    inputs = {
        "logits": random_logits(rng, (total, vocab)) if logits is None else logits,
        "idx_mapping": idx_mapping,
        "temperature": temperatures(rng, num_slots, greedy_share),
        "seeds": seeds(rng, num_slots),
        "positions": torch.from_numpy(rng.integers(0, 2**33, total, dtype=np.int64)),
        "draft": bool(rng.integers(2)),
        "logits_cache": torch.full((num_slots, depth, vocab), SENTINEL_LOGIT, dtype=torch.float32),
        "cache_cols": torch.from_numpy(rng.integers(0, depth, total).astype(np.int32)),
    }
    if not inputs["draft"] and rng.random() < 0.5:
        del inputs["draft"]  # verifying as the engine calls it: the option left out, its default applies
    return Case(inputs=inputs, note=note)


def mixed(rng, device, launch):
    """Greedy and sampled rows, drafting or verifying."""
    rows = int(rng.integers(1, 9)) if big(device) else 1
    return _case(rng, rows=rows, vocab=int(rng.integers(2, 4096 if big(device) else 200)), note=f"{rows} rows")


def padded(rng, device, launch):
    """Inert rows (slot -1) after the live ones must not touch any cache row (docs/fixes.md#fix-3)."""
    pad = int(rng.integers(1, 4))
    return _case(rng, rows=int(rng.integers(1, 3)) if big(device) else 1, pad_rows=pad, vocab=int(rng.integers(2, 64)),
                 greedy_share=0.2, note=f"{pad} inert rows")


def zero_width(rng, device, launch):
    """No rows at all (a depth-0 draft; sometimes over an empty vocabulary too, which only a row needs), or
    only inert ones."""
    if rng.integers(2):
        vocab = 0 if rng.random() < 0.3 else int(rng.integers(1, 32))
        return _case(rng, rows=0, vocab=vocab, note=f"no rows, vocab {vocab}")
    return _case(rng, rows=0, pad_rows=int(rng.integers(1, 3)), vocab=int(rng.integers(1, 32)),
                 note="only inert rows")


def tiny_vocab(rng, device, launch):
    """One- and two-token vocabularies, greedy and sampled: the only choice, or a coin."""
    vocab = pick(rng, (1, 2))
    return _case(rng, rows=int(rng.integers(1, 3)), vocab=vocab, note=f"vocab {vocab}")


def nonfinite(rng, device, launch):
    """NaN and +-inf logits, sometimes a row entirely -inf, NaN or +inf: tokens must be in range."""
    rows, vocab = int(rng.integers(1, 5)) if big(device) else 1, int(rng.integers(2, 48))
    logits = random_logits(rng, (rows, vocab))
    for value in (float("nan"), float("inf"), float("-inf")):
        logits[torch.from_numpy(rng.random((rows, vocab)) < 0.15)] = value
    if rng.random() < 0.3:
        logits[int(rng.integers(rows))] = pick(rng, (float("-inf"), float("nan"), float("inf")))
    return _case(rng, rows=rows, vocab=vocab, logits=logits, note="nonfinite logits")


def long_vocab(rng, device, launch):
    """Vocabularies of many tiles (128k on the GPU)."""
    vocab = pick(rng, (32000, 128256, 131072) if big(device) else (300, 600))
    return _case(rng, rows=int(rng.integers(1, 5 if big(device) else 2)), vocab=vocab, note=f"vocab {vocab}")


def ties(rng, device, launch):
    """Logits on a few levels: exact ties must go to the lowest token id."""
    rows, vocab = int(rng.integers(1, 5)) if big(device) else 1, int(rng.integers(2, 64))
    logits = torch.from_numpy(rng.integers(0, 3, (rows, vocab)).astype(np.float32))
    return _case(rng, rows=rows, vocab=vocab, logits=logits, greedy_share=0.7, note="tied logits")


def extremes(rng, device, launch):
    """Temperatures near 0 (scores near 1e30: only the row max can win), seeds at the int64 limits,
    positions near 2^62, and vocabularies up to 256k on the GPU."""
    if big(device) and rng.integers(3) == 0:
        rows, vocab = int(rng.integers(1, 5)), pick(rng, LONG_VOCABS)
    else:
        rows, vocab = int(rng.integers(1, 9)) if big(device) else 1, int(rng.integers(2, 4096 if big(device) else 64))
    case = _case(rng, rows=rows, pad_rows=int(rng.integers(0, 2)), vocab=vocab, greedy_share=0.1,
                 note=f"extreme keys, vocab {vocab}")
    inputs = case.inputs
    inputs["positions"] = extreme_keys(rng, inputs["temperature"], inputs["seeds"], inputs["positions"].numel())
    return case


def tiles(rng, device, launch):
    """Vocabularies one below, at and one above one and two tiles of the launch shape, the row max tied
    exactly inside a tile or across tiles: greedy takes the lowest tied token."""
    vocab, tile = tile_vocab(rng, device, launch)
    rows = int(rng.integers(1, 5)) if big(device) else 1
    logits = random_logits(rng, (rows, vocab))
    tie_at_tile_edges(rng, logits, tile)
    return _case(rng, rows=rows, vocab=vocab, logits=logits, greedy_share=0.7, note=f"vocab {vocab}, tile {tile}")


def no_cache(rng, device, launch):
    """The optional logits cache left out (verification's bonus sampling): tokens only. The arguments are
    absent, not None, so the launcher's defaults are what the case runs on."""
    case = mixed(rng, device, launch)
    del case.inputs["logits_cache"], case.inputs["cache_cols"]
    case.note = "no logits cache"
    return case


@own_launch()
def huge_vocab(rng, device, launch):
    """One greedy row over a vocabulary one past Triton's largest tile (a sampled row takes a minute under the
    interpreter), no cache: the launcher's own tile must stay capped, its power of two (2^21) does not build."""
    case = _case(rng, rows=1, vocab=HUGE_VOCAB, greedy_share=1.0, note=f"vocab {HUGE_VOCAB}, greedy")
    del case.inputs["logits_cache"], case.inputs["cache_cols"]
    return case


def every_slot(rng, device, launch):
    """Every slot holds a live sampled row, slot 0 and the last included, in shuffled row order: a slot
    taken for padding, or a row read by the wrong index, samples or caches another row's way."""
    num_slots = int(rng.integers(2, 9 if big(device) else 4))
    case = _case(rng, rows=num_slots, vocab=int(rng.integers(2, 4096 if big(device) else 48)), greedy_share=0.0,
                 note=f"all {num_slots} slots live")
    inputs = case.inputs
    inputs["idx_mapping"] = torch.from_numpy(rng.permutation(num_slots).astype(np.int32))
    inputs["temperature"], inputs["seeds"] = temperatures(rng, num_slots, 0.0), seeds(rng, num_slots)
    inputs["logits_cache"] = inputs["logits_cache"][:num_slots].clone()
    return case


def big_offsets(rng, device, launch, layout):
    """On the GPU, offsets past 2^31 elements, which int32 offset arithmetic wraps (views of about 8.6 GB;
    only their rows are written), one layout per family: ``logits``, three logits rows 2^30 elements apart,
    the last a live row's; ``logits_cache``, cache slots spread over 2^31 elements, the last written by a
    live row; ``cache columns``, a cache whose three columns lie 2^30 elements apart (the slots packed inside
    each column), a live row writing the last. The CPU runs the same layouts a few thousand elements apart."""
    reach = offset_reach(rng, device)
    case = _case(rng, rows=2, pad_rows=1, vocab=int(rng.integers(2, 4096 if big(device) else 48)), greedy_share=0.5)
    inputs = case.inputs
    if layout == "cache columns":
        slots, _, vocab = inputs["logits_cache"].shape
        stride = max(slots * vocab, -(-reach // 2))
        inputs["cache_cols"][1] = 2
        inputs["logits_cache"] = torch.empty(2 * stride + slots * vocab).as_strided(
            (slots, 3, vocab), (vocab, stride, 1)).fill_(SENTINEL_LOGIT)
    else:
        if layout == "logits":  # the inert row (slot -1) moves to the middle: the last logits row is read
            inputs["idx_mapping"][1:] = inputs["idx_mapping"][[2, 1]].clone()
        last_slot = inputs["temperature"].numel() - 1
        if layout == "logits_cache" and last_slot not in inputs["idx_mapping"].tolist():
            inputs["idx_mapping"][1] = last_slot  # a live row writes the slot past 2^31 (slots stay distinct)
        inputs[layout] = spread(inputs[layout], 0, reach)
    case.note = f"{layout} spread over {reach} elements"
    return case


# The greedy threshold: a temperature samples iff it is > 0. Exactly at it (0 and -0), one ulp below and one
# above (the smallest subnormals; a build that flushes subnormals to zero makes the one above greedy), and NaN.
THRESHOLD_TEMPERATURES = (0.0, -0.0, 2.0**-149, -(2.0**-149), float("nan"))
ULP_ABOVE_ZERO = 2.0**-149


def tied_integer_logits(rng, shape) -> torch.Tensor:
    """Integer logits in [-3, top] whose maximum ``top`` (0, 1 or 2 per row) is shared exactly by two or three
    tokens of each row. Divided by the subnormal temperature, every positive logit is +inf (a tie of all of
    them: the lowest wins, which is not the greedy argmax when a smaller positive one comes first), a
    0 stays 0 (a Gumbel draw among the zeros when the top is 0), a negative one is -inf."""
    vocab = shape[-1]
    logits = rng.integers(-3, 3, shape)
    for row in logits.reshape(-1, vocab):
        top = int(rng.integers(0, 3))
        np.minimum(row, top, out=row)
        row[rng.choice(vocab, min(vocab, int(rng.integers(2, 4))), replace=False)] = top
    return torch.from_numpy(logits.astype(np.float32))


def threshold_temperatures(rng, num_slots: int, sampled_slot: int) -> torch.Tensor:
    """Per slot one of ``THRESHOLD_TEMPERATURES``; ``sampled_slot`` (a live one) one ulp above 0."""
    temps = torch.tensor([pick(rng, THRESHOLD_TEMPERATURES) for _ in range(num_slots)], dtype=torch.float32)
    temps[sampled_slot] = ULP_ABOVE_ZERO
    return temps


def greedy_threshold(rng, device, launch):
    """Temperatures at the greedy threshold: 0, -0, NaN (greedy: the lowest tied argmax) and one ulp either side
    of 0 (below: greedy; above: sampled, every positive logit +inf), over integer logits whose row maximum two
    or three tokens share exactly."""
    rows = int(rng.integers(1, 9 if big(device) else 4))
    vocab = int(rng.integers(2, 4096 if big(device) else 48))
    case = _case(rng, rows=rows, vocab=vocab, logits=tied_integer_logits(rng, (rows, vocab)),
                 note=f"{rows} rows, vocab {vocab}, threshold temperatures")
    inputs = case.inputs
    inputs["temperature"] = threshold_temperatures(rng, inputs["temperature"].numel(), int(inputs["idx_mapping"][0]))
    return case


NOISE_GAPS = (1.5e-8, 4e-8)  # score gaps of noise_rounding's leading pair


def noise_rounding(rng, device, launch):
    """Sampled rows led by the two tokens whose Gumbel noise is nearest 0, every other logit -inf, their scores
    near 0 and 1.5e-8 to 4e-8 apart (either may lead). Noise computed in float64 and rounded once to float32 is
    off by about 1e-10 there, so the leader is decided; noise computed in float32 passes -log(u) through float32
    near 1, whose spacing (6e-8 to 1.2e-7) moves each score by more than the gap."""
    rows = int(rng.integers(1, 9)) if big(device) else int(rng.integers(2, 5))
    vocab = int(rng.integers(2048, 8192)) if big(device) else int(rng.integers(1024, 2048))
    case = _case(rng, rows=rows, vocab=vocab, logits=torch.zeros(rows, vocab), greedy_share=0.0,
                 note=f"{rows} rows, vocab {vocab}, two near-zero scores apart by less than float32 noise error")
    inputs = case.inputs
    temp = float(pick(rng, (0.5, 1.0, 2.0)))  # powers of two: logits / temp is exact
    inputs["temperature"].fill_(temp)
    salt = reference.sampling.DRAFT_NOISE_SALT if inputs.get("draft", False) else 0
    logits = torch.full((rows, vocab), float("-inf"), dtype=torch.float64)
    for row in range(rows):
        seed = int(inputs["seeds"][int(inputs["idx_mapping"][row])])
        key = reference.philox.randint(seed, int(inputs["positions"][row]) + salt)
        noise = reference.sampling.gumbel_noise(key, vocab)
        first, second = noise.abs().argsort()[:2].tolist()
        gap = rng.uniform(*NOISE_GAPS) * pick(rng, (-1.0, 1.0))
        logits[row, first] = 0.0
        logits[row, second] = float(noise[first] - noise[second]) + gap
    inputs["logits"] = (logits * temp).to(torch.float32)
    return case


FAMILIES = {"mixed": mixed, "padded": padded, "zero_width": zero_width, "nonfinite": nonfinite,
            "long_vocab": long_vocab, "ties": ties, "layouts": laid_out(padded, "logits", "logits_cache"),
            "extremes": extremes, "tiles": tiles, "no_cache": no_cache,
            "tiny_vocab": tiny_vocab, "every_slot": every_slot, "huge_vocab": huge_vocab,
            "greedy_threshold": greedy_threshold, "noise_rounding": noise_rounding,
            **one_per_value(big_offsets, "layout", ("logits", "logits_cache", "cache columns"))}
