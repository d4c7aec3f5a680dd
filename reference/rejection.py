"""Reference verification: a loop over requests and draft steps, float64 probabilities from the
same Philox draws as the kernel; mirrors the semantics listed in ``kernels.rejection``.

Each request also reports ``near_tie``: some accept test or resample in it is decided within the
kernel's float32 rounding (bounds below), so the kernel may legitimately emit other tokens.
"""

import torch

from reference import philox
from reference.sampling import EPS, Decided, argmax_decided, gumbel_max, gumbel_noise, sample_row, scaled

CLAMP = 2.0**126  # as kernels.rejection: a quarter of the float32 range
# float32 softmax error bound, relative: a floor (approximate exp and log on GPUs, the lane
# combine), a term per vocab entry for the sequential sums and max rescales over V/128 tiles
# (128 is the smallest GPU tile the sweeps use), and the exponent's rounding, which grows with
# the distance from the row max. Absolute below 2^-100 (underflow, flushed denormals).
SOFTMAX_REL = 2.0**-14
SOFTMAX_REL_PER_TOKEN = 2.0**-28
SOFTMAX_ABS = 2.0**-100
LOG_ABS = 2.0**-20  # approximate float32 log on GPUs
# Below this shifted score the kernel's p is exactly 0, and so is the reference's, with no bound: a floor there
# would let a real difference of zero (p(x) = 0 against an accept, an empty residual) pass as a near tie. The
# kernel's c - max is the same float32 c and max as here, rounded by 2^-24 relative, so below -110.99; e^-110.99
# is below 2^-160, a factor 2^10 under half the smallest float32 subnormal (2^-150), so a float32 exp accurate
# to within that factor returns 0 there, correctly rounded or not, subnormals flushed or not (numpy under the
# interpreter, ex2.approx on the GPU), and p = 0 / sum = 0. (A float64 exp underflows only below -745.)
EXP_ZERO = -111.0


def clamped(logits: torch.Tensor, temp: float) -> torch.Tensor:
    """``logits / temp`` clamped to [-CLAMP, CLAMP], NaN to -CLAMP: what the kernel's softmax reads (float32 values)."""
    return scaled(logits, temp).nan_to_num(nan=-CLAMP).clamp(-CLAMP, CLAMP)


