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
import inspect
import os
import pathlib
import pkgutil
import re
import textwrap
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stress import checks
from stress.core.patches import source_of
from stress.core.types import Check, Mutant, Patch
from stress.mutate import semantic as mutate_semantic
from stress.mutate.source import Edit, Source, in_strings, is_attr, statements

PREFIX = "gen:"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


@dataclass(frozen=True)
class Generated:
    id: str
    target: str
    operator: str
    line: int  # 1-based line of the edit in the target's file
    patch: Patch
    description: str = ""

    def mutant(self) -> Mutant:
        """The patch, then a rebuild of every kernel that calls the target (a compiled kernel keeps
        the helpers it was compiled with; rebuilt after the patch, it takes the mutated one)."""
        rebuilt = tuple(Patch(t, f"def {t.split(':')[1]}(", f"def {t.split(':')[1]}(") for t in callers(self.target))
        return Mutant(self.id, self.description, (self.patch, *rebuilt), oracles={"cpu": "any", "cuda": "any"})


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


def _calls(tree, names: tuple[str, ...], attr: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and is_attr(node.func, names, attr):
            yield node


# ---------------------------------------------------------------- operators

_FLIPS = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "=="}
_TOKENS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def comparison_flip(tree, src: Source) -> Iterator[Edit]:
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


def constant_shift(tree, src: Source) -> Iterator[Edit]:
    """An integer constant +1 and -1 (bools and constants in strings and annotations excluded)."""
    skip = in_strings(tree)
    for node in ast.walk(tree):
        # compiler hints (pipelining, unrolling, warps) change no result
        if isinstance(node, ast.keyword) and node.arg in _HINTS:
            skip.update(id(n) for n in ast.walk(node.value))
        # argument checks (kernels.validate) have their own tests; an axis or a range start below 0 is no program
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                (isinstance(node.func.value, ast.Name) and node.func.value.id == "validate")
                or is_attr(node.func, ("tl",), "program_id") or is_attr(node.func, ("tl",), "arange")):
            skip.update(id(n) for n in ast.walk(node) if node.func.attr not in ("program_id", "arange")
                        or (isinstance(n, ast.Constant) and n.value == 0))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in skip
                and node.lineno == node.end_lineno):
            for delta in (1, -1):
                yield src.replace(node, str(node.value + delta))


def mask_term_dropped(tree, src: Source) -> Iterator[Edit]:
    """One side of an ``a & b`` conjunction dropped: a mask that lets one more class of lanes through."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            for kept in (node.left, node.right):
                text = src.of(kept)
                yield src.replace(node, f"({text})" if "\n" not in text else text)


def load_other_changed(tree, src: Source) -> Iterator[Edit]:
    """``other=`` of a masked ``tl.load`` changed: what a masked-off lane reads must not matter."""
    for call in _calls(tree, ("tl",), "load"):
        for kw in call.keywords:
            if kw.arg == "other":
                value = src.of(kw.value)
                yield src.replace(kw.value, "1" if value.strip() in ("0", "0.0") else "0")


def int64_cast_removed(tree, src: Source) -> Iterator[Edit]:
    """``x.to(tl.int64)`` -> ``x``: offsets computed in int32 wrap past 2^31."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
                and len(node.args) == 1 and is_attr(node.args[0], ("tl",), "int64")):
            yield src.replace(node, src.of(node.func.value))


def _is_barrier(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and is_attr(stmt.value.func, ("tl",), "debug_barrier"))


def barrier_removed_or_moved(tree, src: Source) -> Iterator[Edit]:
    """``tl.debug_barrier()`` removed, or moved after the next statement that stores."""
    for block in statements(tree):
        for i, stmt in enumerate(block):
            if not _is_barrier(stmt):
                continue
            yield src.replace(stmt, "pass")
            for later in block[i + 1:]:
                if any(isinstance(c, ast.Call) and is_attr(c.func, ("tl",), "store") for c in ast.walk(later)):
                    start = src.offset(stmt.lineno, 0)
                    end = src.offset(later.end_lineno + 1, 0)
                    barrier_line = src.text[start:src.offset(stmt.lineno + 1, 0)]
                    yield Edit(start, end, src.text[src.offset(stmt.lineno + 1, 0):end] + barrier_line)
                    break


def min_max_swapped(tree, src: Source) -> Iterator[Edit]:
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
               and any(is_attr(d.func if isinstance(d, ast.Call) else d, ("triton",), "jit")
                       for d in node.decorator_list)
               for node in ast.walk(tree))


def cdiv_floor_swapped(tree, src: Source) -> Iterator[Edit]:
    """``cdiv(a, b)`` -> ``a // b`` and ``a // b`` -> rounding up: the partial last block.

    Triton's integer ``//`` truncates toward zero, so there Python's ``-(-a // b)`` would be ``a // b``
    again (an equivalent mutant); a kernel's round-up is ``(a + b - 1) // b``."""
    triton_code = _is_triton(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) == 2
                and (is_attr(node.func, ("tl", "triton"), "cdiv"))):
            yield src.replace(node, f"({src.of(node.args[0])}) // ({src.of(node.args[1])})")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            a, b = src.of(node.left), src.of(node.right)
            yield src.replace(node, f"((({a}) + ({b}) - 1) // ({b}))" if triton_code else f"(-(-({a}) // ({b})))")


