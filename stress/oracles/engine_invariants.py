"""Invariants of the engine's step, judged apart from the reference engine: from the scheduler's raw pool
state and the step's own inputs, never through the production host code that keeps the count.

The lockstep comparison (``stress.oracles.engine``) sees a slip only where a workload makes the engine
and the reference engine disagree in a recorded field. Two kinds escape it:

* ``accounting``: the free count a block pool reports. Off by one per cached hit, it decides nothing
  until an admission is tight to that one block; here every count the pools report or hold is
  compared, at every call and after every schedule and step, with the blocks no running request holds.
* ``drafts``: every batch row of a step at depth d > 0 whose restored prefixes are block-aligned gets
  exactly d sampling rows of its slot and d drafted tokens, of which the request later verifies a
  prefix, as drafted; at depth 0, or in a refused batch, none. The depth itself must lie in the DSD
  band of the batch size.
* ``graphs``: on a GPU, where the engine captures its draft graphs, every drafted step dispatched to a
  FULL descriptor replays the captured graph. An engine that never captures, or captures the wrong
  shapes, drafts the same tokens eagerly: no recorded field shows it, only the lost replay.

Each is its own oracle (``fail:accounting``, ``fail:drafts``, ``fail:graphs``), with a planted bug in
``stress.checks``.
"""

from collections import Counter
from typing import NamedTuple

from stress.oracles.graph_replay import silent_fallback

ORACLES = ("accounting", "drafts", "graphs")


class Finding(NamedTuple):
    oracle: str  # one of ORACLES
    step: int
    reason: str  # one line


class Records(list):
    """The engine's step records, with what the pool audit found while they were made."""

    findings: list[Finding]


class PoolAudit:
    """Wraps one scheduler's pools (on the instance only): each count the target pool reports for an
    admission, and both pools' free queues after every schedule and step, against the blocks its
    running requests hold. Findings go to ``findings``; the engine's behaviour is unchanged."""

    def __init__(self, scheduler):
        self.scheduler, self.step, self.findings = scheduler, 0, []
        pool = scheduler.target_pool
        reported, schedule, finish = pool.num_free_after_touch, scheduler.schedule, scheduler.finish_step

        def num_free_after_touch(hits):
            count = reported(hits)
            self._judge_touch(hits, count)
            return count

        def audited_schedule(step):
            plan = schedule(step)
            self._judge_pools("after scheduling")
            return plan

        def audited_finish():
            finish()
            self._judge_pools("after the step")
            self.step += 1

        pool.num_free_after_touch = num_free_after_touch
        scheduler.schedule, scheduler.finish_step = audited_schedule, audited_finish

    def _unheld(self, group: str) -> set[int]:
        """Blocks 1..N-1 of a pool (0 is the null block) that no running request holds."""
        c = self.scheduler.config
        num_blocks = c.target_num_blocks if group == "target" else c.draft_num_blocks
        held = {b for r in self.scheduler.running for b in getattr(r, f"{group}_blocks")}
        return set(range(1, num_blocks)) - held

    def _report(self, reason: str) -> None:
        self.findings.append(Finding("accounting", self.step, reason))

    def _judge_touch(self, hits: list[int], count: int) -> None:
        unheld = self._unheld("target")
        want = len(unheld - set(hits))
        if count != want:
            taken = sorted(unheld & set(hits))
            self._report(f"target pool reported {count} free block(s) after touching cached hits {hits}, but "
                         f"{want} are held by no running request once the unreferenced hit(s) {taken} are taken")

    def _judge_pools(self, when: str) -> None:
        for group in ("target", "draft"):
            pool = getattr(self.scheduler, f"{group}_pool")
            free, unheld = list(pool.free), self._unheld(group)
            if len(free) != len(set(free)) or set(free) != unheld or pool.num_free() != len(unheld):
                missing, extra = sorted(unheld - set(free)), sorted(set(free) - unheld)
                self._report(f"{group} pool {when}: num_free() = {pool.num_free()}, free queue of {len(free)}, but "
                             f"{len(unheld)} block(s) are held by no running request (unheld, not queued: {missing}; "
                             f"queued, but held: {extra})")
                return
        counts = Counter(b for r in self.scheduler.running for b in r.target_blocks)
        refs = self.scheduler.target_pool.refs
        wrong = [b for b in range(1, len(refs)) if int(refs[b]) != counts[b]]
        if wrong:
            b = wrong[0]
            self._report(f"target pool {when}: block {b} has {int(refs[b])} reference(s), but {counts[b]} running "
                         f"request(s) hold it ({len(wrong)} block(s) so)")


class ReplayAudit:
    """Wraps one engine's ``DraftGraphs.run`` (on the instance): a drafted step dispatched to a FULL
    descriptor must have replayed its captured graph. Only where the engine captures (a CUDA device);
    findings go to ``findings``, the engine's behaviour is unchanged."""

    def __init__(self, engine, findings: list[Finding]):
        run = engine.graphs.run

        def audited_run(**step):
            out = run(**step)
            if silent_fallback(out):
                d = out.descriptor
                findings.append(Finding("graphs", engine.step_index, f"the draft was dispatched to FULL(num_reqs="
                                        f"{d.num_reqs}, num_tokens={d.num_tokens}) but ran eagerly: no captured "
                                        "graph was replayed"))
            return out

        engine.graphs.run = audited_run


