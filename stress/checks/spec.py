"""Registry entries of The host-logic checks: spec.graph_candidates, spec.depth, spec.backends."""

import functools
from collections.abc import Callable

import numpy as np
import torch

import reference.spec.backends
import reference.spec.depth
import reference.spec.graphs
from kernels.spec.backends import BACKENDS, LAYER_TYPES
from stress.checks.common import ENGINE_SAMPLED, EVERYWHERE
from stress.core.types import RETURN, Case, Check, Mutant, Patch, Reach
from stress.families import backends as backend_families
from stress.families import depth as depth_families
from stress.families import graphs as graph_families
from stress.families.common import pick
from stress.families.depth import draft_columns
from stress.families.refusals import (
    NOT_POSITIVE,
    Corruption,
    refusal_family,
)
from stress.oracles import host

_GRAPHS = "kernels.spec.graphs"
_DEPTH = "kernels.spec.depth"
_BACKENDS = "kernels.spec.backends"
# Fix 6 (pre-fix): FlashInfer and our host-planned backend claim full-graph support for non-causal
# attention too, so the draft captures launches whose host-side plan only fits the capture batch.
# The graph replay check hunts the same patch on the GPU.
NON_CAUSAL_CLAIMS_FULL = Mutant(
    "non-causal-claims-full", "fix 6, pre-fix (docs/fixes.md#fix-6): non-causal attention claims UNIFORM_BATCH "
                              "graph support",
    (Patch(f"{_BACKENDS}:graph_support",
           "CGSupport.UNIFORM_SINGLE_TOKEN_DECODE if non_causal else CGSupport.UNIFORM_BATCH",
           "CGSupport.UNIFORM_BATCH"),),
    oracles=EVERYWHERE, families=("sm100_non_causal",))


def _host_check(name: str, contract: str, driver, impl, families: dict, compare, mutants: tuple[Mutant, ...]) -> Check:
    """A host-logic check: ``driver`` (stress.oracles.host) runs the production module by default, and the
    reference module ``impl`` of the same names for the expected records."""
    return Check(name=name, contract=contract, kernel=driver, reference=functools.partial(driver, impl=impl),
                 families=families,
                 outputs=(RETURN,), compare=compare, mutants=mutants)



# ---------------------------------------------------------------- refusals

def configured(key: str, value: Callable[[np.random.Generator, dict], object], what: str,
               refused: str | None = None) -> Corruption:
    """The case's ``config`` (a host check's keyword arguments) with ``key`` set to ``value(rng, config)``;
    None from ``value``: this configuration has nothing to corrupt so."""
    def apply(rng, inputs):
        config = dict(inputs["config"])
        new = value(rng, config)
        if new is None:
            return False
        config[key] = new
        inputs["config"] = config
        return True

    return Corruption(refused or key, what, apply)


def query_replaced(query: Callable[[np.random.Generator, dict], graph_families.Query | None], what: str,
                   refused: str) -> Corruption:
    """One of the case's dispatch queries replaced by ``query(rng, config)`` (None: not in this configuration)."""
    def apply(rng, inputs):
        bad = query(rng, inputs["config"])
        if bad is None:
            return False
        queries = list(inputs["queries"])
        queries[int(rng.integers(len(queries)))] = bad
        inputs["queries"] = queries
        return True

    return Corruption(refused, what, apply)


def _depth_without_maximum(rng, config):
    config["adaptive"] = config["adaptive"] or config["schedule"] is None
    return 0


def _below_largest_size(rng, config):
    largest = max(config["capture_sizes"], default=0)
    return largest - 1 if largest > 1 else None


_BAD_SCHEDULES = ("1-8:2", 5, [], {(1, 8, 2)}, [(1, 8)], [(3, 2, 1)], [(0, 4, 1)], [(1, 4, -1)], [(1, 4.0, 1)])


def _uneven_longest(rng, config):
    """A longest request one token short of what ``r`` requests sharing ``t`` tokens need (``r`` does not
    divide ``t``: rounding the mean down instead of up lets it through)."""
    r = min(config["max_num_reqs"], 3)
    return graph_families.Query(r, 2 * r + 1, None, False, 2) if r >= 2 else None


def _uniform_and_longest_differ(rng, config):
    r, w = 2, 3
    return graph_families.Query(r, r * w, w, False, w + 1) if config["max_num_reqs"] >= r else None


