"""Semantic mutation operators: the slips an engineer makes that still read as sensible code. A well-typed
name that is the wrong one, two arguments of one kind in the wrong order, a forgotten statement, the
expression of the neighbouring line, an index off by one at a boundary, an argument check one part short.
``stress.mutate.operators`` makes the one-token slips; these are scored apart from them (``OPERATOR_CLASSES``).

"Of the same kind" is a documented, deliberately simple type hint (``_Scope``): two attributes of one
object; two names with the same annotation; two unannotated parameters (pointers, ``*_ptr``, apart); two
locals first assigned from the same kind of expression (``_kind``: the same function called, both
arithmetic, both masks, both tests, both constants of one type). A candidate name must be bound before the line it
replaces a name in, so a mutant is a program that runs, not a ``NameError``. Each site gets at most
``CANDIDATES`` substitutes, the nearest first. A slip a one-token operator makes is left to it
(``mutate_ops.generate`` drops it here). Each edit says what it does (``Edit.what``); generation adds the
line and target.
"""

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from stress.mutate.source import Edit, Source, in_strings, is_attr, statements

CANDIDATES = 2  # substitutes per site (names, attributes, argument pairs): the nearest ones
NEIGHBOURHOOD = 3  # lines either side an expression may come from
# Calls whose arguments commute, or whose branch swap is the token operator ``where-swap``
_SYMMETRIC = {"min", "max", "tl.minimum", "tl.maximum", "torch.minimum", "torch.maximum", "tl.where",
              "torch.where", "np.where"}
_CONVERSIONS = ("to", "cpu", "item", "flatten", "contiguous", "int", "long")  # methods that keep the kind


def _dotted(func) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{func.value.id}.{func.attr}" if isinstance(func.value, ast.Name) else f".{func.attr}"
    if isinstance(func, ast.Subscript):  # a kernel launch, kernel[grid](...)
        return _dotted(func.value) + "[]"
    return type(func).__name__.lower()


def _kind(node) -> str:
    """The kind of expression a value comes from: the function called (conversions such as ``.to()`` looked
    through), arithmetic, a test, a constant of one type, or the node's type."""
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr in _CONVERSIONS):
        node = node.func.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        node = node.operand
    if isinstance(node, ast.Call):
        return "call " + _dotted(node.func)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        return "mask"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return "arithmetic"
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        return "test"
    if isinstance(node, ast.Constant):
        return "constant " + type(node.value).__name__
    return type(node).__name__.lower()


@dataclass
class _Scope:
    """One function's parameters and locals: each name's kind and the line it is first bound on."""

    fn: ast.FunctionDef
    kinds: dict[str, str] = field(default_factory=dict)
    bound: dict[str, int] = field(default_factory=dict)

    def bind(self, name: str, kind: str, line: int) -> None:
        if name not in self.kinds:
            self.kinds[name], self.bound[name] = kind, line

    def bound_before(self, name: str, line: int) -> bool:
        """A local or parameter bound before ``line`` (a global or builtin: always)."""
        return name not in self.bound or self.bound[name] < line

    def kind(self, node) -> str:
        return self.kinds.get(node.id, "") if isinstance(node, ast.Name) else _kind(node)


def _scopes(tree) -> list[_Scope]:
    """Every function of the target (a class's methods each on their own), in source order."""
    out = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        scope = _Scope(fn)
        args = fn.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is None or arg.arg in ("self", "cls"):
                continue
            kind = ("annotated " + ast.unparse(arg.annotation) if arg.annotation is not None
                    else "pointer parameter" if arg.arg.endswith("_ptr") else "parameter")
            scope.bind(arg.arg, kind, fn.lineno)
        for node in sorted((n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.For))),
                           key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                scope.bind(node.targets[0].id, "value " + _kind(node.value), node.lineno)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                scope.bind(node.target.id, "annotated " + ast.unparse(node.annotation), node.lineno)
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                scope.bind(node.target.id, "loop over " + _kind(node.iter), node.lineno)
            else:  # unpacked targets: bound, of no kind another name shares
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                        scope.bind(name.id, f"unpacked at {node.lineno}:{name.col_offset}", node.lineno)
        out.append(scope)
    return out


def _nearest(site_line: int, candidates: dict[str, int]) -> list[str]:
    return sorted(candidates, key=lambda name: (abs(candidates[name] - site_line), name))[:CANDIDATES]


def _atom(node, src: Source) -> str:
    """The node's text, parenthesized unless it binds tighter than any operator."""
    text = src.of(node)
    return text if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)) else f"({text})"


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


