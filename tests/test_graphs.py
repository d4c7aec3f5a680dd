"""CUDA-graph candidates and dispatch: the upstream expectations of docs/contracts/spec.md#specgraph_candidates /
fix 1, worked by hand, and the invariants every configuration must keep."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kernels.spec.graphs import BatchDescriptor, Mode, build_candidates, decode_widths, dispatch
from reference.spec import graphs as ref


def full(num_tokens, num_reqs, uniform=None, max_req_tokens=None):
    return BatchDescriptor(Mode.FULL, num_tokens, num_reqs, uniform, max_req_tokens)


def piecewise(num_tokens):
    return BatchDescriptor(Mode.PIECEWISE, num_tokens)


def every_size(max_num_reqs, max_spec_tokens):
    """The upstream tests' exact capture grid: every token count up to S * (Kmax + 1)."""
    return range(1, max_num_reqs * (max_spec_tokens + 1) + 1)


def test_zero_draft_band_gets_no_graph_for_an_anchor_first_draft():
    """Fix 1 (e): a DSpark draft manager (D = Kmax, n_new = 0) with a K = 0 band: widths 5, 3, 1 only."""
    schedule = [(1, 32, 5), (33, 64, 3), (65, 96, 1), (97, 128, 0)]
    candidates = build_candidates(every_size(128, 5), 128, 5, 5, schedule)
    assert {d.uniform for d in candidates.full} == {5, 3, 1}
    assert candidates.widths == (1, 3, 5)


def test_the_reference_agrees_on_the_upstream_widths():
    schedule = [(1, 32, 5), (33, 64, 3), (65, 96, 1), (97, 128, 0)]
    assert {d.uniform for d in ref.build_candidates(every_size(128, 5), 128, 5, 5, schedule).full} == {5, 3, 1}
    assert ref.decode_widths(8, 7, [(1, 32, 4), (32, 128, 3)]) == [4, 5]
    candidates = ref.build_candidates(every_size(64, 7), 64, 8, 7)
    assert ref.dispatch(candidates, 8, 64, 8, has_prefill=True) == ref.Descriptor("PIECEWISE", 64)


def test_zero_draft_band_keeps_a_width_one_graph_for_the_target():
    """Fix 1 (d): for the target (n_new = 1) a K = 0 band is plain decode, width 1."""
    schedule = [(1, 32, 5), (33, 64, 3), (65, 96, 1), (97, 128, 0)]
    assert build_candidates(every_size(128, 5), 128, 6, 5, schedule).widths == (1, 2, 4, 6)


def test_every_uniform_decode_shape_dispatches_to_its_exact_full_graph():
    """S = 512, Kmax = 7, a schedule with every query length 1..8: each (num_reqs, qlen) has a FULL graph
    of exactly its size (no padding), as the capture grid holds every token count."""
    schedule = [(qlen, qlen, qlen - 1) for qlen in range(1, 9)]
    candidates = build_candidates(every_size(512, 7), 512, 8, 7, schedule)
    for num_reqs in range(1, 513):
        for qlen in range(1, 9):
            got = dispatch(candidates, num_reqs, num_reqs * qlen, qlen)
            assert got == full(num_reqs * qlen, num_reqs, qlen), (num_reqs, qlen)


def test_non_uniform_batch_runs_piecewise():
    candidates = build_candidates(every_size(512, 4), 512, 5, 4, [(q, q, q - 1) for q in range(1, 6)])
    assert dispatch(candidates, 2, 3, None) == piecewise(3)


def test_basic_spec_decode_captures_only_the_full_width():
    """No DSD: only qlen = K + 1 has FULL graphs; shorter uniform batches run piecewise at their size."""
    candidates = build_candidates(every_size(512, 7), 512, 8, 7)
    assert candidates.widths == (8,)
    for num_reqs in range(1, 513):
        for qlen in range(1, 8):
            assert dispatch(candidates, num_reqs, num_reqs * qlen, qlen) == piecewise(num_reqs * qlen)
        assert dispatch(candidates, num_reqs, num_reqs * 8, 8) == full(num_reqs * 8, num_reqs, 8)


