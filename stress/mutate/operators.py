"""Mutation operators: each reads the AST of one production target (a function, a @triton.jit kernel or
a class) and yields one-slip edits of its source; ``generate`` turns every edit into a ``Patch`` whose
``old`` text occurs exactly once (context lines are added until it does), so ``stress.core.patches`` applies
it like a planted bug.

A generated mutant's name is its stable id, ``gen:<module>:<attr>:<operator>:<hash of old/new>``, so a
worker process (or ``repro --mutant``) rebuilds it from the name alone.
"""

import ast
import functools
import hashlib
import importlib
import importlib.util
import pathlib
import pkgutil
import re
import textwrap
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stress.core.patches import source_of
from stress.core.types import Mutant, Patch

PREFIX = "gen:"


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (offsets into the target's dedented source) by ``text``."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Generated:
    id: str
    target: str
    operator: str
    line: int  # 1-based line of the edit in the target's file
    patch: Patch

    def mutant(self) -> Mutant:
        """The patch, then a rebuild of every kernel that calls the target (a compiled kernel keeps
        the helpers it was compiled with; rebuilt after the patch, it takes the mutated one)."""
        rebuilt = tuple(Patch(t, f"def {t.split(':')[1]}(", f"def {t.split(':')[1]}(") for t in callers(self.target))
        return Mutant(self.id, f"{self.operator} at {self.target} line {self.line}", (self.patch, *rebuilt),
                      oracles={"cpu": "any", "cuda": "any"})


_HELPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel -> jit_helpers(kernel)


def jit_helpers(kernel) -> list[str]:
    """The project's ``@triton.jit`` functions a kernel calls, transitively, as targets ("module:name"), read
    from its source and resolved in its globals. A compiled kernel inlines them, so on a GPU no frame of theirs
    ever runs for a trace function to see (the interpreter runs them as Python). Read once per kernel object
    (a mutant's rebuild is a new one): every case under a mutant asks for its rebuild, through ``callers``."""
    if kernel not in _HELPERS:
        _HELPERS[kernel] = _read_helpers(kernel)
    return list(_HELPERS[kernel])


def _read_helpers(kernel) -> list[str]:
    found: dict[str, None] = {}
    package = kernel.fn.__module__.split(".")[0]
    stack = [kernel]
    while stack:
        fn, text = source_of(stack.pop())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name):
                value = fn.__globals__.get(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                value = getattr(fn.__globals__.get(node.value.id), node.attr, None)
            else:
                continue
            if (isinstance(value, type(kernel)) and value is not kernel
                    and value.fn.__module__.split(".")[0] == package):  # not Triton's own library
                name = f"{value.fn.__module__}:{value.fn.__name__}"
                if name not in found:
                    found[name] = None
                    stack.append(value)
    return list(found)


def callers(target: str) -> list[str]:
    """The Triton functions of the target's package that call it, directly or through others, callees first (a
    callee reaches strictly fewer helpers than its caller). Other modules count: rejection's kernel inlines
    sampling's helpers, and a compiled kernel keeps the helpers it was first built with."""
    module_name = target.split(":")[0]
    package = importlib.import_module(module_name.split(".")[0])
    names = [module_name, *(f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)
                            if _has_kernels(f"{package.__name__}.{m.name}"))]
    reached = {}
    for name in dict.fromkeys(names):
        for obj in vars(importlib.import_module(name)).values():
            if hasattr(obj, "fn") and getattr(obj.fn, "__module__", None) == name:
                reached[f"{name}:{obj.fn.__name__}"] = jit_helpers(obj)
    return sorted((name for name, helpers in reached.items() if target in helpers),
                  key=lambda n: (len(reached[n]), n))


@functools.cache
def _has_kernels(module_name: str) -> bool:
    """The module's file defines a Triton function (read, not imported: a package may hold scripts)."""
    origin = importlib.util.find_spec(module_name).origin or ""
    return origin.endswith(".py") and "@triton.jit" in pathlib.Path(origin).read_text()