def _adaptive_without_maximum(rng, config):
    """Adaptive depth with no schedule and Kmax 0: the adaptive flag alone must refuse it."""
    config.update(schedule=None, adaptive=True)
    return 0


def _each_value(key: str, values: tuple, what: str) -> tuple[Corruption, ...]:
    """One corruption per value: the configuration's ``key`` set to it."""
    return tuple(configured(key, lambda rng, config, bad=bad: bad, f"{what}: {bad!r}") for bad in values)


NOT_COUNTS = (-1, 2.0, True)  # a count the launcher must refuse: negative, float, bool
NOT_FLAGS = (1, "yes")


GRAPH_CANDIDATES_REFUSALS = refusal_family(graph_families.dsd_schedule, (
    configured("max_spec_tokens", _depth_without_maximum, "a DSD schedule or adaptive depth with Kmax 0"),
    configured("max_capture_size", _below_largest_size, "max_capture_size below the largest capture size"),
    *_each_value("schedule", _BAD_SCHEDULES, "a schedule that is no list of bands"),
    query_replaced(lambda rng, c: graph_families.Query(2, 1, None, False, None), "more requests than tokens",
                   "num_reqs"),
    query_replaced(lambda rng, c: graph_families.Query(c["max_num_reqs"] + 1, 2 * c["max_num_reqs"] + 2, None, False,
                                                       None), "more requests than max_num_reqs", "num_reqs"),
    query_replaced(lambda rng, c: graph_families.Query(1, 3, 2, False, None), "a uniform width that misses the tokens",
                   "uniform"),
    query_replaced(_uneven_longest, "a longest request shorter than the mean", "max_req_tokens"),
    query_replaced(lambda rng, c: graph_families.Query(1, 3, None, False, 4), "a longest request past the tokens",
                   "max_req_tokens"),
    query_replaced(_uniform_and_longest_differ, "a longest request other than the uniform width", "max_req_tokens"),
    # what only each argument's own validation refuses: the later guards compare values the bad one never reaches
    *_each_value("max_num_reqs", NOT_POSITIVE, "max_num_reqs not a positive int"),
    *_each_value("decode_query_len", NOT_POSITIVE, "decode_query_len not a positive int"),
    *_each_value("max_spec_tokens", NOT_COUNTS, "max_spec_tokens not an int >= 0"),
    *_each_value("small_grid", NOT_COUNTS, "small_grid not an int >= 0"),
    *_each_value("adaptive", NOT_FLAGS, "adaptive not a bool"),
    *_each_value("varlen", NOT_FLAGS, "varlen not a bool"),
    configured("max_spec_tokens", _adaptive_without_maximum, "adaptive depth without a schedule and with Kmax 0"),
    query_replaced(lambda rng, c: graph_families.Query(0, 2, None, False, None), "a batch of no request", "num_reqs"),
    query_replaced(lambda rng, c: graph_families.Query(1, 0, None, False, None), "a batch of no token", "num_tokens"),
    query_replaced(lambda rng, c: graph_families.Query(1, 2, None, 1, None), "has_prefill not a bool", "has_prefill"),
    query_replaced(lambda rng, c: graph_families.Query(1, 2, None, False, 2.0), "a longest request of 2.0 tokens",
                   "max_req_tokens"),
), "build_candidates and dispatch")


def _call(function: str, args: list, note: str, then: tuple = (), draft: torch.Tensor | None = None) -> Case:
    """A case of ``stress.oracles.host.depth_outcomes``' ``call`` kind: ``function(draft?, *args)``, then each method
    (``stress.oracles.host.called``); its corruptions change ``params``."""
    inputs = {"kind": "call", "params": {"function": function, "args": args, "then": then}}
    if draft is not None:
        inputs["draft"] = draft
    return Case(inputs, note=note)


def limit_call(rng, device, launch):
    """A valid ``limit_draft_tokens``: n in 1..columns of a draft of 1..k_max columns."""
    k_max = int(rng.integers(1, 7))
    columns = int(rng.integers(1, k_max + 1))
    n = int(rng.integers(1, columns + 1))
    return _call("limit_draft_tokens", [n, k_max], f"n={n} of {columns} columns, k_max {k_max}",
                 draft=draft_columns(rng, int(rng.integers(1, 4)), columns))