def test_partial_schedule_captures_only_its_widths():
    """Bands [(1,32,4),(32,128,3)] (they share batch size 32; only their depths matter): widths 5 and 4."""
    candidates = build_candidates(every_size(128, 7), 128, 8, 7, [(1, 32, 4), (32, 128, 3)])
    for num_reqs in range(1, 129):
        for qlen in range(1, 9):
            got = dispatch(candidates, num_reqs, num_reqs * qlen, qlen)
            want = full(num_reqs * qlen, num_reqs, qlen) if qlen in (4, 5) else piecewise(num_reqs * qlen)
            assert got == want, (num_reqs, qlen)


def test_prompt_chunks_shaped_like_decode_never_replay_a_decode_graph():
    """6 decodes and 2 prompt chunks of K + 1 tokens look like 8 uniform decodes (upstream vllm#49918)."""
    candidates = build_candidates(every_size(64, 7), 64, 8, 7)
    assert dispatch(candidates, 8, 64, 8, has_prefill=True) == piecewise(64)
    assert dispatch(candidates, 8, 64, 8, has_prefill=False) == full(64, 8, 8)


def test_capture_sizes_round_up_to_whole_requests():
    """Sizes 1, 2, 4, 8, 16 with width 4: rounded up to 4, 4, 4, 8, 16 tokens, i.e. 1, 1, 1, 2, 4 requests."""
    candidates = build_candidates([1, 2, 4, 8, 16], 8, 4, 3, small_grid=0)
    assert candidates.full == (full(4, 1, 4), full(8, 2, 4), full(16, 4, 4))
    assert candidates.piecewise == tuple(piecewise(c) for c in (1, 2, 4, 8, 16))
    assert dispatch(candidates, 3, 12, 4) == full(16, 4, 4)  # padded by one request
    assert dispatch(candidates, 3, 10, None) == piecewise(16)
    assert dispatch(candidates, 5, 17, None) == BatchDescriptor(Mode.NONE, 17)  # above every graph


def test_small_request_grid_gives_small_batches_exact_graphs():
    candidates = build_candidates([1, 2, 4, 8, 16], 8, 4, 3, small_grid=32)
    for num_reqs in range(1, 9):
        assert dispatch(candidates, num_reqs, 4 * num_reqs, 4) == full(4 * num_reqs, num_reqs, 4)


def test_limits_on_tokens_and_requests():
    """Rounded-up sizes past S * D tokens, past max_capture_size or past S requests are dropped."""
    candidates = build_candidates([3, 7], 3, 3, 2, small_grid=0)  # S * D = 9
    assert candidates.full == (full(3, 1, 3),)  # 7 -> 9 tokens would exceed max_capture_size 7
    candidates = build_candidates([3, 7], 3, 3, 2, small_grid=0, max_capture_size=9)
    assert candidates.full == (full(3, 1, 3), full(9, 3, 3))


def test_only_the_row_of_the_smallest_staged_count_is_tried():
    """Every token count up to a staged count Tk maps to the graphs staged at Tk alone
    (docs/contracts/spec.md#specgraph_candidates): widths 2 and 3 from size 8 stage FULL(8, 4, 2) and
    FULL(9, 3, 3); two 3-token requests (6 tokens) meet only the width-2 graph at 8, so they run piecewise
    although FULL(9, 3, 3) could hold them."""
    candidates = build_candidates([8], 8, 3, 2, [(1, 4, 1), (5, 8, 2)], small_grid=0, max_capture_size=9)
    assert candidates.full == (full(8, 4, 2), full(9, 3, 3))
    assert dispatch(candidates, 2, 6, 3) == piecewise(8)
    assert dispatch(candidates, 3, 9, 3) == full(9, 3, 3)


@pytest.mark.parametrize("decode_query_len,expected", [(3, (1, 2)), (4, (1, 2, 3))])
def test_adaptive_depth_widths_skip_zero(decode_query_len, expected):
    """Adaptive depth with a band cap of 0: depths 0..2; width 0 (n_new = 0) is skipped, width 1 kept."""
    assert decode_widths(decode_query_len, 3, [(1, 4, 0), (5, 8, 2)], adaptive=True) == expected


