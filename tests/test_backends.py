"""Backend selection and graph claims for the draft (fix 6), and the DFlash causality table."""

import itertools

import pytest

from kernels.spec.backends import (
    BACKENDS,
    CGSupport,
    backend_priorities,
    dflash_layer_causal,
    draft_graph_mode,
    graph_support,
    has_any_non_causal,
)
from kernels.spec.graphs import Mode

CAPABILITIES = (8, 9, 10, 12)


def test_support_levels_are_ordered():
    assert (CGSupport.NEVER < CGSupport.UNIFORM_SINGLE_TOKEN_DECODE < CGSupport.UNIFORM_BATCH
            < CGSupport.ALWAYS)


def test_sm100_prefers_flashinfer_only_for_causal_attention():
    assert backend_priorities(10, non_causal=False) == ("flashinfer", "flash_attn", "triton_attn", "flex_attention")
    assert backend_priorities(10, non_causal=True) == ("flash_attn", "flashinfer", "triton_attn", "flex_attention")


@pytest.mark.parametrize("major,non_causal", [(8, False), (9, False), (9, True), (12, False), (12, True)])
def test_flash_attention_leads_elsewhere(major, non_causal):
    assert backend_priorities(major, non_causal)[0] == "flash_attn"


@pytest.mark.parametrize("backend,major,non_causal,expected", [
    ("flashinfer", 9, False, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
    ("flashinfer", 9, True, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
    ("flashinfer", 10, False, CGSupport.UNIFORM_BATCH),
    ("flashinfer", 10, True, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE),  # its non-causal path is a prefill plan
    ("flashinfer", 12, True, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
    ("host_planned", 9, False, CGSupport.UNIFORM_BATCH),
    ("host_planned", 10, True, CGSupport.UNIFORM_SINGLE_TOKEN_DECODE),
    ("specsan_paged", 9, True, CGSupport.ALWAYS),
    ("flash_attn", 9, True, CGSupport.ALWAYS),
    ("flash_attn", 10, True, CGSupport.UNIFORM_BATCH),
    ("triton_attn", 10, True, CGSupport.ALWAYS),
])
def test_graph_claims(backend, major, non_causal, expected):
    assert graph_support(backend, major, non_causal) == expected


def test_the_draft_runs_eagerly_where_full_graphs_are_not_supported():
    assert draft_graph_mode("flashinfer", 10, non_causal=True) is Mode.NONE
    assert draft_graph_mode("host_planned", 10, non_causal=True) is Mode.NONE
    assert draft_graph_mode("flashinfer", 10, non_causal=False) is Mode.FULL
    assert draft_graph_mode("specsan_paged", 10, non_causal=True) is Mode.FULL


def test_no_host_planned_non_causal_path_is_ever_captured_and_nothing_is_piecewise():
    for backend, major, non_causal in itertools.product(BACKENDS, CAPABILITIES, (False, True)):
        mode = draft_graph_mode(backend, major, non_causal)
        assert mode in (Mode.FULL, Mode.NONE)
        if backend in ("flashinfer", "host_planned") and non_causal:
            assert mode is Mode.NONE, (backend, major)


@pytest.mark.parametrize("layer_types,override,expected", [
    (["full_attention"] * 2, True, False),  # the override makes every layer causal
    (["sliding_attention"] * 2, False, True),  # and every layer non-causal
    (["sliding_attention", "full_attention"], None, True),  # full-attention layers see the whole block
    (["sliding_attention", "sliding_attention"], None, False),
    (None, None, True),  # no layer types: non-causal
    ([], None, True),
])
def test_dflash_has_any_non_causal(layer_types, override, expected):
    assert has_any_non_causal(2, layer_types, override) is expected


def test_dflash_causality_is_per_layer():
    types = ["sliding_attention", "full_attention"]
    assert dflash_layer_causal(0, 2, types) is True
    assert dflash_layer_causal(1, 2, types) is False


@pytest.mark.parametrize("call,name", [
    (lambda: graph_support("fa4", 10, False), "backend"),
    (lambda: graph_support("flashinfer", 0, False), "capability_major"),
    (lambda: backend_priorities(10, 1), "non_causal"),
    (lambda: has_any_non_causal(2, ["sliding_attention"]), "layer_types"),
    (lambda: has_any_non_causal(1, ["linear_attention"]), "layer_types"),
    (lambda: has_any_non_causal(0), "num_layers"),
    (lambda: has_any_non_causal(1, None, "yes"), "causal_override"),
    (lambda: dflash_layer_causal(2, 2), "layer"),
])
def test_arguments_are_validated(call, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        call()
