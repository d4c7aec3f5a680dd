"""Which attention backend the draft runs on, and whether its steps may be captured (fix 6).

A captured graph replays the launches recorded at capture time. A backend whose metadata all
lives in device buffers (seq_lens, block tables, query offsets) replays correctly at any batch;
one that plans on the host per step (a prefill wrapper's plan) replays the plan of the capture
batch. FlashInfer's decode paths read device metadata, but they only express causal attention:
non-causal work runs as host-planned prefill, so a non-causal FlashInfer may claim no more than
single-token decode, and the DFlash draft then runs eagerly. On SM100 its non-causal (cutlass)
path is also unreliable, so FlashAttention is preferred for non-causal drafts there.
"""

import enum
from collections.abc import Sequence

from kernels import validate
from kernels.spec.graphs import Mode

UPSTREAM = ("flashinfer", "flash_attn", "triton_attn", "flex_attention")
# Ours: specsan_paged keeps every per-step value in device buffers; host_planned bakes per-step
# lengths into the launch when its non-causal path runs, like a prefill wrapper's plan.
OURS = ("specsan_paged", "host_planned")
BACKENDS = UPSTREAM + OURS
LAYER_TYPES = ("sliding_attention", "full_attention")


class CGSupport(enum.IntEnum):
    """How much of a batch a backend's captured launch stays correct for (ordered)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


def backend_priorities(capability_major: int, non_causal: bool) -> tuple[str, ...]:
    """Auto-selection order of the non-MLA backends: FlashInfer first only on SM10x and causal."""
    _check_device(capability_major, non_causal)
    if capability_major == 10 and not non_causal:
        return ("flashinfer", "flash_attn", "triton_attn", "flex_attention")
    return ("flash_attn", "flashinfer", "triton_attn", "flex_attention")


def graph_support(backend: str, capability_major: int, non_causal: bool) -> CGSupport:
    """The graph support ``backend`` may claim for the draft's attention."""
    _check_device(capability_major, non_causal)
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend in ("specsan_paged", "triton_attn", "flex_attention"):
        return CGSupport.ALWAYS
    if backend == "flash_attn":
        return CGSupport.ALWAYS if capability_major == 9 else CGSupport.UNIFORM_BATCH  # FA3 on SM90
    if backend == "flashinfer" and capability_major == 9:
        return CGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    # flashinfer elsewhere, host_planned: their decode paths are causal only
    return CGSupport.UNIFORM_SINGLE_TOKEN_DECODE if non_causal else CGSupport.UNIFORM_BATCH


def draft_graph_mode(backend: str, capability_major: int, non_causal: bool) -> Mode:
    """FULL graphs for the draft step when the backend supports uniform batches, else eager
    (never PIECEWISE: the DFlash draft has no piecewise split)."""
    if graph_support(backend, capability_major, non_causal) >= CGSupport.UNIFORM_BATCH:
        return Mode.FULL
    return Mode.NONE


def dflash_layer_causal(layer: int, num_layers: int, layer_types: Sequence[str] | None = None,
                        causal_override: bool | None = None) -> bool:
    """Whether DFlash draft layer ``layer`` attends causally.

    An explicit override applies to every layer. Otherwise sliding-window layers are causal and
    full-attention layers attend to the whole draft block; a config without layer types is
    treated as non-causal throughout.
    """
    types = _check_layers(num_layers, layer_types, causal_override)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"layer: expected an int in [0, {num_layers}), got {layer!r}")
    return _causal(layer, types, causal_override)


def has_any_non_causal(num_layers: int, layer_types: Sequence[str] | None = None,
                       causal_override: bool | None = None) -> bool:
    """Whether the draft needs a backend that can attend non-causally (decided before it is built)."""
    types = _check_layers(num_layers, layer_types, causal_override)
    return not all(_causal(layer, types, causal_override) for layer in range(num_layers))


def _causal(layer: int, types: tuple[str, ...], causal_override: bool | None) -> bool:
    if causal_override is not None:
        return causal_override
    return bool(types) and types[layer] == "sliding_attention"


def _check_device(capability_major, non_causal) -> None:
    validate.positive_int("capability_major", capability_major)
    validate.flag("non_causal", non_causal)


def _check_layers(num_layers, layer_types, causal_override) -> tuple[str, ...]:
    validate.positive_int("num_layers", num_layers)
    if causal_override is not None and not isinstance(causal_override, bool):
        raise ValueError(f"causal_override: expected a bool or None, got {causal_override!r}")
    types = tuple(layer_types or ())
    if types and len(types) != num_layers:
        raise ValueError(f"layer_types: {len(types)} entries for {num_layers} layers")
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"layer_types: unknown {unknown}; expected {' or '.join(LAYER_TYPES)}")
    return types