def test_adaptive_depth_without_schedule_spans_one_to_kmax():
    assert decode_widths(6, 5, adaptive=True) == (2, 3, 4, 5, 6)
    assert decode_widths(5, 5, adaptive=True) == (1, 2, 3, 4, 5)


def test_band_depth_is_capped_at_kmax():
    assert decode_widths(4, 3, [(1, 8, 9)]) == (4,)


def test_one_token_drafter_ignores_the_schedule():
    """A manager stepping one token at a time (D < Kmax) has one width whatever the depth."""
    assert decode_widths(1, 5, [(1, 8, 3), (9, 16, 0)]) == (1,)


def test_varlen_graphs_take_the_fewest_requests_that_fit():
    """Varlen, size 8, S = 4, D = 4: request counts ceil(8/4) = 2, (4+1)//2 = 2, (12+3)//4 = 3 and 4."""
    candidates = build_candidates([8], 4, 4, 3, varlen=True)
    assert candidates.full == (full(8, 2, max_req_tokens=4), full(8, 3, max_req_tokens=4),
                               full(8, 4, max_req_tokens=4))
    assert dispatch(candidates, 3, 7, None, max_req_tokens=3) == full(8, 3, max_req_tokens=4)
    assert dispatch(candidates, 1, 4, 4, max_req_tokens=4) == full(8, 2, max_req_tokens=4)
    assert dispatch(candidates, 3, 7, None) == piecewise(8)  # a caller that does not track the longest request
    assert dispatch(candidates, 2, 8, 4, has_prefill=True, max_req_tokens=4) == piecewise(8)


def test_no_capture_sizes_means_eager():
    candidates = build_candidates([], 4, 4, 3)
    assert candidates.full == candidates.piecewise == ()
    assert dispatch(candidates, 1, 4, 4) == BatchDescriptor(Mode.NONE, 4)


def test_descriptors_are_hashable_keys():
    assert len({full(8, 2, 4), full(8, 2, 4), piecewise(8)}) == 2


@pytest.mark.parametrize("kwargs,name", [
    (dict(capture_sizes=[0, 4]), "capture_sizes"),
    (dict(max_num_reqs=0), "max_num_reqs"),
    (dict(decode_query_len=0), "decode_query_len"),
    (dict(max_spec_tokens=-1), "max_spec_tokens"),
    (dict(schedule=[(1, 4, 2)], max_spec_tokens=0), "max_spec_tokens"),
    (dict(schedule=[]), "schedule"),
    (dict(schedule=[(4, 1, 2)]), "schedule"),
    (dict(schedule=[(0, 4, 2)]), "schedule"),
    (dict(schedule=[(1, 4, -1)]), "schedule"),
    (dict(schedule=[(1, 4)]), "schedule"),
    (dict(max_capture_size=4), "max_capture_size"),
    (dict(small_grid=-1), "small_grid"),
    (dict(varlen=1), "varlen"),
])
def test_build_arguments_are_validated(kwargs, name):
    args = dict(capture_sizes=[4, 8], max_num_reqs=4, decode_query_len=4, max_spec_tokens=3) | kwargs
    with pytest.raises(ValueError, match=f"^{name}:"):
        build_candidates(**args)


@pytest.mark.parametrize("num_reqs,num_tokens,uniform,max_req_tokens,name", [
    (1, 0, None, None, "num_tokens"),
    (0, 4, None, None, "num_reqs"),
    (5, 4, None, None, "num_reqs"),
    (9, 9, None, None, "num_reqs"),  # above max_num_reqs
    (2, 5, 2, None, "uniform"),
    (2, 5, None, 2, "max_req_tokens"),  # the longest of 2 requests sharing 5 tokens has at least 3
    (2, 5, None, 5, "max_req_tokens"),  # and at most 4
    (2, 4, 2, 3, "max_req_tokens"),
])
def test_dispatch_arguments_are_validated(num_reqs, num_tokens, uniform, max_req_tokens, name):
    candidates = build_candidates([4, 8], 8, 4, 3)
    with pytest.raises(ValueError, match=f"^{name}:"):
        dispatch(candidates, num_reqs, num_tokens, uniform, max_req_tokens=max_req_tokens)


