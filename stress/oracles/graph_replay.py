"""Drivers and judges of the GPU graph checks: replay against eager and reference, and graph lifetime
in a shared memory pool (docs/contracts/spec.md#specgraph_candidates, docs/contracts/draft_inputs.md#padding, fixes
3, 6, 8 in docs/fixes.md).

``replay_draft_graphs`` captures the draft step at the captured sizes, then runs a sequence of
batches twice: through ``DraftGraphs.run`` (a replay where a graph fits) and through an uncaptured
twin at the same padded size (eager, same shapes). Before each run every static input and output is
poisoned (NaN floats, ``POISON`` ints, the all-NaN poison block in block tables), so a replay that
does nothing, or a row it should have ignored, shows. Replay must equal eager bit for bit; eager
must equal the float64 reference within its error bounds (``reference.spec.draft_step``).

``lifetime_experiment`` captures the same descriptors in two ``DraftGraphs`` that share one pool,
the second under the CUDA caching allocator's memory history. It then replays the first, replays the
second, and only then reads the first graph's backbone output through its tail (the logits of its
sampling rows), as work outside the graph does after a replay. A graph always rewrites its own
intermediates before reading them, so a replay of the second graph *before* the first cannot expose
anything; the read after the other replay can. The first must still equal eager, and the second
capture must not have been handed any byte of the first's backbone output (fix 8).
"""

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kernels.spec import attention_backends, draft_graphs, draft_step
from kernels.spec.draft_step import DraftWeights
from kernels.spec.graphs import Mode
from stress.core import compare

POISON = -999_999
WARM_UP_LOGITS = -12_345.0  # the logits cache before a capture's warm-up: finite, so a write of NaN shows too


@dataclass(frozen=True)
class GraphSetup:
    """How a case's draft step is captured: the backend the case draws and the graph candidates."""

    backend: str
    capture_sizes: tuple[int, ...]
    max_num_reqs: int
    small_grid: int = 32
    schedule: tuple[tuple[int, int, int], ...] | None = None


@dataclass(frozen=True)
class Batch:
    """Target-side inputs of one draft step, as plain tuples (a case compares and prints simply).

    Batch-row fields: ``idx_mapping``, ``num_sampled``, ``num_rejected``, ``block_table`` rows (unshifted)
    and the target CSR ``target_query_start_loc`` over ``target_positions``. Slot fields:
    ``last_sampled``, ``next_prefill_tokens``, ``num_cached_tokens``, ``temperature``, ``seeds``.
    """

    idx_mapping: tuple[int, ...]
    target_query_start_loc: tuple[int, ...]
    target_positions: tuple[int, ...]
    num_sampled: tuple[int, ...]
    num_rejected: tuple[int, ...]
    block_table: tuple[tuple[int, ...], ...]
    last_sampled: tuple[int, ...]
    next_prefill_tokens: tuple[int, ...]
    num_cached_tokens: tuple[int, ...]
    temperature: tuple[float, ...]
    seeds: tuple[int, ...]
    num_draft_tokens: int

    def __repr__(self) -> str:
        return f"Batch(B={len(self.idx_mapping)}, k={self.num_draft_tokens})"

    def target(self, device) -> dict[str, torch.Tensor]:
        """The keyword arguments of ``DraftGraphs.run`` besides the depth, on ``device``."""
        i32, i64 = torch.int32, torch.int64
        width = max((len(row) for row in self.block_table), default=1)
        return {name: torch.tensor(getattr(self, name), dtype=dtype, device=device) for name, dtype in (
            ("idx_mapping", i32), ("target_query_start_loc", i32), ("target_positions", i64), ("num_sampled", i32),
            ("num_rejected", i32), ("last_sampled", i64), ("next_prefill_tokens", i32), ("num_cached_tokens", i32),
        )} | {"block_table": torch.tensor(self.block_table, dtype=i32, device=device).view(-1, width)}


