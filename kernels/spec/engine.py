"""A small but real spec-decode engine on the project's kernels: the whole step, replayable.

One ``Engine.step()`` runs, as the V2 model runner does (docs/contracts/engine.md,
docs/contracts/draft_inputs.md#layouts): schedule (admission with prefix-cache hits, chunked prefill, preemption),
free and assign request slots (``kernels.spec.slots``), gather block tables, compute slot mappings, the target
forward with KV writes and paged causal attention, verification, then the draft at the depth the scheduler
chose (DSD bands, adaptive depth; fix 7: 0 drafts nothing): draft-input preparation, the
prefix-cache shift of the draft block table, the draft forward with paged non-causal attention
over the visible context at the size its graph dispatch pads to (fixes 1 and 6 decide which
graphs exist and whether the draft may be captured), Gumbel draft sampling over every row of
the static sampling buffers, and the depth limit. Every buffer a CUDA graph would capture is
persistent and sized for ``max_num_reqs``, so padded rows hold what the kernels leave there.

``step()`` returns the step's record: every piece of metadata by name (``RECORD_FIELDS``), copied
to the CPU, which the stress harness compares with ``reference.spec.engine`` and digests
across TP ranks.

One deliberate difference from the upstream speculator: a batch refused for an unaligned
restored prefix (fix 4, fail closed) still writes its context rows into the draft KV. Upstream
returns before the context precompute, so the next drafts of the batch's other requests attend
to positions whose draft KV was never written.
"""

from typing import NamedTuple

import numpy as np
import torch

from kernels import block_table, draft_inputs, rejection, runtime, sampling
from kernels.spec import backends, depth, draft_graphs, graphs, scheduler, slots
from kernels.spec.graphs import Mode
from kernels.spec.models import Model, ModelConfig

PAD = -1
PREP_OUTPUTS = ("context_positions", "context_slot_mapping", "input_ids", "positions", "query_slot_mapping",
                "sample_indices", "sample_pos", "sample_idx_mapping", "query_start_loc", "seq_lens", "draft_tokens")
# Everything a step may record, in record order. Batch-row fields cover the B live rows; persistent
# buffers are recorded whole (their padded part included). Present only when the step has a batch:
# idx_mapping onwards; only at a depth above 0: draft.graph; only when the batch was drafted:
# draft.shifted_block_table .. draft.logits_cache (the cache, and verify.draft_logits, only with probabilistic
# drafting).
RECORD_FIELDS = (
    "slots.slot_of_request",  # [num requests]: slot of each request, -1 when it holds none
    "slots.free", "slots.seeds", "slots.temperature", "slots.num_cached_tokens",  # the free list; per-slot state
    "batch.request", "batch.num_tokens", "idx_mapping",  # per batch row: request number, tokens, slot
    "target.graph",  # the graph descriptor the target batch dispatches to (see _descriptor)
    "target.input_ids", "target.positions", "target.query_start_loc", "target.seq_lens", "target.block_table",
    "target.slot_mapping", "target.logits",  # logits [B, K+1, V] of the verified rows, NaN elsewhere
    "verify.draft_logits",  # [B, K, V] the cached draft logits each verified draft is tested against, NaN elsewhere
    "verify.out_tokens", "verify.num_sampled", "verify.num_rejected", "verify.num_drafts",
    "draft.block_table", "draft.graph", "draft.prepared", *(f"draft.{name}" for name in PREP_OUTPUTS),
    "draft.shifted_block_table", "draft.logits", "draft.sampled", "draft.logits_cache",
    "depth", "draft.tokens",  # the depth the drafts were proposed at, and those drafts
    "draft.kept",  # [B, depth]: the drafts each batch row keeps to verify, after every cut (-1 past them)
    "kv.guards_intact",  # no write landed in the guard blocks around a KV cache, nor in its null block
)


