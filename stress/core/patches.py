"""Planted bugs: source patches applied to production kernels and host functions for the
duration of a run, so a mutant is the production code with one deliberate slip, never a
hand-kept twin that could drift from it."""

import importlib
import inspect
import linecache
import sys
import textwrap
import types
from contextlib import contextmanager

from stress.core.types import Mutant, Patch


class StaleMutant(RuntimeError):
    """The text a mutant replaces no longer occurs exactly once: the mutant must be updated."""


_built: dict[tuple[str, Patch], object] = {}


def source_of(obj):
    """The Python function behind ``obj`` (a kernel keeps it in .fn) and its dedented source."""
    fn = getattr(obj, "fn", obj)  # a @triton.jit kernel keeps the Python function in .fn
    return fn, textwrap.dedent(inspect.getsource(fn))


def _build(mutant_name: str, patch: Patch):
    key = (mutant_name, patch)
    if key in _built:
        return _built[key]
    module_name, attr = patch.target.split(":")
    module = importlib.import_module(module_name)
    fn, src = source_of(getattr(module, attr))
    count = src.count(patch.old)
    if count != 1:
        raise StaleMutant(f"mutant {mutant_name}: {patch.old!r} occurs {count} times in {patch.target}, expected once")
    mutated = src.replace(patch.old, patch.new)
    # Register the text with linecache so inspect (and Triton's JIT, which reads the source)
    # can find it like a file's.
    filename = f"<mutant {mutant_name}: {patch.target}>"
    lines = mutated.splitlines(keepends=True)
    linecache.cache[filename] = (len(mutated), None, lines, filename)
    namespace = dict(vars(module))
    exec(compile(mutated, filename, "exec"), namespace)
    built = _reading_live_module(namespace[fn.__name__], module)
    _built[key] = built
    return _built[key]


def _reading_live_module(built, module):
    """Host code reads the live module's globals, as the original does, so a test's monkeypatch of a module
    global (a simulated device's launch, ``draft_graphs.capturing``) reaches the mutant too: a function is
    rebound to them, and so is each method of a class (plain, static, class methods and properties); a
    method left on the copy of the globals would fail such a test under every mutant of its class."""
    if isinstance(built, types.FunctionType):
        live = types.FunctionType(built.__code__, vars(module), built.__name__, built.__defaults__, built.__closure__)
        live.__kwdefaults__, live.__dict__ = built.__kwdefaults__, built.__dict__
        return live
    if isinstance(built, type):
        for name, member in list(vars(built).items()):
            if isinstance(member, types.FunctionType):
                setattr(built, name, _reading_live_module(member, module))
            elif isinstance(member, (staticmethod, classmethod)):
                setattr(built, name, type(member)(_reading_live_module(member.__func__, module)))
            elif isinstance(member, property):
                setattr(built, name, property(*(f and _reading_live_module(f, module)
                                                 for f in (member.fget, member.fset, member.fdel)), member.__doc__))
    return built


def _aliases(original) -> list[tuple[object, str]]:
    """Every (module, name) of the project that holds ``original`` (``from kernels.x import f`` copies), and
    every (dict, key) of a production module's module-level dict that does (a registry of classes by name: a
    mutant left out of it would never run). Dicts of the suite itself (this module's build cache) are not
    production's: they are left alone."""
    found = []
    for mod_name, m in list(sys.modules.items()):
        package = mod_name.split(".")[0]
        if package not in ("kernels", "stress"):
            continue
        for name, value in list(vars(m).items()):
            if value is original:
                found.append((m, name))
            elif package == "kernels" and type(value) is dict and not name.startswith("__"):
                found += [(value, key) for key, item in list(value.items()) if item is original]
    return found


def _set(holder, name, value) -> None:
    if type(holder) is dict:
        holder[name] = value
    else:
        setattr(holder, name, value)


@contextmanager
def applied(mutant: Mutant | None):
    """Swap in the mutated objects for the duration, under every name the project imported them by;
    always restore, also on error. A module first imported meanwhile (the engine, imported lazily by its
    check) copied a replacement with its ``from ... import``: it gets the original back too, or every later
    case in this process would run the mutant."""
    saved, swapped = [], []
    try:
        for patch in mutant.patches if mutant else ():
            module_name, attr = patch.target.split(":")
            module = importlib.import_module(module_name)
            replacement = _build(mutant.name, patch)
            original = getattr(module, attr)
            swapped.append((replacement, original))
            for holder, name in _aliases(original) or [(module, attr)]:
                saved.append((holder, name, original))
                _set(holder, name, replacement)
        yield
    finally:
        for holder, name, original in reversed(saved):
            _set(holder, name, original)
        for replacement, original in reversed(swapped):
            for holder, name in _aliases(replacement):
                _set(holder, name, original)


@contextmanager
def swapped(original, replacement):
    """``replacement`` in place of ``original`` for the duration, under every name the project imported it by
    (a registered implementation in place of a production launcher); always restored."""
    saved = [(holder, name) for holder, name in _aliases(original)]
    try:
        for holder, name in saved:
            _set(holder, name, replacement)
        yield
    finally:
        for holder, name in reversed(saved):
            _set(holder, name, original)


def validate(mutant: Mutant) -> None:
    """Build every patch now, so a stale mutant fails loudly before any run. Built as ``applied`` builds them,
    each after the ones before it are swapped in: a kernel rebuilt after a mutated helper (a build is cached)
    must capture the mutated one, not the production helper."""
    with applied(mutant):
        pass