def build(config, weights: DraftWeights, setup: GraphSetup, k_cache, v_cache, batches, *, pool=None):
    """A ``DraftGraphs`` over a private copy of the KV cache and its own sampling state and buffers."""
    num_slots = len(batches[0].temperature)
    dev = k_cache.device
    # every class as its module holds it now, so a planted bug in any applies: the case's configuration too, built
    # before the bug was planted, is rebuilt from its fields (a slip in DraftConfig's query length would otherwise
    # never run)
    config = draft_step.DraftConfig(**dataclasses.asdict(config))
    step = draft_step.DraftStep(config, weights, attention_backends.make(setup.backend, causal=config.causal),
                     k_cache=k_cache.clone(), v_cache=v_cache.clone(),
                     temperature=torch.zeros(num_slots, dtype=torch.float32, device=dev),
                     seeds=torch.zeros(num_slots, dtype=torch.int64, device=dev),
                     logits_cache=torch.zeros(num_slots, config.max_draft_tokens, config.vocab_size, device=dev),
                     max_num_reqs=setup.max_num_reqs,
                     max_num_tokens=max(b.target_query_start_loc[-1] for b in batches),
                     max_blocks_per_req=max(len(row) for b in batches for row in b.block_table))
    return draft_graphs.DraftGraphs(step, capture_sizes=setup.capture_sizes, max_num_reqs=setup.max_num_reqs,
                                    schedule=setup.schedule, small_grid=setup.small_grid, pool=pool)


def poison(graphs, batch: Batch) -> None:
    """Poison every static input and output of ``graphs`` before it runs ``batch``.

    Block-table entries point at the last block of the cache, which holds NaN; the sampling state of
    slots outside the batch is NaN / ``POISON``; the logits cache is NaN; every captured backbone output
    is NaN. What the step does not write (or preparation does not fill) cannot reach a compared value
    unpoisoned.
    """
    step = graphs.step
    for name, t in step.buffers.tensors().items():
        t.fill_(step.k_cache.shape[0] - 1 if name == "block_table" else POISON)
    live = torch.zeros(len(batch.temperature), dtype=torch.bool)
    live[list(batch.idx_mapping)] = True
    temperature = torch.tensor(batch.temperature, dtype=torch.float32).masked_fill(~live, math.nan)
    seeds = torch.tensor(batch.seeds, dtype=torch.int64).masked_fill(~live, POISON)
    step.temperature.copy_(temperature)
    step.seeds.copy_(seeds)
    step.logits_cache.fill_(math.nan)
    for outputs in graphs.captured.values():
        outputs.hidden.fill_(math.nan)


class StepRecord(NamedTuple):
    draft_tokens: torch.Tensor  # [B, k]
    hidden: torch.Tensor | None  # [B * Q, H, D]
    logits_cache: torch.Tensor  # [S, K, V]


class BatchRecord(NamedTuple):
    label: str
    replay: StepRecord
    eager: StepRecord
    silent_fallback: bool  # dispatched to a FULL descriptor, yet no graph was replayed


