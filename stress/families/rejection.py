"""Case families for verification (greedy / one-hot q / draft logits, placeholders, padding,
nonfinite, long vocab, ties, depth 0, strided views, probabilities exactly 0, vocab tile boundaries),
and the statistical family: many trials of one request."""

import numpy as np
import torch

from stress.core.types import Case
from stress.families.common import (
    INT32_MAX,
    SENTINEL,
    big,
    laid_out,
    offset_reach,
    one_per_value,
    own_launch,
    pick,
    slots_for,
    spread,
)
from stress.families.sampling import (
    HUGE_VOCAB,
    LONG_VOCABS,
    NEAR_ZERO_TEMPERATURES,
    default_block_v,
    extreme_keys,
    random_logits,
    seeds,
    temperatures,
    threshold_temperatures,
    tie_at_tile_edges,
    tied_integer_logits,
    tile_vocab,
)


def verify_sweep(device: str) -> list[dict]:
    """Extremes and the default: small and large vocab tiles, one warp and many. Each shape
    compiles once per (k tile, draft-logits) variant, so the GPU list stays short: the launcher's own
    tile (no knob, a variant per vocab power of two) is reached on the GPU through engine.step."""
    if device == "cuda":
        return [{"block_v": 128, "num_warps": 1}, {"block_v": 128, "num_warps": 8}, {"block_v": 1024, "num_warps": 4},
                {"block_v": 4096, "num_warps": 1}, {"block_v": 4096, "num_warps": 8}]
    return [{}, {"block_v": 32}]


def _drafts(rng, target: torch.Tensor, placeholder_share: float) -> torch.Tensor:
    """Drafts a drafter might propose: a Gumbel-perturbed target argmax (often accepted), some -1."""
    rows = target[:, :-1].to(torch.float64).nan_to_num(nan=-1e30, posinf=1e30, neginf=-1e30)
    noise = torch.from_numpy(rng.gumbel(size=tuple(rows.shape)) * rng.uniform(0, 2))
    drafts = (rows + noise).argmax(-1) if rows.shape[-1] else torch.zeros(rows.shape[:-1], dtype=torch.int64)
    drafts[torch.from_numpy(rng.random(tuple(drafts.shape)) < placeholder_share)] = -1
    return drafts


def _case(rng, *, batch, depth, vocab, greedy_share=0.3, draft_logits=False, inert_share=0.0, pad_out=0,
          target=None, placeholder_share=0.05, note="") -> Case:
    idx_mapping, num_slots = slots_for(rng, batch, int(rng.integers(1, 4)))
    idx_mapping[torch.from_numpy(rng.random(batch) < inert_share)] = -1
    target = random_logits(rng, (batch, depth + 1, vocab)) if target is None else target
    cached = None
    if draft_logits:
        # The drafter's logits: near the target's (frequent accepts, residuals of both signs).
        cached = random_logits(rng, (num_slots, depth, vocab))
        live = idx_mapping >= 0
        cached[idx_mapping[live].long()] = target[live, :depth] + random_logits(rng, (int(live.sum()), depth, vocab),
                                                                                rng.uniform(0, 1.5))
    rows = batch + pad_out
    return Case(inputs={
        "target_logits": target, "draft_tokens": _drafts(rng, target, placeholder_share),
        "idx_mapping": idx_mapping, "temperature": temperatures(rng, num_slots, greedy_share),
        "seeds": seeds(rng, num_slots), "positions": torch.from_numpy(rng.integers(0, 2**33, batch, dtype=np.int64)),
        "out_tokens": torch.full((rows, depth + 1), SENTINEL, dtype=torch.int64),
        "num_sampled": torch.full((rows,), SENTINEL, dtype=torch.int32),
        "num_rejected": torch.full((rows,), SENTINEL, dtype=torch.int32),
        **({} if cached is None else {"draft_logits": cached}),  # one-hot q: the option left out, as callers do
    }, note=note)


def _size(rng, device, vocab_cpu=48):
    """(batch, depth, vocab): small under the interpreter."""
    if big(device):
        return int(rng.integers(1, 17)), int(rng.integers(1, 8)), int(rng.integers(2, 4096))
    return 1, int(rng.integers(1, 3)), int(rng.integers(2, vocab_cpu))


def mixed(rng, device, launch):
    """Greedy, one-hot q (accept with p(x), resample without x) or draft logits from the cache
    (accept with p/q, resample from max(p - q, 0)), one mode per case."""
    b, k, v = _size(rng, device)
    mode = pick(rng, ("greedy", "one-hot q", "draft logits"))
    return _case(rng, batch=b, depth=k, vocab=v, greedy_share=1.0 if mode == "greedy" else 0.1,
                 draft_logits=mode == "draft logits", note=mode)


