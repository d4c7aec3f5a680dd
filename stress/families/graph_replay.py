"""Case families of the draft-graph checks: padded replays, DSD bands of depth 0, shrinking sequence
lengths under prefix-cache shifts, causal and non-causal drafting, two owners of one graph pool.

A case is a seeded draft layer (config and weights), a ``GraphSetup`` (the backend it draws, capture
sizes, DSD schedule) and a sequence of ``Batch``es over one KV cache. Every request of every batch
owns fresh blocks; the positions it may read (from its first visible block to its last accepted
token) hold random K/V and everything else is NaN, so a read of KV that was never written (a stale
length, a missed K/V write, a restored prefix left visible) poisons the output. Block 0 (the null
block) and the last block (the one poisoned block tables point at) are all NaN. Slots outside a batch
carry unaligned cached counts that must be ignored.
"""

import dataclasses

import numpy as np
import torch

from kernels.spec.draft_step import DraftConfig, random_weights
from stress.core.types import Case
from stress.families.common import pick
from stress.oracles.graph_replay import Batch, GraphSetup

BACKENDS = ("specsan_paged", "host_planned")


def _config(rng, *, causal: bool | None = None) -> tuple[DraftConfig, int]:
    """A small draft layer and the table width (blocks per request) its batches use."""
    heads, kv_heads = pick(rng, ((2, 1), (4, 2)))
    block_size, width, vocab = pick(rng, (8, 16)), pick(rng, (4, 6)), pick(rng, (128, 256))
    config = DraftConfig(vocab_size=vocab, hidden_size=32, num_heads=heads, num_kv_heads=kv_heads,
                         head_dim=pick(rng, (16, 32)), block_size=block_size,
                         max_draft_tokens=int(rng.integers(2, 5)), anchor_first=bool(rng.integers(2)),
                         causal=bool(rng.integers(2)) if causal is None else causal,
                         mask_token_id=int(rng.integers(vocab)), max_model_len=width * block_size)
    return config, width