# ---------------------------------------------------------------- operators


def same_kind_name(tree, src: Source) -> Iterator[Edit]:
    """A name replaced by another of its kind bound before it (``src_stride`` -> ``dst_stride``, ``width`` ->
    ``block_size``), or an attribute by another attribute of the same object (``cfg.num_heads`` ->
    ``cfg.num_kv_heads``)."""
    skip = in_strings(tree)
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for scope in _scopes(tree):
        for node in ast.walk(scope.fn):
            if id(node) in skip or id(node) in calls:
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and scope.kinds.get(node.id):
                kind = scope.kinds[node.id]
                others = {n: line for n, line in scope.bound.items()
                          if n != node.id and scope.kinds[n] == kind and line < node.lineno and n != "_"}
                for other in _nearest(scope.bound[node.id], others):
                    yield Edit(*src.span(node), other, f"replaces `{node.id}` by `{other}`")
    yield from _same_object_attribute(tree, src, skip, calls)


def _same_object_attribute(tree, src: Source, skip: set[int], calls: set[int]) -> Iterator[Edit]:
    """``obj.a`` -> ``obj.b`` for data attributes (never called: a method is no value of the kind) of one
    object that is a local, a parameter or ``self``; where both are assigned here, from the same kind of
    expression (``self.seeds`` and ``self.num_cached_tokens`` both ``np.zeros``, not the dict ``self.slot_of``)."""
    local = {name for scope in _scopes(tree) for name in scope.kinds} | {"self", "cls"}
    seen: dict[str, dict[str, int]] = {}  # object text -> attribute -> first line
    methods = {(src.of(n.value), n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) in calls}
    values: dict[tuple[str, str], str] = {}  # (object, attribute) -> kind of the value first assigned to it
    for node in (n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in (t for t in targets if isinstance(t, ast.Attribute)):
            values.setdefault((src.of(target.value), target.attr), _kind(node.value))
    sites = []
    for node in ast.walk(tree):
        root = node.value if isinstance(node, ast.Attribute) else None
        while isinstance(root, ast.Attribute):
            root = root.value
        if not (isinstance(root, ast.Name) and root.id in local) or id(node) in skip:
            continue
        base = src.of(node.value)
        if (base, node.attr) in methods:
            continue
        seen.setdefault(base, {}).setdefault(node.attr, node.lineno)
        if isinstance(node.ctx, ast.Load):
            sites.append((node, base))
    for node, base in sorted(sites, key=lambda s: (s[0].lineno, s[0].col_offset)):
        attrs, kind = seen[base], values.get((base, node.attr))
        others = {a: line for a, line in attrs.items()
                  if a != node.attr and (kind is None or values.get((base, a), kind) == kind)}
        for other in _nearest(attrs[node.attr], others):
            a, b = src.span(node)
            yield Edit(b - len(node.attr), b, other, f"replaces `{base}.{node.attr}` by `{base}.{other}`")


def same_kind_arguments_swapped(tree, src: Source) -> Iterator[Edit]:
    """Two positional arguments of one call, or two keyword values, of the same kind swapped (a launch's
    ``persistent, idx_mapping``; ``stride(0)`` and ``stride(1)``). Calls whose arguments commute are left out."""
    skip = in_strings(tree)
    for scope in _scopes(tree):
        for call in (n for n in ast.walk(scope.fn) if isinstance(n, ast.Call) and id(n) not in skip):
            name = _dotted(call.func)
            if name in _SYMMETRIC:
                continue
            for group in ([a for a in call.args if not isinstance(a, ast.Starred)],
                          [k.value for k in call.keywords if k.arg is not None]):
                pairs = [(i, j) for i in range(len(group)) for j in range(i + 1, len(group))
                         if scope.kind(group[i]) and scope.kind(group[i]) == scope.kind(group[j])
                         and src.of(group[i]) != src.of(group[j])]
                for i, j in sorted(pairs, key=lambda p: (p[1] - p[0], p[0]))[:CANDIDATES]:
                    first, second = group[i], group[j]
                    middle = src.text[src.span(first)[1]:src.span(second)[0]]
                    yield Edit(src.span(first)[0], src.span(second)[1], src.of(second) + middle + src.of(first),
                               f"swaps `{_short(src.of(first), 30)}` and `{_short(src.of(second), 30)}` "
                               f"in the call of `{_short(name, 30)}`")


def effect_deleted(tree, src: Source) -> Iterator[Edit]:
    """A statement with an effect forgotten (replaced by ``pass``): a call statement (a store, an argument
    check), an augmented assignment, a store into an attribute or an element, a reassignment read later, an
    ``if ...: raise`` / ``if ...: return`` guard. ``tl.debug_barrier()`` is ``barrier``'s."""
    for scope in _scopes(tree):
        loads = [n for n in ast.walk(scope.fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        for block in statements(scope.fn):
            for stmt in block:
                if _has_effect(stmt, scope, loads):
                    yield Edit(*src.span(stmt), "pass", f"deletes `{_short(src.of(stmt))}`")


def _has_effect(stmt, scope: _Scope, loads: list) -> bool:
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call) and not is_attr(stmt.value.func, ("tl",), "debug_barrier")
    if isinstance(stmt, ast.AugAssign):
        return True
    if isinstance(stmt, ast.If):
        return (not stmt.orelse and len(stmt.body) == 1 and isinstance(stmt.body[0], (ast.Raise, ast.Return)))
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in targets):
            return True
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        # a reassignment: deleting a first binding is a NameError, not a forgotten update
        return bool(names) and all(scope.bound_before(n, stmt.lineno) for n in names) and any(
            n.id in names and n.lineno > stmt.end_lineno for n in loads)
    return False


def neighbour_expression(tree, src: Source) -> Iterator[Edit]:
    """An expression taken from a line nearby (within ``NEIGHBOURHOOD`` lines): an assignment's value
    replaced by a nearby assignment's value of the same kind, a load's or store's offset by a nearby load's
    or store's offset. Only when every local the new text reads is bound by then."""
    for scope in _scopes(tree):
        assigns = [n for n in ast.walk(scope.fn) if isinstance(n, ast.Assign)]
        for node in assigns:
            for other in _near(node, assigns):
                if (_value_kind(other.value, scope) == _value_kind(node.value, scope)
                        and src.of(other.value) != src.of(node.value)
                        and _reads_bound(other.value, scope, node.lineno)):
                    target = _short(" = ".join(src.of(t) for t in node.targets), 30)
                    yield Edit(*src.span(node.value), src.of(other.value),
                               f"replaces the value of `{target}` by `{_short(src.of(other.value))}` "
                               f"from {_where(other.lineno - node.lineno)}")
        accesses = [(c, terms) for c in ast.walk(scope.fn) if isinstance(c, ast.Call)
                    and (is_attr(c.func, ("tl",), "load") or is_attr(c.func, ("tl",), "store"))
                    and (terms := _offset_terms(c))]
        for call, terms in accesses:
            start, end = src.span(terms[0])[0], src.span(call.args[0])[1]
            for other, other_terms in accesses:
                text = src.text[src.span(other_terms[0])[0]:src.span(other.args[0])[1]]
                if (other is not call and abs(other.lineno - call.lineno) <= NEIGHBOURHOOD
                        and text != src.text[start:end]
                        and all(_reads_bound(t, scope, call.lineno) for t in other_terms)):
                    yield Edit(start, end, text, f"replaces the offset `{_short(src.text[start:end], 30)}` of "
                               f"`tl.{call.func.attr}` by `{_short(text, 30)}` "
                               f"from {_where(other.lineno - call.lineno)}")


def _value_kind(node, scope: _Scope) -> str:
    """A local's or parameter's own kind for a bare name, else the kind of the expression."""
    return scope.kind(node) or _kind(node)


def _near(node, statements: list) -> list:
    return sorted((s for s in statements if s is not node and abs(s.lineno - node.lineno) <= NEIGHBOURHOOD),
                  key=lambda s: (abs(s.lineno - node.lineno), s.lineno))


def _where(delta: int) -> str:
    if delta == 0:
        return "the same line"
    return f"{abs(delta)} line{'s' if abs(delta) > 1 else ''} {'above' if delta < 0 else 'below'}"


def _reads_bound(node, scope: _Scope, line: int) -> bool:
    return all(scope.bound_before(n.id, line) for n in ast.walk(node) if isinstance(n, ast.Name))


def _offset_terms(call) -> list:
    """The terms of a load's or store's offset, ``[a, b]`` for the pointer ``p + a + b`` (a sum led by the
    pointer's name; Python's ``+`` groups to the left, so ``a + b`` is no node of its own); [] for any other
    pointer. The terms are a sum: replacing the text from ``a`` to the pointer's end needs no parentheses."""
    node, terms = call.args[0] if call.args else None, []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        terms.insert(0, node.right)
        node = node.left
    return terms if isinstance(node, ast.Name) else []


def boundary_shifted(tree, src: Source) -> Iterator[Edit]:
    """An index or a bound one off: ``x[i]`` -> ``x[i + 1]`` / ``x[i - 1]``, a slice end +1/-1, ``range(n)``
    -> ``range(n - 1)`` / ``range(1, n)`` (and a range's end or start one off), a scalar ``tl.load`` (no
    mask) one element off. Constants are ``const``'s, and so is an index already written ``i + 1``; a
    boolean mask and a kernel's grid are no positions."""
    skip = in_strings(tree) | {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}  # kernel[grid]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Subscript):
            index = node.slice
            if isinstance(index, ast.Slice):
                for end in (index.lower, index.upper):
                    yield from _shifts(end, src, "a slice end")
            elif not isinstance(index, (ast.Tuple, ast.Compare, ast.BoolOp)):  # a boolean mask is no position
                yield from _shifts(index, src, f"the index of `{_short(src.of(node.value), 30)}`")
        elif isinstance(node, ast.Call) and (isinstance(node.func, ast.Name) and node.func.id == "range"
                                             or is_attr(node.func, ("tl",), "range")):
            yield from _range_shifts(node, src)
        elif isinstance(node, ast.Call) and is_attr(node.func, ("tl",), "load") and node.args and not any(
                k.arg == "mask" for k in node.keywords):
            if terms := _offset_terms(node):
                yield from _shifts(terms[-1], src, "a scalar load's offset")
            elif isinstance(node.args[0], ast.Name):
                yield Edit(*src.span(node.args[0]), f"{src.of(node.args[0])} + 1",
                           f"loads `{src.of(node.args[0])} + 1` instead of `{src.of(node.args[0])}`")


def _shiftable(node) -> bool:
    """Not a constant, nor already ``x + c`` / ``x - c`` (shifting those is ``const``'s slip)."""
    if node is None or isinstance(node, ast.Constant) or (
            isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)):
        return False
    return not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
                and isinstance(node.right, ast.Constant))