def ulp_ties(rng, device, launch):
    """Greedy rows whose two largest logits are one float32 ulp apart near 0 (|logit| < 0.25), the larger at the
    higher token: the argmax is the higher token, but the exponentials of the two round to one float32, so a
    verifier that takes the argmax of probabilities (or of exp(logits)) sees a tie and emits the lower one.
    The drafts propose either of the two, so both a wrong accept and a wrong reject show."""
    b, k, v = _size(rng, device)
    v = max(v, 2)
    target = torch.from_numpy(rng.uniform(-0.25, 0.2, (b, k + 1, v)).astype(np.float32))
    for row in target.view(-1, v):
        low, high = sorted(rng.choice(v, 2, replace=False).tolist())
        top = np.float32(rng.uniform(-0.2, 0.2))
        row.clamp_(max=float(top) - 0.01)
        row[low], row[high] = float(top), float(np.nextafter(top, np.float32(1)))
    case = _case(rng, batch=b, depth=k, vocab=v, greedy_share=1.0, target=target, placeholder_share=0.0,
                 note="greedy, top two logits one ulp apart")
    drafts = case.inputs["draft_tokens"]
    for i in range(b):
        for step in range(k):
            order = target[i, step].argsort(descending=True)
            drafts[i, step] = int(order[int(rng.integers(2))])
    return case


def placeholders(rng, device, launch):
    """-1 drafts (always rejected) in greedy and probabilistic requests."""
    b, k, v = _size(rng, device)
    return _case(rng, batch=b, depth=k, vocab=v, greedy_share=0.4, draft_logits=bool(rng.integers(2)),
                 placeholder_share=0.5, note="placeholders")


def padded(rng, device, launch):
    """Inert requests (slot -1) and output rows past the batch that must keep their sentinels."""
    b, k, v = _size(rng, device)
    return _case(rng, batch=b + 1, depth=k, vocab=v, inert_share=0.5, pad_out=int(rng.integers(1, 4)),
                 note="inert and padded rows")


def zero_width(rng, device, launch):
    """No requests, over an empty vocabulary (which only a request needs: the launcher must return before
    refusing it), or depth 0 (only the bonus row)."""
    if rng.integers(2):
        return _case(rng, batch=0, depth=int(rng.integers(0, 3)), vocab=0, pad_out=2, note="no requests, vocab 0")
    b, _, v = _size(rng, device)
    return _case(rng, batch=b, depth=0, vocab=v, note="depth 0")


def shared_drafts(rng, device, launch):
    """Every request proposes the same drafts (parallel samples of one prompt): draft_tokens is one row
    expanded to the batch, a view whose rows all have stride 0."""
    b, k, v = _size(rng, device)
    case = _case(rng, batch=max(b, int(rng.integers(2, 4))), depth=k, vocab=v, greedy_share=0.5,
                 draft_logits=bool(rng.integers(2)), note="one draft row for every request")
    drafts = case.inputs["draft_tokens"]
    case.inputs["draft_tokens"] = drafts[:1].expand_as(drafts)
    return case


def tiny_vocab(rng, device, launch):
    """One- and two-token vocabularies, greedy and sampled: a bonus or resample that drops a token it must
    keep (token 0 included) leaves one choice or none."""
    b, k, _ = _size(rng, device)
    vocab = pick(rng, (1, 2))
    return _case(rng, batch=b, depth=k, vocab=vocab, draft_logits=bool(rng.integers(2)), note=f"vocab {vocab}")


def nonfinite(rng, device, launch):
    """NaN and +-inf target and draft logits: every emitted token must be in range."""
    b, k, v = _size(rng, device, vocab_cpu=24)
    target = random_logits(rng, (b, k + 1, v))
    for value in (float("nan"), float("inf"), float("-inf")):
        target[torch.from_numpy(rng.random(tuple(target.shape)) < 0.1)] = value
    target[int(rng.integers(b)), int(rng.integers(k + 1))] = pick(rng, (float("-inf"), float("nan"), float("inf")))
    case = _case(rng, batch=b, depth=k, vocab=v, target=target, draft_logits=bool(rng.integers(2)), note="nonfinite")
    if "draft_logits" in case.inputs:
        case.inputs["draft_logits"][torch.from_numpy(rng.random(tuple(case.inputs["draft_logits"].shape)) < 0.1)] = \
            pick(rng, (float("nan"), float("inf"), float("-inf")))
    return case


def long_vocab(rng, device, launch):
    """Vocabularies of many tiles (128k on the GPU)."""
    vocab = pick(rng, (32000, 128256, 131072) if big(device) else (100, 200))
    return _case(rng, batch=int(rng.integers(1, 5 if big(device) else 2)),
                 depth=int(rng.integers(1, 3 if big(device) else 2)), vocab=vocab,
                 draft_logits=bool(rng.integers(2)), note=f"vocab {vocab}")


def ties(rng, device, launch):
    """Logits on a few levels: greedy argmax ties go to the lowest token."""
    b, k, v = _size(rng, device)
    target = torch.from_numpy(rng.integers(0, 3, (b, k + 1, v)).astype(np.float32))
    return _case(rng, batch=b, depth=k, vocab=v, target=target, greedy_share=0.7, note="tied logits")