def band_call(rng, device, launch):
    """A valid ``band_lookup``: 1-3 bands from batch size 1, each ending before the next starts."""
    bands, start = [], 1
    for _ in range(int(rng.integers(1, 4))):
        end = start + int(rng.integers(0, 4))
        bands.append((start, end, int(rng.integers(0, 6))))
        start = end + int(rng.integers(1, 3))
    return _call("band_lookup", [bands, start + 1, 4], f"bands {bands}")


def controller_call(rng, device, launch):
    """A valid ``BandAcceptanceLengthController`` over a table of 1-3 batch sizes, asked one depth."""
    caps = (0, *(int(c) for c in rng.integers(0, 5, size=int(rng.integers(1, 4)))))
    size = int(rng.integers(1, len(caps)))
    return _call("BandAcceptanceLengthController", [caps, 2], f"caps {caps}", then=(("depth_for", [size]),))


def acceptance_call(rng, device, launch):
    """A valid ``AcceptanceLengthController`` (an initial depth or none), then one valid ``observe``: 1-4 drafts of
    1..max_depth tokens each, some of them accepted."""
    max_depth, window = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    initial = None if rng.random() < 0.5 else int(rng.integers(1, max_depth + 1))
    drafts = int(rng.integers(1, 5))
    tokens = drafts * int(rng.integers(1, max_depth + 1))
    counts = [drafts, tokens, int(rng.integers(0, tokens + 1))]
    return _call("AcceptanceLengthController", [max_depth, window, initial], f"Kmax {max_depth}, window {window}, "
                 f"initial {initial}, observe {counts}", then=(("observe", counts),))


def arguments(refused: str, what: str, index: int, values: tuple, valid: Callable, key: str = "params"
              ) -> tuple[Corruption, ...]:
    """One corruption per entry of ``values``: ``args[index]`` of a host ``call`` case (``inputs[key]``, see
    ``stress.oracles.host.called``) set to it, or to what it gives from the args where it is callable (None: not
    in this case)."""
    def argument(value):
        def apply(rng, inputs):
            call = inputs[key]
            args = list(call["args"])
            new = value(args) if callable(value) else value
            if callable(value) and new is None:
                return False
            args[index] = new
            inputs[key] = {**call, "args": args}
            return True

        return apply

    return tuple(Corruption(refused, f"{what}: {value if callable(value) else repr(value)}", argument(value), valid)
                 for value in values)


class _Named:
    """A callable value with a name for the corruption's description."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def __call__(self, args):
        return self.fn(args)

    def __str__(self):
        return self.name


def observed(refused: str, changes: tuple[_Named, ...]) -> tuple[Corruption, ...]:
    """One corruption per entry of ``changes``: ``acceptance_call``'s valid ``observe`` counts replaced by what it
    gives from them, with only ``refused`` bad (the others stay valid counts)."""
    def count(change):
        def apply(rng, inputs):
            (method, counts), = inputs["params"]["then"]
            inputs["params"] = {**inputs["params"], "then": ((method, change(list(counts))),)}

        return apply

    return tuple(Corruption(refused, f"{refused} not an int >= 0: {change}", count(change), acceptance_call)
                 for change in changes)


def _set(index: int, value) -> Callable[[list], list]:
    """The counts with ``counts[index]`` set to ``value``, or to ``value(counts)`` where it is callable."""
    def change(counts):
        counts[index] = value(counts) if callable(value) else value
        return counts

    return change


def _counts_with(index: int, name: str) -> tuple[_Named, ...]:
    """Count ``index`` as -1, as a float of its valid value, and as True."""
    return (_Named("-1", _set(index, -1)), _Named(f"{name} as a float", _set(index, lambda c: float(c[index]))),
            _Named("True", _set(index, True)))


def _no_maximum(value) -> Corruption:
    """``acceptance_call`` with ``max_depth`` set to ``value`` and no initial depth (the controller starts at its
    maximum), so that only the max_depth check can refuse it."""
    def apply(rng, inputs):
        _, window, _ = inputs["params"]["args"]
        inputs["params"] = {**inputs["params"], "args": [value, window, None]}

    return Corruption("max_depth", f"max_depth not a positive int, no initial depth: {value!r}", apply,
                      acceptance_call)


def _never_drafting(window) -> Corruption:
    """A table whose every cap is 0 (valid: no band drafts, so no band controller is made) with ``window`` set: only
    ``BandAcceptanceLengthController`` itself can refuse it."""
    def apply(rng, inputs):
        caps, _ = inputs["params"]["args"]
        inputs["params"] = {**inputs["params"], "args": [(0,) * len(caps), window]}

    return Corruption("window", f"window not a positive int on a table that never drafts: {window!r}", apply,
                      controller_call)


def _trailing_dimension(rng, inputs):
    """``limit_call``'s draft with a trailing dimension of 1: 3-D, with the columns still in dimension 1."""
    inputs["draft"] = inputs["draft"].unsqueeze(-1)


