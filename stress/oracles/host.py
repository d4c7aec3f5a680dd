"""Drivers and comparators of the host-logic checks (graph candidates, depth, backends).

A driver runs one implementation over a case and reports plain records (tuples, lists, ints):
the production module by default, and for the expected records the reference module of the same
names (``reference.spec.<module>``), so the two are compared record by record. A ValueError is
part of the contract (the production code refuses an argument), so a driver records it as the
outcome ``"ValueError"`` and the reference must expect it; any other exception escapes and the
case is ``fail:crash`` (as a ZeroDivisionError in candidate building is: the upstream engine died
at start-up). Drivers look production functions up in their modules at call time, so a planted
bug applies.
"""

import inspect
from typing import NamedTuple

import reference.spec.backends
import reference.spec.graphs
from kernels.spec import backends, depth, graphs
from reference.spec.graphs import Descriptor
from stress.core.compare import SHOW, Divergence

ERROR = "ValueError"  # the recorded outcome of a call the contract refuses

# ---------------------------------------------------------------- graph candidates and dispatch


def _name(value) -> str:
    """An enum member's name; the references return names already."""
    return getattr(value, "name", value)


def _row(desc) -> Descriptor:
    return Descriptor(_name(desc.mode), desc.num_tokens, desc.num_reqs, desc.uniform, desc.max_req_tokens)


class Dispatched(NamedTuple):
    batch: tuple  # (num_reqs, num_tokens, uniform, has_prefill, max_req_tokens)
    graph: Descriptor


def graph_outcomes(config: dict, queries: list[tuple], absent_defaults: bool = False, impl=graphs) -> dict:
    """Candidates of ``config`` (build_candidates' arguments), the decode widths alone (with and without
    its schedule and adaptive depth), and the dispatch of every (num_reqs, num_tokens, uniform,
    has_prefill, max_req_tokens) query, run on ``impl`` (kernels.spec.graphs or reference.spec.graphs);
    with ``absent_defaults`` the optional arguments that hold their default are left out of every call
    (``without_defaults``)."""
    contract = reference.spec.graphs
    candidates = impl.build_candidates(**without_defaults(contract.build_candidates, config, absent_defaults))
    # every (schedule or none, adaptive or not) of this configuration, so each path of decode_widths runs
    widths = [list(impl.decode_widths(config["decode_query_len"], config["max_spec_tokens"], **without_defaults(
        contract.decode_widths, {"schedule": schedule, "adaptive": adaptive}, absent_defaults)))
        for schedule in (None, config.get("schedule")) for adaptive in (False, True)]
    dispatched = []
    for query in queries:
        num_reqs, num_tokens, uniform, has_prefill, max_req_tokens = query
        optional = {"has_prefill": has_prefill, "max_req_tokens": max_req_tokens}
        desc = impl.dispatch(candidates, num_reqs, num_tokens, uniform,
                             **without_defaults(contract.dispatch, optional, absent_defaults))
        dispatched.append(Dispatched(tuple(query), _row(desc)))
    return {"widths": list(candidates.widths), "decode_widths": widths,
            "full": [_row(d) for d in candidates.full], "piecewise": [_row(d) for d in candidates.piecewise],
            "dispatch": dispatched}


def graph_violations(got: dict) -> list[tuple[tuple, str, object]]:
    """(where, the rule, the offending value) for every invariant that ``got`` breaks, whatever the
    reference says: widths >= 1, FULL descriptors that are real batch shapes, and dispatches that
    hold the whole batch and keep prefill out of FULL graphs."""
    found = [(("widths", i), "a width >= 1", w) for i, w in enumerate(got["widths"]) if w < 1]
    full, piecewise = set(got["full"]), set(got["piecewise"])
    if len(full) != len(got["full"]):
        found.append((("full",), "no duplicate graphs", got["full"]))
    for i, d in enumerate(got["full"]):
        if d.mode != "FULL" or not d.num_reqs or d.num_reqs < 1:
            found.append((("full", i), "a FULL graph of >= 1 request", d))
        elif d.uniform is not None and (d.uniform < 1 or d.num_tokens != d.num_reqs * d.uniform):
            found.append((("full", i), "num_tokens == num_reqs * uniform, uniform >= 1", d))
        elif d.uniform is None and (d.max_req_tokens is None or d.max_req_tokens < 1):
            found.append((("full", i), "a uniform width or a max_req_tokens >= 1", d))
    for i, (batch, d) in enumerate(got["dispatch"]):
        num_reqs, num_tokens, uniform, has_prefill, max_req_tokens = batch
        rules = []
        if d.mode == "NONE":
            rules.append(("eager at the batch's own size", d.num_tokens == num_tokens))
        else:
            rules += [
                (f"a captured {d.mode} graph", d in (full if d.mode == "FULL" else piecewise)),
                (f"num_tokens >= {num_tokens} (the batch's)", d.num_tokens >= num_tokens),
                (f"num_reqs >= {num_reqs} (the batch's)", d.num_reqs is None or d.num_reqs >= num_reqs),
                ("no FULL graph for a batch with prefill", not (has_prefill and d.mode == "FULL")),
                (f"uniform None or {uniform} (the batch's)", d.uniform is None or (d.uniform == uniform
                                                                                    and not has_prefill)),
                (f"max_req_tokens None or >= {max_req_tokens}",
                 d.max_req_tokens is None or (not has_prefill and max_req_tokens is not None
                                              and d.max_req_tokens >= max_req_tokens)),
            ]
        found += [(("dispatch", i), f"{rule}, for batch {batch}", d) for rule, held in rules if not held]
    return found