def _any_mode(rng, device, launch):
    """Greedy and sampled requests, draft logits or one-hot q, inert rows, output rows past the batch."""
    b, k, v = _size(rng, device)
    return _case(rng, batch=b + int(rng.integers(0, 2)), depth=k, vocab=v, draft_logits=bool(rng.integers(2)),
                 inert_share=0.2, pad_out=int(rng.integers(0, 3)), placeholder_share=0.2)


# Strided target logits, drafts, outputs and draft logits: the kernel must follow each tensor's strides
# and leave the skipped bytes alone.
layouts = laid_out(_any_mode, "target_logits", "draft_tokens", "out_tokens", "draft_logits")


def extremes(rng, device, launch):
    """Probabilities exactly 0 on the target side, the draft side or both (logits -inf, and temperatures
    near 0, which leave all mass on the row max), with drafts proposing those tokens: a token of target
    probability 0 must be rejected whatever u and q(x). Also drafts out of range (V, 2^31 - 1, 2^62),
    seeds at the int64 limits, positions near 2^62, and vocabularies up to 256k on the GPU."""
    b, k, v = _size(rng, device)
    if big(device) and rng.integers(3) == 0:
        b, v = min(b, 4), pick(rng, LONG_VOCABS)
    side = pick(rng, ("target", "draft", "both", "both"))
    case = _case(rng, batch=b, depth=k, vocab=v, greedy_share=0.1, draft_logits=rng.integers(4) > 0,
                 placeholder_share=0.0, note=f"p = 0 on the {side} side, vocab {v}")
    inputs = case.inputs
    target, cached, drafts = inputs["target_logits"], inputs.get("draft_logits"), inputs["draft_tokens"]
    zero = torch.from_numpy(rng.random((b, k + 1, v)) < 0.3)
    if side != "draft":
        target[zero] = float("-inf")
    live = inputs["idx_mapping"] >= 0
    if cached is not None and side != "target":
        slots = inputs["idx_mapping"][live].long()
        cached[slots] = cached[slots].masked_fill(zero[live, :k], float("-inf"))
    for i in range(b):
        for step in range(k):
            candidates = zero[i, step].nonzero().flatten()
            if len(candidates) and rng.random() < 0.6:
                drafts[i, step] = int(candidates[int(rng.integers(len(candidates)))])
            elif rng.random() < 0.1:
                drafts[i, step] = pick(rng, (v, v - 1, 0, INT32_MAX, 2**62))
    inputs["positions"] = extreme_keys(rng, inputs["temperature"], inputs["seeds"], b)
    return case


def tiles(rng, device, launch):
    """Vocabularies one below, at and one above one and two vocab tiles of the launch shape, with the
    row max tied exactly at two tokens, inside one tile or across tiles (first and last lane of a tile,
    the last token): greedy takes the lowest, a resample keeps its Gumbel order. Every logit is negative in
    three cases of four (the rows shifted down, ties kept, as log-probabilities are), so a lane past the vocab
    that loaded 0 would win (in half, a greedy argmax with such a load survived 6 cases on the CPU)."""
    vocab, tile = tile_vocab(rng, device, launch)
    b, k, _ = _size(rng, device)
    target = random_logits(rng, (b, k + 1, vocab))
    tie_at_tile_edges(rng, target, tile)
    if rng.random() < 0.75:
        target -= float(target.max()) + float(rng.uniform(1, 100))
    return _case(rng, batch=b, depth=k, vocab=vocab, target=target, greedy_share=0.7,
                 draft_logits=bool(rng.integers(2)), note=f"vocab {vocab}, tile {tile}, tied maxima")


def last_slot_placeholder(rng, device, launch):
    """A sampled request over a one-token vocabulary, with draft logits, in the last slot: token 0 is accepted at
    every step but the last, whose placeholder must be rejected without a read at a token of its own (its
    draft row ends the draft-logits storage: token 1 lies past it)."""
    depth = pick(rng, (1, 2))
    case = _case(rng, batch=1, depth=depth, vocab=1, draft_logits=True, placeholder_share=0.0,
                 note=f"vocab 1, depth {depth}, placeholder last in the last slot")
    inputs = case.inputs
    last = inputs["temperature"].numel() - 1
    inputs["idx_mapping"][0] = last
    inputs["temperature"][last] = float(rng.uniform(0.8, 1.5))
    inputs["draft_tokens"][0] = 0
    inputs["draft_tokens"][0, -1] = -1
    return case


@own_launch()
def huge_vocab(rng, device, launch):
    """Depth 0 and greedy (a sampled step takes a minute under the interpreter) over a vocabulary one past
    Triton's largest tile: the launcher's own tile must stay capped, its power of two (2^21) does not build."""
    return _case(rng, batch=1, depth=0, vocab=HUGE_VOCAB, greedy_share=1.0,
                 note=f"vocab {HUGE_VOCAB}, greedy, depth 0")


