"""Verification of drafted tokens (docs/contracts/rejection.md): greedy, and probabilistic rejection sampling
(Leviathan et al.) with a residual resample at the first rejection and a bonus token.

Index spaces: batch row ``b`` is one request; ``slot = idx_mapping[b]`` indexes temperature,
seed and the draft-logits cache ``[S, k, V]`` (as ``kernels.sampling.gumbel_sample`` fills it).
Every request has the same number k of draft steps (a fixed-k layout: a shorter request pads
with placeholder drafts, -1, which are always rejected) and k+1 target rows; row i verifies
draft i, row k gives the bonus token.

Noise: step i of request b draws ``bits = randint(seed[slot], positions[b] + i)`` once. The accept
uniform is ``uniform(bits)`` (= ``rand(seed, pos)``) and the resample or bonus is Gumbel-max keyed
by ``bits``, so a bonus token is exactly what ``gumbel_sample`` gives at that position key.

Semantics, mirrored by ``reference.rejection``:
* temperature not > 0: greedy. Accept while the draft equals the target argmax, then emit it.
* probabilities are softmax of ``logits / temp`` (float32 IEEE division) clamped to
  [-2^126, 2^126], NaN to -2^126: +inf entries share all mass, and a row of NaN/-inf is
  uniform (2^126 keeps differences of clamped scores finite in float32). q is one-hot on
  the draft when no draft logits are given.
* accept draft x iff ``0 <= x < V`` and ``p(x) > u * q(x)`` (upstream's ``log p(x) > log u +
  log q(x)``: a token the target gives probability 0 is never accepted, whatever u and q(x));
  resample from ``max(p - q, 0)`` (with one-hot q: the target distribution without x) by
  Gumbel-max. A placeholder is always rejected; its step has no draft and so no q (a draft-logits row there
  is one the request never drafted): it is sampled from p, Gumbel-max over ``logits / temp`` at its key, the
  token a bonus at that step would be.
* an empty residual (p <= q at every token, as computed: p = q up to rounding, so x lay outside
  q's support or rounding rejected it) resamples from the target itself: Gumbel-max over
  ``logits / temp`` with the same key, the token ``gumbel_sample`` draws there. Upstream's argmax
  over an all-zero residual emits token 0, an arbitrary id (often a special token) the target may
  give probability 0; a correction of a rejection must follow p, and with nothing left of p - q
  that is p itself.
* ``num_rejected`` counts the request's own drafts (upstream: its logit rows minus the tokens
  sampled): trailing placeholders pad a shorter request to k and are not drafts, so a request
  with d real drafts reports ``d + 1 - num_sampled``. The first padding placeholder samples target row d from
  p, which is the bonus token upstream would draw.
* NaN scores never win an argmax; ties go to the lowest token; all -inf gives token 0 (a greedy
  row, a bonus, a one-hot resample, the target fallback of an empty residual).
* an inert row (slot -1) writes -1 tokens and zero counts.

Work split: one program per (request, draft step) computes the softmax statistics of p and q side by side;
then one program per request walks its steps in order, an accept test costing two loads of its statistics, and
reads a whole row again only to resample at the first rejection or to draw the bonus token.
"""

import torch
import triton
import triton.language as tl
from triton.language.random import uint_to_uniform_float

from kernels import runtime, validate  # noqa: F401  (runtime first: it picks compiled vs interpreted)
from kernels.sampling import final_best, gumbel_noise, running_best

# Emitted tokens live in a BLOCK_K-wide register vector. One width covers every depth up to 15,
# so a change of depth never compiles a new variant.
MIN_BLOCK_K = 16
CLAMP = tl.constexpr(2.0**126)  # a global a kernel reads must be constexpr on the GPU


@triton.jit
def _clamped(logits, temp):
    """``logits / temp`` clamped to [-CLAMP, CLAMP], NaN to -CLAMP: finite softmax inputs."""
    s = tl.math.div_rn(logits, temp)
    s = tl.where(s == s, s, -CLAMP)
    return tl.where(s > CLAMP, CLAMP, tl.where(s < -CLAMP, -CLAMP, s))