def _asked(size: Callable[[tuple], int], what: str) -> Corruption:
    """The controller asked for the depth of ``size(caps)``."""
    def apply(rng, inputs):
        caps = inputs["params"]["args"][0]
        inputs["params"] = {**inputs["params"], "then": (("depth_for", [size(caps)]),)}

    return Corruption("batch_size", what, apply, controller_call)


def _draft_columns(columns: Callable[[list], int | None], what: str) -> Corruption:
    """``limit_call``'s draft with ``columns(args)`` columns (None: not in this case)."""
    def apply(rng, inputs):
        wanted = columns(inputs["params"]["args"])
        if wanted is None:
            return False
        inputs["draft"] = draft_columns(rng, inputs["draft"].shape[0], wanted)

    return Corruption("draft", what, apply)


def _ends_before_start(args):
    """A second band that ends before it starts and lies past the first (nothing else wrong with it)."""
    first = args[0][0]
    return [first, (first[1] + 3, first[1] + 2, 1)]


def _touching(args):
    """Two bands sharing one batch size: the second starts where the first ends (past 1)."""
    first = args[0][0]
    if first[1] < 2:
        first = (1, 2, first[2])
    return [first, (first[1], first[1] + 2, 1)]


DEPTH_REFUSALS = refusal_family(limit_call, (
    *arguments("n", "n not an int", 0, (True, 1.0, None, "1"), limit_call),
    *arguments("n", "n outside 0..k_max", 0, (-1, _Named("k_max + 1", lambda a: a[1] + 1)), limit_call),
    *arguments("k_max", "k_max not a positive int", 1, NOT_POSITIVE, limit_call),
    _draft_columns(lambda a: a[1] + 1, "a draft of k_max + 1 columns"),
    _draft_columns(lambda a: a[0] - 1 if a[0] > 1 else None, "a draft of fewer columns than n"),
    *arguments("schedule", "a schedule that is no list of bands", 0, _BAD_SCHEDULES, band_call),
    *arguments("schedule", "bands", 0, (_Named("a band past the first that ends before it starts", _ends_before_start),
                                        _Named("two bands sharing a batch size", _touching), [(2, 4, 1)]), band_call),
    *arguments("caps", "a table without batch sizes, without its unused 0, or with a negative cap", 0,
               ((0,), _Named("(1, *caps)", lambda a: (1, *a[0][1:])), (0, -1)), controller_call),
    *arguments("window", "window not a positive int", 1, NOT_POSITIVE, controller_call),
    _asked(len, "a batch size at the table's end"),
    _asked(lambda caps: 0, "a batch size of 0"),
    # appended: the corruptions above draw as before
    Corruption("draft", "a 3-D draft (a trailing dimension of 1)", _trailing_dimension),
    *arguments("max_batch_size", "max_batch_size not a positive int", 1, NOT_POSITIVE, band_call),
    *arguments("max_depth", "max_depth not a positive int", 2, NOT_POSITIVE, band_call),
    *arguments("schedule", "a band whose start is no positive int but equals 1", 0, ([(True, 4, 1)], [(1.0, 4, 1)]),
               band_call),
    *(_never_drafting(window) for window in NOT_POSITIVE),
    *(_no_maximum(value) for value in NOT_POSITIVE),
    *arguments("window", "window not a positive int", 1, NOT_POSITIVE, acceptance_call),
    *arguments("initial_depth", "initial_depth above max_depth", 2, (_Named("max_depth + 1", lambda a: a[0] + 1),),
               acceptance_call),
    *observed("num_drafts", _counts_with(0, "num_drafts")),
    # a float first: with the num_draft_tokens check gone it goes through, where -1 (or True below what was
    # accepted) is still refused as accepted tokens above the drafted ones, naming num_accepted_tokens
    *observed("num_draft_tokens", tuple(_counts_with(1, "num_draft_tokens")[i] for i in (1, 0, 2))),
    *observed("num_accepted_tokens", _counts_with(2, "num_accepted_tokens")),
), "limit_draft_tokens, band_lookup, AcceptanceLengthController and BandAcceptanceLengthController")


