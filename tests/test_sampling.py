"""kernels.sampling.gumbel_sample: hand-worked cases, then kernel == reference on random inputs."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels import runtime
from kernels.sampling import DRAFT_NOISE_SALT, gumbel_sample
from reference import sampling as ref
from stress.core.compare import Tolerated, exact_unless_near_tie

NAN, INF = float("nan"), float("inf")


def _on(dev, **tensors):
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}


def _sample(logits, slots, temps, seeds=None, positions=None, **kw):
    dev = runtime.device()
    num_rows, num_slots = len(logits), len(temps)
    logits = torch.as_tensor(logits, dtype=torch.float32)
    args = _on(dev, logits=logits,
               idx_mapping=torch.tensor(slots, dtype=torch.int32),
               temperature=torch.tensor(temps, dtype=torch.float32),
               seeds=torch.tensor(seeds if seeds is not None else [7] * num_slots, dtype=torch.int64),
               positions=torch.tensor(positions if positions is not None else [3] * num_rows, dtype=torch.int64),
               **kw)
    return gumbel_sample(**args).cpu().tolist()


def test_greedy_takes_the_spike():
    assert _sample([[0, 0, 9, 0], [5, 1, 1, 1]], slots=[0, 1], temps=[0.0, 0.0]) == [2, 0]


def test_greedy_ties_and_nonfinite():
    rows = [[1, 3, 3, 0], [-INF] * 4, [NAN] * 4, [NAN, 1, NAN, 1], [1, INF, 2, INF], [NAN, -INF, -INF, -INF]]
    assert _sample(rows, slots=list(range(6)), temps=[0.0] * 6) == [1, 0, 0, 1, 1, 0]


ULP = 2.0**-149  # the smallest float32 subnormal: one ulp either side of the greedy threshold


@pytest.mark.parametrize("temp,token", [(0.0, 1), (-0.0, 1), (-ULP, 1), (NAN, 1), (ULP, 0)])
def test_greedy_threshold_with_a_tied_maximum(temp, token):
    """Temperatures not > 0 are greedy: the lowest of the tied maxima (token 1). One ulp above 0 samples: every
    positive logit divided by it is +inf, those tie whatever the noise, and the lowest (token 0) wins."""
    assert _sample([[1, 2, 0, 2]], slots=[0], temps=[temp]) == [token]
    want, near_tie = ref.gumbel_sample(torch.tensor([[1.0, 2, 0, 2]]), torch.tensor([0], dtype=torch.int32),
                                       torch.tensor([temp]), torch.tensor([7]), torch.tensor([3]))[0]
    assert want.tolist() == [token] and not near_tie.any()


def test_one_ulp_above_zero_draws_among_the_tied_zeros():
    """A row whose maximum 0 is tied: one ulp above 0 keeps the zeros finite (0 / ulp = 0) and the others -inf, so
    the noise picks among the zeros, the token the reference draws, and over many keys not always the lowest."""
    logits = torch.tensor([[-1.0, 0, -2, 0, 0, -3]] * 16)
    positions = list(range(16))
    got = _sample(logits, slots=list(range(16)), temps=[ULP] * 16, positions=positions)
    want = ref.gumbel_sample(logits, torch.arange(16, dtype=torch.int32), torch.full((16,), ULP),
                             torch.full((16,), 7), torch.tensor(positions))[0]
    assert got == want.value.tolist() and set(got) == {1, 3, 4}


def test_sampled_rows_follow_the_noise_key():
    """A huge spike wins whatever the noise; without one, the token is the reference's."""
    assert _sample([[0, 0, 0, 80]], slots=[0], temps=[1.0]) == [3]
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    got = _sample(logits, slots=[0, 1, 2, 3], temps=[1.0, 0.5, 2.0, 1.0], seeds=[1, -2, 3, 2**62],
                  positions=[0, 5, 2**40, 7])
    want = ref.gumbel_sample(logits, torch.tensor([0, 1, 2, 3], dtype=torch.int32), torch.tensor([1.0, 0.5, 2, 1]),
                             torch.tensor([1, -2, 3, 2**62]), torch.tensor([0, 5, 2**40, 7]))[0]
    assert not want.near_tie.any() and got == want.value.tolist()


def test_drafting_uses_a_separate_noise_stream():
    logits = torch.zeros(8, 200)
    slots, temps, pos = list(range(8)), [1.0] * 8, list(range(100, 108))
    verify = _sample(logits, slots, temps, positions=pos)
    draft = _sample(logits, slots, temps, positions=pos, draft=True)
    assert draft != verify
    assert draft == _sample(logits, slots, temps, positions=[p + DRAFT_NOISE_SALT for p in pos])


