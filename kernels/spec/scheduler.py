"""The engine's scheduler: admission with a block-hash prefix cache, chunked prefill under a token
budget, preemption under block pressure and resume, and the per-request bookkeeping.

Two KV groups, each with its own block pool and block size. The target group shares full blocks
between requests through the prefix cache; the draft group (the DFlash draft's KV) is never
restored from a cache: a request gets fresh draft blocks for every position, restored ones
included, so the draft KV of a restored prefix was never written (docs/fixes.md#fix-4) and must stay
out of the draft's sight. Block id 0 is the null block and is never handed out.

The policy, which ``reference.spec.scheduler`` restates independently:
* Free queue: allocation pops from the front; a request's blocks are freed in reverse order
  to the back. A freed target block keeps its hash until it is popped again, so a later
  prefix hit can take it back out of the queue.
* Prefix cache: block i of a request is keyed by the chain of its full blocks' tokens. After
  every step each full computed block is offered to the cache and entered unless its prefix or
  the block is there already. A lookup stops at the first miss and never covers the last token
  (it must be recomputed to get logits).
* A step: running requests first, in admission order; a decode schedules its bonus token and
  drafts, a prefill the next chunk, within the token budget. When a pool cannot cover a
  request, the last running request is preempted (blocks freed, progress lost, back to the
  front of the queue) until it can; no request is admitted in a step that preempted. Then
  waiting requests are admitted in order while a slot, budget and blocks allow.
* Blocks cover every scheduled token (target) and every position the draft's query block can
  reach (draft: scheduled tokens + Q lookahead).
"""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Request:
    """One request of the workload and its progress."""

    req_id: str
    index: int  # position in the workload, the request's stable number in step records
    arrival: int  # step at which it joins the waiting queue
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    seed: int | None
    tokens: list[int] = field(default_factory=list)  # prompt + outputs
    num_computed: int = 0  # tokens whose KV is valid in the target cache
    num_cached: int = 0  # tokens restored at the last (re)admission
    drafts: list[int] = field(default_factory=list)  # to verify next step
    target_blocks: list[int] = field(default_factory=list)
    draft_blocks: list[int] = field(default_factory=list)
    block_keys: list[bytes] = field(default_factory=list)  # chain keys of its full computed blocks
    finished: bool = False

    def __post_init__(self):
        self.tokens = list(self.prompt)

    @property
    def num_outputs(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def prefilling(self) -> bool:
        """More than the last token still needs computing (prompt chunks, or a resume's recompute)."""
        return len(self.tokens) - self.num_computed > 1


class BlockPool:
    """Free queue of block ids 1..num_blocks-1 (0 is the null block)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks: need the null block and at least one more, got {num_blocks}")
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise ValueError(f"allocate: {n} blocks asked, {len(self.free)} free")
        return [self._pop() for _ in range(n)]

    def _pop(self) -> int:
        block, _ = self.free.popitem(last=False)
        return block

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.free[block] = None


class PrefixCachingPool(BlockPool):
    """A block pool whose full blocks are shared through a hash of their token chain."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks)
        self.block_size = block_size
        self.refs = np.zeros(num_blocks, dtype=np.int64)
        self.key_of: dict[int, bytes] = {}
        self.block_of: dict[bytes, int] = {}

    def block_keys(self, tokens: list[int], num_blocks: int, known: list[bytes] = ()) -> list[bytes]:
        """Chain keys of the first ``num_blocks`` full blocks of ``tokens``, extending ``known``."""
        keys, bs = list(known[:num_blocks]), self.block_size
        for i in range(len(keys), num_blocks):
            chunk = np.asarray(tokens[i * bs:(i + 1) * bs], dtype=np.int64).tobytes()
            keys.append(hashlib.blake2b((keys[-1] if keys else b"") + chunk, digest_size=16).digest())
        return keys

    def lookup(self, tokens: list[int]) -> list[int]:
        """Cached blocks covering the longest full-block prefix of ``tokens[:-1]``."""
        hits = []
        for key in self.block_keys(tokens, (len(tokens) - 1) // self.block_size):
            block = self.block_of.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_free_after_touch(self, hits: list[int]) -> int:
        return len(self.free) - sum(1 for b in hits if self.refs[b] == 0)

    def touch(self, hits: list[int]) -> None:
        for block in hits:
            if self.refs[block] == 0:
                del self.free[block]
            self.refs[block] += 1

    def _pop(self) -> int:
        block = super()._pop()
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.block_of[key]  # evicted: its content is about to be overwritten
        self.refs[block] = 1
        return block

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None

    def register(self, req: Request) -> None:
        """Offer every full computed block of the request to the prefix cache; one is entered unless its
        prefix or the block is cached already (so a block skipped as a duplicate is entered once the
        other copy is evicted)."""
        full = min(req.num_computed // self.block_size, len(req.target_blocks))
        req.block_keys = self.block_keys(req.tokens, full, req.block_keys)
        for key, block in zip(req.block_keys, req.target_blocks, strict=False):
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key] = block
                self.key_of[block] = key


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_reqs: int
    max_num_batched_tokens: int
    target_block_size: int
    target_num_blocks: int
    draft_block_size: int
    draft_num_blocks: int
    num_query_per_req: int  # Q of the draft layout: the draft's lookahead
    max_model_len: int

    @classmethod
    def from_dict(cls, d: dict) -> "SchedulerConfig":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass
class ScheduledStep:
    """What one step runs: (request, number of tokens) per batch row, and the slot changes."""

    batch: list[tuple[Request, int]]
    admitted: list[Request]
    released: set[str]  # finished last step or preempted now: their slots are freed, in sorted order


class Scheduler:
    def __init__(self, config: SchedulerConfig, requests: list[Request]):
        self.config = config
        self.pending = sorted(requests, key=lambda r: (r.arrival, r.index))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished_ids: set[str] = set()
        self.target_pool = PrefixCachingPool(config.target_num_blocks, config.target_block_size)
        self.draft_pool = BlockPool(config.draft_num_blocks)
        self.freed_draft_blocks: list[int] = []  # since the last step: the engine poisons them

    def _blocks_needed(self, req: Request, num_tokens: int) -> tuple[int, int]:
        c = self.config
        target = ceil_div(num_tokens, c.target_block_size) - len(req.target_blocks)
        draft = ceil_div(num_tokens + c.num_query_per_req, c.draft_block_size) - len(req.draft_blocks)
        return max(target, 0), max(draft, 0)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        target, draft = self._blocks_needed(req, num_tokens)
        if target > self.target_pool.num_free() or draft > self.draft_pool.num_free():
            return False
        req.target_blocks += self.target_pool.allocate(target)
        req.draft_blocks += self.draft_pool.allocate(draft)
        return True

    def _free_blocks(self, req: Request) -> None:
        self.target_pool.release(req.target_blocks)
        self.draft_pool.release(req.draft_blocks)
        self.freed_draft_blocks += req.draft_blocks
        req.target_blocks, req.draft_blocks = [], []

    def _preempt(self, req: Request) -> None:
        self._free_blocks(req)
        req.num_computed, req.drafts = 0, []
        self.waiting.insert(0, req)

    def schedule(self, step: int) -> ScheduledStep:
        while self.pending and self.pending[0].arrival <= step:
            self.waiting.append(self.pending.pop(0))
        released, self.finished_ids = self.finished_ids, set()
        budget = self.config.max_num_batched_tokens
        batch, preempted = [], False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            need = len(req.tokens) - req.num_computed + (0 if req.prefilling else len(req.drafts))
            n = min(need, budget)
            while not self._grow(req, req.num_computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                released.add(victim.req_id)
                preempted = True
                if victim is req:
                    break
            if req not in self.running:
                break
            if not req.prefilling:
                req.drafts = req.drafts[:n - 1]  # drafts that did not fit the budget are dropped
            batch.append((req, n))
            budget -= n
            i += 1
        admitted = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_reqs:
            req = self.waiting[0]
            hits = self.target_pool.lookup(req.tokens)
            cached = len(hits) * self.config.target_block_size
            n = min(len(req.tokens) - cached, budget)
            target, draft = self._blocks_needed(req, cached + n)
            target -= len(hits)
            if target > self.target_pool.num_free_after_touch(hits) or draft > self.draft_pool.num_free():
                break
            self.target_pool.touch(hits)
            req.target_blocks = hits + self.target_pool.allocate(target)
            req.draft_blocks = self.draft_pool.allocate(draft)
            req.num_computed = req.num_cached = cached
            self.waiting.pop(0)
            self.running.append(req)
            admitted.append(req)
            batch.append((req, n))
            budget -= n
        # Batch order: decodes first, then prefill chunks, each in admission order.
        batch.sort(key=lambda item: item[0].prefilling)
        return ScheduledStep(batch, admitted, released)

    def finish_step(self) -> None:
        """After a step's tokens are recorded: register full blocks, retire finished requests."""
        for req in list(self.running):
            self.target_pool.register(req)
            if req.finished:
                self.running.remove(req)
                self._free_blocks(req)
                self.finished_ids.add(req.req_id)