def band_cap(config: dict, batch_size: int) -> int:
    """The deepest a batch of ``batch_size`` may draft: K, or its DSD band's depth (a size in a gap
    keeps the band before it), capped at K."""
    k, schedule = config["num_spec_tokens"], config["dsd_schedule"]
    if schedule is None:
        return k
    cap = 0
    for start, _, depth in sorted(schedule):
        if start <= batch_size:
            cap = depth
    return min(cap, k)


def _row_drafts(record: dict, slot: int) -> tuple[int, list[int]]:
    """How many sampling rows of the step's draft map to ``slot``, and the tokens sampled there."""
    mapping = record.get("draft.sample_idx_mapping")
    if not bool(record.get("draft.prepared", False)) or mapping is None or "draft.sampled" not in record:
        return 0, []
    rows = (mapping.long() == slot).nonzero().flatten()
    return rows.numel(), record["draft.sampled"][rows].tolist()


def _judge_step(config: dict, record: dict, vocab: int) -> str | None:
    """The first broken promise of one step's drafting, or None."""
    slots = record["idx_mapping"].long().tolist()
    requests = record["batch.request"].tolist()
    if "depth" not in record or "draft.tokens" not in record:
        return "the step has a batch but recorded no depth or drafts"
    depth, cap = int(record["depth"]), band_cap(config, len(slots))
    lowest = cap if config["dsd_schedule"] is None or cap == 0 else 1
    if not lowest <= depth <= cap:
        return f"depth {depth} for a batch of {len(slots)}, outside the band's {lowest}..{cap}"
    cached = record["slots.num_cached_tokens"][slots].tolist()
    unaligned = [r for r, n in zip(requests, cached, strict=True) if n % config["scheduler"]["draft_block_size"]]
    want = depth if not unaligned else 0
    tokens = record["draft.tokens"]
    if tuple(tokens.shape) != (len(slots), depth):
        return f"draft.tokens has shape {tuple(tokens.shape)}, expected ({len(slots)}, {depth})"
    why = f"depth {depth}, {len(slots)} live request(s)" + (f", refused for request(s) {unaligned}' unaligned "
                                                            "restored prefix" if unaligned else "")
    for b, (req, slot) in enumerate(zip(requests, slots, strict=True)):
        got, sampled = _row_drafts(record, slot)
        if got != want:
            return f"request {req} (batch row {b}, slot {slot}) got {got} drafted token(s), expected {want} ({why})"
        row = tokens[b].tolist()
        if want and (row != sampled or not all(0 <= t < vocab for t in row)):
            return f"request {req} (batch row {b}) proposes {row}, but its sampling rows drew {sampled}"
        if not want and depth and any(t != -1 for t in row):
            return f"request {req} (batch row {b}) of a refused batch proposes {row}, expected no drafts (-1)"
    return None


def _judge_handoff(proposed: dict[int, list[int]], record: dict) -> str | None:
    """Each request verifies a prefix of the drafts it last proposed (a step that skipped it keeps them),
    as proposed; one that proposed none verifies none."""
    if "verify.num_drafts" not in record:
        return None
    starts, ids = record["target.query_start_loc"].tolist(), record["target.input_ids"].tolist()
    for b, (req, m) in enumerate(zip(record["batch.request"].tolist(), record["verify.num_drafts"].tolist(),
                                     strict=True)):
        verified, last = ids[starts[b] + 1:starts[b] + 1 + m], proposed.get(req, [])
        if verified != last[:m]:
            return f"request {req} (batch row {b}) verifies {m} draft(s) {verified}, but last proposed {last}"
    return None


def draft_findings(config: dict, records: list[dict]) -> list[Finding]:
    """Every step's verification against the drafts proposed before it, then its own drafting against its
    depth band and its batch."""
    found, vocab, proposed = [], config["model"]["vocab"], {}
    for step, record in enumerate(records):
        reason = _judge_handoff(proposed, record)
        if "idx_mapping" in record:
            reason = reason or _judge_step(config, record, vocab)
            if "draft.tokens" in record:
                proposed.update((req, [t for t in row if t >= 0]) for req, row in
                                zip(record["batch.request"].tolist(), record["draft.tokens"].tolist(), strict=True))
        if reason is not None:
            found.append(Finding("drafts", step, reason))
    return found


def first_finding(config: dict | None, records: list[dict]) -> Finding | None:
    """The earliest finding of either oracle (pool accounting first within a step)."""
    found = list(getattr(records, "findings", []))
    if config is not None:
        found += draft_findings(config, records)
    return min(found, key=lambda f: (f.step, ORACLES.index(f.oracle)), default=None)

