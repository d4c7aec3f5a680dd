"""Cases and tasks: a case is addressed by (check, family, seed) and rebuilt from those alone, so every
failure reproduces from one printed line; ``plan`` lays a run's tasks out iteration-major."""

import zlib
from typing import NamedTuple

import numpy as np

from stress.core import refusal
from stress.core.guards import fresh_inputs
from stress.core.types import Case, Check, Mutant


class Task(NamedTuple):
    check: str
    family: str
    seed: int
    mutant: str | None = None
    launch: tuple | None = None  # forced launch shape, as sorted (key, value) pairs
    tool: str | None = None  # run under this compute-sanitizer tool (stress.sanitize.runner) instead
    patched: Mutant | None = None  # the mutant named ``mutant``, when a driver resolved it (a generated one)
    alone: str = ""  # why this run of the task holds its GPU alone (a rerun, stress.core.workers); "" shares it
    trace: bool = True  # False: the CPU tracer skips this case (``run --no-trace``)
    prebuilt: str = ""  # the file its case was built into ahead of its turn (stress.core.prebuild); "": build it


def case_seed(base: int, check: str, family: str, i: int) -> int:
    """Seed of iteration i of (check, family): independent of run order and of the worker."""
    key = (zlib.crc32(check.encode()), zlib.crc32(family.encode()), i)
    state = np.random.SeedSequence(entropy=base, spawn_key=key).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))  # 63 bits: fits an int64 everywhere it is printed or stored


def build_case(check: Check, family: str, seed: int, device: str, launch: dict | None = None) -> Case:
    if family not in check.families:
        raise ValueError(f"family {family!r} is not one of {check.name}'s: {', '.join(check.families)}")
    if launch is None:
        launch = draw_launch(check.sweep(device) if check.sweep else [{}], seed)
    if device in check.families[family].own_launch_on:
        launch = {}
    case = check.families[family](np.random.default_rng(seed), device, dict(launch))
    case.launch = dict(launch)
    return case


DEFAULT_SHARE = 1 / 3  # of the cases at least, where a sweep's first shape is the launcher's own choice ({})


def draw_launch(shapes: list[dict], seed: int) -> dict:
    """The launch shape of a case drawn without one: uniform over the sweep, except that the launcher's own
    choice (an empty first shape) runs in at least DEFAULT_SHARE of the cases. It is what production runs,
    and a slip in its tile heuristic shows only in cases that use it: a uniform draw over a GPU sweep of 13
    shapes gives it 1 case in 13, too few for a short mutate run to reach such a slip. The uniform draw comes
    first and may only move to the default, so a seed whose uniform draw is the default keeps it (a repro line
    without --launch names the same shape), and sweeps of 3 shapes or fewer draw exactly uniformly."""
    rng, n = np.random.default_rng([seed, 7]), len(shapes)
    index = int(rng.integers(n))
    if index and not shapes[0] and rng.random() < (DEFAULT_SHARE - 1 / n) / (1 - 1 / n):  # never at n <= 3
        index = 0
    return shapes[index]


def task_case(check: Check, task: Task, device: str) -> Case:
    """``task``'s case, built from its (family, seed, forced launch shape)."""
    return build_case(check, task.family, task.seed, device, dict(task.launch) if task.launch else None)


def expected_outputs(check: Check, case: Case) -> dict:
    """The reference's outputs by name, computed on CPU copies (the reference must not mutate)."""
    return by_output(check, check.reference(**fresh_inputs(case)))


def by_output(check: Check, returned) -> dict:
    """What ``check``'s reference returned (one value, or a tuple in ``outputs`` order), by output name."""
    values = (returned,) if len(check.outputs) == 1 else tuple(returned)
    return dict(zip(check.outputs, values, strict=True))


def plan(checks: list[Check], families: list[str] | None, iters: int, seed: int,
         mutant: str | None = None, tool: str | None = None) -> list[Task]:
    """Iteration-major order, so an interrupted run has covered every family evenly; ``mutant`` is
    applied in every case, and every case runs under compute-sanitizer's ``tool`` when one is given."""
    # A check (or a family: common.one_per_value) with an iteration share runs its n cases spread evenly over
    # the iterations.
    def spread_over(share: float) -> dict[int, int]:
        n = max(1, round(iters * share)) if share < 1 else iters
        return {j * iters // n: j for j in range(n)}

    at = {(check.name, family): spread_over(check.iteration_share * build.iteration_share)
          for check in checks for family, build in check.families.items()}
    tasks = []
    for i in range(iters):
        for check in checks:
            for family, build in check.families.items():
                # a refusal case launches no kernel: nothing for compute-sanitizer to watch
                if (i in at[check.name, family] and (not families or family in families)
                        and not (tool and refusal.is_family(build))):
                    case = at[check.name, family][i]
                    tasks.append(Task(check.name, family, case_seed(seed, check.name, family, case), mutant, tool=tool))
    return tasks
