"""Case families for request-slot bookkeeping: seeded schedules replayed with set-typed release lists
and a perturbed global numpy RNG (set-order recycling and global-RNG seeds diverge in-process)."""

from stress.core.types import Case
from stress.families.common import pick
from stress.families.schedule import Step, random_schedule


def _case(rng, schedule, max_num_reqs, note) -> Case:
    """Now and then a configuration seed of 0 or none, whose fallback-seed stream is the documented 0's."""
    config_seed = int(rng.integers(0, 2**31)) if rng.random() < 0.75 else pick(rng, (0, None))
    return Case(inputs={"max_num_reqs": max_num_reqs, "config_seed": config_seed,
                        "schedule": schedule, "global_seed": int(rng.integers(0, 2**31))},
                note=f"{note}, config seed {config_seed}")


def churn(rng, device, launch):
    """Steady traffic: some requests finish, some are preempted and resumed, slots are refilled."""
    max_num_reqs = int(rng.integers(2, 9))
    schedule = random_schedule(rng, max_num_reqs=max_num_reqs, num_steps=int(rng.integers(3, 12)))
    return _case(rng, schedule, max_num_reqs, f"S={max_num_reqs}, {len(schedule)} steps")


def mass_finish(rng, device, launch):
    """Most of a full batch finishes in one step: a large set whose order decides every next slot."""
    max_num_reqs = int(rng.integers(4, 17))
    schedule = random_schedule(rng, max_num_reqs=max_num_reqs, num_steps=int(rng.integers(2, 6)), finish_p=0.8)
    return _case(rng, schedule, max_num_reqs, f"S={max_num_reqs}, mass finish")


def resume(rng, device, launch):
    """Heavy preemption: resumed requests get new slots, new cached counts and new fallback seeds."""
    max_num_reqs = int(rng.integers(2, 7))
    schedule = random_schedule(rng, max_num_reqs=max_num_reqs, num_steps=int(rng.integers(4, 12)), finish_p=0.1,
                               preempt_p=0.6, seeded_p=0.0, unaligned_p=0.3)
    return _case(rng, schedule, max_num_reqs, f"S={max_num_reqs}, preemption")


def zero_width(rng, device, launch):
    """No slots, no steps, or steps that admit and release nothing."""
    if rng.integers(2):
        empty = [Step(set(), set(), (), int(rng.integers(0, 5))) for _ in range(int(rng.integers(0, 3)))]
        return _case(rng, empty, int(rng.integers(0, 3)), "empty steps")
    return _case(rng, random_schedule(rng, max_num_reqs=0, num_steps=3), 0, "no slots")


FAMILIES = {"churn": churn, "mass_finish": mass_finish, "resume": resume, "zero_width": zero_width}