def softmax(logits: torch.Tensor, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities of the clamped scaled row (float64), exactly 0 where the kernel's are, and their float32
    error bound (0 there)."""
    c = clamped(logits, temp)
    shifted = c - c.max()
    e = torch.exp(shifted).masked_fill(shifted < EXP_ZERO, 0.0)
    p = e / e.sum()
    rel = SOFTMAX_REL + SOFTMAX_REL_PER_TOKEN * c.numel() + 2.0**-22 * shifted.abs().clamp(max=104)
    return p, torch.where(p > 0, p * rel + SOFTMAX_ABS, 0.0)


def _log_or_neg_inf(r: torch.Tensor) -> torch.Tensor:
    return torch.where(r > 0, torch.log(r.clamp(min=1e-300)), torch.tensor(float("-inf"), dtype=r.dtype))


def residual_or_target(residual: tuple[int, bool], target: tuple[int, bool], kept: torch.Tensor,
                       may_keep: torch.Tensor) -> tuple[int, bool]:
    """The kernel's resample, (token, near tie): the ``residual`` draw where its residual surely keeps a token
    (``kept``), the ``target`` draw (its fallback) where it surely keeps none (no ``may_keep``); in between
    decided only when both ways give one token, the fallback's and the only one the residual may keep."""
    if kept.any():
        return residual
    token, tie = target
    return token, tie or (bool(may_keep.any()) and may_keep.nonzero().flatten().tolist() != [token])


def resample(logits, temp, bits, draft: int, draft_logits: torch.Tensor | None) -> tuple[int, bool]:
    """Gumbel-max keyed by ``bits`` over the residual ``max(p - q, 0)``, or over ``logits / temp`` when the
    kernel's residual is empty; q is one-hot when ``draft_logits`` is None (then the draft is excluded instead)."""
    noise = gumbel_noise(bits, logits.numel())
    values = scaled(logits, temp)
    if draft_logits is None:
        if 0 <= draft < logits.numel():
            values[draft] = float("-inf")
        return gumbel_max(values, noise)
    if torch.equal(clamped(logits, temp), clamped(draft_logits, temp)):
        # The kernel computes p and q from equal inputs by the same float32 operations: equal bit for bit,
        # so p > q nowhere and its residual is empty, however large the bound on each.
        return gumbel_max(values, noise)
    (p, p_tol), (q_p, q_tol) = softmax(logits, temp), softmax(draft_logits, temp)
    r = p - q_p
    r_tol = p_tol + q_tol + EPS * (p + q_p)
    # The kernel keeps a token iff its p > q: surely where r > r_tol, never where p is exactly 0 (so is the
    # kernel's, see softmax; a tiny q's floor must not make it a candidate) or r + r_tol <= 0.
    may_keep = (p > 0) & (r + r_tol > 0)
    w = _log_or_neg_inf(r)
    g_tol = EPS * (torch.where(torch.isfinite(w), w.abs(), 0) + noise.abs()) + LOG_ABS
    lo = _log_or_neg_inf(r - r_tol) + noise - g_tol
    hi = torch.where(may_keep, _log_or_neg_inf(r + r_tol) + noise + g_tol, float("-inf"))
    return residual_or_target(argmax_decided(w + noise, lo, hi), gumbel_max(values, noise), r - r_tol > 0, may_keep)


def verify_request(target, drafts, temp, seed, pos, draft_logits=None) -> tuple[list[int], bool]:
    """Tokens emitted for one live request, and whether any decision was a near tie."""
    tokens, near_tie = [], False
    vocab = target.shape[-1]
    for i, x in enumerate(int(d) for d in drafts):
        if not temp > 0:
            best, _ = sample_row(target[i], 0.0, 0, 0)
            tokens.append(best)
            if x != best:
                return tokens, near_tie
            continue
        bits = philox.randint(seed, pos + i)
        u = float(philox.uniform(bits))
        q = softmax(draft_logits[i], temp) if draft_logits is not None else None
        accepted = False
        if 0 <= x < vocab:
            p, p_tol = softmax(target[i], temp)
            q_x, q_x_tol = (float(q[0][x]), float(q[1][x])) if q is not None else (1.0, 0.0)
            margin = float(p[x]) - u * q_x
            accepted = margin > 0
            # p(x) = 0 in float64 is 0 in float32 too: a certain rejection, never a near tie, so
            # the absolute floor of the bound cannot excuse accepting it (when q(x) = 0 as well)
            near_tie |= float(p[x]) > 0 and abs(margin) <= float(p_tol[x]) + u * q_x_tol + EPS * u * q_x
        if accepted:
            tokens.append(x)
            continue
        # a placeholder step has no draft, so no q: sampled from p (no token excluded), as a bonus at this key
        token, tie = resample(target[i], temp, bits, x, None if draft_logits is None or x < 0 else draft_logits[i])
        return tokens + [token], near_tie or tie
    bonus, tie = sample_row(target[len(drafts)], temp, seed, pos + len(drafts))
    return tokens + [bonus], near_tie or tie


def own_drafts(drafts: torch.Tensor) -> int:
    """A request's drafts: those up to its last non-placeholder (trailing -1s pad it to k)."""
    real = (drafts >= 0).nonzero()
    return int(real[-1]) + 1 if real.numel() else 0


def verify(target_logits, draft_tokens, idx_mapping, temperature, seeds, positions, out_tokens, num_sampled,
           num_rejected, *, draft_logits=None):
    """Returns ``Decided`` out_tokens, num_sampled, num_rejected (rows past the batch unchanged)."""
    out, sampled, rejected = out_tokens.clone(), num_sampled.clone(), num_rejected.clone()
    near_tie = torch.zeros(out.shape[0], dtype=torch.bool)
    for b, slot in enumerate(int(s) for s in idx_mapping):
        out[b] = -1
        if slot < 0:
            sampled[b] = rejected[b] = 0
            continue
        tokens, near_tie[b] = verify_request(
            target_logits[b], draft_tokens[b], float(temperature[slot]), int(seeds[slot]), int(positions[b]),
            None if draft_logits is None else draft_logits[slot])
        out[b, :len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        sampled[b], rejected[b] = len(tokens), own_drafts(draft_tokens[b]) + 1 - len(tokens)
    return Decided(out, near_tie), Decided(sampled, near_tie), Decided(rejected, near_tie)
