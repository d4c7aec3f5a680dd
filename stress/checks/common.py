"""What several registry entries share."""

from stress.core.types import Reach

EVERYWHERE = {"cpu": "divergence", "cuda": "divergence"}
# engine.step's families with temperatures > 0 (seeds, noise, rejections, the logits cache): the path column
# hunts the sampling and verification bugs there first
ENGINE_SAMPLED = ("seeded_sampling", "padded_graphs")


def unreachable_by_engine(why: str) -> Reach:
    """The path column's answer for a planted bug that no workload of the whole step can meet, on either
    device: ``why``."""
    return Reach(unreachable=dict.fromkeys(("cpu", "cuda"), why))


# a flush-to-zero slip in sampling or verification, from the whole step's side
SUBNORMAL_TEMPERATURES_UNREACHABLE = unreachable_by_engine(
    "the engine's requests sample at temperatures of 0 or 0.7 to 2, never a subnormal one")