class _Cache:
    """The KV cache the batches share: fresh blocks per request, readable positions filled."""

    def __init__(self, rng, config: DraftConfig):
        self.rng, self.config = rng, config
        self.next_block = 1  # 0 is the null block
        self.filled: list[tuple[int, int]] = []  # (block, offset) of every position holding K/V

    def row(self, width: int) -> list[int]:
        blocks = list(range(self.next_block, self.next_block + width))
        self.next_block += width
        return [int(b) for b in self.rng.permutation(blocks)]

    def fill(self, row: list[int], first_pos: int, last_pos: int) -> None:
        bs = self.config.block_size
        self.filled += [(row[pos // bs], pos % bs) for pos in range(first_pos, last_pos + 1)]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        shape = (self.next_block + 1, c.block_size, c.num_kv_heads, c.head_dim)  # the last block is the poison one
        keys, values = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
        for block, offset in self.filled:
            keys[block, offset] = self.rng.standard_normal(shape[2:])
            values[block, offset] = self.rng.standard_normal(shape[2:])
        return torch.from_numpy(keys), torch.from_numpy(values)


def _batch(rng, config: DraftConfig, cache: _Cache, *, num_reqs: int, k: int, num_slots: int, width: int,
           depth: float = 1.0, prefix: float = 0.0, unaligned: float = 0.0, offset: int = 0,
           at_end: float = 0.0, past_row: float = 0.0) -> Batch:
    """One batch of ``num_reqs`` requests drafting ``k`` tokens; ``depth`` in (0, 1] scales how far
    into its row a request's context reaches; ``prefix`` is the chance of an aligned cached prefix and
    ``unaligned`` that one live slot's prefix ends mid-block (the batch is then refused). ``offset`` (whole
    blocks) places every context that far in, past a row of null blocks a cached prefix must hide; ``at_end`` is the
    chance that a request's context ends as far in as its row allows; ``past_row`` that its query block runs past the
    row's end."""
    bs, kmax, qmax = config.block_size, config.max_draft_tokens, config.max_query_len
    slots = [int(s) for s in rng.permutation(num_slots)[:num_reqs]]
    cached = [int(rng.integers(0, 4)) * bs + 1 for _ in range(num_slots)]  # idle slots: unaligned, ignored
    victim = int(rng.integers(num_reqs)) if rng.random() < unaligned else -1
    starts, positions, sampled, rejected, table = [0], [], [], [], []
    for batch_row, slot in enumerate(slots):
        if rng.random() < 0.2:  # a prefill chunk; nothing sampled yet when it ends mid-prompt
            n_ctx, n_rejected, n_sampled = int(rng.integers(1, 9)), 0, int(rng.integers(0, 2))
        else:  # decode: the bonus and the drafts verified last step, a rejected suffix sometimes
            n_ctx = int(rng.integers(1, kmax + 2))
            n_rejected = int(rng.integers(0, n_ctx)) if rng.random() < 0.3 else 0
            n_sampled = n_ctx - n_rejected
        reach = max(0, int(depth * (width * bs - qmax - n_ctx - 1)))
        first = offset + (reach if at_end and rng.random() < at_end else int(rng.integers(0, reach + 1)))
        if past_row and rng.random() < past_row:  # the last valid row 1 to Q positions before the row's end
            first = offset + width * bs - int(rng.integers(1, config.query_len(k) + 1)) - (n_ctx - n_rejected) + 1
        last_valid = first + n_ctx - n_rejected - 1
        visible_from = offset + int(rng.integers(0, (first - offset) // bs + 1)) * bs if rng.random() < prefix else 0
        cached[slot] = visible_from + (int(rng.integers(1, bs)) if batch_row == victim else 0)
        row = [0] * (offset // bs) + cache.row(width)
        cache.fill(row, visible_from, last_valid)
        starts.append(starts[-1] + n_ctx)
        positions += range(first, first + n_ctx)
        sampled.append(n_sampled)
        rejected.append(n_rejected)
        table.append(tuple(row))
    temps = rng.uniform(0.25, 2.0, num_slots).astype(np.float32)
    temps[rng.random(num_slots) < 0.3] = 0.0
    return Batch(idx_mapping=tuple(slots), target_query_start_loc=tuple(starts), target_positions=tuple(positions),
                 num_sampled=tuple(sampled), num_rejected=tuple(rejected), block_table=tuple(table),
                 last_sampled=tuple(int(t) for t in rng.integers(0, config.vocab_size, num_slots)),
                 next_prefill_tokens=tuple(int(t) for t in rng.integers(0, config.vocab_size, num_slots)),
                 num_cached_tokens=tuple(cached), temperature=tuple(float(t) for t in temps),
                 seeds=tuple(int(s) for s in rng.integers(-(2**63), 2**63 - 1, num_slots, dtype=np.int64)),
                 num_draft_tokens=k)


def _capture_sizes(rng, max_tokens: int, extra: int) -> tuple[int, ...]:
    """Token counts: the largest batch always fits, plus ``extra`` random smaller sizes."""
    return tuple(sorted({max_tokens, *(int(c) for c in rng.integers(1, max_tokens + 1, extra))}))


def _case(rng, config, width, *, sizes_and_depths, backend=None, small_grid=None, schedule=None, extra_sizes=2,
          capture_sizes=None, note="", **batch_knobs) -> Case:
    num_reqs = max(b for b, _ in sizes_and_depths)
    num_slots = num_reqs + int(rng.integers(0, 3))
    backend = pick(rng, BACKENDS) if backend is None else backend
    small_grid = pick(rng, (0, 4)) if small_grid is None else small_grid  # 4: exact graphs for small batches
    cache = _Cache(rng, config)
    batches = tuple(_batch(rng, config, cache, num_reqs=b, k=k, num_slots=num_slots,
                           width=width[i] if isinstance(width, tuple) else width,
                           **{name: (knob[i] if isinstance(knob, tuple) else knob)
                              for name, knob in batch_knobs.items()})
                    for i, (b, k) in enumerate(sizes_and_depths))
    k_cache, v_cache = cache.tensors()
    sizes = capture_sizes or _capture_sizes(rng, num_reqs * config.max_query_len, extra_sizes)
    setup = GraphSetup(backend=backend, capture_sizes=sizes, max_num_reqs=num_reqs, small_grid=small_grid,
                       schedule=schedule)
    weights = random_weights(config, int(rng.integers(2**31)))
    layout = "dspark" if config.anchor_first else "dflash"
    causality = "causal" if config.causal else "non-causal"
    return Case(inputs={"config": config, "setup": setup, **weights._asdict(), "k_cache": k_cache,
                        "v_cache": v_cache, "batches": batches},
                note=f"{layout} {causality} {backend} K={config.max_draft_tokens} S={num_reqs} "
                     f"capture={list(sizes)} grid={small_grid} {note}".strip())


def _every_size(rng, num_reqs: int, k: int) -> list[tuple[int, int]]:
    """Every batch size up to the largest captured one, in random order (graphs replayed up and down)."""
    return [(int(b), k) for b in rng.permutation(np.arange(1, num_reqs + 1))]


def padded_graph(rng, device, launch):
    """Only the capture sizes are graphs: smaller batches replay padded, their padded rows inert."""
    config, width = _config(rng)
    num_reqs = int(rng.integers(3, 7))
    return _case(rng, config, width, sizes_and_depths=_every_size(rng, num_reqs, config.max_draft_tokens),
                 small_grid=0, extra_sizes=int(rng.integers(0, 3)), note="padded")


def zero_width_band(rng, device, launch):
    """A DSD schedule with a depth-0 band: batches of every size cross the band edges; the 0 band drafts
    nothing (no graph: DSpark's width 0 is dropped, DFlash's bonus-only width 1 is not captured), nor does
    an empty batch asked for K drafts, somewhere among them."""
    config, width = _config(rng)
    num_reqs = int(rng.integers(4, 8))
    edges = sorted(int(e) for e in rng.choice(np.arange(1, num_reqs), size=int(rng.integers(1, 3)), replace=False))
    bounds = list(zip([1] + [e + 1 for e in edges], edges + [num_reqs], strict=True))
    depths = [int(rng.integers(1, config.max_draft_tokens + 1)) for _ in bounds]
    depths[int(rng.integers(len(depths)))] = 0
    if not any(depths):
        depths[0] = config.max_draft_tokens
    schedule = tuple((lo, hi, k) for (lo, hi), k in zip(bounds, depths, strict=True))
    depth_of = {b: k for lo, hi, k in schedule for b in range(lo, hi + 1)}
    sizes = [(b, depth_of[b]) for b, _ in _every_size(rng, num_reqs, 0)]
    sizes.insert(int(rng.integers(len(sizes) + 1)), (0, config.max_draft_tokens))
    return _case(rng, config, width, sizes_and_depths=sizes, schedule=schedule, note=f"schedule={list(schedule)}")


def shrinking_seq_lens(rng, device, launch):
    """One or two batch sizes replayed again and again while contexts shrink and cached prefixes grow
    (the fix-4 shift shortens seq_lens further); now and then a partial cached block refuses a batch."""
    config, width = _config(rng)
    num_reqs = int(rng.integers(2, 7))
    sizes = [int(s) for s in rng.choice(np.arange(1, num_reqs + 1), size=int(rng.integers(1, 3)), replace=False)]
    sizes[0] = num_reqs
    repeats = int(rng.integers(3, 5))
    order = [(b, config.max_draft_tokens) for b in sizes for _ in range(repeats)]
    depth = tuple(1.0 - i / len(order) for i in range(len(order)))
    prefix = tuple(i / len(order) for i in range(len(order)))
    return _case(rng, config, width, sizes_and_depths=order, depth=depth, prefix=prefix, unaligned=0.1,
                 note="shrinking")


def non_causal_draft(rng, device, launch):
    """DFlash full-attention layers: each query row sees its whole block. Always the host-planned backend,
    which must then run eagerly, through its own per-request attention (ours drafts non-causally in the
    other families, whose backend and causality are drawn)."""
    config, width = _config(rng, causal=False)
    num_reqs = int(rng.integers(3, 7))
    return _case(rng, config, width, sizes_and_depths=_every_size(rng, num_reqs, config.max_draft_tokens),
                 backend="host_planned", note="non-causal")


def causal_draft(rng, device, launch):
    """Causal (sliding-window style) draft layers: both backends may be captured."""
    config, width = _config(rng, causal=True)
    num_reqs = int(rng.integers(3, 7))
    return _case(rng, config, width, sizes_and_depths=_every_size(rng, num_reqs, config.max_draft_tokens),
                 note="causal")


def long_positions(rng, device, launch):
    """Contexts tens of thousands of positions in (32K to 128K, behind a restored prefix of null blocks),
    so the rotary angles are large: rounding the inverse frequencies or the angles to float32 moves a key
    by more than float32's own error there, while the short contexts of the other families stay within it."""
    config, width = _config(rng)
    offset = config.block_size * int(rng.integers(2**15 // config.block_size, 2**17 // config.block_size))
    config = dataclasses.replace(config, max_model_len=offset + width * config.block_size)
    num_reqs = int(rng.integers(2, 5))
    return _case(rng, config, width, sizes_and_depths=_every_size(rng, num_reqs, config.max_draft_tokens),
                 prefix=1.0, offset=offset, note=f"positions from {offset}")


def length_limit(rng, device, launch):
    """max_model_len a query block short of the table's end, and most contexts ending as far in as they may: the
    query rows past the limit are clamped to max_model_len - 1 (their K/V written, and attended, there)."""
    config, width = _config(rng)
    config = dataclasses.replace(config, max_model_len=width * config.block_size - config.max_query_len)
    num_reqs = int(rng.integers(2, 6))
    return _case(rng, config, width, sizes_and_depths=_every_size(rng, num_reqs, config.max_draft_tokens),
                 at_end=0.7, note=f"limit {config.max_model_len}")


def narrow_tables(rng, device, launch):
    """The first batch's table as wide as the step's, every later one a block narrower, with query blocks that run
    past their row's end: the step's columns past a batch's width are the null block, so those query rows write
    no K/V (PAD) and attend to the null block (finite here), whatever an earlier batch or the poison left there."""
    config, width = _config(rng)
    sizes = _every_size(rng, int(rng.integers(2, 6)), config.max_draft_tokens)
    narrower = len(sizes) - 1
    case = _case(rng, config, (width,) + (width - 1,) * narrower, sizes_and_depths=sizes,
                 past_row=(0.0,) + (0.5,) * narrower, note="narrower tables")
    for cache in (case.inputs["k_cache"], case.inputs["v_cache"]):
        cache[0] = torch.from_numpy(rng.standard_normal(cache.shape[1:]).astype(np.float32))
    return case


REPLAY_FAMILIES = {"padded_graph": padded_graph, "zero_width_band": zero_width_band,
                   "shrinking_seq_lens": shrinking_seq_lens, "non_causal_draft": non_causal_draft,
                   "causal_draft": causal_draft, "long_positions": long_positions,
                   "length_limit": length_limit, "narrow_tables": narrow_tables}


def _pairs(rng, config, width, *, extra_sizes: int, note: str) -> Case:
    """Batches (a, b) of equal size: a for the first owner of the pool, b for the second. Only backends
    that may be captured: ours, or host-planned drafting causally."""
    backend = pick(rng, BACKENDS) if config.causal else "specsan_paged"
    num_reqs = int(rng.integers(2, 6))
    sizes = [int(b) for b in rng.choice(np.arange(1, num_reqs + 1), size=int(rng.integers(1, 3)), replace=False)]
    pairs = [(b, config.max_draft_tokens) for b in sizes for _ in range(2)]
    return _case(rng, config, width, sizes_and_depths=pairs, backend=backend, small_grid=0, extra_sizes=extra_sizes,
                 note=note)


def shared_pool(rng, device, launch):
    """One captured size in each owner: the second capture mirrors the first allocation for allocation."""
    config, width = _config(rng)
    return _pairs(rng, config, width, extra_sizes=0, note="one graph each")


def shared_pool_many(rng, device, launch):
    """Several captured sizes in each owner (captured largest first)."""
    config, width = _config(rng)
    return _pairs(rng, config, width, extra_sizes=2, note="several graphs each")


LIFETIME_FAMILIES = {"shared_pool": shared_pool, "shared_pool_many": shared_pool_many}
