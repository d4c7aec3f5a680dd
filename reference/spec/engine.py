"""Reference engine: the algorithm of ``kernels.spec.engine`` from the references alone.

float64 throughout; one contiguous target KV and one contiguous draft KV per request (indexed by
position, NaN where nothing was written); no paging for attention, no graphs, no padding in the
forward passes. Block tables, slot mappings and draft inputs are still produced, from the
reference scheduler and ``reference.block_table`` / ``reference.draft_inputs``, because the
engine's records hold them and they must match.

What the draft may see follows the fix-4 rule stated plainly: the draft KV of a request holds
only what was written since its last (re)admission, and its query block attends to the
positions from its restored count on. The target KV of a restored prefix is recomputed at
admission (it is a function of the prefix's tokens alone), as the cache would have restored it.

Floats are compared, and sampling decisions judged, against the engine's error as the reference
bounds it (``HIDDEN_ERROR``, ``reference.spec.models.LogitError``): where a decision could go
either way, it is a near tie. With ``follow`` (the engine's records) the
reference then takes the engine's decision and carries on, so one undecidable token does not
end the comparison; the steps where it did are listed in the result.
"""

from typing import NamedTuple

import torch

from reference import block_table, draft_inputs, philox
from reference.rejection import CLAMP, residual_or_target
from reference.sampling import DRAFT_NOISE_SALT, EPS, argmax_decided, gumbel_noise, scaled
from reference.spec import backends, depth, graphs, slots
from reference.spec.models import LogitError, Model
from reference.spec.scheduler import Scheduler, prefilling

PAD = -1
PREP_OUTPUTS = draft_inputs.OUTPUTS
# Relative error of the engine's hidden states, element by element, by its dtype (see
# ``reference.spec.models.LogitError``): it bounds every float the engine records and every
# difference of logits a decision rests on.
HIDDEN_ERROR = {"float32": 2e-6, "bfloat16": 3e-2}
ROUNDING = 2.0**-14  # float32 softmax rounding, relative (as reference.rejection)


class Trace(NamedTuple):
    records: list[dict]
    tolerances: list[dict]  # per step: float field -> bound on |engine - reference|, element by element
    followed: list[tuple[int, str, int]]  # (step, field, index) where the engine's near-tie decision was taken
    near_ties: list[tuple[int, str, int]]  # every near-tie decision, followed or not


class Row(NamedTuple):
    """One logits row and what bounds the engine's error in it."""

    logits: torch.Tensor  # [V] float64
    error: LogitError
    index: int  # the row of ``error``


def _pairs(row: Row, tokens: torch.Tensor, of: torch.Tensor | None = None) -> torch.Tensor:
    return row.error.pairs(row.index, tokens, of)


def _decided(scores: torch.Tensor, row: Row, scale: float, slack: torch.Tensor | float = 0.0) -> tuple[int, bool]:
    """The first maximal score, and whether a rival is within the engine's error of the difference
    (``scale`` converts logit errors to score errors; ``slack`` adds per-token rounding)."""
    values = scores.nan_to_num(nan=float("-inf"))
    best = int(torch.argmax(values))
    if not torch.isfinite(values[best]):
        return best, False
    spread = 2 * float(row.error.bound()[row.index].max()) * scale + 1e-6
    near = torch.nonzero(values >= values[best] - spread).flatten()
    if near.numel() == 1:
        return best, False
    slack_near = slack[near] if isinstance(slack, torch.Tensor) else slack
    # the error of values[best] - values[t] for each near t: best's row of the pairs, not all of them
    allowed = _pairs(row, near, of=torch.tensor([best]))[0] * scale + slack_near
    rivals = (values[best] - values[near] <= allowed) & (near != best)
    return best, bool(rivals.any())