def test_logits_cache_stores_input_logits_bitwise():
    row = torch.tensor([NAN, -0.0, INF, -INF, 1e-45, 3.4e38, -1.5, 2.0])
    cache = torch.full((3, 2, 8), -7777.0)
    dev = runtime.device()
    args = _on(dev, logits=torch.stack([row, row * 2]), idx_mapping=torch.tensor([2, 0], dtype=torch.int32),
               temperature=torch.tensor([0.7, 0.0, 1.3]), seeds=torch.tensor([1, 2, 3]),
               positions=torch.tensor([4, 4]), logits_cache=cache, cache_cols=torch.tensor([1, 0], dtype=torch.int32))
    gumbel_sample(**args)
    got = args["logits_cache"].cpu()
    assert torch.equal(got[2, 1].view(torch.int32), row.view(torch.int32))
    assert torch.equal(got[0, 0].view(torch.int32), (row * 2).view(torch.int32))
    untouched = torch.ones(3, 2, dtype=torch.bool)
    untouched[2, 1] = untouched[0, 0] = False
    assert bool((got[untouched] == -7777.0).all())


def test_inert_rows_write_nothing_and_are_greedy():
    cache = torch.full((2, 1, 4), -7777.0)
    dev = runtime.device()
    args = _on(dev, logits=torch.tensor([[0.0, 5, 1, 2], [9.0, 0, 0, 0]]),
               idx_mapping=torch.tensor([-1, -1], dtype=torch.int32), temperature=torch.tensor([5.0, 5.0]),
               seeds=torch.tensor([1, 2]), positions=torch.tensor([0, 0]), logits_cache=cache,
               cache_cols=torch.tensor([0, 0], dtype=torch.int32))
    assert gumbel_sample(**args).cpu().tolist() == [1, 0]
    assert bool((args["logits_cache"].cpu() == -7777.0).all())


def test_no_rows():
    assert _sample(torch.zeros(0, 5), slots=[], temps=[1.0]) == []


@pytest.mark.parametrize("change,message", [
    ({"logits": torch.zeros(2, 4, dtype=torch.float64)}, "logits: dtype"),
    ({"idx_mapping": torch.zeros(3, dtype=torch.int32)}, "idx_mapping: 3 entries"),
    ({"seeds": torch.zeros(2, dtype=torch.int32)}, "seeds: dtype"),
    ({"positions": torch.zeros(1, dtype=torch.int64)}, "positions: 1 entries"),
    ({"logits_cache": torch.zeros(2, 1, 4)}, "logits_cache: pass it together"),
    ({"logits_cache": torch.zeros(2, 1, 5), "cache_cols": torch.zeros(2, dtype=torch.int32)}, "logits_cache: shape"),
    ({"block_v": 48}, "block_v: expected a power of two"),
])
def test_launcher_names_the_bad_argument(change, message):
    args = {"logits": torch.zeros(2, 4), "idx_mapping": torch.zeros(2, dtype=torch.int32),
            "temperature": torch.ones(2), "seeds": torch.zeros(2, dtype=torch.int64),
            "positions": torch.zeros(2, dtype=torch.int64), **change}
    with pytest.raises(ValueError, match=message):
        gumbel_sample(**_on(runtime.device(), **args))


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 3), vocab=st.integers(1, 40),
       block_v=st.sampled_from([None, 8]), draft=st.booleans())
def test_kernel_matches_reference(seed, rows, vocab, block_v, draft):
    rng = np.random.default_rng(seed)
    logits = torch.from_numpy((rng.standard_normal((rows, vocab)) * 3).astype(np.float32))
    logits[torch.from_numpy(rng.random((rows, vocab)) < 0.1)] = NAN
    num_slots = rows + 1
    slots = torch.from_numpy(rng.permutation(num_slots)[:rows].astype(np.int32))
    slots[torch.from_numpy(rng.random(rows) < 0.2)] = -1
    inputs = {"logits": logits, "idx_mapping": slots,
              "temperature": torch.from_numpy(rng.choice([0.0, 0.6, 1.0, 1.7], num_slots).astype(np.float32)),
              "seeds": torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, num_slots, dtype=np.int64)),
              "positions": torch.from_numpy(rng.integers(0, 2**40, rows, dtype=np.int64)),
              "logits_cache": torch.full((num_slots, 2, vocab), -7777.0),
              "cache_cols": torch.from_numpy(rng.integers(0, 2, rows).astype(np.int32)), "draft": draft}
    want_tokens, want_cache = ref.gumbel_sample(**inputs)
    args = _on(runtime.device(), **inputs)
    got = gumbel_sample(**args, block_v=block_v)
    verdict = exact_unless_near_tie("tokens", want_tokens, got)
    assert verdict is None or isinstance(verdict, Tolerated), verdict.lines()
    assert torch.equal(args["logits_cache"].cpu().view(torch.int32), want_cache.view(torch.int32))


