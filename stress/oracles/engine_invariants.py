"""Invariants of the engine's step, judged apart from the reference engine: from the scheduler's raw pool
state and the step's own inputs, never through the production host code that keeps the count.

The lockstep comparison (``stress.oracles.engine``) sees a slip only where a workload makes the engine
and the reference engine disagree in a recorded field. Two kinds escape it:

* ``accounting``: the free count a block pool reports. Off by one per cached hit, it decides nothing
  until an admission is tight to that one block; here every count the pools report or hold is
  compared, at every call and after every schedule and step, with the blocks no running request holds.
  So is the prefix cache: a block a running request computed itself and holds under a key must be a
  full block of its computed tokens, under the chain key of its tokens up to the block's end
  (recomputed here from the tokens). A partial block under a full block's key is restored only if another
  request looks that key up before the block fills, which few workloads arrange. And a draft block no running
  request held after one schedule is poisoned (all NaN) by the next: a correct step never reads a freed block,
  so a freed block left unpoisoned changes no record until another slip reads it.
* ``drafts``: every batch row of a step at depth d > 0 whose restored prefixes are block-aligned gets
  exactly d sampling rows of its slot and d drafted tokens, of which the request later verifies a
  prefix, as drafted; at depth 0, or in a refused batch, none. The depth itself must lie in the DSD
  band of the batch size.
  What the step finally hands on (``draft.kept``) is each decoding row's drafts cut to the room left
  before its length limit, nothing for a row still prefilling or finished.
* ``kv``: every target KV slot a step reads holds its request's token at that position
  (``stress.engine_history``, rebuilt from the records and the workload).
* ``graphs``: on a GPU, where the engine captures its draft graphs, every drafted step dispatched to a
  FULL descriptor replays the captured graph. An engine that never captures, or captures the wrong
  shapes, drafts the same tokens eagerly: no recorded field shows it, only the lost replay.

Each is its own oracle (``fail:accounting``, ``fail:drafts``, ``fail:kv``, ``fail:graphs``), with a planted
bug in ``stress.checks``.
"""

import hashlib
from collections import Counter
from typing import NamedTuple

import numpy as np
import torch

from kernels import runtime
from stress.oracles import engine_history
from stress.oracles.graph_replay import silent_fallback

ORACLES = ("accounting", "drafts", "kv", "graphs")


class Finding(NamedTuple):
    oracle: str  # one of ORACLES
    step: int
    reason: str  # one line


class Records(list):
    """The engine's step records, with what the pool audit found while they were made."""

    findings: list[Finding]


def chain_keys(tokens: list[int], block_size: int, num_blocks: int) -> list[bytes]:
    """The prefix cache's key of each of the first ``num_blocks`` full blocks of ``tokens``, as its contract
    documents it (docs/contracts/engine.md): a 16-byte BLAKE2b of the key before it and the block's tokens as
    int64s. Restated here so that the audit never asks the pool it judges."""
    keys, key = [], b""
    for i in range(num_blocks):
        chunk = np.asarray(tokens[i * block_size:(i + 1) * block_size], dtype=np.int64).tobytes()
        key = hashlib.blake2b(key + chunk, digest_size=16).digest()
        keys.append(key)
    return keys


