"""Case families for graph candidates and dispatch: fuzzed DSD schedules (bands with depth 0, depths
above Kmax, overlapping bands, bands that leave batch sizes uncovered), n_new 0 and 1, capture-size
lists, and batches (uniform, mixed, prefill-shaped) sized around band and grid edges."""

from typing import NamedTuple

from reference.spec.graphs import decode_widths
from stress.core.types import Case
from stress.families.common import pick


class Query(NamedTuple):
    num_reqs: int
    num_tokens: int
    uniform: int | None
    has_prefill: bool
    max_req_tokens: int | None


def _schedule(rng, max_num_reqs: int, max_spec_tokens: int, zero_band: bool) -> list[tuple[int, int, int]]:
    """1-4 bands from batch size 1: depths 0..Kmax+2; the next band may share the last batch size of
    the one before (overlap), follow it, or leave a gap; the last may stop short of max_num_reqs."""
    bands, start = [], 1
    for _ in range(int(rng.integers(1, 5))):
        end = start + int(rng.integers(0, max(1, max_num_reqs // 2)))
        bands.append((start, end, int(rng.integers(0, max_spec_tokens + 3))))
        start = end + int(rng.integers(0, 3))
    if zero_band:
        i = int(rng.integers(len(bands)))
        bands[i] = (*bands[i][:2], 0)
    if rng.random() < 0.3:
        bands.reverse()
    return bands


def _capture_sizes(rng, max_tokens: int) -> list[int]:
    """Every size (the upstream tests' grid), powers of two, vLLM-style 1, 2, 4 then steps of 8, or a
    random handful (a few past max_num_reqs * decode_query_len); rarely none at all."""
    if rng.random() < 0.05:
        return []
    style = int(rng.integers(4))
    if style == 0:
        return list(range(1, max_tokens + 1))
    if style == 1:
        return [2 ** i for i in range(max_tokens.bit_length() + 1)]
    if style == 2:
        return [1, 2, 4] + list(range(8, max_tokens + 9, 8))
    return [int(c) for c in rng.integers(1, max_tokens + 5, size=int(rng.integers(1, 13)))]


def _config(rng, *, n_new: int, schedule: bool, zero_band: bool = False, adaptive: bool = False,
            varlen: bool = False, one_token: bool = False, past_default_grid: bool = False) -> dict:
    # past_default_grid: more requests than the default small grid (32) covers
    max_num_reqs = int(rng.integers(33, 41)) if past_default_grid else int(rng.integers(1, 25))
    max_spec_tokens = int(rng.integers(1, 8))
    decode_query_len = 1 if one_token else max_spec_tokens + n_new
    sizes = _capture_sizes(rng, max_num_reqs * decode_query_len)
    return {
        "capture_sizes": sizes,
        "max_num_reqs": max_num_reqs,
        "decode_query_len": decode_query_len,
        "max_spec_tokens": max_spec_tokens,
        "schedule": _schedule(rng, max_num_reqs, max_spec_tokens, zero_band) if schedule else None,
        "max_capture_size": (max(sizes) + int(rng.integers(0, decode_query_len + 1)) if sizes and rng.random() < 0.5
                             else None),
        "adaptive": adaptive,
        "small_grid": pick(rng, (0, 1, 2, 4, 32)),
        "varlen": varlen,
    }


def _queries(rng, config: dict, count: int, *, prefill_p: float = 0.2, track_p: float = 0.5) -> list[Query]:
    """Uniform batches at the configured widths (and others), mixed batches and prefill batches; request
    counts drawn near the band edges, the small-grid edge and max_num_reqs."""
    max_num_reqs, width = config["max_num_reqs"], config["decode_query_len"]
    widths = decode_widths(width, config["max_spec_tokens"], config["schedule"], config["adaptive"]) or [width]
    edges = {1, max_num_reqs, config["small_grid"], config["small_grid"] + 1}
    for start, end, _ in config["schedule"] or ():
        edges |= {start - 1, start, end, end + 1}
    edges = sorted(e for e in edges if 1 <= e <= max_num_reqs)
    queries = []
    for _ in range(count):
        num_reqs = pick(rng, edges) if rng.random() < 0.5 else int(rng.integers(1, max_num_reqs + 1))
        has_prefill = bool(rng.random() < prefill_p)
        shape = rng.random()
        if shape < 0.5:  # uniform: a captured width, or any width up to one past the longest
            q = pick(rng, widths) if rng.random() < 0.7 else int(rng.integers(1, width + 2))
            lengths = [q] * num_reqs
        else:  # mixed; with prefill, a prompt chunk may be long
            longest = 3 * width if has_prefill else width + 1
            lengths = [int(x) for x in rng.integers(1, longest + 1, size=num_reqs)]
        uniform = lengths[0] if len(set(lengths)) == 1 else None
        max_req_tokens = max(lengths) if rng.random() < track_p else None
        queries.append(Query(num_reqs, sum(lengths), uniform, has_prefill, max_req_tokens))
    return queries


def _case(rng, config: dict, note: str, absent: bool | None = None, **query_args) -> Case:
    """``absent``: leave the options that hold their defaults out of the calls, as most callers do (by
    default in half the cases)."""
    queries = _queries(rng, config, 40, **query_args)
    described = (f"S={config['max_num_reqs']} D={config['decode_query_len']} Kmax={config['max_spec_tokens']} "
                 f"schedule={config['schedule']} {len(config['capture_sizes'])} sizes")
    absent = bool(rng.random() < 0.5) if absent is None else absent
    return Case(inputs={"config": config, "queries": queries, "absent_defaults": absent},
                note=f"{note}: {described}{', defaults left out' if absent else ''}")


def zero_width_band(rng, device, launch):
    """Fix 1: a DSpark draft manager (n_new = 0) whose schedule has a band with depth 0."""
    config = _config(rng, n_new=0, schedule=True, zero_band=True, adaptive=bool(rng.random() < 0.3))
    if not config["capture_sizes"]:
        config["capture_sizes"] = [1]
    return _case(rng, config, "zero-depth band, n_new 0")


def dsd_schedule(rng, device, launch):
    """DSD bands of any depth (0, above Kmax), overlapping or partial, for the target or the draft."""
    return _case(rng, _config(rng, n_new=int(rng.integers(2)), schedule=True), "DSD")


def adaptive(rng, device, launch):
    """Acceptance-length adaptation: depths 1..Kmax, or 0..max cap under a schedule (often with a 0 cap)."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=bool(rng.random() < 0.5),
                     zero_band=bool(rng.random() < 0.5), adaptive=True)
    return _case(rng, config, "adaptive depth")


def basic(rng, device, launch):
    """No DSD: one width; or a one-token-per-step drafter whose width ignores the schedule."""
    one_token = bool(rng.random() < 0.3)
    config = _config(rng, n_new=int(rng.integers(2)), schedule=one_token, one_token=one_token)
    return _case(rng, config, "one-token drafter" if one_token else "basic SD")


def varlen(rng, device, launch):
    """Varlen decode graphs at four request counts per size; most batches report their longest request."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=False, varlen=True)
    return _case(rng, config, "varlen", track_p=0.8)


def prefill(rng, device, launch):
    """Batches that still prefill, many shaped exactly like a captured decode batch."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=bool(rng.random() < 0.5),
                     varlen=bool(rng.random() < 0.3))
    return _case(rng, config, "prefill-shaped", prefill_p=0.7)


def defaults(rng, device, launch):
    """Every option at its documented default (no schedule, no max capture size, the small grid of 32
    below max_num_reqs) and left out of the calls, as a caller that names none makes them."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=False, past_default_grid=True)
    config.update(max_capture_size=None, small_grid=32)
    return _case(rng, config, "defaults", absent=True, prefill_p=0.1, track_p=0.3)


def _low_caps_config(rng, *, zero: bool) -> dict:
    """Adaptive depth (Kmax 1 or 2, n_new 1 or 2) under a schedule whose caps include 0 (``zero``), or include
    1 and not 0: the two starts of the adaptive depth range."""
    config = _config(rng, n_new=pick(rng, (1, 2)), schedule=True, adaptive=True)
    config["max_spec_tokens"] = pick(rng, (1, 2))
    config["decode_query_len"] = config["max_spec_tokens"] + pick(rng, (1, 2))
    bands = [(start, end, int(rng.integers(1, config["max_spec_tokens"] + 1))) for start, end, _ in config["schedule"]]
    i = int(rng.integers(len(bands)))
    bands[i] = (*bands[i][:2], 0 if zero else 1)
    config["schedule"] = bands
    return config


def zero_cap_adaptive(rng, device, launch):
    """Adaptive depth where a band disables drafting: the depth range starts at 0, so n_new itself is a width."""
    return _case(rng, _low_caps_config(rng, zero=True), "adaptive, a zero cap")


def one_cap_adaptive(rng, device, launch):
    """Adaptive depth whose lowest cap is 1: the depth range starts at 1 (Kmax 1 half the time)."""
    return _case(rng, _low_caps_config(rng, zero=False), "adaptive, lowest cap 1")


def one_token_low_caps(rng, device, launch):
    """A one-token-per-step drafter (query length 1, Kmax 2: n_new = -1) under a schedule of caps 0 and 1 only:
    its one width, 1, never comes from the caps."""
    config = _config(rng, n_new=0, schedule=True, adaptive=bool(rng.random() < 0.5), one_token=True)
    config["max_spec_tokens"] = 2
    config["schedule"] = [(start, end, int(rng.integers(2))) for start, end, _ in config["schedule"]]
    return _case(rng, config, "one-token drafter, caps below Kmax")


def one_capture_size(rng, device, launch):
    """A single capture size, with an explicit max capture size at or above it."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=bool(rng.random() < 0.5))
    size = int(rng.integers(1, config["max_num_reqs"] * config["decode_query_len"] + 1))
    config.update(capture_sizes=[size], max_capture_size=size + int(rng.integers(0, config["decode_query_len"] + 1)))
    return _case(rng, config, "one capture size")


def no_capture_sizes(rng, device, launch):
    """No capture size at all (graphs off), under any small grid: nothing is staged, every batch up to
    max_num_reqs runs eagerly (NONE), and a batch past it is still refused."""
    config = _config(rng, n_new=int(rng.integers(2)), schedule=bool(rng.random() < 0.5), past_default_grid=True)
    config.update(capture_sizes=[], max_capture_size=None, small_grid=pick(rng, (1, 2, 4, 32)))
    return _case(rng, config, "no capture sizes")


FAMILIES = {"zero_width_band": zero_width_band, "dsd_schedule": dsd_schedule, "adaptive": adaptive, "basic": basic,
            "varlen": varlen, "prefill": prefill, "defaults": defaults, "zero_cap_adaptive": zero_cap_adaptive,
            "one_cap_adaptive": one_cap_adaptive, "one_token_low_caps": one_token_low_caps,
            "one_capture_size": one_capture_size, "no_capture_sizes": no_capture_sizes}
