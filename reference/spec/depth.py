"""Reference depth logic: the fix-7 rules and the controllers of docs/contracts/spec.md#specdepth, written plainly.

Same names and call shapes as kernels.spec.depth, so one driver (stress.oracles.host.depth_outcomes) runs
either. The controller keeps its window as a list of steps and computes the target
floor(accepted / drafts + 1.5) in integers: floor((2 * accepted + 3 * drafts) / (2 * drafts)).
"""


def resolve_num_spec_tokens(value, default):
    if default < 0 or (value is not None and value < 0):
        raise ValueError("negative depth")
    return default if value is None else value


def spec_token_placeholders(value, default):
    return [-1] * resolve_num_spec_tokens(value, default)


def limit_draft_tokens(draft, n, k_max):
    columns = draft.shape[1]
    if k_max < 1 or columns > k_max or n < 0 or n > k_max:
        raise ValueError("refused")
    if n == 0:
        return draft[:, :0]
    if columns == 0:
        return draft
    if columns < n:
        raise ValueError("fewer columns than scheduled")
    return draft[:, :n]


class AcceptanceLengthController:
    def __init__(self, max_depth, window, initial_depth=None):
        self.max_depth, self.window = max_depth, window
        self.depth = max_depth if initial_depth is None else initial_depth
        self.steps = []  # (drafts, accepted) of the open window's non-empty steps

    def observe(self, num_drafts, num_draft_tokens, num_accepted_tokens):
        if (min(num_drafts, num_draft_tokens, num_accepted_tokens) < 0 or num_accepted_tokens > num_draft_tokens
                or num_drafts == 0 < num_draft_tokens):
            raise ValueError("refused counts")
        if num_drafts == 0:
            return False
        self.steps.append((num_drafts, num_accepted_tokens))
        if len(self.steps) < self.window:
            return False
        drafts = sum(d for d, _ in self.steps)
        accepted = sum(a for _, a in self.steps)
        target = max(1, min(self.max_depth, (2 * accepted + 3 * drafts) // (2 * drafts)))
        self.depth = target if target < self.depth else min(self.depth + 1, target)
        self.steps = []
        return True


def band_lookup(schedule, max_batch_size, max_depth):
    """K of each batch size: the band that starts last at or before it (so gaps and the tail keep the
    band before them), capped at ``max_depth``."""
    bands = sorted(schedule)
    if (not bands or bands[0][0] != 1 or any(len(band) != 3 or band[2] < 0 or band[1] < band[0] for band in bands)
            or any(after[0] <= before[1] for before, after in zip(bands, bands[1:], strict=False))):
        raise ValueError("invalid schedule")
    return [0] + [min(max_depth, [band[2] for band in bands if band[0] <= batch_size][-1])
                  for batch_size in range(1, max_batch_size + 1)]


class BandAcceptanceLengthController:
    """Controllers keyed by band number; a band is a run of batch sizes with equal caps."""

    def __init__(self, caps, window, initial_depth=None):
        self.caps = caps
        self.band = [0] * len(caps)
        for batch_size in range(2, len(caps)):
            self.band[batch_size] = self.band[batch_size - 1] + (caps[batch_size] != caps[batch_size - 1])
        self.controllers = {}
        for batch_size in range(1, len(caps)):
            cap = caps[batch_size]
            if cap and self.band[batch_size] not in self.controllers:
                start = None if initial_depth is None else min(initial_depth, cap)
                self.controllers[self.band[batch_size]] = AcceptanceLengthController(cap, window, start)

    def depth_for(self, batch_size):
        return self.controllers[self.band[batch_size]].depth if self.caps[batch_size] else 0

    def observe(self, batch_size, num_drafts, num_draft_tokens, num_accepted_tokens):
        if self.caps[batch_size] == 0:
            return False
        return self.controllers[self.band[batch_size]].observe(num_drafts, num_draft_tokens, num_accepted_tokens)
