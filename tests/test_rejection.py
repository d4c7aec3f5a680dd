"""kernels.rejection.verify: hand-worked cases, then kernel == reference on random inputs."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels import runtime
from kernels.rejection import verify
from kernels.sampling import gumbel_sample
from reference import philox
from reference import rejection as ref
from reference.sampling import sample_row
from stress.core.compare import Divergence, Tolerated, exact_unless_near_tie

NAN, INF = float("nan"), float("inf")
SENTINEL = -7777


def _verify(target, drafts, temps, slots=None, seeds=None, positions=None, pad=0, draft_logits=None, **knobs):
    """Run the kernel on small literal inputs; returns (tokens, num_sampled, num_rejected) as lists."""
    target = torch.as_tensor(target, dtype=torch.float32)
    batch, rows = target.shape[0], target.shape[1]
    num_slots = len(temps)
    inputs = {
        "target_logits": target, "draft_tokens": torch.as_tensor(drafts, dtype=torch.int64).reshape(batch, rows - 1),
        "idx_mapping": torch.tensor(slots if slots is not None else list(range(batch)), dtype=torch.int32),
        "temperature": torch.tensor(temps, dtype=torch.float32),
        "seeds": torch.tensor(seeds if seeds is not None else [11] * num_slots, dtype=torch.int64),
        "positions": torch.tensor(positions if positions is not None else [5] * batch, dtype=torch.int64),
        "out_tokens": torch.full((batch + pad, rows), SENTINEL, dtype=torch.int64),
        "num_sampled": torch.full((batch + pad,), SENTINEL, dtype=torch.int32),
        "num_rejected": torch.full((batch + pad,), SENTINEL, dtype=torch.int32),
        "draft_logits": None if draft_logits is None else torch.as_tensor(draft_logits, dtype=torch.float32),
    }
    dev = runtime.device()
    args = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    verify(**args, **knobs)
    return [args[k].cpu().tolist() for k in ("out_tokens", "num_sampled", "num_rejected")]


def _spikes(*tokens, vocab=6, height=50.0):
    rows = torch.zeros(len(tokens), vocab)
    for i, t in enumerate(tokens):
        rows[i, t] = height
    return rows


def test_greedy_accepts_while_draft_is_argmax():
    target = _spikes(2, 4, 1)[None]
    assert _verify(target, [[2, 3]], temps=[0.0]) == [[[2, 4, -1]], [2], [1]]
    assert _verify(target, [[2, 4]], temps=[0.0]) == [[[2, 4, 1]], [3], [0]]
    assert _verify(target, [[5, 4]], temps=[0.0]) == [[[2, -1, -1]], [1], [2]]


@pytest.mark.parametrize("depth", [15, 16, 17, 31, 32])
def test_every_draft_accepted_at_every_depth_around_a_tile_keeps_the_bonus(depth):
    """The emitted tokens' register tile must hold depth + 1 lanes: sized from the drafts alone, a depth of 16 or 32
    accepted whole loses its bonus token to the lane past the tile (one family draws such depths, not every case)."""
    argmax = [(3 * i + 1) % 7 for i in range(depth + 1)]
    target = _spikes(*argmax, vocab=7)[None]
    assert _verify(target, [argmax[:-1]], temps=[0.0]) == [[argmax], [depth + 1], [0]]


ULP = 2.0**-149  # the smallest float32 subnormal: one ulp either side of the greedy threshold


@pytest.mark.parametrize("temp", [0.0, -0.0, -ULP, NAN])
def test_greedy_threshold_accepts_only_the_lowest_tied_maximum(temp):
    """Temperatures not > 0 verify greedily: of the tied maxima (tokens 1 and 3) only the lowest is the argmax."""
    target = [[[1, 2, 0, 2], [1, 2, 0, 2]]]
    assert _verify(target, [[3]], temps=[temp]) == [[[1, -1]], [1], [1]]
    assert _verify(target, [[1]], temps=[temp]) == [[[1, 1]], [2], [0]]


def test_one_ulp_above_zero_samples_among_the_positive_logits():
    """One ulp above 0 samples: every positive logit is +inf and shares all mass (p = 1/3 each). Accepted or not,
    the emitted tokens end in 0 (the lowest of the +inf ties: the resample without 3, or the bonus), never the
    greedy [1, -1]; the reference agrees over many keys."""
    target = torch.tensor([[[1.0, 2, 0, 2], [1, 2, 0, 2]]]).repeat(8, 1, 1)
    tokens, sampled, rejected = _verify(target, [[3]] * 8, temps=[ULP] * 8, positions=list(range(8)))
    assert all(row in ([3, 0], [0, -1]) for row in tokens) and [3, 0] in tokens and [0, -1] in tokens
    want = ref.verify(target, torch.full((8, 1), 3), torch.arange(8, dtype=torch.int32), torch.full((8,), ULP),
                      torch.full((8,), 11), torch.arange(8), torch.full((8, 2), SENTINEL),
                      torch.full((8,), SENTINEL, dtype=torch.int32), torch.full((8,), SENTINEL, dtype=torch.int32))
    assert tokens == want[0].value.tolist() and sampled == want[1].value.tolist()


def test_placeholder_draft_token_rejected():
    """-1 never matches in greedy mode and never passes the accept test when sampling."""
    target = _spikes(0, 3)[None]
    assert _verify(target, [[-1]], temps=[0.0]) == [[[0, -1]], [1], [0]]
    tokens, sampled, _ = _verify(torch.zeros(1, 2, 6), [[-1]], temps=[1.0])
    assert sampled == [1] and 0 <= tokens[0][0] < 6 and tokens[0][1] == -1


def test_num_rejected_counts_only_the_requests_own_drafts():
    """Trailing placeholders pad a shorter request to k: upstream gives that request d + 1 logit rows,
    so it reports d + 1 - num_sampled; a placeholder before a real draft is a rejected draft."""
    target = _spikes(2, 4, 1, 3)[None]
    assert _verify(target, [[2, -1, -1]], temps=[0.0]) == [[[2, 4, -1, -1]], [2], [0]]
    assert _verify(target, [[5, -1, -1]], temps=[0.0]) == [[[2, -1, -1, -1]], [1], [1]]
    assert _verify(target, [[2, -1, 1]], temps=[0.0]) == [[[2, 4, -1, -1]], [2], [2]]
    assert _verify(target, [[-1, -1, -1]], temps=[0.0]) == [[[2, -1, -1, -1]], [1], [0]]
    tokens, sampled, rejected = _verify(target * 4, [[2, 4, -1]], temps=[1.0])
    assert tokens[0][:2] == [2, 4] and sampled == [3] and rejected == [0]


def _zero_probability_case(seed: int) -> dict:
    """Draft 0 has probability exactly 0 on the target side and on the draft side (logit -inf),
    so the pre-fix test p(x) >= u q(x) reads 0 >= 0 and accepts it."""
    target = torch.zeros(2, 2, 4)
    target[:, 0, 0] = -INF
    q = torch.zeros(2, 1, 4)
    q[:, 0, 0], q[:, 0, 1] = -INF, 3.0  # the residual max(p - q, 0) lives on tokens 2 and 3
    return {"target": target, "drafts": [[0], [0]], "temps": [1.0, 0.5], "seeds": [seed, seed + 1],
            "draft_logits": q}


@pytest.mark.parametrize("seed", range(4))
def test_zero_target_probability_is_never_accepted(seed):
    """Upstream accepts iff log p(x) > log u + log q(x): p(x) = 0 fails for every u, even with q(x) = 0."""
    case = _zero_probability_case(seed)
    tokens, sampled, rejected = _verify(case["target"], case["drafts"], case["temps"], seeds=case["seeds"],
                                        draft_logits=case["draft_logits"])
    assert sampled == [1, 1] and rejected == [1, 1]
    assert all(row[0] in (2, 3) for row in tokens)


def test_zero_probability_is_judged_not_excused_as_a_near_tie():
    """A real difference of zero (p(x) = q(x) = 0) is a certain rejection: the reference must not flag it
    as a near tie, or exact_unless_near_tie would tolerate a kernel that accepts it."""
    case = _zero_probability_case(0)
    inputs = {"target_logits": case["target"], "draft_tokens": torch.tensor(case["drafts"]),
              "idx_mapping": torch.tensor([0, 1], dtype=torch.int32), "temperature": torch.tensor(case["temps"]),
              "seeds": torch.tensor(case["seeds"]), "positions": torch.tensor([5, 5]),
              "out_tokens": torch.full((2, 2), SENTINEL), "num_sampled": torch.full((2,), SENTINEL, dtype=torch.int32),
              "num_rejected": torch.full((2,), SENTINEL, dtype=torch.int32), "draft_logits": case["draft_logits"]}
    out_tokens, num_sampled, _ = ref.verify(**inputs)
    assert not out_tokens.near_tie.any()
    accepted = out_tokens.value.clone()
    accepted[:, 0] = 0  # what the pre-fix kernel emits: the draft, then a bonus
    assert isinstance(exact_unless_near_tie("out_tokens", out_tokens, accepted), Divergence)
    assert isinstance(exact_unless_near_tie("num_sampled", num_sampled, torch.tensor([2, 2], dtype=torch.int32)),
                      Divergence)


def _empty_residual_case(temp: float, seeds: list[int]) -> dict:
    """One request per seed whose draft logits are the target's, bit for bit, so p = q exactly and p - q is 0
    at every token: the residual is empty. Tokens 0 and 1 have logit -inf in both, so p = q = 0 there, and
    draft 1 is rejected whatever u. Token 0, the all -inf argmax, is a token the target never emits."""
    row = torch.tensor([-INF, -INF, 1.0, 2.5, 0.5, 2.0])
    batch = len(seeds)
    return {"target": row.expand(batch, 2, 6).clone(), "drafts": [[1]] * batch, "temps": [temp] * batch,
            "seeds": seeds, "positions": [9 + 4 * i for i in range(batch)],
            "draft_logits": row.expand(batch, 1, 6).clone()}


@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_empty_residual_resamples_from_the_target(temp):
    """p <= q everywhere: the resample is Gumbel-max over the target row with the rejected step's key, the token
    gumbel_sample draws from that row at that (seed, position), never the all -inf argmax, token 0."""
    case = _empty_residual_case(temp, list(range(8)))
    tokens, sampled, rejected = _verify(case["target"], case["drafts"], case["temps"], seeds=case["seeds"],
                                        positions=case["positions"], draft_logits=case["draft_logits"])
    dev = runtime.device()
    expected = gumbel_sample(case["target"][:, 0].to(dev), torch.arange(8, dtype=torch.int32, device=dev),
                             torch.tensor(case["temps"], device=dev), torch.tensor(case["seeds"], device=dev),
                             torch.tensor(case["positions"], device=dev)).cpu().tolist()
    assert sampled == [1] * 8 and rejected == [1] * 8
    assert [row[0] for row in tokens] == expected
    assert set(expected) <= {2, 3, 4, 5} and len(set(expected)) > 1  # sampled from p, not one fixed token


@pytest.mark.parametrize("temp", [1e-3, 1e-30])
def test_empty_residual_near_zero_temperature_emits_the_target_argmax(temp):
    """Target and draft both one-hot on token 3 (every other p and q underflow to exactly 0) and a rejected
    draft of probability 0: the target row itself puts all its mass on 3."""
    case = _empty_residual_case(temp, [5, -(2**63), 2**63 - 1])
    tokens, sampled, _ = _verify(case["target"], case["drafts"], case["temps"], seeds=case["seeds"],
                                 positions=case["positions"], draft_logits=case["draft_logits"])
    assert [row[0] for row in tokens] == [3, 3, 3] and sampled == [1, 1, 1]


def _reference_inputs(case: dict) -> dict:
    batch, rows = len(case["drafts"]), len(case["drafts"][0]) + 1
    return {"target_logits": case["target"], "draft_tokens": torch.tensor(case["drafts"]),
            "idx_mapping": torch.arange(batch, dtype=torch.int32), "temperature": torch.tensor(case["temps"]),
            "seeds": torch.tensor(case["seeds"]), "positions": torch.tensor(case["positions"]),
            "out_tokens": torch.full((batch, rows), SENTINEL), "num_sampled": torch.full((batch,), SENTINEL,
                                                                                          dtype=torch.int32),
            "num_rejected": torch.full((batch,), SENTINEL, dtype=torch.int32), "draft_logits": case["draft_logits"]}


@pytest.mark.parametrize("temp", [1.0, 1e-3, 1e-30])
def test_reference_decides_an_empty_residual(temp):
    """Where p is exactly 0 the kernel's p is 0 too, and p - q of an exact copy is 0: the reference knows the
    residual is empty and judges the fallback token instead of calling every token a near tie."""
    case = _empty_residual_case(temp, list(range(4)))
    out_tokens, _, _ = ref.verify(**_reference_inputs(case))
    assert not out_tokens.near_tie.any()
    for b in range(4):
        fallback, tie = sample_row(case["target"][b, 0], temp, case["seeds"][b], case["positions"][b])
        assert not tie and int(out_tokens.value[b, 0]) == fallback


def test_reference_leaves_an_undecidable_residual_undecided():
    """q a hair above p at one token and below it at another (by far less than float32 rounding): the kernel's
    residual may be empty or hold either token, so the reference must not claim to know the resample."""
    case = _empty_residual_case(1.0, [0])
    case["draft_logits"][0, 0, 3] += 1e-6
    case["draft_logits"][0, 0, 4] -= 1e-6
    out_tokens, _, _ = ref.verify(**_reference_inputs(case))
    assert out_tokens.near_tie.all()


def test_softmax_is_exact_where_the_kernels_p_is_zero():
    """Below EXP_ZERO (-111) the kernel's float32 exp is 0, so its p is exactly 0: the reference's p is 0 there
    with no bound. Above it p keeps its floor (-100: a float32 subnormal, or 0 where subnormals are flushed)."""
    p, tol = ref.softmax(torch.tensor([0.0, -INF, -111.5, -800.0, NAN, -100.0]), 1.0)
    assert (p[1:5] == 0).all() and (tol[1:5] == 0).all()
    assert p[5] > 0 and tol[5] >= ref.SOFTMAX_ABS and tol[0] > 0


def test_probability_below_float32_exp_underflow_is_rejected():
    """p(x) with a shifted logit of -111.5 is exactly 0 in the kernel (the reference's EXP_ZERO claim) and q(x) is
    0 too: p(x) > u q(x) fails whatever u, and the reference decides it, no near tie. The residual is token 2."""
    target = torch.tensor([[[0.0, -111.5, -1.0], [0.0, 0.0, 0.0]]]).repeat(4, 1, 1)
    q = torch.tensor([[[0.0, -2000.0, -3.0]]]).repeat(4, 1, 1)
    case = {"target": target, "drafts": [[1]] * 4, "temps": [1.0] * 4, "seeds": [0, 1, 2, 3], "positions": [3] * 4,
            "draft_logits": q}
    tokens, sampled, _ = _verify(target, case["drafts"], case["temps"], seeds=case["seeds"], draft_logits=q,
                                 positions=case["positions"])
    assert sampled == [1] * 4 and [row[0] for row in tokens] == [2] * 4
    out_tokens, num_sampled, _ = ref.verify(**_reference_inputs(case))
    assert not out_tokens.near_tie.any() and num_sampled.value.tolist() == [1] * 4


def test_one_hot_q_accepts_a_draft_the_target_is_sure_of_at_the_largest_uniform():
    """With one-hot q the resample excludes x, so a p one-hot on x must never be rejected (nothing would be left):
    p(x) = exp(0) / exp(0) = 1 exactly, every other exp 0, and Triton's uniform stays below 1. Seed 7 at position
    8263248 draws its largest value, 1 - 2^-24: only a p(x) of exactly 1 passes p(x) > u there."""
    assert float(philox.uniform(philox.randint(7, 8263248))) == 1 - 2.0**-24
    target = torch.zeros(2, 2, 5)
    target[0, 0] = torch.tensor([-INF, -INF, 1.0, -INF, -INF])
    target[1, 0] = torch.tensor([0.0, 0.0, 3.0, 0.0, 0.0])  # at temperature 1e-3 the others lie 3000 below
    tokens, sampled, _ = _verify(target, [[2], [2]], temps=[1.0, 1e-3], seeds=[7, 7], positions=[8263248] * 2)
    assert sampled == [2, 2] and [row[0] for row in tokens] == [2, 2]


def test_probabilistic_accepts_a_certain_draft_and_emits_the_bonus():
    target = _spikes(3, 1, 4, height=200.0)[None]
    assert _verify(target, [[3, 1]], temps=[1.0]) == [[[3, 1, 4]], [3], [0]]


def test_one_hot_resample_never_emits_the_rejected_draft():
    """Draft 0 has probability ~e^-20: rejected, and the resample excludes it."""
    target = torch.zeros(1, 2, 4)
    target[0, :, 0] = -20.0
    for seed in range(6):
        tokens, sampled, _ = _verify(target, [[0]], temps=[1.0], seeds=[seed])
        assert sampled == [1] and tokens[0][0] in (1, 2, 3)


def test_bonus_is_the_gumbel_sample_at_the_same_key():
    """Depth 0: the bonus token of a request equals gumbel_sample on that row and position."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    temps, seeds, positions = [1.0, 0.7, 0.0], [3, -9, 4], [10, 2**35, 7]
    tokens, _, _ = _verify(logits[:, None], torch.zeros(3, 0), temps=temps, seeds=seeds, positions=positions)
    dev = runtime.device()
    sampled = gumbel_sample(logits.to(dev), torch.arange(3, dtype=torch.int32, device=dev),
                            torch.tensor(temps, device=dev), torch.tensor(seeds, device=dev),
                            torch.tensor(positions, device=dev))
    assert [t[0] for t in tokens] == sampled.cpu().tolist()


def test_placeholder_step_is_sampled_from_p_whatever_the_draft_logits_row_holds():
    """A step with no draft has no q: the draft-logits row there, one the request never drafted, must not shape its
    token. Kernel and reference give the bonus gumbel_sample draws at that key, although that row puts almost all
    its mass on p's likeliest token (a residual max(p - q, 0) would never emit it)."""
    batch, vocab = 8, 6
    target = torch.zeros(batch, 2, vocab)
    target[:, 0, 3] = 2.0
    never_drafted = torch.zeros(batch, 1, vocab)
    never_drafted[:, 0, 3] = 50.0
    seeds, positions = list(range(batch)), [5] * batch
    tokens, _, _ = _verify(target, [[-1]] * batch, temps=[1.0] * batch, seeds=seeds, positions=positions,
                           draft_logits=never_drafted)
    dev = runtime.device()
    from_p = gumbel_sample(target[:, 0].to(dev), torch.arange(batch, dtype=torch.int32, device=dev),
                           torch.ones(batch, device=dev), torch.tensor(seeds, device=dev),
                           torch.tensor(positions, device=dev)).cpu().tolist()
    assert 3 in from_p, "the case must draw p's likeliest token somewhere, or it tells nothing"
    assert [t[0] for t in tokens] == from_p
    assert [ref.verify_request(target[b], [-1], 1.0, seeds[b], positions[b], never_drafted[b])[0][0]
            for b in range(batch)] == from_p


def test_inert_and_padded_rows():
    target = _spikes(1, 2)[None].repeat(2, 1, 1)
    assert _verify(target, [[1], [1]], temps=[0.0], slots=[0, -1], pad=2) == [
        [[1, 2], [-1, -1], [SENTINEL] * 2, [SENTINEL] * 2], [2, 0, SENTINEL, SENTINEL], [0, 0, SENTINEL, SENTINEL]]


def test_nonfinite_rows_give_in_range_tokens():
    target = torch.tensor([[[NAN] * 5, [-INF] * 5, [1, INF, NAN, INF, 0]]])
    for temp in (0.0, 1.0):
        for draft_logits in (None, torch.full((1, 2, 5), NAN)):
            tokens, sampled, _ = _verify(target, [[0, 0]], temps=[temp], draft_logits=draft_logits)
            emitted = tokens[0][:sampled[0]]
            assert emitted and all(0 <= t < 5 for t in emitted)


def test_no_requests():
    assert _verify(torch.zeros(0, 3, 4), torch.zeros(0, 2), temps=[1.0], pad=1) == [
        [[SENTINEL] * 3], [SENTINEL], [SENTINEL]]


@pytest.mark.parametrize("change,message", [
    ({"target_logits": torch.zeros(2, 3, 4, dtype=torch.float16)}, "target_logits: dtype"),
    ({"draft_tokens": torch.zeros(2, 3, dtype=torch.int64)}, "draft_tokens: shape"),
    ({"idx_mapping": torch.zeros(3, dtype=torch.int32)}, "idx_mapping: 3 entries"),
    ({"out_tokens": torch.zeros(2, 2, dtype=torch.int64)}, "out_tokens: shape"),
    ({"num_sampled": torch.zeros(1, dtype=torch.int32)}, "num_sampled: 1 entries"),
    ({"draft_logits": torch.zeros(2, 1, 4)}, "draft_logits: shape"),
])
def test_launcher_names_the_bad_argument(change, message):
    args = {"target_logits": torch.zeros(2, 3, 4), "draft_tokens": torch.zeros(2, 2, dtype=torch.int64),
            "idx_mapping": torch.zeros(2, dtype=torch.int32), "temperature": torch.ones(2),
            "seeds": torch.zeros(2, dtype=torch.int64), "positions": torch.zeros(2, dtype=torch.int64),
            "out_tokens": torch.zeros(2, 3, dtype=torch.int64), "num_sampled": torch.zeros(2, dtype=torch.int32),
            "num_rejected": torch.zeros(2, dtype=torch.int32), **change}
    dev = runtime.device()
    with pytest.raises(ValueError, match=message):
        verify(**{k: v.to(dev) for k, v in args.items()})


@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(0, 2), vocab=st.integers(1, 24),
       with_draft_logits=st.booleans(), block_v=st.sampled_from([None, 8]))
