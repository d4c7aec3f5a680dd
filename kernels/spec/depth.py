"""Per-step speculative depth: chosen by the scheduler, kept when it is 0 (fix 7), adapted to
the observed acceptance (docs/contracts/spec.md#specdepth) and capped per batch-size band (DSD).

Depth 0 is a decision (drafting is off for this step: a DSD band with K = 0, or a controller),
not a missing value. Replacing it by the default K made the worker draft K tokens and the async
scheduler reserve K placeholders while the scheduler had budgeted none.
"""

import math
from collections.abc import Sequence

import torch

from kernels import validate

PLACEHOLDER = -1  # a draft token not known yet (async scheduling); verification rejects it


def resolve_num_spec_tokens(value: int | None, default: int) -> int:
    """The depth a step runs at: the scheduler's ``value``; ``default`` only when it gave none
    (a synthetic or empty step)."""
    validate.non_negative_int("default", default)
    resolved = default if value is None else value
    return validate.non_negative_int("value", resolved)


def spec_token_placeholders(value: int | None, default: int) -> list[int]:
    """What the async scheduler appends for the drafts of the next step: one per resolved token."""
    return [PLACEHOLDER] * resolve_num_spec_tokens(value, default)


def limit_draft_tokens(draft: torch.Tensor, n: int, k_max: int) -> torch.Tensor:
    """The first ``n`` draft columns of ``draft`` [B, <= k_max], as a view of the same storage.

    ``n == 0`` gives the zero-width view: the runner then writes no drafts and tells the
    scheduler there are none. A speculator that drafted nothing (0 columns) passes through.
    """
    validate.tensor("draft", draft, ndim=2, unit_stride=False)
    validate.positive_int("k_max", k_max)
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"n: expected an int, got {n!r}")
    if draft.shape[1] > k_max:
        raise ValueError(f"draft: {draft.shape[1]} columns, more than k_max={k_max}")
    if n == 0:
        return draft[:, :0]
    if not 1 <= n <= k_max:
        raise ValueError(f"n: the scheduler chose {n} draft tokens; expected 0..{k_max}")
    if draft.shape[1] == 0:
        return draft
    if draft.shape[1] < n:
        raise ValueError(f"draft: {draft.shape[1]} columns, fewer than the n={n} scheduled")
    return draft[:, :n]


class AcceptanceLengthController:
    """The depth from the mean accepted draft length over a window of non-empty steps.

    When ``window`` steps with drafts have been seen, the target is floor(mean accepted per
    draft + 1.5) clamped to [1, max_depth]. A lower target is taken at once; a higher one only
    one step per window, so one lucky window cannot jump to the maximum. Then the window starts
    over.
    """

    def __init__(self, max_depth: int, window: int, initial_depth: int | None = None):
        validate.positive_int("max_depth", max_depth)
        validate.positive_int("window", window)
        depth = max_depth if initial_depth is None else validate.positive_int("initial_depth", initial_depth)
        if depth > max_depth:
            raise ValueError(f"initial_depth: {depth} is above max_depth={max_depth}")
        self.max_depth, self.window, self.depth = max_depth, window, depth
        self._reset()

    def observe(self, num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int) -> bool:
        """Record one step; True when it closed a window (the depth may have changed)."""
        validate.non_negative_int("num_drafts", num_drafts)
        validate.non_negative_int("num_draft_tokens", num_draft_tokens)
        validate.non_negative_int("num_accepted_tokens", num_accepted_tokens)
        if num_accepted_tokens > num_draft_tokens:
            raise ValueError(f"num_accepted_tokens: {num_accepted_tokens} exceeds num_draft_tokens={num_draft_tokens}")
        if num_drafts == 0:
            if num_draft_tokens:
                raise ValueError(f"num_draft_tokens: {num_draft_tokens} tokens without a draft")
            return False  # an empty step says nothing about acceptance
        self._steps += 1
        self._drafts += num_drafts
        self._accepted += num_accepted_tokens
        if self._steps < self.window:
            return False
        target = min(self.max_depth, max(1, math.floor(self._accepted / self._drafts + 1.5)))
        if target < self.depth:
            self.depth = target
        elif target > self.depth:
            self.depth += 1
        self._reset()
        return True

    def _reset(self) -> None:
        self._steps = self._drafts = self._accepted = 0


