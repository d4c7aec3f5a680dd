"""Case families for the per-step depth: explicit zeros among resolved depths (fix 7), draft views of
every width including 0, acceptance traces that collapse and recover, DSD band tables (with gaps,
caps above Kmax and refused schedules), and a scheduler loop through a band that disables drafting."""

import numpy as np
import torch

from stress.core.types import Case
from stress.families.common import pick


def _case(kind: str, params: dict, note: str, draft: torch.Tensor | None = None) -> Case:
    inputs = {"kind": kind, "params": params}
    if draft is not None:
        inputs["draft"] = draft
    return Case(inputs=inputs, note=note)


def draft_columns(rng, rows: int, columns: int) -> torch.Tensor:
    """Distinct token ids, so a wrong column or row shows which one it came from."""
    return torch.from_numpy(rng.permutation(rows * columns + 1)[: rows * columns].astype(np.int64)).view(rows, columns)


def resolve(rng, device, launch):
    """Scheduler depths None, 0 or K against defaults, a few negative (refused)."""
    def depth(none_p):
        roll = rng.random()
        return None if roll < none_p else 0 if roll < none_p + 0.3 else int(rng.integers(-1 if roll > 0.95 else 1, 9))
    pairs = [(depth(0.3), int(rng.integers(-1 if rng.random() < 0.05 else 0, 9))) for _ in range(20)]
    return _case("resolve", {"pairs": pairs}, f"{sum(v == 0 for v, _ in pairs)} explicit zeros")


def limit(rng, device, launch):
    """A draft of 0..k_max columns (sometimes one too many) cut to n in -1..k_max+1, 0 included."""
    k_max = int(rng.integers(1, 7))
    columns = int(rng.integers(0, k_max + 1)) if rng.random() < 0.9 else k_max + 1
    draft = draft_columns(rng, int(rng.integers(0, 5)), columns)
    ns = [0] + [int(n) for n in rng.integers(-1, k_max + 2, size=6)]
    return _case("limit", {"k_max": k_max, "ns": ns}, f"draft {tuple(draft.shape)}, k_max {k_max}", draft)


def _steps(rng, max_depth: int, count: int) -> list[tuple[int, int, int]]:
    """(num_drafts, num_draft_tokens, num_accepted_tokens) in phases: everything rejected, everything
    accepted, random; some empty steps and a few the controller must refuse."""
    steps = []
    while len(steps) < count:
        phase, length = rng.random(), int(rng.integers(1, 6))
        for _ in range(length):
            drafts = int(rng.integers(0, 6))
            tokens = drafts * int(rng.integers(1, max_depth + 1))
            accepted = 0 if phase < 0.3 else tokens if phase < 0.6 else int(rng.integers(0, tokens + 1))
            if rng.random() < 0.04:
                drafts, tokens, accepted = pick(rng, ((drafts + 1, tokens, tokens + 1), (0, tokens + 1, 0)))
            steps.append((drafts, tokens, accepted))
    return steps[:count]


def controller(rng, device, launch):
    """One controller over a trace that collapses and recovers."""
    max_depth, window = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    initial = None if rng.random() < 0.5 else int(rng.integers(1, max_depth + 1))
    params = {"max_depth": max_depth, "window": window, "initial_depth": initial,
              "steps": _steps(rng, max_depth, int(rng.integers(5, 41)))}
    return _case("controller", params, f"Kmax {max_depth}, window {window}")