@pytest.mark.slow
def test_kernel_matches_reference(seed, depth, vocab, with_draft_logits, block_v):
    rng = np.random.default_rng(seed)
    batch, num_slots = 2, 3
    target = torch.from_numpy((rng.standard_normal((batch, depth + 1, vocab)) * 2).astype(np.float32))
    slots = torch.from_numpy(rng.permutation(num_slots)[:batch].astype(np.int32))
    inputs = {
        "target_logits": target,
        "draft_tokens": torch.from_numpy(rng.integers(-1, vocab, (batch, depth))),
        "idx_mapping": slots,
        "temperature": torch.from_numpy(rng.choice([0.0, 0.8, 1.5], num_slots).astype(np.float32)),
        "seeds": torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, num_slots, dtype=np.int64)),
        "positions": torch.from_numpy(rng.integers(0, 2**40, batch, dtype=np.int64)),
        "out_tokens": torch.full((batch, depth + 1), SENTINEL, dtype=torch.int64),
        "num_sampled": torch.full((batch,), SENTINEL, dtype=torch.int32),
        "num_rejected": torch.full((batch,), SENTINEL, dtype=torch.int32),
        "draft_logits": torch.from_numpy((rng.standard_normal((num_slots, depth, vocab)) * 2).astype(np.float32))
        if with_draft_logits else None,
    }
    expected = ref.verify(**inputs)
    dev = runtime.device()
    args = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    verify(**args, block_v=block_v)
    for name, want in zip(("out_tokens", "num_sampled", "num_rejected"), expected, strict=True):
        verdict = exact_unless_near_tie(name, want, args[name])
        assert verdict is None or isinstance(verdict, Tolerated), verdict.lines()