@pytest.mark.parametrize("wanted", [1, 2, 3, 512])
def test_the_token_is_the_same_for_every_vocab_split(wanted, monkeypatch):
    """Rows whose maximum is tied across split edges (the first lane of a later split ties the last of an
    earlier one), rows of -inf in some splits or all, NaN: the launcher's token with its vocab split one per
    row, in a few pieces, or as many as tiles, is the reference's."""
    import kernels.sampling

    rng = np.random.default_rng(wanted)
    block, vocab = 16, 16 * 7 + 3
    logits = torch.from_numpy(rng.standard_normal((6, vocab)).astype(np.float32))
    logits[0, [15, 16, 47, 48]] = 9.0  # tied across the first split edges, lowest 15
    logits[1, :64] = -INF  # the first splits all -inf
    logits[2] = -INF  # every split -inf: token 0
    logits[3, ::3] = NAN
    logits[4, vocab - 1] = logits[4].max() + 1  # the last, partial tile
    monkeypatch.setattr(kernels.sampling, "PROGRAMS_WANTED", wanted * 6)
    temps = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    got = _sample(logits, slots=list(range(6)), temps=temps, block_v=block)
    (want, _), _ = ref.gumbel_sample(logits, torch.arange(6, dtype=torch.int32), torch.tensor(temps),
                                     torch.full((6,), 7, dtype=torch.int64), torch.full((6,), 3, dtype=torch.int64))
    assert got == want.tolist() and got[:3] == [15, int(logits[1].argmax()), 0]
    assert kernels.sampling.vocab_splits(6, vocab, block)[1] == min(8, wanted)


@pytest.mark.parametrize("launch", [{}, {"block_v": 128}])
def test_the_vocab_split_families_reach_the_cuts_they_name(launch):
    """Every case of each vocab_splits family cuts its rows as its name says, at the launcher's own tile and a
    swept one: a split count that is not a power of two, a last split shorter than the rest, more rows than the
    programs a launch aims at, no rows over a vocabulary."""
    import kernels.sampling
    from kernels.sampling import PROGRAMS_WANTED
    from stress.families.sampling_splits import FAMILIES

    for seed in range(8):
        for name, family in FAMILIES.items():
            rows, vocab = family(np.random.default_rng(seed), "cpu", dict(launch)).inputs["logits"].shape
            if name == "vocab_splits_many_rows":
                assert rows > PROGRAMS_WANTED
                continue
            if name == "vocab_splits_no_rows":
                assert rows == 0 and vocab > 0
                continue
            tile = launch.get("block_v", min(1024, 1 << (vocab - 1).bit_length()))
            per_split, splits = kernels.sampling.vocab_splits(rows, vocab, tile)
            tiles = -(-vocab // tile)
            if name == "vocab_splits_one_tile":
                assert per_split == 1 and splits == tiles and splits & (splits - 1), (rows, vocab)
            else:
                assert per_split == 2 and tiles == 2 * splits - 1, (rows, vocab)


def test_the_bench_noise_floor_draws_the_noise_of_the_contract():
    """make bench's floor for sampling at a temperature times gumbel_sample's noise over its programs: each
    (row, split) program's largest value is the largest of the reference noise over its share of the vocab."""
    from kernels.sampling import vocab_splits
    from stress.bench.noise_floor import noise_max

    rows, vocab, block = 3, 1000, 64
    split_tiles, splits = vocab_splits(rows, vocab, block)
    out = torch.full((rows * splits,), float("nan"), device=runtime.DEVICE)
    noise_max(out, rows, vocab, block)
    share = split_tiles * block
    expected = torch.tensor([ref.gumbel_noise(row, vocab)[s * share:(s + 1) * share].max().item()
                             for row in range(rows) for s in range(splits)], dtype=torch.float32)
    assert splits > 1
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
