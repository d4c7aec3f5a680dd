"""Reference backend selection (fix 6) as tables; same names and call shapes as kernels.spec.backends.

Support levels are ints 0..3 (NEVER to ALWAYS), graph modes their names.
"""

NEVER, SINGLE_TOKEN, UNIFORM_BATCH, ALWAYS = range(4)

# (backend, capability major or None for any, non-causal) -> claim; the first matching row wins
CLAIMS = (
    ("specsan_paged", None, None, ALWAYS),
    ("triton_attn", None, None, ALWAYS),
    ("flex_attention", None, None, ALWAYS),
    ("flash_attn", 9, None, ALWAYS),  # FA3
    ("flash_attn", None, None, UNIFORM_BATCH),
    ("flashinfer", 9, None, SINGLE_TOKEN),
    ("flashinfer", None, False, UNIFORM_BATCH),
    ("flashinfer", None, True, SINGLE_TOKEN),  # non-causal runs a host-planned prefill
    ("host_planned", None, False, UNIFORM_BATCH),
    ("host_planned", None, True, SINGLE_TOKEN),
)


def backend_priorities(capability_major, non_causal):
    rest = ["triton_attn", "flex_attention"]
    if capability_major == 10 and not non_causal:
        return ["flashinfer", "flash_attn"] + rest
    return ["flash_attn", "flashinfer"] + rest


def graph_support(backend, capability_major, non_causal):
    for name, major, causality, claim in CLAIMS:
        if name == backend and major in (None, capability_major) and causality in (None, non_causal):
            return claim
    raise ValueError(f"unknown backend {backend!r}")


def draft_graph_mode(backend, capability_major, non_causal):
    return "FULL" if graph_support(backend, capability_major, non_causal) >= UNIFORM_BATCH else "NONE"


def dflash_layer_causal(layer, num_layers, layer_types=None, causal_override=None):
    types = list(layer_types or [])
    if (num_layers < 1 or not 0 <= layer < num_layers or (types and len(types) != num_layers)
            or any(t not in ("sliding_attention", "full_attention") for t in types)):
        raise ValueError("invalid layer config")
    if causal_override is not None:
        return causal_override
    return bool(types) and types[layer] == "sliding_attention"  # no types at all: non-causal


def has_any_non_causal(num_layers, layer_types=None, causal_override=None):
    if num_layers < 1:
        raise ValueError("no layers")
    return any(not dflash_layer_causal(layer, num_layers, layer_types, causal_override) for layer in range(num_layers))