_INDEX = re.compile(r"^(b|s|i|j|row|slot|req|batch_row|.+_row|.+_slot|.+_idx|row_.+|slot_.+|req_.+)$")


def _vectors(tree) -> set[str]:
    """Names assigned from a ``tl.arange`` expression: lanes, not an index of the batch or a slot."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(is_attr(c.func, ("tl",), "arange") for c in ast.walk(node.value)
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


def index_names_swapped(tree, src: Source) -> Iterator[Edit]:
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


def where_swapped(tree, src: Source) -> Iterator[Edit]:
    """``where(c, a, b)`` -> ``where(c, b, a)``."""
    for name in ("tl", "torch", "np"):
        for call in _calls(tree, (name,), "where"):
            if len(call.args) == 3:
                a, b = call.args[1], call.args[2]
                yield Edit(src.span(a)[0], src.span(b)[1], f"{src.of(b)}, {src.of(a)}")


def bool_op_flipped(tree, src: Source) -> Iterator[Edit]:
    """``or`` <-> ``and`` (host code)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp):
            token, other = ("or", "and") if isinstance(node.op, ast.Or) else ("and", "or")
            for left, right in zip(node.values, node.values[1:], strict=False):
                a, b = src.span(left)[1], src.span(right)[0]
                at = src.text[a:b].find(token)
                if at >= 0:
                    yield Edit(a + at, a + at + len(token), other)


def default_changed(tree, src: Source) -> Iterator[Edit]:
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
        if text.count(old.rstrip("\n")) == 1:  # unique as applied: a trailing blank line is no context
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
    """Every mutant of ``target`` ("module:attribute") the operators make, in source order, each once.
    ``operators`` names them, one-token (this module's) or semantic (``stress.mutate.semantic``); None
    is every one-token operator."""
    fn, text = source_of(_target(target))
    return list(_generated(target, text, _first_line(fn), os.path.relpath(inspect.getsourcefile(fn), ROOT),
                           None if operators is None else tuple(operators)))


@functools.lru_cache(maxsize=64)
def _generated(target: str, text: str, first_line: int, file: str,
               operators: tuple[str, ...] | None) -> tuple[Generated, ...]:
    """``generate``'s mutants of ``target`` as its source ``text`` reads now: kept per text, since a run resolves
    each of its ids (``resolve``) several times, and a semantic operator's mutants are made only after every
    one-token operator's, which a large class (the engine) takes seconds to make."""
    tree = ast.parse(text)
    src = Source(text)
    quiet = _messages(tree, src)
    seen, out = set(), []
    # a slip a one-token operator makes stays that operator's: the semantic class never makes it again
    token_made = ({_unique_patch(target, text, edit) for operator in OPERATORS.values() for edit in operator(tree, src)}
                  if set(operators or ()) & set(mutate_semantic.OPERATORS) else set())
    for name, operator in {**OPERATORS, **mutate_semantic.OPERATORS}.items():
        if name not in (operators or OPERATORS):
            continue
        for edit in operator(tree, src):
            if any(a <= edit.start and edit.end <= b for a, b in quiet):
                continue
            patch = _unique_patch(target, text, edit)
            if (patch is None or patch in seen or (name in mutate_semantic.OPERATORS and patch in token_made)
                    or not _parses(text.replace(patch.old, patch.new))):
                continue
            seen.add(patch)
            line = first_line + text.count("\n", 0, edit.start)
            description = (f"{edit.what} in line {line} of {file}:{target.split(':')[1]}" if edit.what
                           else f"{name} at {target} line {line}")
            out.append(Generated(_mutant_id(target, name, patch), target, name, line, patch, description))
    out.sort(key=lambda g: (g.line, g.operator, g.id))
    return tuple(out)


def _messages(tree, src: Source) -> list[tuple[int, int]]:
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
    return inspect.getsourcelines(fn)[1]


def _parses(text: str) -> bool:
    try:
        ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    return True


def find(name: str, check: Check) -> Mutant:
    """A planted bug of ``check`` by name, or a generated mutant by its id (which names its own patch)."""
    return resolve(name) if name.startswith(PREFIX) else checks.find_mutant(name, check)


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


# The two classes a run selects (``--operators``) and scores apart.
OPERATOR_CLASSES: dict[str, tuple[str, ...]] = {"token": tuple(OPERATORS), "semantic": tuple(mutate_semantic.OPERATORS)}


def operator_class(operator: str) -> str:
    """"semantic" for ``stress.mutate.semantic``'s operators, "token" for this module's."""
    return "semantic" if operator in mutate_semantic.OPERATORS else "token"