@triton.jit
def _softmax_stats(row_ptr, temp, vocab, BLOCK_V: tl.constexpr):
    """Max and sum of exp of the clamped scaled row, online per lane, then combined."""
    lane_max = tl.full((BLOCK_V,), -CLAMP, tl.float32)
    lane_sum = tl.zeros((BLOCK_V,), tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        tokens = v0 + tl.arange(0, BLOCK_V)
        in_vocab = tokens < vocab
        c = tl.where(in_vocab, _clamped(tl.load(row_ptr + tokens, mask=in_vocab, other=0.0), temp), float("-inf"))
        new_max = tl.maximum(lane_max, c)
        lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.exp(c - new_max)
        lane_max = new_max
    row_max = tl.max(lane_max, 0)
    return row_max, tl.sum(lane_sum * tl.exp(lane_max - row_max), 0)


@triton.jit
def _argmax(row_ptr, vocab, BLOCK_V: tl.constexpr):
    best_scores = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_tokens = tl.zeros((BLOCK_V,), tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        tokens = v0 + tl.arange(0, BLOCK_V)
        logits = tl.load(row_ptr + tokens, mask=tokens < vocab, other=float("-inf"))
        best_scores, best_tokens = running_best(logits, tokens, best_scores, best_tokens)
    return final_best(best_scores, best_tokens, vocab).to(tl.int64)


@triton.jit
def _gumbel_argmax(row_ptr, draft_row_ptr, temp, gumbel_seed, excluded, p_max, p_sum, q_max, q_sum, vocab,
                   RESIDUAL: tl.constexpr, BLOCK_V: tl.constexpr):
    """Gumbel-max over log max(p - q, 0) (RESIDUAL), else over ``logits / temp`` without ``excluded``.

    An empty residual (p <= q at every token) falls back to ``logits / temp`` under the same noise, the
    token ``gumbel_sample`` draws at this key; its running best rides in the residual's loop."""
    best_scores = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_tokens = tl.zeros((BLOCK_V,), tl.int32)
    target_best_scores = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    target_best_tokens = tl.zeros((BLOCK_V,), tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        tokens = v0 + tl.arange(0, BLOCK_V)
        in_vocab = tokens < vocab
        logits = tl.load(row_ptr + tokens, mask=in_vocab, other=float("-inf"))
        noise = gumbel_noise(gumbel_seed, tokens)
        target_scores = tl.math.div_rn(logits, temp) + noise  # as kernels.sampling.gumbel_scores
        if RESIDUAL:
            draft_logits = tl.load(draft_row_ptr + tokens, mask=in_vocab, other=float("-inf"))
            p = tl.exp(_clamped(logits, temp) - p_max) / p_sum
            q = tl.exp(_clamped(draft_logits, temp) - q_max) / q_sum
            keep = in_vocab & (p > q)
            scores = tl.where(keep, tl.log(tl.where(keep, p - q, 1.0)), float("-inf")) + noise
            target_best_scores, target_best_tokens = running_best(target_scores, tokens, target_best_scores,
                                                                  target_best_tokens)
        else:
            scores = tl.where(tokens == excluded, float("-inf"), target_scores)
        best_scores, best_tokens = running_best(scores, tokens, best_scores, best_tokens)
    token = final_best(best_scores, best_tokens, vocab)
    if RESIDUAL:  # no token kept: every residual score is -inf (a kept one's is finite)
        token = tl.where(tl.max(best_scores, 0) > float("-inf"), token,
                         final_best(target_best_scores, target_best_tokens, vocab))
    return token.to(tl.int64)


@triton.jit
def _probability(row_ptr, token, temp, row_max, row_sum):
    return tl.exp(_clamped(tl.load(row_ptr + token), temp) - row_max) / row_sum


# Vocab and depth sizes and strides change from batch to batch; specializing on their alignment would
# compile a new variant for each (stress sweeps meet dozens), for no gain in a latency-bound kernel.
_RUNTIME_SIZES = ["target_request_stride", "target_step_stride", "draft_tokens_stride", "draft_logits_slot_stride",
                  "draft_logits_step_stride", "out_stride", "num_drafts", "vocab"]


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _softmax_stats_kernel(target_ptr, target_request_stride, target_step_stride, idx_mapping_ptr, temperature_ptr,
                          draft_logits_ptr, draft_logits_slot_stride, draft_logits_step_stride, stats_ptr, num_drafts,
                          vocab, HAS_DRAFT_LOGITS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Softmax max and sum of p (and q) at every draft step of a sampled request, one program per (request,
    step). A step's accept test then costs the verify kernel two loads instead of a pass over the vocab, and
    the passes run side by side instead of one request's steps one after another."""
    b = tl.program_id(0)
    step = tl.program_id(1).to(tl.int64)  # int64: step * stride passes 2^31 elements in a wide step stride
    slot = tl.load(idx_mapping_ptr + b)
    live = slot >= 0
    temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)
    if live & (temp > 0):  # the requests whose steps the verify kernel tests by probability
        stats_at = stats_ptr + (b.to(tl.int64) * num_drafts + step) * 4
        row_ptr = target_ptr + b.to(tl.int64) * target_request_stride + step * target_step_stride
        p_max, p_sum = _softmax_stats(row_ptr, temp, vocab, BLOCK_V)
        tl.store(stats_at, p_max)
        tl.store(stats_at + 1, p_sum)
        if HAS_DRAFT_LOGITS:
            q_row_ptr = draft_logits_ptr + slot.to(tl.int64) * draft_logits_slot_stride
            q_row_ptr += step * draft_logits_step_stride
            q_max, q_sum = _softmax_stats(q_row_ptr, temp, vocab, BLOCK_V)
            tl.store(stats_at + 2, q_max)
            tl.store(stats_at + 3, q_sum)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def _verify_kernel(target_ptr, target_request_stride, target_step_stride, draft_tokens_ptr, draft_tokens_stride,
                   idx_mapping_ptr, temperature_ptr, seeds_ptr, positions_ptr, draft_logits_ptr,
                   draft_logits_slot_stride, draft_logits_step_stride, stats_ptr, out_ptr, out_stride,
                   num_sampled_ptr, num_rejected_ptr, num_drafts, vocab, HAS_DRAFT_LOGITS: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + b)
    live = slot >= 0
    temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)
    seed = tl.load(seeds_ptr + slot, mask=live, other=0)
    pos = tl.load(positions_ptr + b)
    target_row_ptr = target_ptr + b.to(tl.int64) * target_request_stride
    draft_row_ptr = draft_logits_ptr + slot.to(tl.int64) * draft_logits_slot_stride
    lanes = tl.arange(0, BLOCK_K)
    # Tokens are collected in registers and stored once: no lane rereads what another wrote.
    emitted = tl.full((BLOCK_K,), -1, tl.int64)
    step = b.to(tl.int64) * 0  # int64: step * stride passes 2^31 elements in a view with a wide step stride
    verifying = live
    while verifying & (step < num_drafts):
        row_ptr = target_row_ptr + step * target_step_stride
        draft = tl.load(draft_tokens_ptr + b.to(tl.int64) * draft_tokens_stride + step)
        if temp > 0:
            bits = tl.randint(seed, pos + step)
            q_row_ptr = draft_row_ptr + step * draft_logits_step_stride
            valid = (draft >= 0) & (draft < vocab)
            x = tl.where(valid, draft, 0)
            stats_at = stats_ptr + (b.to(tl.int64) * num_drafts + step) * 4  # _softmax_stats_kernel's
            p_max = tl.load(stats_at)
            p_sum = tl.load(stats_at + 1)
            p_x = _probability(row_ptr, x, temp, p_max, p_sum)
            if HAS_DRAFT_LOGITS:
                q_max = tl.load(stats_at + 2)
                q_sum = tl.load(stats_at + 3)
                q_x = _probability(q_row_ptr, x, temp, q_max, q_sum)
            else:  # one-hot q
                # Its resample excludes x and has no fallback: it is empty only when every other token scores
                # -inf (logits -inf/NaN), where "all -inf gives token 0" holds as for a bonus. A p one-hot on x
                # itself is never rejected: every other exp underflows to 0, so p(x) = exp(0) / exp(0)^m = 1,
                # and u <= 1 - 2^-24 (uint_to_uniform_float's scale keeps it below 1).
                q_max, q_sum, q_x = p_max, p_sum, 1.0
            accepted = valid & (p_x > uint_to_uniform_float(bits) * q_x)
            token = draft
            if draft < 0:  # no draft at this step, so no q: sampled from p, as a bonus at this key
                token = _gumbel_argmax(row_ptr, row_ptr, temp, bits, -1, 0.0, 1.0, 0.0, 1.0, vocab, False, BLOCK_V)
            elif accepted == 0:
                token = _gumbel_argmax(row_ptr, q_row_ptr, temp, bits, draft, p_max, p_sum, q_max, q_sum, vocab,
                                       HAS_DRAFT_LOGITS, BLOCK_V)
        else:
            token = _argmax(row_ptr, vocab, BLOCK_V)
            accepted = draft == token
        emitted = tl.where(lanes == step, token, emitted)
        verifying = accepted
        step += 1
    if verifying:  # every draft accepted: the bonus token from row k
        row_ptr = target_row_ptr + step * target_step_stride  # step == num_drafts here
        if temp > 0:
            bits = tl.randint(seed, pos + num_drafts)
            bonus = _gumbel_argmax(row_ptr, row_ptr, temp, bits, -1, 0.0, 1.0, 0.0, 1.0, vocab, False, BLOCK_V)
        else:
            bonus = _argmax(row_ptr, vocab, BLOCK_V)
        emitted = tl.where(lanes == num_drafts, bonus, emitted)
    sampled = step + verifying.to(tl.int32)
    # the request's own drafts end at its last non-placeholder: trailing -1s only pad it to k
    drafts = tl.load(draft_tokens_ptr + b.to(tl.int64) * draft_tokens_stride + lanes, mask=lanes < num_drafts,
                     other=-1)
    own_drafts = tl.max(tl.where(drafts >= 0, lanes + 1, 0), 0)
    tl.store(out_ptr + b.to(tl.int64) * out_stride + lanes, emitted, mask=lanes <= num_drafts)
    tl.store(num_sampled_ptr + b, sampled)
    tl.store(num_rejected_ptr + b, tl.where(live, own_drafts + 1 - sampled, 0))


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, idx_mapping: torch.Tensor,
           temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, out_tokens: torch.Tensor,
           num_sampled: torch.Tensor, num_rejected: torch.Tensor, *, draft_logits: torch.Tensor | None = None,
           block_v: int | None = None, num_warps: int | None = None) -> None:
    """Verify k drafts per request; writes rows ``b < B`` of the three outputs, later rows untouched.

    target_logits [B, k+1, V] float32 and draft_tokens [B, k] int64 (by batch row, -1 =
    placeholder; any row stride, 0 included: one row of drafts expanded to the batch); idx_mapping
    [B] int32 (slot, -1 = inert); temperature [S] float32, seeds [S] int64 (by slot); positions [B]
    int64 (position key of target row 0; row i uses +i);
    draft_logits [S, k, V] float32 (unscaled) or None for one-hot q.
    Outputs: out_tokens [R >= B, k+1] int64 (emitted tokens, then -1), num_sampled [R] int32
    (accepted + 1), num_rejected [R] int32 (d + 1 - num_sampled, d = drafts before the trailing
    placeholders). ``block_v`` and ``num_warps`` are launch knobs (powers of two).
    """
    validate.tensor("target_logits", target_logits, dtype=torch.float32, ndim=3)
    validate.tensor("draft_tokens", draft_tokens, dtype=torch.int64, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("temperature", temperature, dtype=torch.float32, ndim=1)
    validate.tensor("seeds", seeds, dtype=torch.int64, ndim=1)
    validate.tensor("positions", positions, dtype=torch.int64, ndim=1)
    validate.tensor("out_tokens", out_tokens, dtype=torch.int64, ndim=2)
    validate.tensor("num_sampled", num_sampled, dtype=torch.int32, ndim=1)
    validate.tensor("num_rejected", num_rejected, dtype=torch.int32, ndim=1)
    tensors = {"target_logits": target_logits, "draft_tokens": draft_tokens, "idx_mapping": idx_mapping,
               "temperature": temperature, "seeds": seeds, "positions": positions, "out_tokens": out_tokens,
               "num_sampled": num_sampled, "num_rejected": num_rejected}
    batch, rows, vocab = target_logits.shape
    num_drafts = rows - 1
    if rows == 0:
        raise ValueError("target_logits: needs k+1 >= 1 rows per request (the bonus row)")
    if tuple(draft_tokens.shape) != (batch, num_drafts):
        raise ValueError(f"draft_tokens: shape {tuple(draft_tokens.shape)}, expected [{batch}, {num_drafts}]")
    for name in ("idx_mapping", "positions"):
        if tensors[name].numel() != batch:
            raise ValueError(f"{name}: {tensors[name].numel()} entries for {batch} requests")
    if seeds.numel() != temperature.numel():
        raise ValueError(f"seeds: {seeds.numel()} slots, but temperature has {temperature.numel()}")
    if out_tokens.shape[0] < batch or out_tokens.shape[1] != rows:
        raise ValueError(f"out_tokens: shape {tuple(out_tokens.shape)}, expected [>= {batch}, {rows}]")
    for name in ("num_sampled", "num_rejected"):
        if tensors[name].numel() < batch:
            raise ValueError(f"{name}: {tensors[name].numel()} entries for {batch} requests")
    if draft_logits is not None:
        validate.tensor("draft_logits", draft_logits, dtype=torch.float32, ndim=3)
        if tuple(draft_logits.shape) != (temperature.numel(), num_drafts, vocab):
            raise ValueError(f"draft_logits: shape {tuple(draft_logits.shape)}, expected "
                             f"[{temperature.numel()}, {num_drafts}, {vocab}]")
        tensors["draft_logits"] = draft_logits
    validate.on_kernel_device(**tensors)
    validate.indices("idx_mapping", idx_mapping, -1, temperature.numel(), what="slot")
    if batch == 0:
        return
    if vocab == 0:
        raise ValueError("target_logits: vocab size 0; there is no token to emit")
    block = validate.power_of_two("block_v", block_v) if block_v is not None else min(
        1024, triton.next_power_of_2(vocab))
    extra = {} if num_warps is None else {"num_warps": validate.power_of_two("num_warps", num_warps)}
    has_draft_logits = draft_logits is not None
    draft_args = (draft_logits, draft_logits.stride(0), draft_logits.stride(1)) if has_draft_logits else (
        target_logits, 0, 0)
    stats = torch.empty((batch, num_drafts, 4), dtype=torch.float32, device=target_logits.device)
    if num_drafts:
        _softmax_stats_kernel[(batch, num_drafts)](
            target_logits, target_logits.stride(0), target_logits.stride(1), idx_mapping, temperature, *draft_args,
            stats, num_drafts, vocab, HAS_DRAFT_LOGITS=has_draft_logits, BLOCK_V=block, **extra)
    _verify_kernel[(batch,)](target_logits, target_logits.stride(0), target_logits.stride(1), draft_tokens,
                             draft_tokens.stride(0), idx_mapping, temperature, seeds, positions, *draft_args,
                             stats, out_tokens, out_tokens.stride(0), num_sampled, num_rejected, num_drafts, vocab,
                             HAS_DRAFT_LOGITS=has_draft_logits, BLOCK_K=max(MIN_BLOCK_K, triton.next_power_of_2(rows)),
                             BLOCK_V=block, **extra)