def band_lookup(schedule: Sequence[tuple[int, int, int]], max_batch_size: int, max_depth: int) -> tuple[int, ...]:
    """The DSD schedule [(range_start, range_end, K_b), ...] as a dense batch_size -> K_b table.

    Index 0 is unused (0). Bands must not overlap and the first must start at 1; a batch size in
    a gap keeps the band before it, one past the last band keeps the last, and every K_b is
    capped at ``max_depth`` (buffers and graphs are sized for it).
    """
    validate.positive_int("max_batch_size", max_batch_size)
    validate.positive_int("max_depth", max_depth)
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not schedule:
        raise ValueError(f"schedule: expected a non-empty list of (range_start, range_end, K), got {schedule!r}")
    for band in schedule:
        if not isinstance(band, Sequence) or len(band) != 3:
            raise ValueError(f"schedule: entry {band!r} is not (range_start, range_end, K)")
        validate.positive_int("schedule", band[0])
        validate.non_negative_int("schedule", band[2])
        if validate.positive_int("schedule", band[1]) < band[0]:
            raise ValueError(f"schedule: band {band!r} ends before it starts")
    bands = sorted(schedule, key=lambda band: band[0])
    if bands[0][0] != 1:
        raise ValueError(f"schedule: the first band starts at {bands[0][0]}; it must start at 1 so every batch "
                         "size has a depth")
    for before, after in zip(bands, bands[1:], strict=False):
        if after[0] <= before[1]:
            raise ValueError(f"schedule: bands {before!r} and {after!r} overlap")
    table = [0] * (max_batch_size + 1)
    for i, (start, _, depth) in enumerate(bands):
        reach = bands[i + 1][0] - 1 if i + 1 < len(bands) else max_batch_size  # through the gap after it
        for batch_size in range(start, min(reach, max_batch_size) + 1):
            table[batch_size] = min(depth, max_depth)
    return tuple(table)


class BandAcceptanceLengthController:
    """One acceptance-length controller per band of a dense DSD table (``band_lookup``).

    A band is a run of batch sizes with the same cap; its controller's maximum is that cap. A
    band with cap 0 never drafts: it has no controller and its depth is 0.
    """

    def __init__(self, caps: Sequence[int], window: int, initial_depth: int | None = None):
        if len(caps) < 2 or caps[0] != 0:
            raise ValueError("caps: expected a dense batch_size -> cap table with an unused 0 at index 0")
        validate.positive_int("window", window)
        self._by_batch_size: list[AcceptanceLengthController | None] = [None]
        previous, controller = None, None
        for cap in caps[1:]:
            validate.non_negative_int("caps", cap)
            if cap != previous:
                start = None if initial_depth is None else min(initial_depth, cap)
                controller = AcceptanceLengthController(cap, window, start) if cap else None
                previous = cap
            self._by_batch_size.append(controller)

    def depth_for(self, batch_size: int) -> int:
        controller = self._controller(batch_size)
        return 0 if controller is None else controller.depth

    def observe(self, batch_size: int, num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int) -> bool:
        """Record one step of ``batch_size`` requests with its band's controller."""
        controller = self._controller(batch_size)
        if controller is None:
            return False
        return controller.observe(num_drafts, num_draft_tokens, num_accepted_tokens)

    def _controller(self, batch_size: int) -> AcceptanceLengthController | None:
        validate.positive_int("batch_size", batch_size)
        if batch_size >= len(self._by_batch_size):
            raise ValueError(f"batch_size: {batch_size} is above the table's {len(self._by_batch_size) - 1}")
        return self._by_batch_size[batch_size]
