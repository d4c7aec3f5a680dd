"""Paged attention: hand-worked masks, launch shapes, poison, untouched rows, arguments, oracle 1's
positive controls, the prefix-masked draft step (and its planted bug), CUDA-graph replay."""

import numpy as np
import pytest
import torch

import kernels.attention as katt
import reference.attention as ratt
from kernels import runtime
from stress import checks
from stress.core import cases, compare, guards
from stress.core import patches as mutants
from stress.families import attention as families

DEV = runtime.device()
SENTINEL = -7777.0


def attend_on_device(inputs: dict, **launch) -> torch.Tensor:
    on_dev = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    katt.paged_attention(**on_dev, **launch)
    return on_dev["out"].cpu()


def one_request(keys, values, queries, *, causal, block_size=4, dtype=torch.float32, seq_len=None):
    """Request 0 holds ``keys / values [L, 1, D]`` in reversed blocks; request 1 is empty; one padded out row."""
    length = keys.shape[0]
    width = -(-length // block_size) + 1
    table = torch.arange(width, 0, -1, dtype=torch.int32).view(1, width).repeat(2, 1)
    cache_k = torch.full((width + 1, block_size, 1, keys.shape[2]), float("nan"), dtype=dtype)
    cache_v = cache_k.clone()
    pos = torch.arange(length)
    cache_k[table[0, pos // block_size].long(), pos % block_size] = keys.to(dtype)
    cache_v[table[0, pos // block_size].long(), pos % block_size] = values.to(dtype)
    q = queries.shape[0]
    return {"query": queries.to(dtype), "k_cache": cache_k, "v_cache": cache_v, "block_table": table,
            "seq_lens": torch.tensor([length if seq_len is None else seq_len, 0], dtype=torch.int32),
            "query_start_loc": torch.tensor([0, q, q], dtype=torch.int32), "scale": 1.0, "causal": causal,
            "out": torch.full((q + 1, queries.shape[1], keys.shape[2]), SENTINEL, dtype=dtype)}


LAUNCHES = [{}, {"block_n": 16, "kv_splits": 2}, {"block_m": 32, "block_n": 16, "kv_splits": 5}]


@pytest.mark.parametrize("launch", LAUNCHES)
def test_equal_keys_average_the_visible_values(launch):
    """All scores equal: each query gets the mean of the values it sees (prefix means when causal)."""
    length, d = 21, 8
    values = torch.arange(length, dtype=torch.float32)[:, None, None].expand(length, 1, d).contiguous()
    inputs = one_request(torch.zeros(length, 1, d), values, torch.ones(3, 2, d), causal=True)
    out = attend_on_device(inputs, **launch)
    for i in range(3):
        last = length - 3 + i  # query i is at position L - Q + i and sees keys 0..last
        assert torch.allclose(out[i], torch.full((2, d), last / 2), atol=1e-5)
    assert (out[3] == SENTINEL).all()  # past the batch: untouched
    inputs["causal"] = False
    out = attend_on_device(inputs, **launch)
    assert torch.allclose(out[:3], torch.full((3, 2, d), (length - 1) / 2), atol=1e-5)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_one_hot_keys_pick_their_value(launch):
    """Query 0 matches key 39 only, query 1 key 37 only. Non-causal: each returns its key's value. Causal:
    query 0 (position 38) cannot see key 39 and averages keys 0..38; query 1 (position 39) still sees 37."""
    length, d = 40, 64
    keys = torch.eye(d)[:length, None, :] * 30
    values = torch.randn(length, 1, d, generator=torch.Generator().manual_seed(1))
    inputs = one_request(keys, values, torch.eye(d)[[39, 37], None, :].clone(), causal=False)
    out = attend_on_device(inputs, **launch)
    assert torch.allclose(out[0, 0], values[39, 0], atol=1e-4) and torch.allclose(out[1, 0], values[37, 0], atol=1e-4)
    inputs["causal"] = True
    out = attend_on_device(inputs, **launch)
    assert torch.allclose(out[0, 0], values[:39, 0].mean(0), atol=1e-4)
    assert torch.allclose(out[1, 0], values[37, 0], atol=1e-4)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_poison_in_a_visible_slot_reaches_the_output(launch):
    """A NaN key or value the request may read shows as NaN in its rows, through the split combine too."""
    length, d = 37, 8
    gen = torch.Generator().manual_seed(2)
    for which in ("k_cache", "v_cache"):
        inputs = one_request(torch.randn(length, 1, d, generator=gen), torch.randn(length, 1, d, generator=gen),
                             torch.randn(2, 1, d, generator=gen), causal=False)
        block = int(inputs["block_table"][0, 0])
        inputs[which][block, 1] = float("nan")  # position 1
        assert attend_on_device(inputs, **launch)[:2].isnan().all()


@pytest.mark.parametrize("launch", LAUNCHES)
def test_keys_that_score_minus_inf_carry_no_weight(launch):
    """Keys 0..9 hold -inf in dim 0 and the queries are positive there. Causal, query 0 (position 9) sees only
    those keys and gets zeros, like a query that sees no key; query 1 (position 10) sees key 10 as its only
    finite score and returns its value exactly; non-causal, both return the mean of keys 10..19's values (every
    finite score is 0). The reference agrees on each."""
    length, d = 20, 8
    keys = torch.zeros(length, 1, d)
    keys[:10, 0, 0] = float("-inf")
    values = torch.randn(length, 1, d, generator=torch.Generator().manual_seed(5))
    inputs = one_request(keys, values, torch.ones(2, 1, d), causal=True, seq_len=11)
    out = attend_on_device(inputs, **launch)
    assert (out[0] == 0).all()
    assert torch.allclose(out[1, 0], values[10, 0], atol=1e-6)
    assert torch.allclose(ratt.paged_attention(**inputs)[:2].float(), out[:2], atol=1e-6)
    inputs["causal"], inputs["seq_lens"][0] = False, length
    out = attend_on_device(inputs, **launch)
    assert torch.allclose(out[:2, 0], values[10:, 0].mean(0).expand(2, d), atol=1e-5)
    assert torch.allclose(ratt.paged_attention(**inputs)[:2].float(), out[:2], atol=1e-5)


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("key,poisons", [(float("nan"), True), (float("inf"), True), (1e38, True),
                                         (-1e38, False)])
def test_a_nan_or_infinite_score_poisons_exactly_the_queries_that_see_it(launch, key, poisons):
    """Key 30 of 37 holds ``key`` in dim 0, the queries 4 there: NaN, +inf and 1e38 (4e38 overflows float32, a
    +inf score) make the rows of the causal queries that see key 30 NaN, through one split or the combine of
    several; -1e38 scores -inf and carries no weight. Queries before position 30 stay finite either way, and
    the reference agrees element for element."""
    length, d = 37, 8
    gen = torch.Generator().manual_seed(3)
    keys, queries = torch.randn(length, 1, d, generator=gen), torch.randn(9, 2, d, generator=gen)
    keys[30, 0, 0], queries[..., 0] = key, 4.0
    inputs = one_request(keys, torch.randn(length, 1, d, generator=gen), queries, causal=True)
    out = attend_on_device(inputs, **launch)
    first_seeing = 30 - (length - 9)  # query i sits at position L - 9 + i
    assert not out[:first_seeing].isnan().any()
    assert out[first_seeing:9].isnan().all() if poisons else not out.isnan().any()
    want = ratt.paged_attention(**inputs)[:9].float()
    assert torch.equal(want.isnan(), out[:9].isnan())
    assert torch.allclose(want.nan_to_num(), out[:9].nan_to_num(), atol=1e-5)


def test_a_nan_partial_dropped_by_the_combine_is_caught():
    """The planted combine-drops-nan-partial turns the +inf row finite over several splits: the check's oracle
    must fail it: a NaN reference element is matched exactly, never bounded."""
    check = checks.get("attention.paged")
    keys = torch.randn(37, 1, 8, generator=torch.Generator().manual_seed(4))
    keys[3, 0, 0] = float("inf")
    queries = torch.ones(2, 1, 8)
    inputs = one_request(keys, torch.randn(37, 1, 8, generator=torch.Generator().manual_seed(5)), queries,
                         causal=False)
    expected = check.reference(**inputs)
    assert expected.value[:2].isnan().all()
    assert isinstance(compare.within_float32_baseline("out", expected, attend_on_device(inputs, **LAUNCHES[2])),
                      compare.Tolerated)
    with mutants.applied(check.mutant("combine-drops-nan-partial")):
        got = attend_on_device(inputs, **LAUNCHES[2])
    assert not got[:2].isnan().any()
    assert isinstance(compare.within_float32_baseline("out", expected, got), compare.Divergence)


def test_split_families_plant_across_several_splits_and_head_dims_reach_every_path():
    """The split family's rows span two or more KV splits on the CPU (the combine runs), the one-split family's
    one; the head-dim families meet every (head-dim tile, tile filled) class from 16 to 512."""
    check = checks.get("attention.paged")
    for seed in range(4):
        for family, many in (("nonfinite_keys_split", True), ("nonfinite_keys", False)):
            case = cases.build_case(check, family, seed, "cpu")
            counts = [len(parts) for parts in families.split_ranges(case, case.launch, "cpu")]
            assert (min(counts) >= 2) if many else (max(counts) == 1), (family, seed, counts)
    classes = {(max(16, 1 << max(0, d - 1).bit_length()), d == max(16, 1 << max(0, d - 1).bit_length()))
               for d in families.PATH_HEAD_DIMS}
    assert classes == {(tile, filled) for tile in (16, 32, 64, 128, 256, 512) for filled in (False, True)}
    assert {f"head_dim_{d}" for d in families.PATH_HEAD_DIMS} <= set(check.families)


@pytest.mark.parametrize("launch", LAUNCHES)
def test_reads_nothing_past_seq_len(launch):
    """Positions past seq_len hold NaN (the rest of the last block, and the spare blocks): never read."""
    gen = torch.Generator().manual_seed(4)
    inputs = one_request(torch.randn(30, 1, 8, generator=gen), torch.randn(30, 1, 8, generator=gen),
                         torch.randn(4, 2, 8, generator=gen), causal=True, seq_len=23)
    pos = torch.arange(23, 30)
    inputs["k_cache"][inputs["block_table"][0, pos // 4].long(), pos % 4] = float("nan")
    out = attend_on_device(inputs, **launch)
    assert not out.isnan().any()
    assert torch.allclose(out.double(), ratt.paged_attention(**inputs), atol=1e-5)


def test_empty_requests_write_nothing():
    """seq_len 0 with queries, and queries 0 with keys: their out rows stay as they were."""
    gen = torch.Generator().manual_seed(6)
    inputs = one_request(torch.randn(9, 1, 8, generator=gen), torch.randn(9, 1, 8, generator=gen),
                         torch.randn(2, 1, 8, generator=gen), causal=False, seq_len=0)
    assert (attend_on_device(inputs) == SENTINEL).all()
    inputs["seq_lens"][0] = 9
    inputs["query_start_loc"] = torch.tensor([0, 0, 0], dtype=torch.int32)
    assert (attend_on_device(inputs, kv_splits=3) == SENTINEL).all()


def _args(**changes):
    args = one_request(torch.zeros(5, 1, 8), torch.zeros(5, 1, 8), torch.zeros(2, 2, 8), causal=False)
    args.update(changes)
    return args


@pytest.mark.parametrize("changes,needle", [
    ({"query": torch.zeros(2, 3, 8), "k_cache": torch.zeros(4, 4, 2, 8), "v_cache": torch.zeros(4, 4, 2, 8)},
     "query: 3 heads is not a multiple of the caches' 2"),
    ({"out": torch.zeros(2, 2, 8, dtype=torch.float16)}, "out: dtype"),
    ({"out": torch.zeros(1, 2, 8)}, r"out: shape \(1, 2, 8\)"),
    ({"block_table": torch.zeros(1, 2, dtype=torch.int32)}, "block_table: 1 rows"),
    ({"seq_lens": torch.zeros(2, dtype=torch.int64)}, "seq_lens: dtype int64"),
    ({"query_start_loc": torch.zeros(0, dtype=torch.int32)}, "query_start_loc: has 0 elements"),
    ({"v_cache": torch.zeros(4, 4, 1, 8).transpose(0, 1).contiguous().transpose(0, 1)}, "v_cache: shape .* strides"),
    ({"scale": float("inf")}, "scale"),
])
def test_bad_arguments_name_the_argument(changes, needle):
    with pytest.raises(ValueError, match=needle):
        attend_on_device(_args(**changes))


@pytest.mark.parametrize("knob,needle", [({"block_n": 8}, "block_n"), ({"block_m": 1}, "block_m"),
                                         ({"kv_splits": 0}, "kv_splits"), ({"num_warps": 3}, "num_warps"),
                                         ({"num_stages": 0}, "num_stages")])
def test_bad_knobs_name_the_knob(knob, needle):
    with pytest.raises(ValueError, match=needle):
        attend_on_device(_args(), **knob)


@pytest.mark.parametrize("family", ["two_splits", "infinite_keys_split"])
def test_the_split_families_reach_the_combine_pass_in_the_launchers_own_shape_on_the_cpu(monkeypatch, family):
    """Their cases run the launcher's own shape, sized so that its split count is 2 or more on the CPU too: a slip
    in the combine pass alone (a row of -inf divided by its zero sum) must meet them there."""
    from stress import checks
    from stress.core import cases, guards

    real, splits = katt._launch, []
    monkeypatch.setattr(katt, "_launch", lambda shape, *args, **kwargs: splits.append(shape["kv_splits"]) or
                        real(shape, *args, **kwargs))
    check = checks.get("attention.paged")
    for seed in range(4):
        case = cases.build_case(check, family, seed, "cpu")
        check.kernel(**guards.fresh_inputs(case), **case.launch)
    assert splits and min(splits) >= 2, splits


def test_launch_shape_follows_shapes_only(monkeypatch):
    """The split count aims at a wave of programs per multiprocessor, bounded by what the table can address."""
    cpu = torch.device("cpu")
    shape = katt.launch_shape(64, 4, 8, 8, 128, 32 * 1024, torch.bfloat16, cpu)
    assert shape["block_m"] == 128 and shape["queries_per_chunk"] == 16 and shape["kv_splits"] == 1
    decode = katt.launch_shape(4, 4, 8, 8, 128, 32 * 1024, torch.float32, cpu)
    assert decode["block_m"] == 16 and decode["block_n"] == 32
    assert katt.launch_shape(4, 4, 8, 8, 128, 32, torch.bfloat16, cpu, kv_splits=7)["kv_splits"] == 7
    monkeypatch.setattr(katt, "_multiprocessors", lambda device: 132)  # an H200
    programs = katt.PROGRAMS_PER_SM * 132
    decode_32k = katt.launch_shape(4, 4, 8, 8, 128, 32 * 1024, torch.bfloat16, cpu)
    # as many splits as one wave holds, never a program past it
    assert decode_32k["kv_splits"] * 4 * 8 <= programs < (decode_32k["kv_splits"] + 1) * 4 * 8
    assert decode_32k["num_stages"] == 3
    draft_1k = katt.launch_shape(64, 4, 8, 8, 128, 1024, torch.bfloat16, cpu)  # 128 rows: 256 keys per split
    assert draft_1k["kv_splits"] == 4 and draft_1k["num_stages"] == 2
    assert katt.launch_shape(4, 4, 8, 8, 256, 1024, torch.float32, cpu)["num_stages"] == 2  # 64 KB per stage


# ---------------------------------------------------------------- oracle 1 and its positive controls


def _judged_case(family="multi_query", seed=11):
    check = checks.get("attention.paged")
    case = cases.build_case(check, family, seed, "cpu", launch={})
    return case, cases.expected_outputs(check, case)["out"]


def _padded_case():
    """Request 0: 3 queries over 20 keys; request 1: 2 queries, no key; two out rows past the batch."""
    case = families.attention_case(np.random.default_rng(0), query_lens=[3, 2], seq_lens=[20, 0], kv_heads=1,
                                   group=2, head_dim=8, block_size=16, dtype=torch.bfloat16, causal=True,
                                   pad_tokens=2)
    return case, cases.expected_outputs(checks.get("attention.paged"), case)["out"]


def test_oracle_passes_the_kernel_and_logs_the_ratio():
    case, expected = _judged_case()
    got = attend_on_device(guards.fresh_inputs(case))
    found = compare.within_float32_baseline("out", expected, got)
    assert isinstance(found, compare.Tolerated) and "the float32 baseline's" in found.lines()[0]


def test_oracle_fails_an_error_beyond_the_allowance():
    case, expected = _judged_case()
    got = attend_on_device(guards.fresh_inputs(case))
    baseline_error = float((expected.baseline.double() - expected.value).abs()[expected.computed].max())
    allowed = 2 * baseline_error + expected.floor
    row = int(expected.computed.any(-1).any(-1).nonzero()[0])
    nudged = got.clone()
    nudged[row, 0, 0] = float(expected.value[row, 0, 0]) + 1.5 * allowed
    found = compare.within_float32_baseline("out", expected, nudged)
    assert isinstance(found, compare.FloatDivergence) and found.total == 1
    poisoned = got.clone()
    poisoned[row, 0, 0] = float("nan")
    assert isinstance(compare.within_float32_baseline("out", expected, poisoned), compare.Divergence)


def test_oracle_holds_untouched_rows_bit_for_bit():
    case, expected = _padded_case()
    assert torch.equal(expected.computed.any(-1).any(-1), torch.tensor([True] * 3 + [False] * 4))
    got = attend_on_device(guards.fresh_inputs(case))
    assert isinstance(compare.within_float32_baseline("out", expected, got), compare.Tolerated)
    got[5, 0, 0] = 0.0  # what a stray write of an attention output would leave there
    assert isinstance(compare.within_float32_baseline("out", expected, got), compare.Divergence)


# ---------------------------------------------------------------- fix 4 end to end


def _prefix_case(seed):
    check = checks.get("attention.prefix_masked")
    for offset in range(50):  # a case with a restored block
        case = cases.build_case(check, "restored", seed + offset, "cpu", launch={})
        if (case.inputs["num_cached_tokens"][case.inputs["idx_mapping"].long()] > 0).any():
            return check, case
    raise AssertionError("no restored prefix in 50 seeds")


def _draft_step(case):
    inputs = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in guards.fresh_inputs(case).items()}
    families.prefix_masked_draft(**inputs)
    return inputs["out"].cpu()


def test_draft_step_hides_the_restored_prefix():
    check, case = _prefix_case(21)
    out = _draft_step(case)
    expected = cases.expected_outputs(check, case)["out"]
    assert not out.isnan().any()
    assert isinstance(compare.within_float32_baseline("out", expected, out), compare.Tolerated)


def test_restored_blocks_left_visible_surface_as_poison():
    """The pre-fix form of fix 4 (docs/fixes.md#fix-4): no shift and full seq_lens make the draft read
    never-written KV."""
    check, case = _prefix_case(21)
    with mutants.applied(check.mutant("restored-blocks-visible")):
        out = _draft_step(case)
    restored_rows = []
    q = case.inputs["num_draft_tokens"] + (0 if case.inputs["anchor_first"] else 1)
    for batch_row, slot in enumerate(case.inputs["idx_mapping"].tolist()):
        if int(case.inputs["num_cached_tokens"][slot]) > 0:
            restored_rows.append(out[batch_row * q:(batch_row + 1) * q])
    assert restored_rows and all(rows.isnan().all() for rows in restored_rows)


def test_reference_attends_exactly_the_computed_tokens():
    """The prefix reference equals plain attention over positions [restored, last query] of each request."""
    check, case = _prefix_case(40)
    inputs = case.inputs
    out, k_cache, v_cache, table = ratt.prefix_masked_draft(**guards.fresh_inputs(case))
    q = inputs["num_draft_tokens"] + (0 if inputs["anchor_first"] else 1)
    bs = inputs["block_size"]
    starts = inputs["target_query_start_loc"].tolist()
    for batch_row, slot in enumerate(inputs["idx_mapping"].tolist()):
        last = int(inputs["target_positions"][starts[batch_row + 1] - 1 - int(inputs["num_rejected"][batch_row])])
        restored_blocks = int(inputs["num_cached_tokens"][slot]) // bs
        pos = torch.arange(restored_blocks * bs, last + q + 1)
        row = inputs["block_table"][batch_row].long()
        keys = k_cache[row[pos // bs], pos % bs]
        values = v_cache[row[pos // bs], pos % bs]
        rows = slice(batch_row * q, (batch_row + 1) * q)
        want = ratt.attend(inputs["query"][rows], keys, values, scale=inputs["scale"], causal=False)
        assert not keys.isnan().any() and torch.equal(out[rows], want)
        kept = row[restored_blocks:restored_blocks + len(pos) // bs]  # the draft's view starts past the restored
        assert torch.equal(table[batch_row, :len(kept)].long(), kept)


# ---------------------------------------------------------------- CUDA graphs (fix 6: replay-safe draft attention)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_graph_replay_with_new_lengths_and_tables(causal):
    """Captured at one step, replayed with other seq_lens, query_start_loc and block tables."""
    gen = torch.Generator().manual_seed(12)
    rng = np.random.default_rng(12)
    batch, kv_heads, group, d, bs, width = 4, 2, 4, 64, 16, 64
    cache_k = torch.randn(batch * width + 1, bs, kv_heads, d, generator=gen).to(torch.bfloat16).to(DEV)
    cache_v = torch.randn(batch * width + 1, bs, kv_heads, d, generator=gen).to(torch.bfloat16).to(DEV)
    query = torch.randn(batch * 8, kv_heads * group, d, generator=gen).to(torch.bfloat16).to(DEV)
    static = {"table": torch.zeros(batch, width, dtype=torch.int32, device=DEV),
              "seq_lens": torch.zeros(batch, dtype=torch.int32, device=DEV),
              "qsl": torch.zeros(batch + 1, dtype=torch.int32, device=DEV),
              "out": torch.zeros(batch * 8, kv_heads * group, d, dtype=torch.bfloat16, device=DEV)}

    def launch():
        katt.paged_attention(query, cache_k, cache_v, static["table"], static["seq_lens"], static["qsl"],
                             scale=d ** -0.5, causal=causal, out=static["out"])

    launch()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for _ in range(4):
        q_lens = rng.integers(0, 9, batch)
        static["qsl"].copy_(torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32))
        static["seq_lens"].copy_(torch.tensor([int(rng.integers(q, width * bs + 1)) for q in q_lens],
                                              dtype=torch.int32))
        static["table"].copy_(torch.from_numpy(rng.permutation(batch * width).astype(np.int32) + 1).view(batch, width))
        static["out"].fill_(SENTINEL)
        graph.replay()
        replayed = static["out"].clone()
        static["out"].fill_(SENTINEL)
        launch()
        assert torch.equal(replayed, static["out"])
        expected = ratt.paged_attention(query.cpu(), cache_k.cpu(), cache_v.cpu(), static["table"].cpu(),
                                        static["seq_lens"].cpu(), static["qsl"].cpu(), scale=d ** -0.5,
                                        causal=causal, out=torch.full_like(replayed.cpu(), SENTINEL))
        assert (replayed.cpu().double() - expected).abs().max() < 0.05


def test_fitting_tiles_halve_keys_then_rows_down_to_a_group():
    """Own tiles first; key tiles down to 16 under each row count; rows down to one GQA group (at least 16)."""
    own = {"block_m": 128, "block_n": 64}
    assert katt.fitting_tiles(own, 24, rows_forced=False, keys_forced=False) == [
        (128, 64), (128, 32), (128, 16), (64, 64), (64, 32), (64, 16), (32, 64), (32, 32), (32, 16)]
    assert katt.fitting_tiles(own, 3, rows_forced=True, keys_forced=False) == [(128, 64), (128, 32), (128, 16)]
    assert katt.fitting_tiles(own, 3, rows_forced=False, keys_forced=True) == [(128, 64), (64, 64), (32, 64),
                                                                               (16, 64)]
    assert katt.fitting_tiles(own, 3, rows_forced=True, keys_forced=True) == [(128, 64)]


def test_tiles_that_overflow_shared_memory_fall_back(monkeypatch):
    """A device whose shared memory holds no key tile wider than 16 and no program of more than 16 rows (Triton
    raises OutOfResources at the launch): the launcher walks its tiles down until one fits and returns the
    reference's attention; a forced key tile that does not fit is the caller's, and its error propagates."""
    from triton.runtime.errors import OutOfResources

    tried, launch = [], katt._launch

    def small_device(shape, *args, **kwargs):
        tried.append((shape["block_m"], shape["block_n"]))
        if shape["block_n"] > 16 or shape["block_m"] > 16:
            raise OutOfResources(shape["block_n"] * 1024, 16 * 1024, "shared memory")
        return launch(shape, *args, **kwargs)

    monkeypatch.setattr(katt, "_launch", small_device)
    gen = torch.Generator().manual_seed(6)
    inputs = one_request(torch.randn(9, 1, 8, generator=gen), torch.randn(9, 1, 8, generator=gen),
                         torch.randn(3, 2, 8, generator=gen), causal=True)
    out = attend_on_device(inputs)  # own tiles: 16 rows (3 queries of 2 heads over 2 batch rows), 32 fp32 keys
    assert tried == [(16, 32), (16, 16)]
    torch.testing.assert_close(out[:3].double(), ratt.paged_attention(**inputs)[:3], atol=1e-5, rtol=0)
    assert (out[3] == SENTINEL).all()
    tried.clear()
    with pytest.raises(OutOfResources):
        attend_on_device(inputs, block_n=32)
    assert tried == [(16, 32)]
    tried.clear()
    with pytest.raises(OutOfResources):
        attend_on_device(inputs, block_m=32)
    assert tried == [(32, 32), (32, 16)]