class _Source:
    """The target's source with (line, column) -> offset conversion and text of nodes."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets; production sources are ASCII, where they agree
        return self.starts[line - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def of(self, node) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def replace(self, node, text: str) -> Edit:
        return Edit(*self.span(node), text)


def _is_attr(node, names: tuple[str, ...], attr: str) -> bool:
    """``node`` is ``<one of names>.<attr>`` (``tl.minimum``, ``triton.cdiv``)."""
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id in names)


def _calls(tree, names: tuple[str, ...], attr: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_attr(node.func, names, attr):
            yield node


def _in_strings(tree) -> set[int]:
    """ids of nodes inside f-strings and annotations (not code a mutant should touch)."""
    inside = set()
    for node in ast.walk(tree):
        roots = [node] if isinstance(node, ast.JoinedStr) else []
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AnnAssign)) and getattr(node, "returns", None) is not None:
            roots.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            inside.update(id(n) for n in ast.walk(root))
    return inside


# ---------------------------------------------------------------- operators

_FLIPS = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "=="}
_TOKENS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def comparison_flip(tree, src: _Source) -> Iterator[Edit]:
    """``<``/``<=``, ``>``/``>=``, ``==``/``!=``: the classic off-by-one and inverted test."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            if type(op) in _FLIPS:
                a, b = src.span(left)[1], src.span(right)[0]
                gap = src.text[a:b]
                token = _TOKENS[type(op)]
                at = gap.find(token)
                if at >= 0 and gap.count(token) == 1:
                    yield Edit(a + at, a + at + len(token), _FLIPS[type(op)])
            left = right


_HINTS = ("num_stages", "loop_unroll_factor", "num_warps", "num_ctas")


def constant_shift(tree, src: _Source) -> Iterator[Edit]:
    """An integer constant +1 and -1 (bools and constants in strings and annotations excluded)."""
    skip = _in_strings(tree)
    for node in ast.walk(tree):
        # compiler hints (pipelining, unrolling, warps) change no result
        if isinstance(node, ast.keyword) and node.arg in _HINTS:
            skip.update(id(n) for n in ast.walk(node.value))
        # argument checks (kernels.validate) have their own tests; an axis or a range start below 0 is no program
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                (isinstance(node.func.value, ast.Name) and node.func.value.id == "validate")
                or _is_attr(node.func, ("tl",), "program_id") or _is_attr(node.func, ("tl",), "arange")):
            skip.update(id(n) for n in ast.walk(node) if node.func.attr not in ("program_id", "arange")
                        or (isinstance(n, ast.Constant) and n.value == 0))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in skip
                and node.lineno == node.end_lineno):
            for delta in (1, -1):
                yield src.replace(node, str(node.value + delta))


def mask_term_dropped(tree, src: _Source) -> Iterator[Edit]:
    """One side of an ``a & b`` conjunction dropped: a mask that lets one more class of lanes through."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            for kept in (node.left, node.right):
                text = src.of(kept)
                yield src.replace(node, f"({text})" if "\n" not in text else text)


def load_other_changed(tree, src: _Source) -> Iterator[Edit]:
    """``other=`` of a masked ``tl.load`` changed: what a masked-off lane reads must not matter."""
    for call in _calls(tree, ("tl",), "load"):
        for kw in call.keywords:
            if kw.arg == "other":
                value = src.of(kw.value)
                yield src.replace(kw.value, "1" if value.strip() in ("0", "0.0") else "0")


def int64_cast_removed(tree, src: _Source) -> Iterator[Edit]:
    """``x.to(tl.int64)`` -> ``x``: offsets computed in int32 wrap past 2^31."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
                and len(node.args) == 1 and _is_attr(node.args[0], ("tl",), "int64")):
            yield src.replace(node, src.of(node.func.value))


def _statements(tree) -> Iterator[list]:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _is_barrier(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and _is_attr(stmt.value.func, ("tl",), "debug_barrier"))


def barrier_removed_or_moved(tree, src: _Source) -> Iterator[Edit]:
    """``tl.debug_barrier()`` removed, or moved after the next statement that stores."""
    for block in _statements(tree):
        for i, stmt in enumerate(block):
            if not _is_barrier(stmt):
                continue
            yield src.replace(stmt, "pass")
            for later in block[i + 1:]:
                if any(isinstance(c, ast.Call) and _is_attr(c.func, ("tl",), "store") for c in ast.walk(later)):
                    start = src.offset(stmt.lineno, 0)
                    end = src.offset(later.end_lineno + 1, 0)
                    barrier_line = src.text[start:src.offset(stmt.lineno + 1, 0)]
                    yield Edit(start, end, src.text[src.offset(stmt.lineno + 1, 0):end] + barrier_line)
                    break