def big_offsets(rng, device, launch, layout):
    """On the GPU, one view per family whose last row lies 2^31 elements past its first, which int32 offset
    arithmetic wraps; only its rows are written (an 8.6 GB view). ``steps``: one request's three target rows
    (two drafts, the bonus) 2^30 elements apart, so the bonus row's step offset passes 2^31. ``draft_logits``:
    the drafter's logits of 4-6 request slots spread over 2^31 elements, the last slot's held by a request.
    Else three requests whose ``target_logits``, ``draft_tokens`` or ``out_tokens`` rows lie 2^30 elements
    apart: the last request's row offset passes 2^31. The CPU runs the same layouts with rows a few thousand
    elements apart (the guard fill of 8 GB is too slow there)."""
    reach = offset_reach(rng, device)
    vocab = int(rng.integers(2, 4096 if big(device) else 48))
    by_step = layout == "steps"
    by_slot = layout == "draft_logits"
    case = _case(rng, batch=1 if by_step else 3, depth=2, vocab=vocab, greedy_share=0.0 if by_slot else 0.5,
                 draft_logits=by_slot or bool(rng.integers(2)), placeholder_share=0.0)
    if by_slot:
        _last_slot_used(rng, case.inputs)
    name = "target_logits" if by_step else layout
    case.inputs[name] = spread(case.inputs[name], 1 if by_step else 0, reach)
    rows = case.inputs[name].shape[1 if by_step else 0]
    where = "steps" if by_step else "slot rows" if by_slot else "request rows"
    case.note = f"{name} {where} {reach // (rows - 1)} elements apart"
    return case


def _last_slot_used(rng, inputs) -> None:
    """Relabel request slots so a request holds the highest one (the row a slot offset reaches farthest): its
    slot and the highest swap places in the mapping and in every input indexed by slot."""
    mapping, last = inputs["idx_mapping"], len(inputs["temperature"]) - 1
    held = int(mapping[int(rng.integers(len(mapping)))])
    was_last, was_held = mapping == last, mapping == held
    mapping[was_last], mapping[was_held] = held, last
    for name in ("temperature", "seeds", "draft_logits"):
        inputs[name][[held, last]] = inputs[name][[last, held]]


def _sampled_temperatures(rng, num_slots: int) -> torch.Tensor:
    """Every slot sampled, at temperatures that keep gaps of tens of logits decisive."""
    return torch.from_numpy(rng.uniform(0.8, 1.5, num_slots).astype(np.float32))


# Each kind is a draft the target must reject at step 0 whatever the uniform; see rejected_drafts.
REJECTED_KINDS = ("placeholder", "out_of_vocab", "zero_probability", "dominated", "uniform_target", "greedy")


def rejected_drafts(rng, device, launch):
    """One request per kind of draft that must be rejected at step 0 whatever u, with draft logits, over a
    vocab that leaves the last tile part empty (V = 2^m + 1): a placeholder over a token 0 the target is sure
    of (and the drafter is not); token id V over a row whose next element (the next row's token 0) is far
    above its maximum; a token both models give probability 0; the target's second choice, 5 above the rest and 30 below
    its first, token 0; a placeholder over a target row of only -inf (p uniform) against a draft that gives
    all but one token more than 1/V (one token keeps a residual, the padded lanes must not); and a greedy
    placeholder whose argmax is token 0. A test or a loop that lets an invalid draft through, reads past the
    row, or skips token 0 emits another token."""
    kinds = [REJECTED_KINDS[i] for i in rng.permutation(len(REJECTED_KINDS))]
    batch, depth, vocab = len(kinds), pick(rng, (1, 2)), pick(rng, (5, 9, 17))
    case = _case(rng, batch=batch, depth=depth, vocab=vocab, draft_logits=True, placeholder_share=0.0,
                 target=random_logits(rng, (batch, depth + 1, vocab), 1.0), note=f"rejected drafts, vocab {vocab}")
    inputs = case.inputs
    target, cached, drafts, slots = (inputs["target_logits"], inputs["draft_logits"], inputs["draft_tokens"],
                                     inputs["idx_mapping"].long())
    cached.copy_(random_logits(rng, tuple(cached.shape), 1.0))
    inputs["temperature"] = _sampled_temperatures(rng, inputs["temperature"].numel())
    for b, kind in enumerate(kinds):
        row, draft_row, x = target[b, 0], cached[slots[b], 0], int(rng.integers(1, vocab))
        if kind in ("placeholder", "greedy"):
            row[0], draft_row[0], x = row.max() + 30, draft_row.min() - 30, -1
            if kind == "greedy":
                inputs["temperature"][slots[b]] = 0.0
        elif kind == "out_of_vocab":
            target[b, 1, 0], x = row.max() + 30, vocab
        elif kind == "zero_probability":
            row[x] = draft_row[x] = float("-inf")
        elif kind == "dominated":  # x leads token 0's rivals by 5
            row[x] = row.max() + 5
            row[0], draft_row[x] = row[x] + 30, draft_row.max() + 30
        else:  # uniform_target
            row[:] = float("-inf")
            draft_row[:] = 0.0
            draft_row[x], x = float("-inf"), -1
        drafts[b, 0] = x
    return case