# ---------------------------------------------------------------- properties of every configuration

bands = st.tuples(st.integers(1, 12), st.integers(0, 8), st.integers(0, 9)).map(lambda b: (b[0], b[0] + b[1], b[2]))
configs = st.fixed_dictionaries({
    "capture_sizes": st.lists(st.integers(1, 60), max_size=8),
    "max_num_reqs": st.integers(1, 12),
    "max_spec_tokens": st.integers(1, 6),
    "n_new": st.integers(0, 1),
    "schedule": st.none() | st.lists(bands, min_size=1, max_size=4),
    "adaptive": st.booleans(),
    "varlen": st.booleans(),
    "small_grid": st.integers(0, 4),
})


def _build(config):
    return build_candidates(config["capture_sizes"], config["max_num_reqs"],
                            config["max_spec_tokens"] + config["n_new"], config["max_spec_tokens"],
                            config["schedule"], adaptive=config["adaptive"], varlen=config["varlen"],
                            small_grid=config["small_grid"])


@given(configs)
def test_every_full_descriptor_is_a_real_batch_shape(config):
    candidates = _build(config)
    assert all(w >= 1 for w in candidates.widths)
    assert len(set(candidates.full)) == len(candidates.full)
    assert [d.num_tokens for d in candidates.full] == sorted(d.num_tokens for d in candidates.full)
    for desc in candidates.full:
        assert 1 <= desc.num_reqs <= config["max_num_reqs"], desc
        if desc.uniform is None:
            assert desc.max_req_tokens is not None and desc.num_reqs <= desc.num_tokens, desc
        else:
            assert desc.uniform >= 1 and desc.num_tokens == desc.num_reqs * desc.uniform, desc


@st.composite
def batches(draw, max_num_reqs):
    """Query lengths of a batch (each >= 1) and whether one of them is a prompt chunk."""
    num_reqs = draw(st.integers(1, max_num_reqs))
    lengths = draw(st.lists(st.integers(1, 9), min_size=num_reqs, max_size=num_reqs))
    if draw(st.booleans()):
        lengths = [lengths[0]] * num_reqs
    return lengths, draw(st.booleans())


@given(configs, st.data())
def test_dispatch_never_shrinks_a_batch_and_keeps_prefill_out_of_full_graphs(config, data):
    candidates = _build(config)
    lengths, has_prefill = data.draw(batches(config["max_num_reqs"]))
    num_reqs, num_tokens = len(lengths), sum(lengths)
    uniform = lengths[0] if len(set(lengths)) == 1 else None
    got = dispatch(candidates, num_reqs, num_tokens, uniform, has_prefill, max_req_tokens=max(lengths))
    if got.mode is Mode.NONE:
        assert got == BatchDescriptor(Mode.NONE, num_tokens)
        return
    assert got in candidates.full + candidates.piecewise
    assert got.num_tokens >= num_tokens
    assert got.num_reqs is None or got.num_reqs >= num_reqs
    assert got.uniform is None or (got.uniform == uniform and not has_prefill)
    assert got.max_req_tokens is None or (got.max_req_tokens >= max(lengths) and not has_prefill)
    if has_prefill:
        assert got.mode is Mode.PIECEWISE


@given(configs, st.data())
def test_small_uniform_batches_of_a_captured_width_get_an_exact_graph(config, data):
    config = config | {"varlen": False, "capture_sizes": config["capture_sizes"] or [1]}
    candidates = _build(config)
    # every band at depth 0 with no new token: each decode width is 0, skipped, so no uniform graph exists
    assume(candidates.widths)
    width = data.draw(st.sampled_from(candidates.widths))
    num_reqs = data.draw(st.integers(1, config["max_num_reqs"]))
    got = dispatch(candidates, num_reqs, num_reqs * width, width)
    if num_reqs <= config["small_grid"]:
        assert got == full(num_reqs * width, num_reqs, width)
