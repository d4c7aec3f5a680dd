"""The whole-step check: the engine and the reference engine replay one workload in lockstep, and
after every step every field of the engine's record must equal the reference's.

Integer fields (slots, block tables, slot mappings, draft inputs, tokens, depth) compare exactly;
float fields (logits) within the bound the reference gives for each element (from the engine's
dtype and the hidden states), NaN where and only where the reference has NaN. The first
difference, in step order and then in record order, is the report: step, field, index, expected,
got. Where the reference found a sampling decision that
the engine's rounding could turn either way (a near tie), it is replayed following the engine's
decisions at those points, so one undecidable token does not end the comparison.

Before that comparison, the step's own invariants (``stress.oracles.engine_invariants``: the block pools'
accounting, the drafts every live request gets and keeps, the KV each read finds) are judged apart from the
reference; a broken one fails the case as ``fail:accounting``, ``fail:drafts``, ``fail:kv`` or ``fail:graphs``
with a one-line reason.

Each case also yields its acceptance (accepted drafts / verified drafts) for the engine and the
reference, which the run summary aggregates per family.
"""

from typing import NamedTuple

import numpy as np
import torch

from reference.spec import engine as reference_engine
from stress.core.compare import SHOW, Divergence, Tolerated, Unjudged
from stress.core.types import RETURN
from stress.oracles import engine_invariants

ITERATION_SHARE = 0.1  # a case replays ~6 steps of ~10 kernel launches each: one per 10 iterations

NEAR_TIE_SHARE = 0.05  # followed decisions beyond this share of all decisions: the case is not judged


class Expected(NamedTuple):
    trace: reference_engine.Trace
    inputs: dict  # to replay the reference following the engine at near ties


def run_engine(config, weights, requests, num_steps, global_seed) -> engine_invariants.Records:
    """The engine's step records, with the findings of an audit of its scheduler's pools. The global numpy
    RNG is seeded and drawn from before every step (a rank-local consumer the engine must not depend on),
    then restored: the case stays reproducible."""
    from kernels.spec import engine  # looked up at call time, so an applied mutant is the one used

    saved = np.random.get_state()
    try:
        np.random.seed(global_seed)  # deliberate: see the docstring
        replay = engine.Engine(config, weights, requests)
        records = engine_invariants.Records()
        records.findings = engine_invariants.PoolAudit(replay.scheduler, replay.caches_d).findings
        if replay.graphs is not None and replay.device.type == "cuda":  # elsewhere nothing is captured
            engine_invariants.ReplayAudit(replay, records.findings)
        for _ in range(num_steps):
            np.random.random(int(np.random.randint(1, 8)))
            records.append(replay.step())
        return records
    finally:
        np.random.set_state(saved)


def reference(**inputs) -> Expected:
    return Expected(reference_engine.replay(**inputs), inputs)


def _float_diff(want: torch.Tensor, got: torch.Tensor, tolerance: torch.Tensor) -> torch.Tensor:
    """Elements outside the tolerance: a NaN on one side only, or |got - want| > tolerance."""
    want, got = want.to(torch.float64), got.to(torch.float64)
    nan_want, nan_got = torch.isnan(want), torch.isnan(got)
    far = (got - want).abs() > tolerance
    return (nan_want != nan_got) | (far & ~nan_want & ~nan_got)