def layer_call(rng, device, launch):
    """A valid ``dflash_layer_causal`` (``stress.oracles.host.backend_outcomes``' ``call``): a layer of 1-6, with
    per-layer types or none, and an override now and then."""
    num_layers = int(rng.integers(1, 7))
    types = pick(rng, (None, [pick(rng, LAYER_TYPES) for _ in range(num_layers)]))
    args = [int(rng.integers(num_layers)), num_layers, types, pick(rng, (None, None, True, False))]
    return Case({"rows": [], "call": {"function": "dflash_layer_causal", "args": args}},
                note=f"layer {args[0]} of {num_layers}, types {types}")


def device_call(function: str) -> Callable:
    """A valid ``function`` call of the device's backend choice (``backend_priorities(capability_major,
    non_causal)``, ``graph_support(backend, ...)`` with the backend first), as ``layer_call``'s cases."""
    def valid(rng, device, launch):
        args = [pick(rng, backend_families.CAPABILITIES), bool(rng.integers(2))]
        if function == "graph_support":
            args.insert(0, pick(rng, BACKENDS))
        return Case({"rows": [], "call": {"function": function, "args": args}}, note=f"{function}{tuple(args)}")

    valid.__name__ = f"{function}_call"
    return valid


def _device_arguments(function: str) -> tuple[Corruption, ...]:
    """capability_major and non_causal of ``function``'s valid call, each bad in turn."""
    first = 1 if function == "graph_support" else 0
    return (*arguments("capability_major", "capability_major not a positive int", first, NOT_POSITIVE,
                       device_call(function), key="call"),
            *arguments("non_causal", "non_causal not a bool", first + 1, NOT_FLAGS + (None,), device_call(function),
                       key="call"))


BACKENDS_REFUSALS = refusal_family(layer_call, (
    *arguments("layer", "a layer that is no int in [0, num_layers)", 0,
               (True, False, 1.0, -1, _Named("num_layers", lambda a: a[1])), layer_call, key="call"),
    *arguments("num_layers", "num_layers not a positive int", 1, NOT_POSITIVE, layer_call, key="call"),
    *arguments("layer_types", "layer types", 2,
               (_Named("one entry past the layers", lambda a: ["full_attention"] * (a[1] + 1)),
                _Named("one of an unknown kind", lambda a: ["full_attention"] * (a[1] - 1) + ["linear_attention"])),
               layer_call, key="call"),
    *arguments("causal_override", "causal_override neither a bool nor None", 3, (1, 0, "yes"), layer_call,
               key="call"),
    *_device_arguments("backend_priorities"), *_device_arguments("graph_support"),
), "dflash_layer_causal, backend_priorities and graph_support")