def graph_outcomes_agree(output: str, expected: dict, got) -> Divergence | None:
    """Invariant violations first (each names its rule and the offending descriptor), then every
    record against the reference's."""
    if not isinstance(got, dict):
        return Divergence(output, 1, [], problem=f"expected a dict of records, got {type(got).__name__}")
    violations = graph_violations(got)
    if violations:
        return Divergence(f"{output} (invariant)", len(violations), violations[:SHOW])
    return records_agree(output, expected, got)


# ---------------------------------------------------------------- depth


class Resolution(NamedTuple):
    value: int | None
    default: int
    resolved: int | str
    placeholders: tuple | str


class View(NamedTuple):
    shape: tuple
    values: list
    same_storage: bool  # as the draft it was cut from


class Limit(NamedTuple):
    n: int
    view: View | str


class SchedulerStep(NamedTuple):
    batch_size: int
    scheduled: int | None  # the band's depth; None on a synthetic step
    resolved: int
    placeholders: int
    draft_width: int
    same_storage: bool
    depth_after: int


def called(impl, call: dict, *first) -> list:
    """A refusal case (stress.families.refusals): ``call["function"](*first, *call["args"])`` on ``impl``, then
    each (method, args) of ``call["then"]`` on what it made. Its ValueError is not recorded but left to the
    refusal judge (stress.core.refusal), which asks that it name the refused argument."""
    made = getattr(impl, call["function"])(*first, *call["args"])
    for method, args in call.get("then", ()):
        getattr(made, method)(*args)
    return []


def depth_outcomes(kind: str, params: dict, draft=None, impl=depth) -> list:
    """One case of the depth logic, run on ``impl``: the production module, or reference.spec.depth
    (same names) for the expected records. ``kind`` names the part exercised (stress.families.depth)."""
    if kind == "resolve":
        return [Resolution(value, default, _call(impl.resolve_num_spec_tokens, value, default),
                           _call(lambda v, d: tuple(impl.spec_token_placeholders(v, d)), value, default))
                for value, default in params["pairs"]]
    if kind == "limit":
        return [Limit(n, _call(_view, impl, draft, draft.shape[0], n, params["k_max"])) for n in params["ns"]]
    if kind == "call":
        return called(impl, params, *([] if draft is None else [draft]))
    if kind == "controller":  # the depth after each step
        controller = impl.AcceptanceLengthController(params["max_depth"], params["window"], **_initial(params))
        return [ERROR if _call(controller.observe, *step) == ERROR else controller.depth for step in params["steps"]]
    caps = _call(impl.band_lookup, params["schedule"], params["max_batch_size"], params["max_depth"])
    if caps == ERROR:
        return [ERROR]
    bands = impl.BandAcceptanceLengthController(caps, params["window"], **_initial(params))
    sizes = range(1, params["max_batch_size"] + 1)
    if kind == "bands":  # the table, then every batch size's depth after each step
        out = [list(caps)]
        for batch_size, *counts in params["steps"]:
            refused = _call(bands.observe, batch_size, *counts) == ERROR
            out.append(ERROR if refused else {b: bands.depth_for(b) for b in sizes})
        return out
    if kind == "disable_drafting":
        out = []
        max_depth = params["max_depth"]
        for batch_size, synthetic, accepted_per_draft in params["steps"]:
            scheduled = None if synthetic else bands.depth_for(batch_size)
            resolved = impl.resolve_num_spec_tokens(scheduled, max_depth)
            placeholders = len(impl.spec_token_placeholders(scheduled, max_depth))
            view = _view(impl, draft, batch_size, resolved, max_depth)
            bands.observe(batch_size, batch_size if resolved else 0, batch_size * resolved,
                          batch_size * min(accepted_per_draft, resolved))
            out.append(SchedulerStep(batch_size, scheduled, resolved, placeholders, view.shape[1], view.same_storage,
                                     bands.depth_for(batch_size)))
        return out
    raise ValueError(f"kind: unknown {kind!r}")


