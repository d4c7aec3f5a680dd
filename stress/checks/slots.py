"""Registry entries of spec.slots: request slots and seeds that stay identical across TP ranks."""



import reference.spec.slots
import stress.families.schedule
from stress.checks.common import EVERYWHERE
from stress.core.types import RETURN, Check, Mutant, Patch, Reach
from stress.families import slots as slot_families
from stress.families.refusals import (
    Corruption,
    refusal_family,
    replaced,
)

_SLOTS = "kernels.spec.slots:RequestSlots"


# ---------------------------------------------------------------- refusals

def _no_slots(rng, inputs):
    inputs["max_num_reqs"] = 0  # every schedule admits at least one request


def _admitted_twice(rng, inputs):
    """The first admission made again in its own step, with a slot to spare: only the check for a request that
    already holds a slot refuses it (with every slot taken, the full pool would refuse it too)."""
    schedule = list(inputs["schedule"])
    first = next((i for i, step in enumerate(schedule) if step.admitted), None)
    if first is None:
        return False
    step = schedule[first]
    schedule[first] = step._replace(admitted=(*step.admitted, step.admitted[0]))
    inputs.update(schedule=schedule, max_num_reqs=inputs["max_num_reqs"] + 1)
    return True


SLOTS_REFUSALS = refusal_family(slot_families.churn, (
    *replaced("max_num_reqs", (-1, 4.0, True, None, "8"), "max_num_reqs not an int >= 0"),
    Corruption("req_id", "an admission with every slot taken", _no_slots),
    Corruption("req_id", "a request admitted while it holds a slot, a slot to spare", _admitted_twice),
), "RequestSlots")


CHECKS = (
    Check(
        name="spec.slots",
        contract="request slots and fallback seeds identical on every TP rank: sorted slot recycling, a private "
                 "seed generator (fix 2)",
        kernel=stress.families.schedule.replay,  # drives the production kernels.spec.slots.RequestSlots
        reference=reference.spec.slots.replay,
        families={**slot_families.FAMILIES, "refused": SLOTS_REFUSALS},
        outputs=(RETURN,),
        mutants=(
            Mutant("set-order-recycling", "fix 2B, pre-fix (docs/fixes.md#fix-2b): freed slots are recycled in set "
                                          "order",
                   (Patch(_SLOTS, "for req_id in sorted(req_ids):", "for req_id in req_ids:"),),
                   oracles=EVERYWHERE, families=("mass_finish", "churn"),
                   path=Reach(families=("shared_prefix",))),
            Mutant("global-rng-seeds", "fix 2A, pre-fix (docs/fixes.md#fix-2a): fallback seeds come from the global "
                                       "numpy RNG",
                   (Patch(_SLOTS, "self._fallback_seed_rng.integers(", "np.random.randint("),),
                   oracles=EVERYWHERE, families=("resume", "churn")),
        ),
    ),
)