class PoolAudit:
    """Wraps one scheduler's pools (on the instance only): each count the target pool reports for an
    admission, and both pools' free queues after every schedule and step, against the blocks its
    running requests hold; with ``draft_caches`` (the engine's draft KV, (k, v) per layer), that the draft blocks no
    running request held after the last schedule are poisoned. Findings go to ``findings``; the engine's behaviour
    is unchanged."""

    def __init__(self, scheduler, draft_caches=()):
        self.scheduler, self.step, self.findings = scheduler, 0, []
        self.draft_caches, self._draft_unheld = draft_caches, None
        pool = scheduler.target_pool
        reported, schedule, finish = pool.num_free_after_touch, scheduler.schedule, scheduler.finish_step

        def num_free_after_touch(hits):
            count = reported(hits)
            self._judge_touch(hits, count)
            return count

        def audited_schedule(step):
            plan = schedule(step)
            self._judge_poisoned()
            self._judge_pools("after scheduling")
            self._draft_unheld = self._unheld("draft")
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

    def _judge_poisoned(self) -> None:
        """Before the step writes: every draft block unheld since the last schedule holds NaN only (the blocks
        freed then were poisoned since, and a step writes only blocks its requests hold)."""
        if not self._draft_unheld or not self.draft_caches:
            return
        blocks = sorted(self._draft_unheld)
        index = runtime.upload(blocks, self.draft_caches[0][0].device, torch.int64)
        # [cache, block]: one wait for the device over every cache, K and V of each layer in turn
        written = torch.stack([~cache[index].isnan().flatten(1).all(1) for pair in self.draft_caches for cache in pair])
        if bool(written.any()):
            first = written[int(written.any(1).nonzero()[0])]  # the first cache that holds one
            block = blocks[int(first.nonzero()[0])]
            self._report(f"draft pool after scheduling: block {block}, held by no running request since the "
                         f"last schedule, holds KV that is not poisoned (NaN) ({int(first.sum())} such "
                         "block(s)): a freed draft block was never poisoned")

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
            return
        if (reason := self._cache_error()) is not None:
            self._report(f"prefix cache {when}: {reason}")

    def _cache_error(self) -> str | None:
        """The first block a running request computed itself (past what it restored) that is cached (the block's
        own entry) without being full under its chain key. The blocks a lookup restored are the ``kv`` oracle's:
        a stale entry shows there as a read of other KV."""
        pool = self.scheduler.target_pool
        key_of, bs = pool.key_of, pool.block_size
        for req in self.scheduler.running:
            keys = chain_keys(req.tokens, bs, min(len(req.target_blocks), req.num_computed // bs))
            for i, block in enumerate(req.target_blocks):
                if i < req.num_cached // bs or (key := key_of.get(block)) is None:
                    continue
                where = f"block {block} is cached, but request {req.index} holds it as its block {i}"
                if i >= len(keys):
                    computed = min(max(req.num_computed - i * bs, 0), bs)
                    return f"{where} with {computed} of its {bs} tokens computed (a partial block under a full key)"
                if key != keys[i]:
                    return f"{where} under a key other than the chain of its tokens 0..{(i + 1) * bs - 1}"
        return None


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


def _judge_kept(config: dict, record: dict, tokens: engine_history.Tokens) -> str | None:
    """Each row that decodes next (at most one token of it left uncomputed: its KV is valid through its
    sequence less what verification rejected) and is not finished keeps its drafts cut to the room before
    its length limit; any other row keeps none."""
    max_len = config["scheduler"]["max_model_len"]
    computed = (record["target.seq_lens"].long() - record["verify.num_rejected"].long()).tolist()
    kept = record.get("draft.kept")
    if kept is None or kept.shape != record["draft.tokens"].shape:
        return f"draft.kept is {None if kept is None else tuple(kept.shape)}, expected the shape of draft.tokens"
    for b, (req, row) in enumerate(zip(record["batch.request"].tolist(), record["draft.tokens"].tolist(),
                                       strict=True)):
        decodes = len(tokens.of[req]) - computed[b] <= 1 and not tokens.finished(req)
        want = [t for t in row if t >= 0][:max_len - len(tokens.of[req])] if decodes else []
        got = [t for t in kept[b].tolist() if t >= 0]
        if got != want:
            return (f"request {req} (batch row {b}, {len(tokens.of[req])} of at most {max_len} tokens) keeps drafts "
                    f"{got}, expected {want}")
    return None


def draft_findings(config: dict, records: list[dict], requests: list[dict] | None = None) -> list[Finding]:
    """Every step's verification against the drafts proposed before it, then its own drafting against its
    depth band and its batch; with the workload's ``requests``, also the drafts each row keeps."""
    found, vocab, proposed = [], config["model"]["vocab"], {}
    tokens = engine_history.Tokens(config, requests) if requests is not None else None
    for step, record in enumerate(records):
        reason = _judge_handoff(proposed, record)
        if "idx_mapping" in record:
            reason = reason or _judge_step(config, record, vocab)
            if tokens is not None:
                tokens.emit(record)
                reason = reason or _judge_kept(config, record, tokens)
            if "draft.tokens" in record:
                proposed.update((req, [t for t in row if t >= 0]) for req, row in
                                zip(record["batch.request"].tolist(), record["draft.tokens"].tolist(), strict=True))
        if reason is not None:
            found.append(Finding("drafts", step, reason))
    return found


def first_finding(config: dict | None, records: list[dict], requests: list[dict] | None = None) -> Finding | None:
    """The earliest finding of any oracle (in ``ORACLES`` order within a step); the ``kv`` oracle and the kept
    drafts need the workload's ``requests``."""
    found = list(getattr(records, "findings", []))
    if config is not None:
        found += draft_findings(config, records, requests)
    if config is not None and requests is not None and (bad := engine_history.first_bad_read(config, requests,
                                                                                             records)):
        found.append(Finding("kv", *bad))
    return min(found, key=lambda f: (f.step, ORACLES.index(f.oracle)), default=None)

