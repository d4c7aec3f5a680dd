"""Case families for backend selection and graph claims: rows of (capability, backend, DFlash layer
config), fuzzed over every backend and causality configuration, and focused on non-causal drafts on
SM100 where fix 6 lives."""

from kernels.spec.backends import BACKENDS, LAYER_TYPES
from stress.core.types import Case
from stress.families.common import pick

CAPABILITIES = (7, 8, 9, 10, 11, 12)


def _layers(rng, valid_p: float = 0.9) -> tuple[int, list[str] | None, bool | None]:
    """(num_layers, layer_types, causal_override): types missing, empty or per layer; an override now
    and then; a few configs to refuse (types of the wrong length or an unknown kind)."""
    num_layers = int(rng.integers(1, 7))
    roll = rng.random()
    types = None if roll < 0.15 else [] if roll < 0.25 else [pick(rng, LAYER_TYPES) for _ in range(num_layers)]
    if types and rng.random() < 0.3:
        types = ["sliding_attention"] * num_layers  # every layer causal
    if rng.random() > valid_p:
        types = pick(rng, (["full_attention"] * (num_layers + 1), ["linear_attention"] * num_layers))
    override = pick(rng, (None, None, None, True, False))
    return num_layers, types, override


def _rows(rng, count: int, capabilities, names, valid_p: float = 0.9) -> list[tuple]:
    return [(pick(rng, capabilities), pick(rng, names), *_layers(rng, valid_p)) for _ in range(count)]


def _case(rng, rows: list[tuple], note: str) -> Case:
    """Half the cases leave a layer config that holds the defaults (no types, no override) out of the calls,
    as the engine does."""
    absent = bool(rng.random() < 0.5)
    return Case(inputs={"rows": rows, "absent_defaults": absent}, note=note + (", defaults left out" if absent else ""))


def selection(rng, device, launch):
    """Every backend (and an unknown name) on every capability, any layer config."""
    return _case(rng, _rows(rng, 30, CAPABILITIES, BACKENDS + ("fa4",)), "all backends")


def sm100_non_causal(rng, device, launch):
    """Capability 10 with the backends whose claims depend on causality, most drafts non-causal."""
    rows = _rows(rng, 30, (10, 10, 10, 9, 12), ("flashinfer", "host_planned", "flash_attn"), valid_p=1.0)
    return _case(rng, rows, "SM100, causality-dependent backends")


FAMILIES = {"selection": selection, "sm100_non_causal": sm100_non_causal}