def _shifts(node, src: Source, what: str) -> Iterator[Edit]:
    if _shiftable(node):
        for sign in ("+", "-"):
            new = f"{_atom(node, src)} {sign} 1"
            yield Edit(*src.span(node), new,
                       f"shifts {what} by one: `{_short(src.of(node), 30)}` -> `{_short(new, 34)}`")


def _range_shifts(call, src: Source) -> Iterator[Edit]:
    args = call.args
    if len(args) == 1 and _shiftable(args[0]):
        n = src.of(args[0])
        yield Edit(*src.span(args[0]), f"{_atom(args[0], src)} - 1", f"ends `range({_short(n, 30)})` one early")
        yield Edit(*src.span(args[0]), f"1, {n}", f"starts `range({_short(n, 30)})` at 1")
    elif len(args) >= 2:
        if _shiftable(args[1]):
            for sign, how in (("-", "one early"), ("+", "one late")):
                yield Edit(*src.span(args[1]), f"{_atom(args[1], src)} {sign} 1",
                           f"ends `{_short(src.of(call), 40)}` {how}")
        if _shiftable(args[0]):
            yield Edit(*src.span(args[0]), f"{_atom(args[0], src)} + 1",
                       f"starts `{_short(src.of(call), 40)}` one late")


def guard_part_dropped(tree, src: Source) -> Iterator[Edit]:
    """An argument check one part short: an operand of the test of an ``if a or b: raise`` left out (the guard
    lets through what only that part refuses), or of an ``if a and b: raise`` (it refuses what that part lets
    through). Deleting the whole guard is ``stmt-delete``'s; ``or`` for ``and`` is ``and-or``'s."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1
                and isinstance(node.body[0], ast.Raise) and isinstance(node.test, ast.BoolOp)):
            continue
        parts = node.test.values
        joint = " or " if isinstance(node.test.op, ast.Or) else " and "
        for dropped in parts:
            kept = joint.join(f"({src.of(p)})" if isinstance(p, ast.BoolOp) else src.of(p)
                              for p in parts if p is not dropped)
            yield Edit(*src.span(node.test), kept,
                       f"drops `{_short(src.of(dropped), 40)}` from the guard `{_short(src.of(node.test), 50)}`")


OPERATORS: dict[str, Callable] = {
    "same-name": same_kind_name,
    "arg-swap": same_kind_arguments_swapped,
    "stmt-delete": effect_deleted,
    "neighbour-expr": neighbour_expression,
    "boundary-shift": boundary_shifted,
    "guard-part": guard_part_dropped,
}