def min_max_swapped(tree, src: _Source) -> Iterator[Edit]:
    """``tl.minimum`` <-> ``tl.maximum`` (and ``min``/``max`` in host code)."""
    swap = {"minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("minimum", "maximum") and \
                isinstance(node.func.value, ast.Name) and node.func.value.id in ("tl", "torch", "np"):
            a, b = src.span(node.func)
            yield Edit(b - len(node.func.attr), b, swap[node.func.attr])
        elif isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            yield src.replace(node.func, swap[node.func.id])


def _is_triton(tree) -> bool:
    """The target is a ``@triton.jit`` function (bare or called with options)."""
    return any(isinstance(node, ast.FunctionDef)
               and any(_is_attr(d.func if isinstance(d, ast.Call) else d, ("triton",), "jit")
                       for d in node.decorator_list)
               for node in ast.walk(tree))


def cdiv_floor_swapped(tree, src: _Source) -> Iterator[Edit]:
    """``cdiv(a, b)`` -> ``a // b`` and ``a // b`` -> rounding up: the partial last block.

    Triton's integer ``//`` truncates toward zero, so there Python's ``-(-a // b)`` would be ``a // b``
    again (an equivalent mutant); a kernel's round-up is ``(a + b - 1) // b``."""
    triton_code = _is_triton(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) == 2
                and (_is_attr(node.func, ("tl", "triton"), "cdiv"))):
            yield src.replace(node, f"({src.of(node.args[0])}) // ({src.of(node.args[1])})")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            a, b = src.of(node.left), src.of(node.right)
            yield src.replace(node, f"((({a}) + ({b}) - 1) // ({b}))" if triton_code else f"(-(-({a}) // ({b})))")


_INDEX = re.compile(r"^(b|s|i|j|row|slot|req|batch_row|.+_row|.+_slot|.+_idx|row_.+|slot_.+|req_.+)$")


def _vectors(tree) -> set[str]:
    """Names assigned from a ``tl.arange`` expression: lanes, not an index of the batch or a slot."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_is_attr(c.func, ("tl",), "arange") for c in ast.walk(node.value)
                                                if isinstance(c, ast.Call)):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _index_names(tree) -> list[str]:
    """Scalar names a function indexes memory with (an offset added to a ``*_ptr``, a subscript) that are
    named like an index (batch row, slot, request): the names a row-vs-slot slip confuses."""
    vectors = _vectors(tree)
    return [n for n in _used_as_index(tree) if _INDEX.match(n) and n not in vectors]


def _used_as_index(tree) -> list[str]:
    names: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Name) and s.id.endswith("_ptr") for s in sides):
                names.update({s.id: None for s in sides if isinstance(s, ast.Name) and not s.id.endswith("_ptr")})
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name):
            names[node.slice.id] = None
    return list(names)


def index_names_swapped(tree, src: _Source) -> Iterator[Edit]:
    """Two index names swapped where one indexes memory (batch row vs request slot)."""
    names = _index_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            uses = [s for s in (node.left, node.right) if isinstance(s, ast.Name) and s.id in names]
            if not any(isinstance(s, ast.Name) and s.id.endswith("_ptr") for s in (node.left, node.right)):
                uses = []
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id in names:
            uses = [node.slice]
        else:
            continue
        for use in uses:
            for other in names:
                if other != use.id:
                    yield src.replace(use, other)


def where_swapped(tree, src: _Source) -> Iterator[Edit]:
    """``where(c, a, b)`` -> ``where(c, b, a)``."""
    for name in ("tl", "torch", "np"):
        for call in _calls(tree, (name,), "where"):
            if len(call.args) == 3:
                a, b = call.args[1], call.args[2]
                yield Edit(src.span(a)[0], src.span(b)[1], f"{src.of(b)}, {src.of(a)}")


def bool_op_flipped(tree, src: _Source) -> Iterator[Edit]:
    """``or`` <-> ``and`` (host code)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp):
            token, other = ("or", "and") if isinstance(node.op, ast.Or) else ("and", "or")
            for left, right in zip(node.values, node.values[1:], strict=False):
                a, b = src.span(left)[1], src.span(right)[0]
                at = src.text[a:b].find(token)
                if at >= 0:
                    yield Edit(a + at, a + at + len(token), other)