def _probs(row: Row, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 probabilities of the clamped scaled row, and per token a bound on the engine's relative
    error in it: log p_v moves by at most the p-weighted mean of the error of logit[v] - logit[u]."""
    c = scaled(row.logits, temp).nan_to_num(nan=-CLAMP).clamp(-CLAMP, CLAMP)
    p = torch.softmax(c, dim=0)
    rel = torch.full_like(p, ROUNDING)
    support = torch.nonzero(p > 1e-12).flatten()
    if support.numel():
        shift = (_pairs(row, support) * p[support][None, :]).sum(1) / temp
        rel[support] += torch.expm1(shift)
    return p, rel


def sample(row: Row, temp, seed, pos, excluded=None, q: Row | None = None) -> tuple[int, bool]:
    """Greedy (temp not > 0) or Gumbel-max keyed by (seed, pos); with ``q`` over max(p - q, 0) (over
    ``logits / temp`` when that is empty), else over ``logits / temp`` without ``excluded``. Returns the
    token and whether it is a near tie."""
    if not temp > 0:
        return _decided(row.logits, row, 1.0)
    noise = gumbel_noise(philox.randint(seed, pos), row.logits.numel())
    if q is None:
        values = scaled(row.logits, temp)
        if excluded is not None and 0 <= excluded < values.numel():
            values[excluded] = float("-inf")
        scores = values + noise
        return _decided(scores, row, 1.0 / temp, EPS * (scores.abs().nan_to_num(0) + noise.abs()))
    (p, p_rel), (q_p, q_rel) = _probs(row, temp), _probs(q, temp)
    r, r_err = p - q_p, p * p_rel + q_p * q_rel
    w = _log_or_neg_inf(r) + noise
    residual = argmax_decided(w, _log_or_neg_inf(r - r_err) + noise - 1e-6, _log_or_neg_inf(r + r_err) + noise + 1e-6)
    return residual_or_target(residual, sample(row, temp, seed, pos), r > r_err, r + r_err > 0)


def _log_or_neg_inf(r):
    return torch.where(r > 0, torch.log(r.clamp(min=1e-300)), torch.tensor(float("-inf"), dtype=r.dtype))


def verify_request(rows: list[Row], drafts, temp, seed, pos, cached_q: list[Row] | None = None) -> tuple[list[int],
                                                                                                          bool]:
    """Tokens one request emits (docs/contracts/rejection.md, as ``kernels.rejection``), and whether a decision was
    a near tie."""
    tokens, near = [], False
    for i, x in enumerate(drafts):
        if not temp > 0:
            best, tie = sample(rows[i], temp, seed, pos + i)
            tokens.append(best)
            near |= tie
            if x != best:
                return tokens, near
            continue
        q = cached_q[i] if cached_q is not None else None
        u = float(philox.uniform(philox.randint(seed, pos + i)))
        p, p_rel = _probs(rows[i], temp)
        q_x, q_x_err = 1.0, 0.0
        if q is not None:
            q_p, q_rel = _probs(q, temp)
            q_x, q_x_err = float(q_p[x]), float(q_p[x] * q_rel[x])
        margin = float(p[x]) - u * q_x
        # accept iff p(x) > u q(x): p(x) = 0 is a certain rejection, never a near tie
        near |= float(p[x]) > 0 and abs(margin) <= float(p[x] * p_rel[x]) + u * q_x_err
        if margin > 0:
            tokens.append(x)
            continue
        token, tie = sample(rows[i], temp, seed, pos + i, excluded=x, q=q)
        return tokens + [token], near or tie
    bonus, tie = sample(rows[len(drafts)], temp, seed, pos + len(drafts))
    return tokens + [bonus], near or tie


def _descriptor(desc: graphs.Descriptor) -> torch.Tensor:
    """As the engine records a graph descriptor: [mode (NONE 0, PIECEWISE 1, FULL 2), tokens, requests,
    uniform, max tokens per request], -1 for what it leaves open."""
    return torch.tensor([("NONE", "PIECEWISE", "FULL").index(desc.mode), desc.num_tokens,
                         *(-1 if v is None else v for v in (desc.num_reqs, desc.uniform, desc.max_req_tokens))])


class ReferenceEngine:
    def __init__(self, config: dict, weights: dict, requests: list[dict], follow: list[dict] | None = None):
        self.k = config["num_spec_tokens"]
        self.anchor_first = config["anchor_first"]
        self.q = self.k if self.anchor_first else 1 + self.k
        self.mc, self.c = config["model"], config["scheduler"]
        self.model = Model(self.mc, weights)
        self.eps = HIDDEN_ERROR[config["dtype"]]
        self.tolerances: list[dict] = []
        self.reqs = [dict(r, index=i, tokens=list(r["prompt"]), num_computed=0, num_cached=0, drafts=[],
                          target_blocks=[], draft_blocks=[], finished=False) for i, r in enumerate(requests)]
        self.sched = Scheduler(self.c, self.q, self.reqs)
        s, k, v = self.c["max_num_reqs"], self.k, self.mc["vocab"]
        self.slots = slots.Slots(s, config["seed"])
        self.seeds = torch.zeros(s, dtype=torch.int64)
        self.num_cached = torch.zeros(s, dtype=torch.int32)
        self.temperature = [0.0] * s
        self.last_sampled = torch.zeros(s, dtype=torch.int64)
        self.next_prefill = torch.zeros(s, dtype=torch.int32)
        self.kv_len = self.c["max_model_len"] + k + self.q + 2
        self.width_t = -(-(self.c["max_model_len"] + k) // self.c["target_block_size"])
        self.width_d = -(-(self.c["max_model_len"] + k + self.q) // self.c["draft_block_size"])
        self.table_t = torch.zeros(s, self.width_t, dtype=torch.int32)
        self.table_d = torch.zeros(s, self.width_d, dtype=torch.int32)
        tokens = self.c["max_num_batched_tokens"]
        i32, i64 = torch.int32, torch.int64
        self.buffers = {
            "context_positions": torch.zeros(tokens, dtype=i64), "context_slot_mapping": torch.zeros(tokens, dtype=i64),
            "input_ids": torch.zeros(s * self.q, dtype=i32), "positions": torch.zeros(s * self.q, dtype=i64),
            "query_slot_mapping": torch.zeros(s * self.q, dtype=i64), "sample_indices": torch.zeros(s * k, dtype=i64),
            "sample_pos": torch.zeros(s * k, dtype=i64), "sample_idx_mapping": torch.full((s * k,), -1, dtype=i32),
            "query_start_loc": torch.zeros(s + 1, dtype=i32), "seq_lens": torch.zeros(s, dtype=i32),
            "draft_tokens": torch.zeros(s, k, dtype=i64)}
        self.probabilistic = config["draft_probabilistic"]
        self.draft_logits = torch.zeros(s, k, v, dtype=torch.float64) if self.probabilistic else None
        self.draft_logits_bound = torch.zeros(s, k, v, dtype=torch.float64)
        self.cached_rows: dict[tuple[int, int], Row] = {}  # (slot, column) -> the draft row cached there
        self.schedule = config["dsd_schedule"]
        if self.schedule is not None:
            caps = depth.band_lookup(self.schedule, s, k)
            self.controller = depth.BandAcceptanceLengthController(caps, config["adaptive_window"])
        self._select_graphs(config)
        self.follow = follow
        self.followed, self.near_ties = [], []
        self.step_index = 0

    def _select_graphs(self, config: dict) -> None:
        """The draft backend by priority among those offered, its graph mode, the per-layer causality of
        the DFlash draft, and the graph candidates of draft and target."""
        layers, cap = self.mc["layers"], config["capability_major"]
        self.new_tokens = 0 if self.anchor_first else 1
        self.draft_causal = [backends.dflash_layer_causal(layer, layers) for layer in range(layers)]
        non_causal = backends.has_any_non_causal(layers)
        offered = config["draft_backends"]
        chosen = [b for b in backends.backend_priorities(cap, non_causal) if b in offered] or [offered[0]]
        self.draft_mode = backends.draft_graph_mode(chosen[0], cap, non_causal)
        shape = (config["capture_sizes"], self.c["max_num_reqs"])
        options = {"adaptive": self.schedule is not None, "small_grid": config["small_grid"]}
        self.draft_candidates = graphs.build_candidates(*shape, self.q, self.k, self.schedule, **options)
        self.target_candidates = graphs.build_candidates(*shape, 1 + self.k, self.k, self.schedule, **options)

    def _decide(self, field: str, index: int, own, tie: bool):
        """Our decision, or at a near tie the engine's (when following it)."""
        if not tie:
            return own
        where = (self.step_index, field, index)
        self.near_ties.append(where)
        if self.follow is None or self.step_index >= len(self.follow) or field not in self.follow[self.step_index]:
            return own
        self.followed.append(where)
        return self.follow[self.step_index][field][index]

    # ------------------------------------------------------------------ one step

    def step(self) -> dict:
        record = {}
        self.tolerance = {}
        self.tolerances.append(self.tolerance)
        batch, admitted, released = self.sched.schedule(self.step_index)
        self.sched.pools.freed_d = []
        self.slots.release(released)
        for req in admitted:
            slot, seed = self.slots.admit(req["req_id"], req["seed"])
            self.seeds[slot], self.num_cached[slot] = seed, req["num_cached"]
            self.temperature[slot] = req["temperature"]
            self._readmit(req)
        for req, _ in batch:
            slot = self.slots.slot_of[req["req_id"]]
            for table, blocks in ((self.table_t, req["target_blocks"]), (self.table_d, req["draft_blocks"])):
                table[slot] = 0
                table[slot, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        record["slots.slot_of_request"] = torch.tensor([self.slots.slot_of.get(r["req_id"], -1) for r in self.reqs],
                                                       dtype=torch.int64)
        record["slots.free"] = torch.tensor(self.slots.free_stack, dtype=torch.int64)
        record["slots.seeds"] = self.seeds.clone()
        record["slots.temperature"] = torch.tensor(self.temperature, dtype=torch.float32)
        self.tolerance["slots.temperature"] = torch.zeros(len(self.temperature), dtype=torch.float64)  # copied: exact
        record["slots.num_cached_tokens"] = self.num_cached.clone()
        record["batch.request"] = torch.tensor([r["index"] for r, _ in batch], dtype=torch.int64)
        record["batch.num_tokens"] = torch.tensor([n for _, n in batch], dtype=torch.int32)
        if batch:
            step_depth = self._depth(len(batch))
            idx = torch.tensor([self.slots.slot_of[r["req_id"]] for r, _ in batch], dtype=torch.int32)
            record["idx_mapping"] = idx
            target = self._target(batch, idx, record)
            verified = self._verify(batch, idx, target, record)
            self._propose(batch, idx, target, verified, step_depth, record)
            if self.schedule is not None:
                self.controller.observe(len(batch), *verified["acceptance"])
        record["kv.guards_intact"] = torch.tensor(True)  # nothing is ever written outside a request's KV
        self.sched.finish_step()
        self.step_index += 1
        return record

    def _readmit(self, req: dict) -> None:
        """Fresh KV: the draft's holds nothing, the target's holds the restored prefix."""
        req["kv_t"], req["kv_d"] = self.model.empty_kv(self.kv_len), self.model.empty_kv(self.kv_len)
        cached = req["num_cached"]
        if cached:
            positions = list(range(cached))
            self.model.forward(req["tokens"][:cached], positions, positions, req["kv_t"],
                               lambda layer, i: range(0, i + 1))

    def _target(self, batch, idx, record) -> dict:
        ids, positions, starts = [], [], [0]
        for req, n in batch:
            first = req["num_computed"]
            ids += req["tokens"][first:first + n] if prefilling(req) else [req["tokens"][-1]] + req["drafts"]
            positions += range(first, first + n)
            starts.append(starts[-1] + n)
        qsl = torch.tensor(starts, dtype=torch.int32)
        positions_t = torch.tensor(positions, dtype=torch.int64)
        lengths = {n for _, n in batch}
        record["target.graph"] = _descriptor(graphs.dispatch(
            self.target_candidates, len(batch), len(ids), lengths.pop() if len(lengths) == 1 else None,
            any(prefilling(req) for req, _ in batch)))
        table = block_table.gather_block_tables(self.table_t, idx, torch.zeros(len(batch), self.width_t,
                                                                               dtype=torch.int32))
        slot_mapping = block_table.compute_slot_mappings(table, qsl, positions_t, self.c["target_block_size"],
                                                         torch.zeros(self.c["max_num_batched_tokens"],
                                                                     dtype=torch.int64))
        hidden, aux = [], []
        for b, (req, _) in enumerate(batch):
            rows = range(starts[b], starts[b + 1])
            stored = [positions[t] if int(slot_mapping[t]) != PAD else None for t in rows]
            h, a = self.model.forward(ids[starts[b]:starts[b + 1]], positions[starts[b]:starts[b + 1]], stored,
                                      req["kv_t"], lambda layer, i, first=positions[starts[b]]: range(0, first + i + 1))
            hidden.append(h)
            aux.append(a)
        record["target.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        record["target.positions"] = positions_t
        record["target.query_start_loc"] = qsl
        record["target.seq_lens"] = torch.tensor([r["num_computed"] + n for r, n in batch], dtype=torch.int32)
        record["target.block_table"] = table
        record["target.slot_mapping"] = slot_mapping
        return {"hidden": hidden, "aux": aux, "positions": positions, "starts": starts, "qsl": qsl,
                "positions_t": positions_t}

    def _verify(self, batch, idx, target, record) -> dict:
        num_rows, k, v = len(batch), self.k, self.mc["vocab"]
        out = torch.full((num_rows, k + 1), -1, dtype=torch.int64)
        num_sampled = torch.zeros(num_rows, dtype=torch.int32)
        num_rejected = torch.zeros(num_rows, dtype=torch.int32)
        num_drafts = torch.zeros(num_rows, dtype=torch.int32)
        logits_record = torch.full((num_rows, k + 1, v), float("nan"), dtype=torch.float64)
        logits_bound = torch.zeros(num_rows, k + 1, v, dtype=torch.float64)
        if self.probabilistic:  # the draft-logits rows each verified draft is tested against
            q_record = torch.full((num_rows, k, v), float("nan"), dtype=torch.float64)
            q_bound = torch.zeros(num_rows, k, v, dtype=torch.float64)
        acceptance = [0, 0, 0]
        for b, (req, n) in enumerate(batch):
            if prefilling(req) and req["num_computed"] + n < len(req["tokens"]):
                continue  # a chunk that ends mid-prompt samples nothing
            drafts = [] if prefilling(req) else req["drafts"]
            d = len(drafts)
            first = target["positions"][target["starts"][b + 1] - d - 1]
            hidden = target["hidden"][b][-(d + 1):]
            logits = self.model.logits(hidden, [first + 1 + i for i in range(d + 1)])
            error = self.model.logit_error(hidden, self.eps)
            logits_record[b, :d + 1], logits_bound[b, :d + 1] = logits, error.bound()
            slot = int(idx[b])
            temp = self.temperature[slot]
            cached_q = [self.cached_rows[(slot, j)] for j in range(d)] if self.probabilistic and d else None
            for j, q in enumerate(cached_q or ()):  # draft j is verified against the row that sampled it
                q_record[b, j], q_bound[b, j] = q.logits, q.error.bound()[q.index]
            tokens, tie = verify_request([Row(logits[i], error, i) for i in range(d + 1)], drafts, temp,
                                         int(self.seeds[slot]), first + 1, cached_q)
            row = torch.full((k + 1,), -1, dtype=torch.int64)
            row[:len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            row = self._decide("verify.out_tokens", b, row, tie)
            emitted = int((row >= 0).sum())
            out[b], num_sampled[b], num_rejected[b], num_drafts[b] = row, emitted, d + 1 - emitted, d
            if d:
                acceptance = [acceptance[0] + 1, acceptance[1] + d, acceptance[2] + emitted - 1]
        record["target.logits"] = logits_record
        self.tolerance["target.logits"] = logits_bound
        if self.probabilistic:
            record["verify.draft_logits"] = q_record
            self.tolerance["verify.draft_logits"] = q_bound
        record["verify.out_tokens"] = out
        record["verify.num_sampled"] = num_sampled
        record["verify.num_rejected"] = num_rejected
        record["verify.num_drafts"] = num_drafts
        self._advance(batch, idx, out, num_sampled)
        return {"num_sampled": num_sampled, "num_rejected": num_rejected, "acceptance": tuple(acceptance)}

    def _advance(self, batch, idx, out, num_sampled) -> None:
        for b, (req, n) in enumerate(batch):
            emitted = out[b, :int(num_sampled[b])].tolist()
            slot = int(idx[b])
            req["num_computed"] += n if prefilling(req) else len(emitted)
            req["tokens"] += emitted
            if emitted:
                self.last_sampled[slot] = emitted[-1]
            elif req["num_computed"] < len(req["tokens"]):
                self.next_prefill[slot] = req["tokens"][req["num_computed"]]
            limit = min(len(req["prompt"]) + req["max_new_tokens"], self.c["max_model_len"])
            if len(req["tokens"]) >= limit:
                del req["tokens"][limit:]
                req["num_computed"] = min(req["num_computed"], limit)
                req["finished"] = True
            req["drafts"] = []

    def _propose(self, batch, idx, target, verified, step_depth, record) -> None:
        num_rows, k, bs = len(batch), self.k, self.c["draft_block_size"]
        table = block_table.gather_block_tables(self.table_d, idx, torch.zeros(num_rows, self.width_d,
                                                                               dtype=torch.int32))
        record["draft.block_table"] = table
        prepared, q = False, step_depth + self.new_tokens
        if step_depth:
            desc = graphs.Descriptor("NONE", num_rows * q)  # a FULL graph, or eager: no piecewise draft
            if self.draft_mode == "FULL":
                found = graphs.dispatch(self.draft_candidates, num_rows, num_rows * q, q)
                desc = found if found.mode == "FULL" else desc
            record["draft.graph"] = _descriptor(desc)
            prepared, *outputs = draft_inputs.prepare_draft_inputs(
                idx_mapping=idx, target_query_start_loc=target["qsl"], target_positions=target["positions_t"],
                num_sampled=verified["num_sampled"], num_rejected=verified["num_rejected"],
                last_sampled=self.last_sampled, next_prefill_tokens=self.next_prefill,
                num_cached_tokens=self.num_cached, block_table=table, block_size=bs, num_draft_tokens=step_depth,
                anchor_first=self.anchor_first, mask_token_id=self.mc["vocab"], max_model_len=self.c["max_model_len"],
                **dict(self.buffers, draft_tokens=self.buffers["draft_tokens"][:, :step_depth]))
            drafted = dict(zip(PREP_OUTPUTS, outputs, strict=True))
            drafted["draft_tokens"] = self.buffers["draft_tokens"].clone()
            drafted["draft_tokens"][:, :step_depth] = outputs[-1]
            self.buffers = drafted
        buf = self.buffers
        if not prepared:
            self._refused_context_rows(table, target, verified["num_rejected"])
        self._write_context(batch, target)
        record["draft.prepared"] = torch.tensor(prepared)
        for name in PREP_OUTPUTS:
            record[f"draft.{name}"] = buf[name].clone()
        if prepared:
            record["draft.shifted_block_table"] = block_table.shift_block_table_rows(
                table, idx, self.num_cached, buf["seq_lens"][:num_rows], bs)
            starts, positions = target["starts"], target["positions"]
            last_context = [positions[starts[b + 1] - int(verified["num_rejected"][b]) - 1] for b in range(num_rows)]
            self._draft(batch, idx, last_context, step_depth, record)
        drafts = depth.limit_draft_tokens(buf["draft_tokens"][:num_rows, :step_depth], step_depth, k)
        record["depth"] = torch.tensor(step_depth, dtype=torch.int64)
        record["draft.tokens"] = drafts.clone()
        kept = torch.full((num_rows, step_depth), PAD, dtype=torch.int64)
        for b, ((req, _), row) in enumerate(zip(batch, drafts.tolist(), strict=True)):
            if not prefilling(req) and not req["finished"]:
                req["drafts"] = [t for t in row if t >= 0][:self.c["max_model_len"] - len(req["tokens"])]
            kept[b, :len(req["drafts"])] = torch.tensor(req["drafts"], dtype=torch.int64)
        record["draft.kept"] = kept

    def _refused_context_rows(self, table, target, num_rejected) -> None:
        """Without a draft (depth 0, or a refused batch) the context rows are still stored: valid ones at
        their position and slot."""
        buf, starts, positions = self.buffers, target["starts"], target["positions"]
        buf["context_positions"] = torch.zeros_like(buf["context_positions"])
        buf["context_slot_mapping"] = torch.full_like(buf["context_slot_mapping"], PAD)
        for b in range(len(starts) - 1):
            row = table[b].tolist()
            for t in range(starts[b], starts[b + 1] - int(num_rejected[b])):
                buf["context_positions"][t] = positions[t]
                buf["context_slot_mapping"][t] = block_table.kv_slot(row, positions[t], self.c["draft_block_size"])

    def _write_context(self, batch, target) -> None:
        """Each context row with a slot writes the draft KV of its aux states at its position."""
        buf = self.buffers
        for b, (req, _) in enumerate(batch):
            tokens = torch.arange(target["starts"][b], target["starts"][b + 1])
            written = buf["context_slot_mapping"][tokens] != PAD
            rows, positions = torch.nonzero(written).flatten(), buf["context_positions"][tokens[written]]
            for layer, states in enumerate(target["aux"][b]):
                key, value = self.model.kv_of(layer, states[rows], positions.tolist())
                req["kv_d"][layer][0][positions], req["kv_d"][layer][1][positions] = key, value

    def _draft(self, batch, idx, last_context, step_depth, record) -> None:
        """Each request's query block (at the unclamped positions after its last context row, RoPE at the
        clamped ones) attends to its draft KV from its restored count on (a causal layer: up to its own
        position); then every sampling row."""
        buf, q, d = self.buffers, step_depth + self.new_tokens, step_depth
        hidden = []
        for b, (req, _) in enumerate(batch):
            rows = range(b * q, (b + 1) * q)
            stored = [last_context[b] + 1 + i if int(buf["query_slot_mapping"][r]) != PAD else None
                      for i, r in enumerate(rows)]
            first, end = int(self.num_cached[int(idx[b])]), last_context[b] + q + 1

            def visible(layer, i, first=first, end=end, own=last_context[b] + 1):
                return range(first, own + i + 1) if self.draft_causal[layer] else range(first, end)

            h, _ = self.model.forward(buf["input_ids"][b * q:(b + 1) * q].tolist(),
                                      buf["positions"][b * q:(b + 1) * q].tolist(), stored, req["kv_d"], visible)
            hidden.append(h)
        hidden = torch.cat(hidden)
        rows_hidden = hidden[buf["sample_indices"]]
        logits = self.model.logits(rows_hidden, buf["sample_pos"].tolist())
        error = self.model.logit_error(rows_hidden, self.eps)
        bound = error.bound()
        sampled = torch.zeros(logits.shape[0], dtype=torch.int64)
        for r in range(logits.shape[0]):
            slot = int(buf["sample_idx_mapping"][r])
            temp, seed = (self.temperature[slot], int(self.seeds[slot])) if slot >= 0 else (0.0, 0)
            row = Row(logits[r], error, r)
            if slot >= 0 and self.probabilistic:
                self.draft_logits[slot, r % d], self.draft_logits_bound[slot, r % d] = logits[r], bound[r]
                self.cached_rows[(slot, r % d)] = row
            token, tie = sample(row, temp, seed, int(buf["sample_pos"][r]) + DRAFT_NOISE_SALT)
            sampled[r] = self._decide("draft.sampled", r, torch.tensor(token), tie)
        num_slots = self.c["max_num_reqs"]
        buf["draft_tokens"][:, :d] = sampled[:num_slots * d].view(num_slots, d)
        record["draft.logits"] = logits
        self.tolerance["draft.logits"] = bound
        record["draft.sampled"] = sampled
        if self.probabilistic:
            record["draft.logits_cache"] = self.draft_logits.clone()
            self.tolerance["draft.logits_cache"] = self.draft_logits_bound.clone()

    def _depth(self, batch_size: int) -> int:
        if self.schedule is None:
            return depth.resolve_num_spec_tokens(None, self.k)
        return depth.resolve_num_spec_tokens(self.controller.depth_for(batch_size), self.k)


def replay(config: dict, weights: dict, requests: list[dict], num_steps: int, follow: list[dict] | None = None,
           **_ignored) -> Trace:
    """The records of ``num_steps`` steps; with ``follow`` (the engine's records) near ties take its decisions."""
    engine = ReferenceEngine(config, weights, requests, follow)
    records = [engine.step() for _ in range(num_steps)]
    return Trace(records, engine.tolerances, engine.followed, engine.near_ties)
