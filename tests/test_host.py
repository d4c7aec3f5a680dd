"""The host checks' drivers and comparators: invariant violations name the rule and the offending
descriptor, records differ entry by entry, refusals are outcomes and other exceptions escape."""

import pytest
import torch

from reference.spec import depth as ref_depth
from reference.spec import graphs as ref_graphs
from reference.spec.graphs import Descriptor
from stress.oracles import host

CONFIG = {"capture_sizes": [4, 8], "max_num_reqs": 4, "decode_query_len": 4, "max_spec_tokens": 3, "small_grid": 0}
QUERIES = [(2, 8, 4, False, None), (2, 8, 4, True, 4), (3, 7, None, False, 3)]


def _good():
    return host.graph_outcomes(CONFIG, QUERIES)


def test_production_and_reference_records_agree_on_a_hand_case():
    got = _good()
    assert got == host.graph_outcomes(CONFIG, QUERIES, impl=ref_graphs)
    assert got["full"] == [Descriptor("FULL", 4, 1, 4), Descriptor("FULL", 8, 2, 4)]
    assert [d for _, d in got["dispatch"]] == [Descriptor("FULL", 8, 2, 4), Descriptor("PIECEWISE", 8),
                                               Descriptor("PIECEWISE", 8)]
    assert host.graph_outcomes_agree("return", got, _good()) is None


@pytest.mark.parametrize("break_it,rule", [
    (lambda r: r["widths"].append(0), "a width >= 1, got 0"),
    (lambda r: r["full"].append(Descriptor("FULL", 9, 2, 4)), "num_tokens == num_reqs * uniform"),
    (lambda r: r["full"].append(Descriptor("FULL", 0, 0, 4)), "a FULL graph of >= 1 request"),
    (lambda r: _dispatch(r, 0, Descriptor("FULL", 4, 1, 4)), "num_tokens >= 8"),
    (lambda r: _dispatch(r, 1, Descriptor("FULL", 8, 2, 4)), "no FULL graph for a batch with prefill"),
    (lambda r: _dispatch(r, 0, Descriptor("FULL", 12, 3, 4)), "a captured FULL graph"),
    (lambda r: _dispatch(r, 2, Descriptor("FULL", 8, 2, None, 4)), "num_reqs >= 3"),
])
def test_an_invariant_violation_names_its_rule_and_descriptor(break_it, rule):
    got = _good()
    break_it(got)
    found = host.graph_outcomes_agree("return", _good(), got)
    assert found is not None and found.output == "return (invariant)"
    text = "\n".join(found.lines())
    assert rule in text
    assert "got 0" in rule or "got Descriptor(" in text


def _dispatch(records, i, graph):
    records["dispatch"][i] = host.Dispatched(QUERIES[i], graph)


def test_a_plain_difference_lists_the_path_of_each_entry():
    got = _good()
    _dispatch(got, 2, Descriptor("NONE", 7))
    found = host.graph_outcomes_agree("return", _good(), got)
    assert found.first == [(("dispatch", 2), host.Dispatched(QUERIES[2], Descriptor("PIECEWISE", 8)),
                            host.Dispatched(QUERIES[2], Descriptor("NONE", 7)))]


def test_named_records_are_compared_field_by_field():
    want = [host.Resolution(0, 5, 0, ())]
    got = [host.Resolution(0, 5, 5, (-1,) * 5)]
    assert host.records_agree("return", want, got).first == [((0, "resolved"), 0, 5), ((0, "placeholders"), (),
                                                                                         (-1,) * 5)]
    assert host.records_agree("return", [True], [1]) is not None  # a bool is not an int


def test_refusals_are_outcomes_other_exceptions_escape():
    draft = torch.zeros(2, 3, dtype=torch.int64)
    records = host.depth_outcomes("limit", {"k_max": 3, "ns": [4, 0]}, draft)
    assert records[0] == host.Limit(4, host.ERROR)
    assert records[1].view.shape == (2, 0) and records[1].view.same_storage
    assert records == host.depth_outcomes("limit", {"k_max": 3, "ns": [4, 0]}, draft, impl=ref_depth)
    with pytest.raises(ZeroDivisionError):
        host.graph_outcomes(CONFIG, [], impl=_DividesByZero)


class _DividesByZero:
    @staticmethod
    def build_candidates(**config):
        return 1 // 0


def test_absent_defaults_leave_out_only_what_equals_the_contract_default():
    kwargs = {"schedule": None, "adaptive": False, "small_grid": 32, "varlen": 0, "max_capture_size": 8}
    assert host.without_defaults(ref_graphs.build_candidates, kwargs, False) == kwargs
    # varlen=0 is not the default False (a bool), so it stays; so do values that differ from the default
    assert host.without_defaults(ref_graphs.build_candidates, kwargs, True) == {"varlen": 0, "max_capture_size": 8}


def test_a_changed_default_shows_when_the_option_is_left_out():
    class PrefillByDefault:
        build_candidates = staticmethod(ref_graphs.build_candidates)
        decode_widths = staticmethod(ref_graphs.decode_widths)

        @staticmethod
        def dispatch(candidates, num_reqs, num_tokens, uniform, has_prefill=True, *, max_req_tokens=None):
            return ref_graphs.dispatch(candidates, num_reqs, num_tokens, uniform, has_prefill,
                                       max_req_tokens=max_req_tokens)

    want = host.graph_outcomes(CONFIG, QUERIES, True, impl=ref_graphs)
    assert host.graph_outcomes(CONFIG, QUERIES, False, impl=PrefillByDefault) == want
    assert host.graph_outcomes_agree("return", want, host.graph_outcomes(CONFIG, QUERIES, True,
                                                                         impl=PrefillByDefault)) is not None