def default_changed(tree, src: _Source) -> Iterator[Edit]:
    """A default argument changed: an int +1, a bool flipped, None -> 0."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            if isinstance(default, ast.Constant):
                value = default.value
                if isinstance(value, bool):
                    yield src.replace(default, str(not value))
                elif isinstance(value, int):
                    yield src.replace(default, str(value + 1))
                elif value is None:
                    yield src.replace(default, "0")


OPERATORS: dict[str, Callable] = {
    "cmp-flip": comparison_flip,
    "const": constant_shift,
    "mask-term": mask_term_dropped,
    "load-other": load_other_changed,
    "no-int64": int64_cast_removed,
    "barrier": barrier_removed_or_moved,
    "min-max": min_max_swapped,
    "cdiv-floor": cdiv_floor_swapped,
    "index-swap": index_names_swapped,
    "where-swap": where_swapped,
    "and-or": bool_op_flipped,
    "default": default_changed,
}


# ---------------------------------------------------------------- edits -> patches


def _unique_patch(target: str, text: str, edit: Edit) -> Patch | None:
    """The smallest run of whole lines around ``edit`` that occurs once in ``text``."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    first = max(i for i, s in enumerate(starts) if s <= edit.start)
    last = max(i for i, s in enumerate(starts) if s <= max(edit.start, edit.end - 1))
    while True:
        a = starts[first]
        b = starts[last + 1] if last + 1 < len(starts) else len(text)
        old = text[a:b]
        if text.count(old) == 1:
            new = text[a:edit.start] + edit.text + text[edit.end:b]
            return Patch(target, old.rstrip("\n"), new.rstrip("\n")) if old != new else None
        if last + 2 < len(starts):
            last += 1
        elif first > 0:
            first -= 1
        else:
            return None


def _mutant_id(target: str, operator: str, patch: Patch) -> str:
    digest = hashlib.sha1(f"{patch.old}\0{patch.new}".encode()).hexdigest()[:8]
    return f"{PREFIX}{target}:{operator}:{digest}"


def generate(target: str, operators: list[str] | None = None) -> list[Generated]:
    """Every mutant of ``target`` ("module:attribute") the operators make, in source order, each once."""
    fn, text = source_of(_target(target))
    first_line = _first_line(fn)
    tree = ast.parse(text)
    src = _Source(text)
    quiet = _messages(tree, src)
    seen, out = set(), []
    for name, operator in OPERATORS.items():
        if operators and name not in operators:
            continue
        for edit in operator(tree, src):
            if any(a <= edit.start and edit.end <= b for a, b in quiet):
                continue
            patch = _unique_patch(target, text, edit)
            if patch is None or patch in seen or not _parses(text.replace(patch.old, patch.new)):
                continue
            seen.add(patch)
            line = first_line + text.count("\n", 0, edit.start)
            out.append(Generated(_mutant_id(target, name, patch), target, name, line, patch))
    out.sort(key=lambda g: (g.line, g.operator, g.id))
    return out


def _messages(tree, src: _Source) -> list[tuple[int, int]]:
    """Spans no mutant touches: what a ``raise`` raises, f-strings, docstrings (text, not behaviour)."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            spans.append(src.span(node.exc))
        elif isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            spans.append(src.span(node))
    return spans


def _target(target: str):
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def _first_line(fn) -> int:
    import inspect

    return inspect.getsourcelines(fn)[1]


def _parses(text: str) -> bool:
    try:
        ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    return True


def resolve(mutant_id: str) -> Mutant:
    """The generated mutant named ``mutant_id``, rebuilt from the current source."""
    body = mutant_id.removeprefix(PREFIX)
    parts = body.split(":")
    if not mutant_id.startswith(PREFIX) or len(parts) != 4:
        raise ValueError(f"--mutant: {mutant_id!r} is not a generated mutant id; ids look like "
                         f"{PREFIX}kernels.block_table:_gather_rows_kernel:cmp-flip:1a2b3c4d")
    target = f"{parts[0]}:{parts[1]}"
    for g in generate(target, [parts[2]]):
        if g.id == mutant_id:
            return g.mutant()
    raise ValueError(f"--mutant: {mutant_id!r} no longer matches a mutant of {target} (the source changed); "
                     f"`python -m stress mutate --check C` lists the current ones")