def agreeing_drafter(rng, device, launch):
    """A drafter whose logits are the target's, bit for bit: every draft is accepted (p(x) = q(x) > u q(x)),
    so requests reach the bonus row through depths 16 to 20, past the 16-lane token vector. From step 1 on each draft
    is the target's least likely token, which only the step's own draft row gives that probability: a read
    of another step's row rejects it. The bonus row is sure of token 0, which no bonus may exclude."""
    return _agreeing(rng, int(rng.integers(16, 21)))


def _two_agreeing_steps(rng, device, launch):
    """agreeing_drafter at depth 2: one step past step 0, whose row offset is 0 whatever the stride."""
    return _agreeing(rng, 2)


def _agreeing(rng, depth: int) -> Case:
    """One sampled request whose draft logits are its target rows (see agreeing_drafter)."""
    vocab = int(rng.integers(3, 25))
    case = _case(rng, batch=1, depth=depth, vocab=vocab, draft_logits=True, placeholder_share=0.0,
                 target=random_logits(rng, (1, depth + 1, vocab), 1.0), note=f"agreeing drafter, depth {depth}")
    inputs = case.inputs
    target, drafts = inputs["target_logits"], inputs["draft_tokens"]
    inputs["temperature"] = _sampled_temperatures(rng, inputs["temperature"].numel())
    for step in range(1, depth):
        x = int(target[0, step].argmin())
        target[0, step, x] -= 10
        drafts[0, step] = x
    target[0, depth, 0] = target[0, depth].max() + 30
    inputs["draft_logits"][inputs["idx_mapping"].long()] = target[:, :depth]
    return case


def _peaked_agreeing_steps(rng, device, launch):
    """agreeing_drafter at depth 3 whose every step row peaks at its last token by a margin of 30. A window of the
    row that starts early misses the peak: softmax statistics of q over a step row addressed with the target's
    stride, shorter than the row-padded draft's, start a few elements early at every step past the first, put q(x)
    far above p(x), and drafts that are always accepted are rejected."""
    case = _agreeing(rng, 3)
    target = case.inputs["target_logits"]
    for step in range(3):
        target[0, step, -1] = target[0, step].max() + 30
    case.inputs["draft_logits"][case.inputs["idx_mapping"].long()] = target[:, :3]
    return case


def empty_residual(rng, device, launch, spread: bool = False):
    """Draft logits that leave no residual max(p - q, 0): a copy of the target row, bit for bit (p = q at any
    temperature), or, at a temperature near 0, another row whose maximum is the target's by a margin of 1 (both
    one-hot on it, every other p and q exactly 0). Each request accepts its first j drafts (the row's argmax,
    p(x) = q(x) > u q(x)) and then proposes a token of p(x) = q(x) = 0, a placeholder or an id past the vocab,
    rejected whatever u: its resample must follow the target row, Gumbel-max over logits / temp. Token 0, which
    an all -inf argmax gives, is outside the target's support in half the requests."""
    b, k, v = _size(rng, device)
    v = max(v, 3)
    if spread:  # two or three vocab tiles (the launcher's own tile is 1024 at most): a best must survive its tile
        tile = launch.get("block_v", 1024)
        v = int(rng.integers(tile + 1, 3 * tile))
    case = _case(rng, batch=b, depth=k, vocab=v, greedy_share=0.0, draft_logits=True, placeholder_share=0.0,
                 note=f"empty residual{', spread' if spread else ''}, vocab {v}")
    inputs = case.inputs
    target, cached, drafts, slots = (inputs["target_logits"], inputs["draft_logits"], inputs["draft_tokens"],
                                     inputs["idx_mapping"].long())
    temps = inputs["temperature"]
    for slot in range(temps.numel()):
        if spread:
            temps[slot] = rng.uniform(1.0, 2.0)
        else:
            temps[slot] = pick(rng, NEAR_ZERO_TEMPERATURES) if rng.integers(2) else rng.uniform(0.25, 2.0)
    for i in range(b):
        one_hot = not spread and float(temps[slots[i]]) <= max(NEAR_ZERO_TEMPERATURES) and bool(rng.integers(2))
        rejected_at = int(rng.integers(0, k if spread else k + 1))
        for step in range(k):
            row = target[i, step]
            if spread:  # logits within [-1, 1]: at temperatures 1-2 the resample lands off the argmax most times
                row /= row.abs().max().clamp(min=1e-30)
            y = int(row.argmax())
            if not spread:
                row[y] = row.max() + 1  # the margin that makes the row one-hot near temperature 0
            outside = torch.from_numpy(rng.random(v) < 0.3)
            outside[0] = bool(rng.integers(2))
            outside[pick(rng, [t for t in range(v) if t != y])] = True
            outside[y] = False
            row[outside] = float("-inf")
            if one_hot:
                q = random_logits(rng, (v,))
                q[y] = q.max() + 1
                cached[slots[i], step] = q
            else:
                cached[slots[i], step] = row
            if step < rejected_at:
                drafts[i, step] = y
            elif step == rejected_at:
                zero = outside.nonzero().flatten()
                # a placeholder resamples as a bonus would, outside the residual: spread cases leave it out
                past = (v, 2**62) if spread else (-1, v, 2**62)
                unsupported = (int(zero[int(rng.integers(len(zero)))]),) * 3 + past
                drafts[i, step] = pick(rng, unsupported)
    return case


