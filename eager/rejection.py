"""Verification of drafted tokens, as ``kernels.rejection.verify``, in plain tensor ops: greedy, and
probabilistic rejection sampling with a residual resample at the first rejection and a bonus token
(docs/contracts/rejection.md).

Every step of every request is decided at once (accept test and replacement token per step), then the first
rejection of each request cuts its emitted tokens. Noise as the kernel's: step i of request b draws
``bits = randint(seeds[slot], positions[b] + i)``; the accept uniform is ``uniform(bits)`` and the resample or
bonus is Gumbel-max keyed by ``bits``. Declared random stream: ``reference.philox``, drawn on the logits'
device by ``eager.philox`` (see ``eager.sampling``). Requests are decided a chunk at a time, so a GPU-sized
vocabulary times many requests never materializes at once. The argument checks repeat the launcher's (same
helpers, same messages): they are inline there, where its planted refusal bugs patch them.
"""

import torch

from eager import philox
from eager.sampling import first_argmax, gumbel_noise, per_slot
from kernels import validate

CLAMP = 2.0**126  # scaled logits are clamped to [-CLAMP, CLAMP], NaN to -CLAMP (as kernels.rejection)
CHUNK_LOGITS = 2**24  # logits decided at once: the float64 noise of a chunk stays near 128 MiB


def softmax(logits: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """float32 softmax of ``logits / temp`` clamped: +inf entries share all mass, a row of NaN/-inf is uniform."""
    c = (logits / temp).nan_to_num(nan=-CLAMP, posinf=CLAMP, neginf=-CLAMP).clamp(-CLAMP, CLAMP)
    e = torch.exp(c - c.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _sampled_steps(target, drafts, draft_q, temp, seed, pos) -> tuple[torch.Tensor, torch.Tensor]:
    """Requests at a temperature > 0: each step's emitted token if it is reached ``[n, k+1]`` (the draft where
    accepted, else its replacement; the bonus last) and whether its draft is accepted ``[n, k]``."""
    n, rows, vocab = target.shape
    k = rows - 1
    bits = philox.randint(seed[:, None], pos[:, None] + torch.arange(rows, device=target.device))
    t = temp[:, None, None]
    target_scores = target / t + gumbel_noise(bits, vocab)  # as kernels.sampling's Gumbel-max at each key
    from_p = first_argmax(target_scores)  # a placeholder step (no draft, so no q), and the bonus
    p = softmax(target[:, :k], t)
    valid = (drafts >= 0) & (drafts < vocab)
    x = torch.where(valid, drafts, 0)[..., None]
    if draft_q is None:  # one-hot q: accept iff p(x) > u; resample p without x
        q_x = 1.0
        excluded = torch.arange(vocab, device=target.device) == drafts[..., None]
        resampled = first_argmax(target_scores[:, :k].masked_fill(excluded, float("-inf")))
    else:  # resample max(p - q, 0); an empty residual falls back to p at the same key
        q = softmax(draft_q, t)
        q_x = q.gather(-1, x)[..., 0]
        keep = p > q
        residual = torch.where(keep, torch.log(torch.where(keep, p - q, 1.0)), float("-inf"))
        resampled = torch.where(keep.any(-1), first_argmax(residual + gumbel_noise(bits[:, :k], vocab)), from_p[:, :k])
    accepted = valid & (p.gather(-1, x)[..., 0] > philox.uniform(bits[:, :k]) * q_x)
    tokens = torch.where(drafts < 0, from_p[:, :k], torch.where(accepted, drafts, resampled))
    return torch.cat([tokens, from_p[:, k:]], 1), accepted


def _decided_steps(target, drafts, slots, temp, seed, pos, draft_logits) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's emitted token if it is reached ``[n, k+1]`` and whether its draft is accepted ``[n, k]``, for
    the requests of one chunk: greedy (temperature not > 0) accepts while the draft is the target argmax."""
    tokens = first_argmax(target)
    accepted = drafts == tokens[:, :drafts.shape[1]]
    sampled_rows = (temp > 0).nonzero()[:, 0]
    if sampled_rows.numel():
        draft_q = None if draft_logits is None else draft_logits[slots[sampled_rows]]
        tokens[sampled_rows], accepted[sampled_rows] = _sampled_steps(
            target[sampled_rows], drafts[sampled_rows], draft_q, temp[sampled_rows], seed[sampled_rows],
            pos[sampled_rows])
    return tokens, accepted


def verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor, idx_mapping: torch.Tensor,
           temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, out_tokens: torch.Tensor,
           num_sampled: torch.Tensor, num_rejected: torch.Tensor, *, draft_logits: torch.Tensor | None = None) -> None:
    """Verify k drafts per request; writes rows ``b < B`` of the three outputs, later rows untouched. Arguments as
    ``kernels.rejection.verify``."""
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
    validate.same_device(**tensors)
    validate.indices("idx_mapping", idx_mapping, -1, temperature.numel(), what="slot")
    if batch == 0:
        return
    if vocab == 0:
        raise ValueError("target_logits: vocab size 0; there is no token to emit")
    slots = idx_mapping.to(torch.int64)
    live = slots >= 0
    temp, seed = per_slot(temperature, slots, 0.0), per_slot(seeds, slots, 0)
    step = max(1, CHUNK_LOGITS // (rows * vocab))
    decided = [_decided_steps(target_logits[part], draft_tokens[part], slots[part], temp[part], seed[part],
                              positions[part], draft_logits)
               for part in (slice(start, start + step) for start in range(0, batch, step))]
    tokens, accepted = (torch.cat(parts) for parts in zip(*decided, strict=True))
    num_accepted = accepted.to(torch.int64).cumprod(1).sum(1)  # drafts before the first rejection
    sampled = torch.where(live, num_accepted + 1, 0)
    lanes = torch.arange(rows, device=tokens.device)
    out_tokens[:batch] = torch.where(lanes[None, :] < sampled[:, None], tokens, -1)
    # the request's own drafts end at its last non-placeholder: trailing -1s only pad it to k
    own_drafts = torch.where(draft_tokens >= 0, lanes[None, :num_drafts] + 1, 0).amax(1) if num_drafts else 0 * sampled
    num_sampled[:batch] = sampled.to(torch.int32)
    num_rejected[:batch] = torch.where(live, own_drafts + 1 - sampled, 0).to(torch.int32)