CHECKS = (
    _host_check(
        "spec.graph_candidates", "FULL and PIECEWISE graph candidates per capture size and uniform width, never "
                                 "width 0 (fix 1); dispatch picks the first staged graph that fits, else eager",
        host.graph_outcomes, reference.spec.graphs,
        {**graph_families.FAMILIES, "refused": GRAPH_CANDIDATES_REFUSALS},
        host.graph_outcomes_agree,
        (
            Mutant("zero-width-candidates", "fix 1, pre-fix (docs/fixes.md#fix-1): no zero-width filter, so a "
                                            "depth-0 band of an "
                   "n_new = 0 draft rounds capture sizes up to a multiple of 0: candidate building raises "
                   "ZeroDivisionError on a valid configuration, as the upstream engine did at start-up",
                   (Patch(f"{_GRAPHS}:decode_widths", "{d + n_new for d in depths if d + n_new > 0}",
                          "{d + n_new for d in depths}"),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("zero_width_band",),
                   path=Reach(families=("dsd_bands",))),
            Mutant("dispatch-fewer-requests", "the request test of dispatch is flipped (<=): a varlen graph with "
                   "fewer requests than the batch is replayed",
                   (Patch(f"{_GRAPHS}:_fits", "desc.num_reqs >= num_reqs", "desc.num_reqs <= num_reqs"),),
                   oracles=EVERYWHERE, families=("varlen", "dsd_schedule")),
            Mutant("prefill-replays-decode-graph", "a batch still prefilling keeps its uniform width, so prompt "
                   "chunks shaped like decode replay a FULL decode graph (upstream vllm#49918)",
                   (Patch(f"{_GRAPHS}:dispatch", "if has_prefill:", "if False:"),),
                   oracles=EVERYWHERE, families=("prefill",),
                   path=Reach(families=("mixed_prefill_decode",))),
            Mutant("capture-size-rounded-down", "capture sizes rounded down to whole requests: graphs smaller "
                   "than the size, and 0-request graphs below one width",
                   (Patch(f"{_GRAPHS}:_round_up", "(n + multiple - 1) // multiple * multiple",
                          "n // multiple * multiple"),),
                   oracles=EVERYWHERE, families=("basic", "dsd_schedule")),
        ),
    ),
    _host_check(
        "spec.depth", "a scheduled depth of 0 stays 0 and limits drafts to a zero-width view (fix 7); "
                      "acceptance-length controllers per DSD band",
        host.depth_outcomes, reference.spec.depth,
        {**depth_families.FAMILIES, "refused": DEPTH_REFUSALS}, host.records_agree,
        (
            Mutant("depth-or-default", "fix 7, pre-fix (docs/fixes.md#fix-7): the depth is resolved as `value or "
                                       "default`, so a "
                   "scheduled 0 becomes K",
                   (Patch(f"{_DEPTH}:resolve_num_spec_tokens", "default if value is None else value",
                          "value or default"),),
                   oracles=EVERYWHERE, families=("resolve", "disable_drafting"),
                   path=Reach(families=("dsd_bands",))),
            Mutant("limit-refuses-zero", "fix 7, pre-fix (docs/fixes.md#fix-7): limit_draft_tokens has no depth-0 "
                                         "branch and "
                   "refuses 0 like any depth outside 1..k_max",
                   (Patch(f"{_DEPTH}:limit_draft_tokens", "if n == 0:", "if False:"),),
                   oracles=EVERYWHERE, families=("limit", "disable_drafting"),
                   path=Reach(families=("dsd_bands",))),
            Mutant("rises-to-target", "the controller jumps straight up to a higher target instead of one step per "
                   "window",
                   (Patch(f"{_DEPTH}:AcceptanceLengthController", "self.depth += 1", "self.depth = target"),),
                   oracles=EVERYWHERE, families=("controller", "bands"),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("controller-per-cap", "bands of one cap share a controller even where another band lies between "
                   "them: steps at one band move the depth the other drafts at",
                   (Patch(f"{_DEPTH}:BandAcceptanceLengthController", "self._by_batch_size.append(controller)",
                          "self._by_batch_size.append(next((c for c in self._by_batch_size if c is not None "
                          "and c.max_depth == cap), controller))"),),
                   oracles=EVERYWHERE, families=("shared_cap_bands",)),
        ),
    ),
    _host_check(
        "spec.backends", "backend priorities and graph claims by capability and causality: non-causal drafts never "
                         "claim full graphs or FlashInfer first on SM100 (fix 6)",
        host.backend_outcomes, reference.spec.backends,
        {**backend_families.FAMILIES, "refused": BACKENDS_REFUSALS},
        host.records_agree,
        (
            NON_CAUSAL_CLAIMS_FULL,
            Mutant("sm100-non-causal-prefers-flashinfer", "fix 6, pre-fix (docs/fixes.md#fix-6): SM100 puts "
                                                          "FlashInfer first "
                   "whatever the causality, so non-causal drafts auto-select its cutlass path",
                   (Patch(f"{_BACKENDS}:backend_priorities", "if capability_major == 10 and not non_causal:",
                          "if capability_major == 10:"),),
                   oracles=EVERYWHERE, families=("sm100_non_causal",)),
            Mutant("no-layer-types-causal", "a DFlash config without layer types is taken as causal, so its "
                   "non-causal draft claims FlashInfer's full graphs",
                   (Patch(f"{_BACKENDS}:_causal", "bool(types) and types[layer]", "not types or types[layer]"),),
                   oracles=EVERYWHERE),
        ),
    ),
)