def field_divergence(step: int, name: str, want, got, tolerance: torch.Tensor | None) -> Divergence | None:
    """``tolerance``: the reference's bound on the engine's error in a float field (integers: exact)."""
    label = f"step {step} {name}"
    if got is None:
        return Divergence(label, 1, [], problem="missing from the engine's record")
    if tuple(want.shape) != tuple(got.shape):
        return Divergence(label, 1, [], problem=f"shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    floating = want.is_floating_point()
    if floating != got.is_floating_point() or (not floating and want.dtype != got.dtype):
        return Divergence(label, 1, [], problem=f"dtype {got.dtype}, expected {want.dtype}")
    if floating and tolerance is None:
        return Divergence(label, 1, [], problem="a float field without a tolerance from the reference")
    differ = _float_diff(want, got, tolerance) if floating else want != got
    total = int(differ.sum())
    if total == 0:
        return None
    first = [(tuple(i), want[tuple(i)].item(), got[tuple(i)].item()) for i in differ.nonzero()[:SHOW].tolist()]
    return Divergence(label, total, first)


def first_divergence(trace: reference_engine.Trace, got: list[dict]) -> Divergence | None:
    """The first difference in step order, then in the reference record's field order."""
    want = trace.records
    if len(got) != len(want):
        return Divergence("steps", 1, [], problem=f"{len(got)} step records, expected {len(want)}")
    for step, (expected, actual) in enumerate(zip(want, got, strict=True)):
        extra = sorted(set(actual) - set(expected))
        for name, value in expected.items():
            tolerance = trace.tolerances[step].get(name)
            if (found := field_divergence(step, name, value, actual.get(name), tolerance)) is not None:
                return found
        if extra:
            return Divergence(f"step {step} {extra[0]}", 1, [], problem="recorded by the engine, not the reference")
    return None


def broken_invariant(expected: Expected, got: list[dict]) -> Divergence | None:
    """The first invariant the engine's own run broke (``stress.oracles.engine_invariants``), as its oracle's
    verdict."""
    finding = engine_invariants.first_finding(expected.inputs.get("config"), got, expected.inputs.get("requests"))
    if finding is None:
        return None
    return Divergence(f"step {finding.step} {finding.oracle}", 1, [], problem=finding.reason, verdict=finding.oracle)


def missing_field(trace: reference_engine.Trace, got: list[dict]) -> Divergence | None:
    """The first field the reference records that the engine's record lacks: where the invariants fail reading
    one, the engine's failure, never the suite's own code failing on it (a suite error, which kills nothing)."""
    for step, (expected, actual) in enumerate(zip(trace.records, got, strict=False)):
        if (name := next((n for n in expected if n not in actual), None)) is not None:
            return Divergence(f"step {step} {name}", 1, [], problem="missing from the engine's record")
    return None


def compare(output: str, expected: Expected, got: list[dict]) -> Divergence | Tolerated | None:
    """The step's invariants first (they name the broken promise; one that reads a field the engine did not
    record gives way to that missing field), then the lockstep comparison."""
    try:
        broken = broken_invariant(expected, got)
    except KeyError:
        if (missing := missing_field(expected.trace, got)) is None:
            raise
        return missing
    if broken is not None:
        return broken
    trace = expected.trace
    found = first_divergence(trace, got)
    if found is not None and trace.near_ties:
        trace = reference_engine.replay(**expected.inputs, follow=got)
        found = first_divergence(trace, got)
    if found is not None or not trace.followed:
        return found
    decisions = sum(r[name].numel() for r in trace.records for name in ("verify.num_sampled", "draft.sampled")
                    if name in r)
    note = (f"{len(trace.followed)} of {decisions} sampling decision(s) within the engine's rounding of a tie: "
            f"the reference took the engine's (first at step {trace.followed[0][0]} {trace.followed[0][1]})")
    if len(trace.followed) > 1 + NEAR_TIE_SHARE * decisions:
        return Unjudged(output, note + "; too few decided")
    return Tolerated(output, note)


def acceptance(records: list[dict]) -> tuple[int, int]:
    """(verified drafts, accepted drafts) over every step."""
    drafted = accepted = 0
    for r in records:
        if "verify.num_drafts" not in r:
            continue
        drafts = r["verify.num_drafts"].long()
        has = drafts > 0
        drafted += int(drafts[has].sum())
        accepted += int((r["verify.num_sampled"].long()[has] - 1).sum())
    return drafted, accepted


def metrics(expected: dict, outputs: dict) -> dict:
    """Acceptance of the engine's run and of the reference's (``Check.metrics``)."""
    got = outputs[RETURN]
    drafted, accepted = acceptance(got) if isinstance(got, list) else (0, 0)
    ref_drafted, ref_accepted = acceptance(expected[RETURN].trace.records)
    return {"drafted": drafted, "accepted": accepted, "expected_drafted": ref_drafted,
            "expected_accepted": ref_accepted}