def empty_residual_spread(rng, device, launch):
    """``empty_residual`` with every request rejected, at temperatures 1 to 2 over logits within [-1, 1]: the
    resample from the target row is spread over its support, so a fallback that takes the row's argmax, or
    scores p or q instead of logits / temp, emits another token in most requests. The vocabulary spans two or
    three vocab tiles, so a fallback that forgets an earlier tile's best shows too."""
    return empty_residual(rng, device, launch, spread=True)


def greedy_threshold(rng, device, launch):
    """Temperatures at the greedy threshold (0, -0, NaN, one ulp below 0: greedy; one ulp above: sampled, every
    positive logit +inf and sharing all mass) over integer target and draft logits whose row maximum two or
    three tokens share exactly: greedy accepts only the lowest tied token, a sampled step any positive one."""
    b = int(rng.integers(1, 9 if big(device) else 4))
    k, v = int(rng.integers(1, 4)), int(rng.integers(2, 4096 if big(device) else 32))
    target = tied_integer_logits(rng, (b, k + 1, v))
    case = _case(rng, batch=b, depth=k, vocab=v, target=target, draft_logits=bool(rng.integers(2)),
                 note=f"vocab {v}, threshold temperatures")
    inputs = case.inputs
    inputs["temperature"] = threshold_temperatures(rng, inputs["temperature"].numel(), int(inputs["idx_mapping"][0]))
    if "draft_logits" in inputs:
        inputs["draft_logits"] = tied_integer_logits(rng, tuple(inputs["draft_logits"].shape))
    return case


def _uniform_target_case(rng, device, launch, b: int, k: int, what: str) -> tuple[Case, int]:
    """A sampled case of ``b`` requests at depth ``k`` whose target rows are each all -inf or all NaN (p uniform),
    over a vocab one past a power of two or past the swept tile (its last tile about half padding); and the vocab."""
    vocab = launch.get("block_v", 2 ** int(rng.integers(1, 12 if big(device) else 6))) + 1
    target = torch.from_numpy(rng.choice(np.array([float("-inf"), float("nan")], dtype=np.float32), (b, k + 1, 1)))
    case = _case(rng, batch=b, depth=k, vocab=vocab, target=target.expand(b, k + 1, vocab).contiguous(),
                 greedy_share=0.0, placeholder_share=0.0, note=f"{what}, vocab {vocab}")
    return case, vocab


def uniform_rows(rng, device, launch):
    """Sampled requests whose target rows are all -inf or all NaN (p uniform over the vocabulary) under
    constant draft rows (q uniform too): p = q, so every draft is accepted. The vocab is one past a power of
    two or past the swept tile, so its last tile is about half padding: a uniform p counts the vocab's lanes
    only, and padding that weighs in lowers p(x) below q(x) and rejects."""
    batch, k, _ = _size(rng, device)
    b = min(batch, 4)  # each step's accept test is the point, not the batch: a GPU-sized case stays cheap
    case, vocab = _uniform_target_case(rng, device, launch, b, k, "uniform rows")
    levels = rng.standard_normal((case.inputs["temperature"].numel(), k, 1)).astype(np.float32)
    case.inputs["draft_logits"] = torch.from_numpy(levels).expand(-1, -1, vocab).contiguous()
    return case


def uniform_rejected(rng, device, launch):
    """Sampled requests whose target rows are all -inf or all NaN (p uniform over the vocabulary) under draft
    rows that give each drafted token most of their mass (q(x) well above 1 / V): drafts are mostly rejected
    and resampled from max(p - q, 0), uniform over the tokens q gives less than p. The vocab is one past a
    power of two or past the swept tile, so its last tile is about half padding: padding lanes hold no p, and
    a residual that counts them resamples a token past the vocabulary. Two to four requests on every device:
    a padding lane wins a resample about one time in three."""
    _, k, _ = _size(rng, device)
    b = int(rng.integers(2, 5))
    case, vocab = _uniform_target_case(rng, device, launch, b, k, "uniform rows, peaked drafts")
    drafts = torch.from_numpy(rng.integers(0, vocab, (b, k)))
    cached = torch.from_numpy(rng.standard_normal((case.inputs["temperature"].numel(), k, vocab)).astype(np.float32))
    slots = case.inputs["idx_mapping"].long()
    for row in range(b):
        cached[slots[row], torch.arange(k), drafts[row]] += 12.0
    case.inputs["draft_tokens"], case.inputs["draft_logits"] = drafts, cached
    return case