def _band_schedule(rng, max_batch_size: int, max_depth: int, zero_band: bool) -> list[tuple[int, int, int]]:
    """Valid bands from 1 with gaps between them, caps 0..Kmax+2, in any order."""
    bands, start = [], 1
    for _ in range(int(rng.integers(1, 5))):
        end = start + int(rng.integers(0, max(1, max_batch_size // 2)))
        bands.append((start, end, int(rng.integers(0, max_depth + 3))))
        start = end + 1 + int(rng.integers(0, 3))
    if zero_band:
        i = int(rng.integers(len(bands)))
        bands[i] = (*bands[i][:2], 0)
    return [bands[i] for i in rng.permutation(len(bands))]


def bands(rng, device, launch):
    """A DSD table with one controller per band, observed at random batch sizes, each starting at its cap or
    at an initial depth clamped to it; some schedules are refused (bands that overlap, none starting at 1,
    or one past the others that ends before it starts)."""
    max_batch_size, max_depth = int(rng.integers(1, 17)), int(rng.integers(1, 7))
    schedule = _band_schedule(rng, max_batch_size, max_depth, zero_band=bool(rng.random() < 0.5))
    if rng.random() < 0.15:
        start, end, depth = schedule[0]
        last = max(band[1] for band in schedule)
        schedule = pick(rng, ([(start + 1, end + 1, depth)] + schedule[1:], schedule + [(end, end + 2, depth)],
                              schedule + [(last + 3, last + 2, depth)]))
    steps = [(int(rng.integers(1, max_batch_size + 1)), *step) for step in _steps(rng, max_depth, 25)]
    # an initial depth above some band's cap (up to past every cap) starts that band at its cap
    initial = None if rng.random() < 0.25 else int(rng.integers(1, max_depth + 3))
    params = {"schedule": schedule, "max_batch_size": max_batch_size, "max_depth": max_depth,
              "window": int(rng.integers(1, 4)), "initial_depth": initial, "steps": steps}
    return _case("bands", params, f"S={max_batch_size} Kmax={max_depth} schedule={schedule}")


def band_edges(rng, device, launch):
    """Two neighbouring bands, anywhere in the schedule, that touch (the next starts on the last batch size of
    the one before: refused), overlap further (refused), or follow each other with no gap (accepted)."""
    max_batch_size, max_depth = int(rng.integers(2, 17)), int(rng.integers(1, 7))
    schedule = sorted(_band_schedule(rng, max_batch_size, max_depth, zero_band=False))
    if len(schedule) == 1:
        end = schedule[0][1]
        schedule.append((end + 1, end + 1 + int(rng.integers(0, 3)), int(rng.integers(0, max_depth + 3))))
    i = int(rng.integers(len(schedule) - 1))
    (start, end, _), (_, after_end, after_depth) = schedule[i], schedule[i + 1]
    after_start = max(start, end + 1 - int(pick(rng, (0, 1, 1, 2))))  # 0: adjacent, 1: touching, 2: overlap
    schedule[i + 1] = (after_start, max(after_start, after_end), after_depth)
    schedule = [schedule[j] for j in rng.permutation(len(schedule))]
    steps = [(int(rng.integers(1, max_batch_size + 1)), *step) for step in _steps(rng, max_depth, 10)]
    params = {"schedule": schedule, "max_batch_size": max_batch_size, "max_depth": max_depth,
              "window": int(rng.integers(1, 3)), "initial_depth": None, "steps": steps}
    return _case("bands", params, f"S={max_batch_size} Kmax={max_depth} schedule={schedule}")


def table_edges(rng, device, launch):
    """A table of one batch size (max_batch_size 1: two entries) under a schedule whose later bands start past
    it, beyond max_batch_size + 1: the first band's reach through the gap ends past the table."""
    max_depth = int(rng.integers(1, 7))
    schedule, start = [(1, int(rng.integers(1, 3)), int(rng.integers(0, max_depth + 3)))], int(rng.integers(3, 6))
    for _ in range(int(rng.integers(1, 3))):
        end = start + int(rng.integers(0, 3))
        schedule.append((start, end, int(rng.integers(0, max_depth + 3))))
        start = end + 1 + int(rng.integers(0, 3))
    schedule = [schedule[i] for i in rng.permutation(len(schedule))]
    params = {"schedule": schedule, "max_batch_size": 1, "max_depth": max_depth, "window": int(rng.integers(1, 3)),
              "initial_depth": None, "steps": [(1, *step) for step in _steps(rng, max_depth, 10)]}
    return _case("bands", params, f"S=1 Kmax={max_depth} schedule={schedule}")


def shared_cap_bands(rng, device, launch):
    """Two bands that are not neighbours share a cap (>= 2), a band of another cap between them: each is its own
    run of batch sizes with its own controller. Most steps land in one twin, rejection-heavy, so its depth moves
    while the other twin's must stay where its own steps put it."""
    max_depth = int(rng.integers(2, 7))
    cap = int(rng.integers(2, max_depth + 1))
    between = int(pick(rng, [c for c in range(max_depth + 1) if c != cap]))
    caps = [cap, between, cap] if rng.random() < 0.7 else [between, cap, between, cap]
    schedule, start = [], 1
    for band_cap in caps:
        end = start + int(rng.integers(0, 3))
        schedule.append((start, end, band_cap))
        start = end + 1 + int(rng.integers(0, 2))  # a gap keeps the band before it
    max_batch_size = schedule[-1][1] + int(rng.integers(0, 3))  # past the last band keeps the last
    twins = [band for band in schedule if band[2] == cap]
    moved = twins[int(rng.integers(len(twins)))]
    steps = []
    for step in _steps(rng, max_depth, 24):
        in_moved = rng.random() < 0.75
        batch_size = int(rng.integers(moved[0], moved[1] + 1)) if in_moved else int(rng.integers(1, max_batch_size + 1))
        steps.append((batch_size, *step))
    params = {"schedule": [schedule[i] for i in rng.permutation(len(schedule))], "max_batch_size": max_batch_size,
              "max_depth": max_depth, "window": int(rng.integers(1, 3)),
              "initial_depth": None if rng.random() < 0.5 else int(rng.integers(1, max_depth + 1)), "steps": steps}
    return _case("bands", params, f"S={max_batch_size} Kmax={max_depth} schedule={schedule} moved={moved}")


def disable_drafting(rng, device, launch):
    """Fix 7 end to end: a scheduler loop through a band with depth 0 (and synthetic steps with no
    depth): resolved depth, placeholders, the limited draft, acceptance fed back."""
    max_batch_size, max_depth = int(rng.integers(2, 13)), int(rng.integers(1, 7))
    schedule = _band_schedule(rng, max_batch_size, max_depth, zero_band=True)
    steps = [(int(rng.integers(1, max_batch_size + 1)), bool(rng.random() < 0.1), int(rng.integers(0, max_depth + 1)))
             for _ in range(int(rng.integers(5, 30)))]
    params = {"schedule": schedule, "max_batch_size": max_batch_size, "max_depth": max_depth,
              "window": int(rng.integers(1, 3)), "initial_depth": None, "steps": steps}
    return _case("disable_drafting", params, f"S={max_batch_size} Kmax={max_depth} schedule={schedule}",
                 draft_columns(rng, max_batch_size, max_depth))


FAMILIES = {"resolve": resolve, "limit": limit, "controller": controller, "bands": bands,
            "disable_drafting": disable_drafting, "band_edges": band_edges, "table_edges": table_edges,
            "shared_cap_bands": shared_cap_bands}