def _initial(params: dict) -> dict:
    """The controllers' ``initial_depth``, left out where it is None (a caller without one), so the default
    applies."""
    return {} if params["initial_depth"] is None else {"initial_depth": params["initial_depth"]}


def _view(impl, draft, rows: int, n: int, k_max: int) -> View:
    """The first ``rows`` drafts limited to ``n``."""
    limited = impl.limit_draft_tokens(draft[:rows], n, k_max)
    same = limited.untyped_storage().data_ptr() == draft.untyped_storage().data_ptr()
    return View(tuple(limited.shape), limited.tolist(), same)


# ---------------------------------------------------------------- backends


class Selection(NamedTuple):
    causal: list[bool]  # per layer
    outside: list  # dflash_layer_causal of layers -1 and num_layers: refused (ERROR)
    non_causal: bool
    priorities: list[str]
    support: int  # CGSupport, NEVER = 0 .. ALWAYS = 3
    mode: str


def backend_outcomes(rows: list[tuple], absent_defaults: bool = False, impl=backends, call: dict | None = None) -> list:
    """Per (capability_major, backend, num_layers, layer_types, causal_override) row, run on ``impl``
    (kernels.spec.backends or reference.spec.backends): a Selection, or ERROR for a refused row. With
    ``absent_defaults`` a layer config that holds the defaults is left out of the calls. A ``call``
    (a refusal case) is made instead of the rows' (``called``)."""
    if call is not None:
        return called(impl, call)
    contract = reference.spec.backends
    out = []
    for capability_major, backend, num_layers, layer_types, causal_override in rows:
        layers = {"layer_types": layer_types, "causal_override": causal_override}
        layer_args = without_defaults(contract.dflash_layer_causal, layers, absent_defaults)
        try:
            causal = [impl.dflash_layer_causal(layer, num_layers, **layer_args) for layer in range(num_layers)]
            outside = [_call(impl.dflash_layer_causal, layer, num_layers, **layer_args) for layer in (-1, num_layers)]
            non_causal = impl.has_any_non_causal(num_layers, **without_defaults(contract.has_any_non_causal, layers,
                                                                                absent_defaults))
            out.append(Selection(causal, outside, non_causal,
                                 list(impl.backend_priorities(capability_major, non_causal)),
                                 int(impl.graph_support(backend, capability_major, non_causal)),
                                 _name(impl.draft_graph_mode(backend, capability_major, non_causal))))
        except ValueError:
            out.append(ERROR)
    return out


# ---------------------------------------------------------------- comparison


def without_defaults(contract, kwargs: dict, absent: bool) -> dict:
    """``kwargs``, less (when ``absent``) every argument that holds ``contract``'s default: the call a
    caller makes without the option, so a changed production default shows. ``contract`` is the
    reference function of the same name: its defaults are the documented ones, never read from the
    code under test."""
    if not absent:
        return kwargs
    params = inspect.signature(contract).parameters
    return {name: value for name, value in kwargs.items()
            if not (name in params and type(value) is type(params[name].default) and value == params[name].default)}


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError:
        return ERROR


def _differences(path: tuple, want, got):
    """(path, expected, got) of every differing leaf; a named tuple's path names its fields, but a
    graph descriptor and a dispatch (batch and graph) are leaves: they read best whole."""
    if isinstance(want, dict) and isinstance(got, dict) and want.keys() == got.keys():
        for key in want:
            yield from _differences(path + (key,), want[key], got[key])
    elif (isinstance(want, (list, tuple)) and type(want) is type(got) and len(want) == len(got)
          and not isinstance(want, (Descriptor, Dispatched))):
        for key, a, b in zip(getattr(want, "_fields", range(len(want))), want, got, strict=True):
            yield from _differences(path + (key,), a, b)
    elif want != got or type(want) is not type(got):
        yield path, want, got


def records_agree(output: str, expected, got) -> Divergence | None:
    """Plain records (dicts, lists, tuples, ints, strings) equal to the reference's, entry by entry;
    the first few differing entries are listed with their path."""
    found = list(_differences((), expected, got))
    if not found:
        return None
    return Divergence(output, len(found), found[:SHOW])
