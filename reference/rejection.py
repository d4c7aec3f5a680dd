"""Reference verification: a loop over requests and draft steps, float64 probabilities from the
same Philox draws as the kernel; mirrors the semantics listed in ``kernels.rejection``.

Each request also reports ``near_tie``: some accept test or resample in it is decided within the
kernel's float32 rounding (bounds below), so the kernel may legitimately emit other tokens.
"""

import torch

from reference import philox
from reference.sampling import EPS, Decided, argmax_decided, gumbel_noise, noise_tolerance, sample_row, scaled

CLAMP = 2.0**126  # as kernels.rejection: a quarter of the float32 range
# float32 softmax error bound, relative: a floor (approximate exp and log on GPUs, the lane
# combine), a term per vocab entry for the sequential sums and max rescales over V/128 tiles
# (128 is the smallest GPU tile the sweeps use), and the exponent's rounding, which grows with
# the distance from the row max. Absolute below 2^-100 (underflow, flushed denormals).
SOFTMAX_REL = 2.0**-14
SOFTMAX_REL_PER_TOKEN = 2.0**-28
SOFTMAX_ABS = 2.0**-100
LOG_ABS = 2.0**-20  # approximate float32 log on GPUs


def softmax(logits: torch.Tensor, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities of the clamped scaled row (float64) and their float32 error bound."""
    c = scaled(logits, temp).nan_to_num(nan=-CLAMP).clamp(-CLAMP, CLAMP)
    shifted = c - c.max()
    e = torch.exp(shifted)
    p = e / e.sum()
    rel = SOFTMAX_REL + SOFTMAX_REL_PER_TOKEN * c.numel() + 2.0**-22 * shifted.abs().clamp(max=104)
    return p, p * rel + SOFTMAX_ABS


def _log_or_neg_inf(r: torch.Tensor) -> torch.Tensor:
    return torch.where(r > 0, torch.log(r.clamp(min=1e-300)), torch.tensor(float("-inf"), dtype=r.dtype))


def resample(logits, temp, bits, draft: int, q: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[int, bool]:
    """Gumbel-max keyed by ``bits`` over the residual ``max(p - q, 0)``; q is (probs, bound), one-hot when None."""
    noise = gumbel_noise(bits, logits.numel())
    if q is None:
        values = scaled(logits, temp)
        if 0 <= draft < logits.numel():
            values[draft] = float("-inf")
        scores = values + noise
        tol = noise_tolerance(values, noise)
        return argmax_decided(scores, scores - tol, scores + tol)
    (p, p_tol), (q_p, q_tol) = softmax(logits, temp), q
    r = p - q_p
    r_tol = p_tol + q_tol + EPS * (p + q_p)
    w = _log_or_neg_inf(r)
    g_tol = EPS * (torch.where(torch.isfinite(w), w.abs(), 0) + noise.abs()) + LOG_ABS
    lo = _log_or_neg_inf(r - r_tol) + noise - g_tol
    hi = _log_or_neg_inf(r + r_tol) + noise + g_tol
    return argmax_decided(w + noise, lo, hi)


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
        token, tie = resample(target[i], temp, bits, x, q)
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