def _snap(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy for the record (``.cpu()`` of a CPU tensor would alias the live buffer). From a GPU it is
    taken in stream order into pinned memory without waiting (a step records about 25 fields, and each wait
    costs a GPU that several processes share a turn of their time slices): ``Engine._wait`` makes it readable."""
    return t.detach().to("cpu", copy=True, non_blocking=True)


def _descriptor(desc: graphs.BatchDescriptor) -> torch.Tensor:
    """A graph descriptor as int64 [mode (NONE 0, PIECEWISE 1, FULL 2), tokens, requests, uniform, max
    tokens per request], -1 for what it leaves open."""
    mode = (Mode.NONE, Mode.PIECEWISE, Mode.FULL).index(desc.mode)
    return torch.tensor([mode, desc.num_tokens, *(-1 if v is None else v for v in (desc.num_reqs, desc.uniform,
                                                                                   desc.max_req_tokens))])


def _table_width(max_len: int, block_size: int) -> int:
    return scheduler.ceil_div(max_len, block_size)


class Engine:
    """The engine over one workload. ``config`` and ``requests`` are plain data (see ``replay``)."""

    def __init__(self, config: dict, weights: dict, requests: list[dict], device: torch.device | None = None):
        self.device = device or runtime.device()
        self.k = config["num_spec_tokens"]
        self.anchor_first = config["anchor_first"]
        self.q = self.k if self.anchor_first else 1 + self.k
        self.model_config = ModelConfig.from_dict(config["model"])
        self.model = Model(self.model_config, weights, self.device, getattr(torch, config["dtype"]))
        sched = dict(config["scheduler"], num_query_per_req=self.q)
        self.sched_config = scheduler.SchedulerConfig.from_dict(sched)
        self.requests = [scheduler.Request(r["req_id"], i, r["arrival"], list(r["prompt"]), r["max_new_tokens"],
                                           r["temperature"], r["seed"]) for i, r in enumerate(requests)]
        self.scheduler = scheduler.Scheduler(self.sched_config, self.requests)
        c = self.sched_config
        self.slots = slots.RequestSlots(c.max_num_reqs, config["seed"])  # looked up now: a mutant applies
        self.probabilistic = config["draft_probabilistic"]
        self.schedule = config["dsd_schedule"]
        if self.schedule is not None:
            caps = depth.band_lookup(self.schedule, c.max_num_reqs, self.k)
            self.depth_controller = depth.BandAcceptanceLengthController(caps, config["adaptive_window"])
        self._select_graphs(config)
        self.step_index = 0
        self._allocate()
        self.graphs = None
        if config["cuda_graphs"]:
            self.graphs = draft_graphs.DraftGraphs(
                _GraphStep(self), capture_sizes=config["capture_sizes"], max_num_reqs=c.max_num_reqs,
                schedule=self.schedule, small_grid=config["small_grid"], capability_major=config["capability_major"])
            self.graphs.candidates = self.draft_candidates  # the engine's table: adaptive depths included
            if self.device.type == "cuda":
                self.graphs.capture()
                self._clear_buffers()  # capture ran on dummy inputs

    def _select_graphs(self, config: dict) -> None:
        """The draft's attention backend, picked as upstream does by capability and causality among the
        ones offered (all run on the project's paged attention here: the choice decides whether the
        draft step may be captured, fix 6), and the graph candidates of the draft and the target
        (fix 1: a DSD band of depth 0 gives no width). Both steps dispatch every batch; the draft runs
        at the dispatched padded size."""
        layers, cap = self.model_config.layers, config["capability_major"]
        self.new_tokens = 0 if self.anchor_first else 1
        self.draft_causal = [backends.dflash_layer_causal(layer, layers) for layer in range(layers)]
        self.non_causal = non_causal = backends.has_any_non_causal(layers)
        offered = config["draft_backends"]
        self.draft_backend = next((b for b in backends.backend_priorities(cap, non_causal) if b in offered),
                                  offered[0])
        self.draft_mode = backends.draft_graph_mode(self.draft_backend, cap, non_causal)
        shape = {"capture_sizes": config["capture_sizes"], "max_num_reqs": self.sched_config.max_num_reqs,
                 "max_spec_tokens": self.k, "schedule": self.schedule, "adaptive": self.schedule is not None,
                 "small_grid": config["small_grid"]}
        self.draft_candidates = graphs.build_candidates(decode_query_len=self.q, **shape)
        self.target_candidates = graphs.build_candidates(decode_query_len=1 + self.k, **shape)

    def _allocate(self) -> None:
        c, dev, s, k, q = self.sched_config, self.device, self.sched_config.max_num_reqs, self.k, self.q
        i32, i64 = torch.int32, torch.int64
        self.width_t = _table_width(c.max_model_len + k, c.target_block_size)
        self.width_d = _table_width(c.max_model_len + k + q, c.draft_block_size)
        self.host_table_t = np.zeros((s, self.width_t), dtype=np.int32)
        self.host_table_d = np.zeros((s, self.width_d), dtype=np.int32)
        self.table_t = torch.zeros(s, self.width_t, dtype=i32, device=dev)
        self.table_d = torch.zeros(s, self.width_d, dtype=i32, device=dev)
        self.batch_table_t = torch.zeros(s, self.width_t, dtype=i32, device=dev)
        self.batch_table_d = torch.zeros(s, self.width_d, dtype=i32, device=dev)
        tokens = c.max_num_batched_tokens
        self.slot_mapping_t = torch.zeros(tokens, dtype=i64, device=dev)
        self.caches_t = self.model.new_kv_caches(c.target_num_blocks, c.target_block_size)
        self.caches_d = self.model.new_kv_caches(c.draft_num_blocks, c.draft_block_size)
        self.temperature = torch.zeros(s, dtype=torch.float32, device=dev)
        self.seeds = torch.zeros(s, dtype=i64, device=dev)
        self.last_sampled = torch.zeros(s, dtype=i64, device=dev)
        self.next_prefill_tokens = torch.zeros(s, dtype=i32, device=dev)
        self.buffers = {  # the prep kernel's outputs
            "context_positions": torch.zeros(tokens, dtype=i64, device=dev),
            "context_slot_mapping": torch.zeros(tokens, dtype=i64, device=dev),
            "input_ids": torch.zeros(s * q, dtype=i32, device=dev),
            "positions": torch.zeros(s * q, dtype=i64, device=dev),
            "query_slot_mapping": torch.zeros(s * q, dtype=i64, device=dev),
            "sample_indices": torch.zeros(s * k, dtype=i64, device=dev),
            "sample_pos": torch.zeros(s * k, dtype=i64, device=dev),
            "sample_idx_mapping": torch.zeros(s * k, dtype=i32, device=dev),
            "query_start_loc": torch.zeros(s + 1, dtype=i32, device=dev),
            "seq_lens": torch.zeros(s, dtype=i32, device=dev),
            "draft_tokens": torch.zeros(s, k, dtype=i64, device=dev),
        }
        vocab = self.model_config.vocab
        self.logits_out = torch.zeros(s * k, vocab, dtype=torch.float32, device=dev)
        self.sampled_out = torch.zeros(s * k, dtype=i64, device=dev)
        self.cache_cols = {d: (torch.arange(s * k, device=dev) % d).to(i32) for d in range(1, k + 1)}
        self.draft_logits = torch.zeros(s, k, vocab, dtype=torch.float32, device=dev) if self.probabilistic else None
        self._clear_buffers()

    def _clear_buffers(self) -> None:
        """The static buffers' state before any step: zeros, every sampling row inert (fix 3)."""
        for t in (*self.buffers.values(), self.logits_out, self.sampled_out, self.batch_table_d):
            t.zero_()
        self.buffers["sample_idx_mapping"].fill_(-1)

    # ------------------------------------------------------------------ the step

    def step(self) -> dict:
        record: dict = {}
        plan = self.scheduler.schedule(self.step_index)
        self._poison_freed_draft_blocks()
        self._assign_slots(plan, record)
        batch = plan.batch
        record["batch.request"] = torch.tensor([r.index for r, _ in batch], dtype=torch.int64)
        record["batch.num_tokens"] = torch.tensor([n for _, n in batch], dtype=torch.int32)
        if batch:
            slot_ids = [self.slots.slot_of[r.req_id] for r, _ in batch]
            idx_mapping = self._upload(slot_ids, torch.int32)
            record["idx_mapping"] = _snap(idx_mapping)
            step_depth = self._depth(len(batch))  # chosen at schedule time, from what was observed so far
            target = self._target_step(batch, idx_mapping, record)
            verified = self._verify(batch, slot_ids, target, record)
            self._propose(batch, slot_ids, idx_mapping, target, verified, step_depth, record)
            if self.schedule is not None:
                self.depth_controller.observe(len(batch), *verified["acceptance"])
        record["kv.guards_intact"] = torch.tensor(self.model.guards_intact())
        self.scheduler.finish_step()
        self.step_index += 1
        self._wait()
        return record

    def _wait(self) -> None:
        """Wait for the device: the record's copies taken so far (``_snap``) are then readable."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _upload(self, data, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``data`` (a list or a numpy array) on the engine's device, without waiting (``runtime.upload``)."""
        return runtime.upload(data, self.device, dtype)

    def _set_rows(self, t: torch.Tensor, rows: list[int], values: list) -> None:
        """``t[rows[i]] = values[i]`` for distinct rows, without waiting for the device: one scalar written into
        a device tensor is a copy the host waits for."""
        if rows:
            t[self._upload(rows, torch.int64)] = self._upload(values, t.dtype)

    def _poison_freed_draft_blocks(self) -> None:
        """Freed draft blocks hold no valid KV any more; NaN makes a read of them show."""
        freed = self.scheduler.freed_draft_blocks
        if freed:
            index = self._upload(freed, torch.int64)
            for k_cache, v_cache in self.caches_d:
                k_cache.index_fill_(0, index, float("nan"))
                v_cache.index_fill_(0, index, float("nan"))
        self.scheduler.freed_draft_blocks = []

    def _assign_slots(self, plan, record) -> None:
        self.slots.release(plan.released)
        admitted, temperatures, seeds = [], [], []
        for req in plan.admitted:
            slot = self.slots.admit(req.req_id, req.num_cached, req.seed)
            admitted.append(slot)
            temperatures.append(req.temperature)
            seeds.append(int(self.slots.seeds[slot]))
        self._set_rows(self.temperature, admitted, temperatures)
        self._set_rows(self.seeds, admitted, seeds)
        for req, _ in plan.batch:
            slot = self.slots.slot_of[req.req_id]
            for host, blocks in ((self.host_table_t, req.target_blocks), (self.host_table_d, req.draft_blocks)):
                host[slot] = 0
                host[slot, :len(blocks)] = blocks
        self.table_t.copy_(runtime.host_copy(self.host_table_t, self.device), non_blocking=True)
        self.table_d.copy_(runtime.host_copy(self.host_table_d, self.device), non_blocking=True)
        slot_of = np.full(len(self.requests), -1, dtype=np.int64)
        for req in self.requests:
            slot_of[req.index] = self.slots.slot_of.get(req.req_id, -1)
        record["slots.slot_of_request"] = torch.from_numpy(slot_of)
        record["slots.free"] = torch.tensor(self.slots.free_slots, dtype=torch.int64)
        record["slots.seeds"] = torch.from_numpy(self.slots.seeds.copy())
        record["slots.temperature"] = _snap(self.temperature)  # what the samplers read, every slot
        record["slots.num_cached_tokens"] = torch.from_numpy(self.slots.num_cached_tokens.copy())

    def _target_step(self, batch, idx_mapping, record) -> dict:
        """Gather, slot mappings, the target forward with KV writes; returns what later stages need."""
        ids, positions, starts, seq_lens = [], [], [0], []
        for req, n in batch:
            first = req.num_computed
            ids += req.tokens[first:first + n] if req.prefilling else [req.tokens[-1]] + req.drafts
            positions += range(first, first + n)
            starts.append(starts[-1] + n)
            seq_lens.append(first + n)
        ids_t = self._upload(ids, torch.int64)
        positions_t = self._upload(positions, torch.int64)
        qsl = self._upload(starts, torch.int32)
        seq_lens_t = self._upload(seq_lens, torch.int32)
        num_rows = len(batch)
        # The target runs eagerly; which graph would run the batch is recorded (prefill never a FULL one).
        lengths = {n for _, n in batch}
        has_prefill = any(req.prefilling for req, _ in batch)
        record["target.graph"] = _descriptor(graphs.dispatch(
            self.target_candidates, num_rows, len(ids), lengths.pop() if len(lengths) == 1 else None, has_prefill))
        block_table.gather_block_tables(self.table_t, idx_mapping, self.batch_table_t)
        block_table.compute_slot_mappings(self.batch_table_t, qsl, positions_t, self.sched_config.target_block_size,
                                          self.slot_mapping_t)
        attn = {"block_table": self.batch_table_t[:num_rows], "seq_lens": seq_lens_t, "query_start_loc": qsl}
        hidden, aux = self.model.target_forward(ids_t, positions_t, self.slot_mapping_t, self.caches_t, attn)
        record["target.input_ids"] = _snap(ids_t)
        record["target.positions"] = _snap(positions_t)
        record["target.query_start_loc"] = _snap(qsl)
        record["target.seq_lens"] = _snap(seq_lens_t)
        record["target.block_table"] = _snap(self.batch_table_t[:num_rows])
        record["target.slot_mapping"] = _snap(self.slot_mapping_t)
        return {"hidden": hidden, "aux": aux, "positions": positions_t, "query_start_loc": qsl, "starts": starts}

    def _verify(self, batch, slot_ids, target, record) -> dict:
        """Verify each sampling request's drafts (one launch per draft count: the kernel's k is fixed).

        Decoding requests verify their drafts and take a bonus; a prefill chunk that ends its prompt
        samples its first token (0 drafts); a chunk that ends mid-prompt samples nothing.
        """
        num_rows, k, vocab, dev = len(batch), self.k, self.model_config.vocab, self.device
        out_tokens = torch.full((num_rows, k + 1), -1, dtype=torch.int64, device=dev)
        num_sampled = torch.zeros(num_rows, dtype=torch.int32, device=dev)
        num_rejected = torch.zeros(num_rows, dtype=torch.int32, device=dev)
        logits_record = torch.full((num_rows, k + 1, vocab), float("nan"), dtype=torch.float32, device=dev)
        q_record = torch.full((num_rows, k, vocab), float("nan"), dtype=torch.float32,
                              device=dev) if self.probabilistic else None
        groups: dict[int, list[int]] = {}
        for b, (req, n) in enumerate(batch):
            if not req.prefilling:
                groups.setdefault(n - 1, []).append(b)
            elif req.num_computed + n == len(req.tokens):
                groups.setdefault(0, []).append(b)
        starts = target["starts"]
        for num_drafts, rows in sorted(groups.items()):
            # rows of the hidden states verified: the last num_drafts + 1 of each request
            token_rows = self._upload([starts[b + 1] - num_drafts - 1 + i for b in rows for i in range(num_drafts + 1)],
                                      torch.int64)
            predicted = target["positions"][token_rows] + 1
            logits = self.model.logits(target["hidden"][token_rows], predicted).view(len(rows), num_drafts + 1, vocab)
            drafts = self._upload([batch[b][0].drafts for b in rows], torch.int64).view(len(rows), num_drafts)
            rows_t = self._upload(rows, torch.int64)
            group_out = torch.empty(len(rows), num_drafts + 1, dtype=torch.int64, device=dev)
            group_sampled = torch.empty(len(rows), dtype=torch.int32, device=dev)
            group_rejected = torch.empty(len(rows), dtype=torch.int32, device=dev)
            cached_q = self.draft_logits[:, :num_drafts] if self.probabilistic and num_drafts else None
            group_slots = self._upload([slot_ids[b] for b in rows], torch.int32)
            rejection.verify(logits, drafts, group_slots, self.temperature, self.seeds,
                             predicted.view(len(rows), -1)[:, 0].contiguous(), group_out, group_sampled,
                             group_rejected, draft_logits=cached_q)
            if cached_q is not None:  # the q rows the verification read: each row's slot's
                q_record[rows_t, :num_drafts] = cached_q[group_slots.long()]
            out_tokens[rows_t, :num_drafts + 1] = group_out
            num_sampled[rows_t] = group_sampled
            num_rejected[rows_t] = group_rejected
            logits_record[rows_t, :num_drafts + 1] = logits
        record["target.logits"] = _snap(logits_record)
        if q_record is not None:
            record["verify.draft_logits"] = _snap(q_record)
        record["verify.out_tokens"] = _snap(out_tokens)
        record["verify.num_sampled"] = _snap(num_sampled)
        record["verify.num_rejected"] = _snap(num_rejected)
        num_drafts = torch.zeros(num_rows, dtype=torch.int32)
        for d, rows in groups.items():
            num_drafts[rows] = d
        record["verify.num_drafts"] = num_drafts
        self._wait()
        sampled_host = record["verify.num_sampled"]
        drafting = [b for d, rows in groups.items() if d for b in rows]
        acceptance = (len(drafting), sum(len(batch[b][0].drafts) for b in drafting),
                      sum(int(sampled_host[b]) - 1 for b in drafting))
        self._advance(batch, slot_ids, record["verify.out_tokens"], sampled_host)
        return {"num_sampled": num_sampled, "num_rejected": num_rejected, "acceptance": acceptance}

    def _advance(self, batch, slot_ids, out_tokens, num_sampled) -> None:
        """Host bookkeeping after verification: computed counts, emitted tokens, finished requests."""
        max_len = self.sched_config.max_model_len
        sampled_slots, last_sampled, prefill_slots, next_prefill = [], [], [], []
        for b, (req, n) in enumerate(batch):
            emitted = out_tokens[b, :int(num_sampled[b])].tolist()
            req.num_computed += len(emitted) if not req.prefilling else n
            req.tokens += emitted
            if emitted:
                sampled_slots.append(slot_ids[b])
                last_sampled.append(emitted[-1])
            elif req.num_computed < len(req.tokens):
                prefill_slots.append(slot_ids[b])
                next_prefill.append(req.tokens[req.num_computed])
            limit = min(len(req.prompt) + req.max_new_tokens, max_len)
            if len(req.tokens) >= limit:
                del req.tokens[limit:]
                req.num_computed = min(req.num_computed, limit)
                req.finished = True
            req.drafts = []
        self._set_rows(self.last_sampled, sampled_slots, last_sampled)
        self._set_rows(self.next_prefill_tokens, prefill_slots, next_prefill)

    def _propose(self, batch, slot_ids, idx_mapping, target, verified, step_depth, record) -> None:
        """The draft step at the step's depth (0: nothing drafted, but the context KV is still stored):
        inputs, context KV, shift, draft forward at the dispatched size, sampling, depth limit. With
        CUDA graphs it runs through ``DraftGraphs`` (replayed on the GPU, eagerly elsewhere)."""
        num_rows, k, c = len(batch), self.k, self.sched_config
        buf = self.buffers
        block_table.gather_block_tables(self.table_d, idx_mapping, self.batch_table_d)
        record["draft.block_table"] = _snap(self.batch_table_d[:num_rows])
        step = _StepInputs(idx_mapping, self._upload(self.slots.num_cached_tokens), target,
                           verified, record)
        prepared = False
        if step_depth == 0:
            self.prepare(step_depth, step)
        elif self.graphs is not None:
            record["draft.graph"] = _descriptor(self.graphs.descriptor_for(num_rows, step_depth))
            prepared = self.graphs.run(num_draft_tokens=step_depth, idx_mapping=idx_mapping, step=step).hidden \
                is not None
        else:
            q = step_depth + self.new_tokens
            desc = graphs.BatchDescriptor(Mode.NONE, num_rows * q)  # the draft has no piecewise split
            if self.draft_mode is Mode.FULL:
                found = graphs.dispatch(self.draft_candidates, num_rows, num_rows * q, q)
                desc = found if found.mode is Mode.FULL else desc
            record["draft.graph"] = _descriptor(desc)
            prepared = self.prepare(step_depth, step)
            if prepared:
                padded = desc.num_reqs if desc.mode is Mode.FULL else num_rows
                self.sample(self.logits(self.backbone(padded, step_depth)), step_depth)
        if prepared:
            record["draft.logits"] = _snap(self.logits_out)
            record["draft.sampled"] = _snap(self.sampled_out)
            if self.probabilistic:
                record["draft.logits_cache"] = _snap(self.draft_logits)
        drafts = depth.limit_draft_tokens(buf["draft_tokens"][:num_rows, :step_depth], step_depth, k)
        record["depth"] = torch.tensor(step_depth, dtype=torch.int64)
        record["draft.tokens"] = _snap(drafts)
        self._wait()
        kept = torch.full((num_rows, step_depth), PAD, dtype=torch.int64)
        for b, ((req, _), row) in enumerate(zip(batch, record["draft.tokens"].tolist(), strict=True)):
            if not req.prefilling and not req.finished:
                room = c.max_model_len - len(req.tokens)
                req.drafts = [t for t in row if t >= 0][:room]
            kept[b, :len(req.drafts)] = torch.tensor(req.drafts, dtype=torch.int64)
        record["draft.kept"] = kept  # what the step finally hands on: the length limit's cut applied

    # -------------------------------------------- the draft step's parts (DraftGraphs drives them too)

    def prepare(self, step_depth: int, step: "_StepInputs") -> bool:
        """Eager, before the draft forward: draft inputs over the whole static buffers (refused for an
        unaligned restored prefix, fix 4), the batch's context KV (stored whatever the outcome), and the
        shift of the draft block table by the restored blocks. False when nothing is to be drafted."""
        c, buf, record, target = self.sched_config, self.buffers, step.record, step.target
        num_rows, positions = step.idx_mapping.numel(), target["positions"]
        prepared = step_depth > 0 and draft_inputs.prepare_draft_inputs(
            idx_mapping=step.idx_mapping, target_query_start_loc=target["query_start_loc"],
            target_positions=positions, num_sampled=step.verified["num_sampled"],
            num_rejected=step.verified["num_rejected"], last_sampled=self.last_sampled,
            next_prefill_tokens=self.next_prefill_tokens, num_cached_tokens=step.num_cached,
            block_table=self.batch_table_d, block_size=c.draft_block_size, num_draft_tokens=step_depth,
            anchor_first=self.anchor_first, mask_token_id=self.model_config.mask_token_id,
            max_model_len=c.max_model_len, **dict(buf, draft_tokens=buf["draft_tokens"][:, :step_depth]))
        if not prepared:
            self._context_rows(target, step.verified["num_rejected"])
        num_tokens = positions.numel()
        self.model.write_context_kv(target["aux"], buf["context_positions"][:num_tokens],
                                    buf["context_slot_mapping"][:num_tokens], self.caches_d)
        record["draft.prepared"] = torch.tensor(prepared)
        for name in PREP_OUTPUTS:
            record[f"draft.{name}"] = _snap(buf[name])
        if prepared:
            block_table.shift_block_table_rows(self.batch_table_d, step.idx_mapping, step.num_cached,
                                               buf["seq_lens"], c.draft_block_size)
            record["draft.shifted_block_table"] = _snap(self.batch_table_d[:num_rows])
        return prepared

    def backbone(self, padded: int, step_depth: int) -> torch.Tensor:
        """The draft forward over ``padded`` batch rows' query blocks (padded rows are inert: no queries,
        seq_len 0). Reads every per-step value from the static buffers: a graph can hold it."""
        buf, rows = self.buffers, padded * (step_depth + self.new_tokens)
        attn = {"block_table": self.batch_table_d[:padded], "seq_lens": buf["seq_lens"][:padded],
                "query_start_loc": buf["query_start_loc"][:padded + 1]}
        return self.model.draft_forward(buf["input_ids"][:rows], buf["positions"][:rows],
                                        buf["query_slot_mapping"][:rows], self.caches_d, attn, self.draft_causal)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of every row of the static sampling buffer (padded rows read query row 0)."""
        return self.model.logits(hidden[self.buffers["sample_indices"]], self.buffers["sample_pos"])

    def sample(self, logits: torch.Tensor, step_depth: int) -> None:
        """Gumbel-sample every sampling row into ``draft_tokens[:, :depth]`` (inert rows write no logits
        cache), keeping the logits and tokens in static buffers for the record."""
        buf, num_slots = self.buffers, self.sched_config.max_num_reqs
        cache = {"logits_cache": self.draft_logits, "cache_cols": self.cache_cols[step_depth]} \
            if self.probabilistic else {}
        sampled = sampling.gumbel_sample(logits, buf["sample_idx_mapping"], self.temperature, self.seeds,
                                         buf["sample_pos"], draft=True, **cache)
        buf["draft_tokens"][:, :step_depth].copy_(sampled[:num_slots * step_depth].view(num_slots, step_depth))
        self.logits_out.copy_(logits)
        self.sampled_out.copy_(sampled)

    def _context_rows(self, target, num_rejected) -> None:
        """Context rows when the prep kernel did not run (depth 0) or refused the batch, as it would have
        written them: valid rows at their position and slot, the rejected suffix at position 0 / PAD,
        everything past at 0 / PAD."""
        buf, qsl, positions = self.buffers, target["query_start_loc"], target["positions"]
        starts = qsl.long()
        row_of_token = torch.repeat_interleave(torch.arange(starts.numel() - 1, device=self.device),
                                               starts[1:] - starts[:-1], output_size=positions.numel())
        valid = torch.arange(positions.numel(), device=self.device) < (starts[1:] - num_rejected.long())[row_of_token]
        buf["context_positions"].zero_()
        buf["context_positions"][:positions.numel()] = torch.where(valid, positions, 0)
        block_table.compute_slot_mappings(self.batch_table_d, qsl, torch.where(valid, positions, -1),
                                          self.sched_config.draft_block_size, buf["context_slot_mapping"])

    def _depth(self, num_rows: int) -> int:
        """The depth the scheduler chose for this step's drafts (fix 7: 0 stays 0)."""
        if self.schedule is None:
            return depth.resolve_num_spec_tokens(None, self.k)
        return depth.resolve_num_spec_tokens(self.depth_controller.depth_for(num_rows), self.k)


class _StepInputs(NamedTuple):
    """What one step's draft preparation needs."""

    idx_mapping: torch.Tensor
    num_cached: torch.Tensor
    target: dict
    verified: dict
    record: dict


class _DraftShape(NamedTuple):
    """The draft's shape as ``DraftGraphs`` reads it (``kernels.spec.draft_step.DraftConfig``'s terms)."""

    max_draft_tokens: int
    new_tokens: int  # the DFlash bonus row (1), none in anchor-first mode
    causal: bool

    @property
    def max_query_len(self) -> int:
        return self.max_draft_tokens + self.new_tokens

    def query_len(self, num_draft_tokens: int) -> int:
        return num_draft_tokens + self.new_tokens


class _Backend(NamedTuple):
    """The selected backend's name; nothing to plan: the engine's paged attention reads every per-step
    value from the static device buffers."""

    name: str

    def plan(self, metadata) -> None:
        return None


class _GraphStep:
    """The engine's draft step in the shape ``kernels.spec.draft_graphs.DraftGraphs`` captures and drives:
    preparation eagerly, then backbone, logits and sampling over the static buffers."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.device, self.max_num_reqs = engine.device, engine.sched_config.max_num_reqs
        self.config = _DraftShape(engine.k, engine.new_tokens, not engine.non_causal)
        self.backend = _Backend(engine.draft_backend)
        self.buffers = _DraftTokens(engine.buffers["draft_tokens"])

    def metadata(self, num_reqs: int) -> None:
        return None

    def prepare(self, *, num_reqs: int, num_draft_tokens: int, idx_mapping, step: _StepInputs) -> bool:
        return self.engine.prepare(num_draft_tokens, step)

    def reset_for_capture(self, num_reqs: int, num_draft_tokens: int) -> None:
        """Dummy inputs for a capture, whose warm-up really runs: bare query blocks over the null block,
        no KV write, every sampling row inert (docs/contracts/draft_inputs.md#padding)."""
        buf, q = self.engine.buffers, self.config.query_len(num_draft_tokens)
        self.engine._clear_buffers()
        buf["query_slot_mapping"].fill_(-1)
        buf["query_start_loc"][:num_reqs + 1].copy_(torch.arange(0, (num_reqs + 1) * q, q))
        buf["seq_lens"][:num_reqs] = q

    def backbone(self, num_reqs: int, num_draft_tokens: int) -> torch.Tensor:
        return self.engine.backbone(num_reqs, num_draft_tokens)

    def logits(self, hidden: torch.Tensor, num_reqs: int, num_draft_tokens: int) -> torch.Tensor:
        return self.engine.logits(hidden)

    def sample(self, logits: torch.Tensor, num_reqs: int, num_draft_tokens: int) -> None:
        self.engine.sample(logits, num_draft_tokens)


class _DraftTokens(NamedTuple):
    draft_tokens: torch.Tensor


def replay(config: dict, weights: dict, requests: list[dict], num_steps: int) -> list[dict]:
    """Run ``num_steps`` steps of the workload; the records, one per step."""
    engine = Engine(config, weights, requests)
    return [engine.step() for _ in range(num_steps)]