def last_token_max(rng, device, launch):
    """Rows over a vocabulary one past one or two vocab tiles of the launch shape (the launcher's own tile is
    capped at 1024), whose maximum is the last token, 60 to 80 above the rest: the last tile holds that token
    alone, so a loop over the vocabulary that stops a tile early, or a tile's mask one short, emits another
    token, greedy or sampled (the gap is past any Gumbel noise). The drafts propose the last token (accepted)
    or the runner-up (rejected, the last token emitted); half the rows sample."""
    tile = launch.get("block_v") or default_block_v(1025)
    vocab = tile * int(rng.integers(1, 3)) + 1
    b, k, _ = _size(rng, device)
    target = random_logits(rng, (b, k + 1, vocab))
    target[..., -1] = target.amax(-1) + float(rng.uniform(60, 80))
    case = _case(rng, batch=b, depth=k, vocab=vocab, target=target, greedy_share=0.5, placeholder_share=0.0,
                 note=f"vocab {vocab}, tile {tile}, maximum at the last token")
    runner_up = target[..., :-1].argmax(-1)
    proposes_last = torch.from_numpy(rng.random(tuple(runner_up[:, :k].shape)) < 0.5)
    case.inputs["draft_tokens"] = torch.where(proposes_last, vocab - 1, runner_up[:, :k])
    return case


def unsupported_drafts(rng, device, launch):
    """Sampled requests with draft logits whose every draft is a token the drafter gave probability 0: its draft
    logit -inf, or 1000 below its row's maximum (float32 exp underflows to 0 at every temperature drawn), while
    the target gives it a logit within 2 of its row's maximum. p(x) > 0 = u q(x): every draft is accepted and
    the bonus follows. A verifier that rejects a draft of q(x) = 0 (a test of p / q that needs q > 0) stops at
    the first."""
    b, k, v = _size(rng, device)
    v = max(v, 2)
    case = _case(rng, batch=b, depth=k, vocab=v, greedy_share=0.0, draft_logits=True, placeholder_share=0.0,
                 note="every draft outside the drafter's support")
    inputs = case.inputs
    target, cached, drafts = inputs["target_logits"], inputs["draft_logits"], inputs["draft_tokens"]
    for b_row, slot in enumerate(inputs["idx_mapping"].tolist()):
        if slot < 0:
            continue
        for step in range(k):
            x = int(rng.integers(v))
            drafts[b_row, step] = x
            target[b_row, step, x] = float(target[b_row, step].max()) - float(rng.uniform(0, 2))
            row = cached[slot, step]
            row[x] = float("-inf") if rng.random() < 0.5 else float(row.max()) - 1000.0
    return case


def overconfident_drafter(rng, device, launch):
    """Sampled requests given log-probabilities (every logit <= 0, as a verifier fed log-softmax rows sees them)
    at temperatures near 1, whose every draft is a token both models favour, the drafter more: p(x) in [0.3, 0.6],
    q(x) in [0.9, 0.99], the rest of each row spread thinly. A draft is rejected about half the time, and its
    resample from max(p - q, 0) never emits x: a resample that keeps tokens by another quantity than p > q (a
    score, a logit) falls back to the target row and emits x about as often as p(x)."""
    b, k, v = _size(rng, device)
    if not big(device):  # several requests even under the interpreter: each rejects about half the time
        b = int(rng.integers(4, 9))
    v = max(v, 3)
    case = _case(rng, batch=b, depth=k, vocab=v, greedy_share=0.0, draft_logits=True, placeholder_share=0.0,
                 note=f"overconfident drafter, vocab {v}")
    inputs = case.inputs
    inputs["temperature"] = torch.from_numpy(rng.uniform(0.9, 1.1, inputs["temperature"].numel()).astype(np.float32))
    target, cached, drafts = inputs["target_logits"], inputs["draft_logits"], inputs["draft_tokens"]
    for b_row, slot in enumerate(inputs["idx_mapping"].tolist()):
        for step in range(k):
            x = int(rng.integers(v))
            drafts[b_row, step] = x
            target[b_row, step] = _log_probabilities(rng, v, x, rng.uniform(0.3, 0.6))
            if slot >= 0:
                cached[slot, step] = _log_probabilities(rng, v, x, rng.uniform(0.9, 0.99))
    return case


def _log_probabilities(rng, vocab: int, token: int, mass: float) -> torch.Tensor:
    """log of a distribution that gives ``token`` probability ``mass`` and spreads the rest by a softmax."""
    rest = np.exp(rng.standard_normal(vocab))
    rest[token] = 0.0
    probs = rest / rest.sum() * (1.0 - mass)
    probs[token] = mass
    return torch.from_numpy(np.log(probs).astype(np.float32))