class ReplayRun(NamedTuple):
    batches: tuple[BatchRecord, ...]
    kv_cache: tuple[torch.Tensor, torch.Tensor]  # after every batch, through the graphs
    eager_kv_cache: tuple[torch.Tensor, torch.Tensor]
    replays: int


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU copy (never a view of a buffer the next step overwrites)."""
    return None if t is None else t.to("cpu", copy=True)


def _record(graphs, out) -> StepRecord:
    return StepRecord(_copy(out.draft_tokens), _copy(out.hidden), _copy(graphs.step.logits_cache))


def silent_fallback(out) -> bool:
    """Whether a ``DraftGraphs.run`` was dispatched to a FULL descriptor and drafted, yet replayed no graph."""
    return out.descriptor.mode is Mode.FULL and out.hidden is not None and not out.replayed


def _label(index: int, batch: Batch, out) -> str:
    d = out.descriptor
    how = (f"replay of FULL(num_reqs={d.num_reqs}, num_tokens={d.num_tokens})" if out.replayed
           else "refused or drafted nothing" if out.hidden is None
           else f"eager at {d.num_reqs} rows (FULL, no graph)" if d.mode is Mode.FULL else "eager (no graph fits)")
    return f"batch {index} (B={len(batch.idx_mapping)}, k={batch.num_draft_tokens}, {how})"


def replay_draft_graphs(*, config, setup: GraphSetup, embed, wq, wk, wv, w_out, k_cache, v_cache,
                        batches) -> ReplayRun:
    """Capture, then run every batch through the graphs and through an eager twin; see the module doc."""
    weights = DraftWeights(embed, wq, wk, wv, w_out)
    graphs = build(config, weights, setup, k_cache, v_cache, batches)
    twin = build(config, weights, setup, k_cache, v_cache, batches)  # never captured: the eager comparison
    graphs.capture()
    records, replays = [], 0
    for index, batch in enumerate(batches):
        outs = []
        for owner, replay in ((graphs, True), (twin, False)):
            poison(owner, batch)
            out = owner.run(num_draft_tokens=batch.num_draft_tokens, replay=replay, **batch.target(embed.device))
            outs.append((out, _record(owner, out)))
        (out, replayed), (_, eager) = outs
        replays += out.replayed
        records.append(BatchRecord(_label(index, batch, out), replayed, eager, silent_fallback(out)))
    return ReplayRun(tuple(records), (_copy(graphs.step.k_cache), _copy(graphs.step.v_cache)),
                     (_copy(twin.step.k_cache), _copy(twin.step.v_cache)), replays)


@dataclass
class Findings:
    """Divergences of several parts of one returned value, reported as one divergence."""

    output: str
    parts: list  # compare.Divergence, at least one

    @property
    def verdict(self) -> str:
        """The oracle the case fails by (the runner reads it from every comparison that fails)."""
        return self.parts[0].verdict

    def lines(self, source: torch.Tensor | None = None) -> list[str]:
        return [line for part in self.parts for line in part.lines()]


def within(output: str, expected: torch.Tensor, bound: torch.Tensor, got) -> compare.Divergence | None:
    """``|got - expected| <= bound`` elementwise (float64); NaN must meet NaN, equal values always pass."""
    if got is None:
        return compare.Divergence(output, 1, [], problem="missing from the kernel's outputs")
    have = got.detach().cpu().to(torch.float64)
    if have.shape != expected.shape:
        return compare.Divergence(output, 1, [], problem=f"shape {tuple(have.shape)}, expected {tuple(expected.shape)}")
    ok = ((have - expected).abs() <= bound) | (have == expected) | (torch.isnan(have) & torch.isnan(expected))
    total = int((~ok).sum())
    if total == 0:
        return None
    first = [(tuple(i), expected[tuple(i)].item(), have[tuple(i)].item())
             for i in (~ok).nonzero()[:compare.SHOW].tolist()]
    return compare.Divergence(output, total, first)


def verdict(output: str, found: list, notes: list[str], decided: list):
    """Divergences fail the case. Near ties (their rows are compared by nothing) are counted over the
    whole case (``decided``: the expected tokens of every step), not per batch, where two in a batch of
    three would leave a case unjudged: more than ``1 + NEAR_TIE_SHARE`` of all rows does. Otherwise the
    count and the notes pass along."""
    failed = [f for f in found if f is not None and not isinstance(f, compare.Tolerated)]
    if failed:
        return Findings(output, failed)
    near_ties = sum(int(d.near_tie.sum()) for d in decided)
    rows = sum(d.near_tie.numel() for d in decided)
    if near_ties > 1 + compare.NEAR_TIE_SHARE * rows:
        return compare.Unjudged(output, f"{near_ties} of {rows} sampled rows are near ties that float32 cannot "
                                        "decide: too few rows judged")
    counted = [f"{near_ties} of {rows} sampled rows within rounding of a tie, not judged"] if near_ties else []
    lines = counted + notes
    return compare.Tolerated(output, "; ".join(lines)) if lines else None


def _eager_vs_reference(label: str, expected, tokens, hidden, logits_cache=None) -> list:
    """Eager outputs against the reference step: tokens exact unless near a tie, floats within bounds."""
    found = [compare.exact_unless_near_tie(f"{label} draft_tokens (eager vs reference)", expected.draft_tokens,
                                           tokens.reshape(-1))]
    if logits_cache is not None:
        found.append(within(f"{label} logits_cache (eager vs reference)", expected.logits_cache,
                            expected.logits_bound, logits_cache))
    if expected.hidden is not None:
        found.append(within(f"{label} hidden (eager vs reference)", expected.hidden, expected.hidden_bound, hidden))
    elif hidden is not None:
        found.append(compare.Divergence(f"{label} hidden", 1, [], problem="the step ran, but nothing should have"))
    return found


def judge_replay(output: str, expected, got: ReplayRun):
    """Replay == eager bitwise (every output, every batch, the final KV cache); eager == reference."""
    found = []
    for record, step in zip(got.batches, expected.steps, strict=True):
        label = record.label
        for name in StepRecord._fields:
            want, have = getattr(record.eager, name), getattr(record.replay, name)
            if want is not None or have is not None:
                found.append(compare.exact(f"{label} {name} (replay vs eager)", want, have))
        if record.silent_fallback:
            found.append(compare.Divergence(label, 1, [], problem="dispatched to a FULL graph that was never captured"))
        eager = record.eager
        found += _eager_vs_reference(label, step, eager.draft_tokens, eager.hidden, eager.logits_cache)
    for name, have, want, exp, bound in (("k_cache", *got.kv_cache[:1], *got.eager_kv_cache[:1], expected.k_cache,
                                          expected.k_bound),
                                         ("v_cache", *got.kv_cache[1:], *got.eager_kv_cache[1:], expected.v_cache,
                                          expected.v_bound)):
        found.append(compare.exact(f"{name} after every batch (replay vs eager)", want, have))
        found.append(within(f"{name} after every batch (eager vs reference)", exp, bound, want))
    return verdict(output, found, [f"{got.replays} of {len(got.batches)} batches replayed a graph"],
                   [step.draft_tokens for step in expected.steps])


# ---------------------------------------------------------------- the eager step alone (any device)


class EagerRun(NamedTuple):
    batches: tuple[tuple[str, StepRecord], ...]  # (label, what the step left) per batch
    descriptors: tuple[tuple[str, int | None, int], ...]  # (mode, padded requests, tokens) each run dispatched
    kv_cache: tuple[torch.Tensor, torch.Tensor]  # after every batch
    to_capture: tuple[tuple[int, int, int], ...]  # (requests, tokens, width) of every graph capture() would record
    warm_ups: tuple["WarmUp", ...]  # each capture's warm-up, in capture order


class WarmUp(NamedTuple):
    label: str
    kv_before: tuple[torch.Tensor, torch.Tensor]
    kv_after: tuple[torch.Tensor, torch.Tensor]
    logits_cache: torch.Tensor  # after the warm-up; all WARM_UP_LOGITS before it


def eager_draft_step(*, config, setup: GraphSetup, embed, wq, wk, wv, w_out, k_cache, v_cache, batches) -> EagerRun:
    """Every batch through ``DraftGraphs.run`` with nothing captured: the step runs eagerly at the padded size
    its dispatch picks, the very work a replay would do, on any device. Static buffers poisoned before each."""
    owner = build(config, DraftWeights(embed, wq, wk, wv, w_out), setup, k_cache, v_cache, batches)
    order = sorted(owner.descriptors, key=lambda d: (d.num_tokens, d.uniform), reverse=True)  # capture()'s order
    warm_ups = tuple(_warm_up(owner, desc, batches[0]) for desc in order)
    records, dispatched = [], []
    for index, batch in enumerate(batches):
        poison(owner, batch)
        out = owner.run(num_draft_tokens=batch.num_draft_tokens, replay=False, **batch.target(embed.device))
        records.append((_label(index, batch, out), _record(owner, out)))
        d = out.descriptor
        dispatched.append((d.mode.value, d.num_reqs, d.num_tokens))
    to_capture = tuple(sorted((d.num_reqs, d.num_tokens, d.uniform) for d in owner.descriptors))
    return EagerRun(tuple(records), tuple(dispatched), (_copy(owner.step.k_cache), _copy(owner.step.v_cache)),
                    to_capture, warm_ups)


def _warm_up(owner, desc, batch) -> WarmUp:
    """The warm-up ``DraftGraphs.capture`` runs before capturing ``desc`` (dummy inputs, the backend's plan, one
    forward), run here over buffers poisoned first: its dummy inputs must reset everything it reads, and it
    must leave the KV cache and the logits cache as they were."""
    step = owner.step
    poison(owner, batch)
    # the slot maps hold a live slot instead: a kernel skips POISON's negative slot as padding, so a row the reset
    # missed would write no cache and show nothing; slot 0 (the null block's first slot, slot 0's logits) would
    step.buffers.query_slot_mapping.fill_(0)
    step.buffers.sample_idx_mapping.fill_(0)
    # and the logits cache a finite sentinel: the dummy forward attends over the null block's NaN, so what a
    # warm-up would write there is NaN too, which a NaN poison could not tell from itself
    step.logits_cache.fill_(WARM_UP_LOGITS)
    before = (_copy(step.k_cache), _copy(step.v_cache))
    step.reset_for_capture(desc.num_reqs, owner.depth(desc))
    step.backend.plan(step.metadata(desc.num_reqs))
    owner.forward(desc.num_reqs, owner.depth(desc))
    label = f"capture warm-up of FULL(num_reqs={desc.num_reqs}, num_tokens={desc.num_tokens})"
    return WarmUp(label, before, (_copy(step.k_cache), _copy(step.v_cache)), _copy(step.logits_cache))


def judge_eager(output: str, expected, got: EagerRun):
    """Each batch's drafts, live hidden rows and logits cache, and the KV cache after every batch, against
    the float64 reference; the graph each run dispatched to, and the graphs a capture would record, against the
    reference's (``expected.dispatched``, ``expected.to_capture``); each capture's warm-up wrote nothing."""
    found, run = [], expected.run
    for (label, record), step in zip(got.batches, run.steps, strict=True):
        found += _eager_vs_reference(label, step, record.draft_tokens, record.hidden, record.logits_cache)
    for (label, _), want, have in zip(got.batches, expected.dispatched, got.descriptors, strict=True):
        if tuple(want) != tuple(have):
            found.append(compare.Divergence(f"{label} dispatch", 1, [],
                                            problem=f"ran as {have} (mode, padded requests, tokens), expected {want}"))
    for warm in got.warm_ups:
        found += [compare.exact(f"{warm.label} {name} (no write)", was, now)
                  for name, was, now in zip(("k_cache", "v_cache"), warm.kv_before, warm.kv_after, strict=True)]
        found.append(compare.exact(f"{warm.label} logits_cache (no write)",
                                   torch.full_like(warm.logits_cache, WARM_UP_LOGITS), warm.logits_cache))
    if tuple(expected.to_capture) != tuple(got.to_capture):
        found.append(compare.Divergence("graphs to capture", 1, [], problem=f"{list(got.to_capture)} (requests, "
                                        f"tokens, width), expected {list(expected.to_capture)}"))
    for name, have, exp, bound in (("k_cache", got.kv_cache[0], run.k_cache, run.k_bound),
                                   ("v_cache", got.kv_cache[1], run.v_cache, run.v_bound)):
        found.append(within(f"{name} after every batch (eager vs reference)", exp, bound, have))
    return verdict(output, found, [], [step.draft_tokens for step in run.steps])


# ---------------------------------------------------------------- lifetime in a shared pool


def _device_trace(device: torch.device) -> list[dict]:
    traces = torch.cuda.memory._snapshot(device)["device_traces"]
    return traces[device.index] if device.index < len(traces) else []


@contextmanager
def allocations(device: torch.device):
    """Collects ``(address, size)`` of every allocation the block makes, from the caching allocator's
    memory history (``torch.cuda.memory._record_memory_history``)."""
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1 << 20)
    made: list[tuple[int, int]] = []
    try:
        before = len(_device_trace(device))
        yield made
        made += [(e["addr"], e["size"]) for e in _device_trace(device)[before:] if e["action"] == "alloc"]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def reused(address: int, size: int, made: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(a, n) for a, n in made if a < address + size and address < a + n]


class PairRecord(NamedTuple):
    label: str
    hidden: torch.Tensor  # the first graph's backbone output, read after the second graph replayed
    logits: torch.Tensor  # its tail: the sampling rows' logits computed from that hidden state
    draft_tokens: torch.Tensor
    eager_hidden: torch.Tensor
    eager_logits: torch.Tensor
    eager_draft_tokens: torch.Tensor
    reuse: tuple[str, ...]  # memory-history evidence: second-capture allocations over the first's output


class LifetimeRun(NamedTuple):
    pairs: tuple[PairRecord, ...]
    retained: int  # backbone outputs the first owner retained


def lifetime_experiment(*, config, setup: GraphSetup, embed, wq, wk, wv, w_out, k_cache, v_cache,
                        batches) -> LifetimeRun:
    """``batches`` alternate: the first graph's batch, then the second's (same size); see the module doc."""
    device = embed.device
    weights = DraftWeights(embed, wq, wk, wv, w_out)
    pool = torch.cuda.graph_pool_handle()
    first = build(config, weights, setup, k_cache, v_cache, batches, pool=pool)
    if first.mode is not Mode.FULL:
        raise ValueError(f"lifetime: backend {setup.backend} (causal={config.causal}) is not captured; "
                         "the experiment needs full graphs")
    first.capture()  # from here on the first owner holds only what the fix keeps
    outputs = {desc: (out.hidden.data_ptr(), out.hidden.untyped_storage().nbytes())
               for desc, out in first.captured.items()}
    with allocations(device) as made:
        second = build(config, weights, setup, k_cache, v_cache, batches, pool=pool)
        second.capture()
    twin = build(config, weights, setup, k_cache, v_cache, batches)
    pairs = []
    for index in range(0, len(batches), 2):
        batch_a, batch_b = batches[index], batches[index + 1]
        k = batch_a.num_draft_tokens
        live = len(batch_a.idx_mapping)
        for owner, batch in ((first, batch_a), (second, batch_b), (twin, batch_a)):
            poison(owner, batch)  # and the batch's sampling state
        out = first.run(num_draft_tokens=k, **batch_a.target(device))
        second.run(num_draft_tokens=batch_b.num_draft_tokens, **batch_b.target(device))
        logits = first.step.logits(out.hidden, live, k)  # the tail, after the other graph's replay
        eager = twin.run(num_draft_tokens=k, replay=False, **batch_a.target(device))
        eager_logits = twin.step.logits(eager.hidden, live, k)
        address, size = outputs.get(out.descriptor, (0, 0))
        evidence = tuple(f"the second capture allocated {n} bytes at {a:#x}, inside the first graph's backbone "
                         f"output ({size} bytes at {address:#x})" for a, n in reused(address, size, made))
        label = f"pair {index // 2} (B={live}, k={k}, {'replayed' if out.replayed else 'NOT replayed'})"
        pairs.append(PairRecord(label, _copy(out.hidden), _copy(logits), _copy(out.draft_tokens), _copy(eager.hidden),
                                _copy(eager_logits), _copy(eager.draft_tokens), evidence))
    return LifetimeRun(tuple(pairs), len(first.retained))


def judge_lifetime(output: str, expected, got: LifetimeRun):
    """The first graph's outputs, read after the second replayed, equal eager bit for bit; no byte of a
    backbone output was handed to the second capture; eager equals the reference."""
    found = []
    for record, step in zip(got.pairs, expected.steps, strict=True):
        parts = [compare.exact(f"{record.label} {name} (after the second replay vs eager)",
                               getattr(record, f"eager_{name}"), getattr(record, name))
                 for name in ("hidden", "logits", "draft_tokens")]
        if record.reuse:
            parts.append(compare.Divergence(f"{record.label} memory history", len(record.reuse), [],
                                            problem="; ".join(record.reuse)))
        found += parts
        found += _eager_vs_reference(record.label, step, record.eager_draft_tokens, record.eager_hidden)
    return verdict(output, found, [f"{got.retained} backbone output(s) retained"],
                   [step.draft_tokens for step in expected.steps])