FAMILIES = {"mixed": mixed, "placeholders": placeholders, "padded": padded, "zero_width": zero_width,
            "nonfinite": nonfinite, "long_vocab": long_vocab, "ties": ties, "layouts": layouts,
            "extremes": extremes, "tiles": tiles, "tiny_vocab": tiny_vocab,
            "shared_drafts": shared_drafts, "rejected_drafts": rejected_drafts, "agreeing_drafter": agreeing_drafter,
            # draft logits row-padded, the target not: their step strides differ, so only a step row addressed with
            # the draft's own stride holds its q
            "agreeing_layouts": laid_out(_two_agreeing_steps, "draft_logits"),
            # the same for the softmax statistics of q, which read a step's whole row: each row peaks at its last
            # token, which a window addressed with the target's shorter stride leaves out
            "agreeing_peaked_layouts": laid_out(_peaked_agreeing_steps, "draft_logits"),
            "huge_vocab": huge_vocab, "last_slot_placeholder": last_slot_placeholder,
            "empty_residual": empty_residual, "empty_residual_spread": empty_residual_spread, "ulp_ties": ulp_ties,
            "greedy_threshold": greedy_threshold, "uniform_rows": uniform_rows, "uniform_rejected": uniform_rejected,
            "unsupported_drafts": unsupported_drafts, "last_token_max": last_token_max,
            "overconfident_drafter": overconfident_drafter,
            **one_per_value(big_offsets, "layout", ("steps", "target_logits", "draft_tokens", "out_tokens",
                                                           "draft_logits"))}


def target_distribution(rng, device, launch):
    """Many trials of one request (see stress.oracles.distribution): greedy, one-hot q, or drawn drafts.

    Under the interpreter a sampled trial costs ~90 ms, so CPU cases are a smoke version: 9 in 10
    greedy (4 trials), else one-hot q with two equally likely tokens, one draft step and 16
    trials (8 expected per bin; an accept test that ignores u empties the draft's bin:
    chi-square 16 > 15.1). Drawn drafts (a second kernel per trial) run on the GPU only; on the
    CPU the draft-logits path is covered exactly by rejection.verify.
    """
    mode = pick(rng, ("greedy", "one_hot", "draft_logits") if big(device) else ("greedy",) * 9 + ("one_hot",))
    if big(device):
        trials, depth, vocab = 20000, int(rng.integers(1, 4)), int(rng.integers(2, 64))
        target = random_logits(rng, (depth + 1, vocab), rng.uniform(0.5, 2.0))
        temperature = float(pick(rng, (0.6, 1.0)))
    else:
        trials, depth, vocab = 4 if mode == "greedy" else 16, 1, 2
        target = torch.zeros(depth + 1, vocab)
        target[:, int(rng.integers(2))] = float(mode == "greedy")  # greedy needs an argmax to check
        temperature = 1.0
    if mode == "greedy":
        temperature = 0.0
    drafts = _drafts_near_argmax(rng, target)
    draft_logits = None
    if mode == "draft_logits":
        draft_logits = target[:depth] + random_logits(rng, (depth, vocab), 0.7)
    return _trials_case(rng, mode, trials, target, drafts, draft_logits, temperature)


def distribution_long_vocab(rng, device, launch):
    """The chi-square at a 128k vocabulary (GPU): peaked logits, so merged bins keep real counts;
    greedy or one-hot q (drawn drafts would need a [trials, k, V] logits cache). The CPU runs a
    greedy smoke version over a vocabulary of a few hundred."""
    if big(device):
        mode = pick(rng, ("greedy", "one_hot", "one_hot"))
        trials, depth, vocab = 20000, int(rng.integers(1, 3)), 128256
        target = random_logits(rng, (depth + 1, vocab), rng.uniform(4.0, 8.0))
        temperature = 0.0 if mode == "greedy" else float(pick(rng, (0.6, 1.0)))
    else:
        mode, trials, depth, vocab, temperature = "greedy", 4, 1, int(rng.integers(300, 600)), 0.0
        target = random_logits(rng, (depth + 1, vocab), 1.0)
    return _trials_case(rng, mode, trials, target, _drafts_near_argmax(rng, target), None, temperature)


def _drafts_near_argmax(rng, target: torch.Tensor) -> torch.Tensor:
    """One draft per position but the last: the target argmax 4 times in 5 (often accepted), else any token."""
    depth, vocab = target.shape[0] - 1, target.shape[1]
    return torch.where(torch.from_numpy(rng.random(depth) < 0.8), target.argmax(-1)[:depth],
                       torch.from_numpy(rng.integers(0, vocab, depth)))


def _trials_case(rng, mode, trials, target, drafts, draft_logits, temperature) -> Case:
    """``trials`` trials of one request: the same logits and drafts, a seed and a position each."""
    return Case(inputs={"target_logits": target, "draft_tokens": drafts, "draft_logits": draft_logits,
                        "temperature": temperature, "seeds": seeds(rng, trials),
                        "positions": torch.from_numpy(rng.integers(0, 2**33, trials, dtype=np.int64))},
                note=f"{mode}, {trials} trials, k={target.shape[0] - 1}, V={target.shape[1]}")


DISTRIBUTION_FAMILIES = {"target_distribution": target_distribution, "long_vocab": distribution_long_vocab}
