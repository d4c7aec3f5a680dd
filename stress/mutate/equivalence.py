"""Is a generated mutant the same program as the original? Then it cannot be killed and is not counted.

Host code: the bytecode (``co_code``, names and constants, nested code objects included) of the
target before and after. Triton kernels: the TTIR (Triton's first IR, after its canonicalizing passes)
of every launched kernel the patch reaches, compiled for ``GPUTarget("cuda", 90, 32)`` with each
signature the check's cases launched; that compile stops before any driver is needed, so it runs on
a CPU-only machine too. When a kernel cannot be compiled (or was never launched), the normalized AST is
compared instead. The verdict names the test it used.
"""

import importlib
import inspect
import os
import re
import sys
import types
from contextlib import contextmanager

import torch
import triton.language as tl

from stress.core import patches as planted
from stress.core.types import Mutant

_DTYPES = {torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
           torch.bool: "i1", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.float64: "fp64"}
_LOC = re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)|^#loc.*$", re.M)


def is_kernel(obj) -> bool:
    return hasattr(obj, "fn") and hasattr(obj, "run")


# ---------------------------------------------------------------- launch signatures


def signature(kernel, args: tuple, kwargs: dict) -> tuple | None:
    """A launch's TTIR specialization: argument types, and the values of constexprs (hashable)."""
    params = inspect.signature(kernel.fn).parameters
    try:
        bound = inspect.signature(kernel.fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
    except TypeError:
        return None
    out = []
    for name, param in params.items():
        value = bound.arguments.get(name, param.default)
        constexpr = param.annotation is tl.constexpr or "constexpr" in str(param.annotation)
        if constexpr or value is None:
            out.append((name, "constexpr", value if isinstance(value, (int, float, bool, str, type(None))) else None))
        elif isinstance(value, torch.Tensor):
            out.append((name, "*" + _DTYPES.get(value.dtype, "i8"), None))
        elif isinstance(value, bool):
            out.append((name, "i1", None))
        elif isinstance(value, int):
            out.append((name, "i32" if -2**31 <= value < 2**31 else "i64", None))
        elif isinstance(value, float):
            out.append((name, "fp32", None))
        else:
            return None
    return tuple(out)


def _compilable(fn, memo: dict):
    """``fn`` with its globals' interpreted kernels replaced by JIT functions, so Triton can compile it."""
    from triton.runtime.jit import JITFunction

    if id(fn) in memo:
        return memo[id(fn)]
    scope = dict(fn.__globals__)
    clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__module__, clone.__qualname__ = fn.__module__, fn.__qualname__
    memo[id(fn)] = jitted = JITFunction(clone)
    for name, value in fn.__globals__.items():
        if is_kernel(value) and not isinstance(value, JITFunction):
            scope[name] = _compilable(value.fn, memo)
    return jitted


@contextmanager
def _compiled_library():
    """Under the interpreter, Triton's own library functions (``tl.cdiv``, ...) are interpreted twins
    (``kernels.runtime``); the compiler needs JIT functions: swap them back for the duration."""
    from triton.runtime.jit import JITFunction

    holders = [m for n, m in list(sys.modules.items()) if n == "triton.language" or n.startswith("triton.language.")]
    holders.append(tl.core.tensor)
    saved = []
    try:
        for holder in holders:
            for attr, value in list(vars(holder).items()):
                if is_kernel(value) and not isinstance(value, JITFunction):
                    saved.append((holder, attr, value))
                    setattr(holder, attr, _LIBRARY.setdefault(id(value), JITFunction(value.fn)))
        yield
    finally:
        for holder, attr, value in reversed(saved):
            setattr(holder, attr, value)


_LIBRARY: dict[int, object] = {}


def ttir(kernel, sig: tuple) -> str:
    """The kernel's TTIR for one launch signature, source locations stripped."""
    with _compiled_library():
        return _ttir(kernel, sig)


def _ttir(kernel, sig: tuple) -> str:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    fn = _compilable(kernel.fn, {})
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    signature = {name: kind for name, kind, _ in sig}
    constexprs = {(i,): value for i, (_, kind, value) in enumerate(sig) if kind == "constexpr"}
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ASTSource(fn, signature, constexprs).make_ir(target, options, backend.get_codegen_implementation(options),
                                                         backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, options, ASTSource(fn, signature, constexprs).language)
    return _LOC.sub("", str(stages["ttir"](module, {})))


# ---------------------------------------------------------------- host bytecode


def _code_key(code: types.CodeType) -> tuple:
    consts = tuple(_code_key(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                   for c in code.co_consts)
    return code.co_code, code.co_names, code.co_varnames, code.co_freevars, consts


def _host_key(obj) -> tuple:
    if isinstance(obj, type):
        return tuple((name, _host_key(value)) for name, value in vars(obj).items()
                     if name not in ("__module__", "__doc__", "__dict__", "__weakref__", "__qualname__"))
    for wrapper in ("__func__", "fget"):
        if hasattr(obj, wrapper):
            return (wrapper, _host_key(getattr(obj, wrapper)), _host_key(getattr(obj, "fset", None)))
    if isinstance(obj, types.FunctionType):
        defaults = tuple(repr(d) for d in obj.__defaults__ or ())
        kw = tuple(sorted((k, repr(v)) for k, v in (obj.__kwdefaults__ or {}).items()))
        return _code_key(obj.__code__), defaults, kw
    return ("value", repr(obj))


def _ast_key(fn) -> str:
    import ast

    return ast.dump(ast.parse(planted.source_of(fn)[1]), include_attributes=False)


# ---------------------------------------------------------------- the verdict

NOT_COMPILED = "ttir (the mutant does not compile)"  # the test's name for a kernel mutant the GPU compiler refuses


class Equivalence:
    """Decides mutants of one run; caches the original TTIR per (kernel, signature)."""

    def __init__(self, launches: dict[str, set]):
        self.launches = launches  # "module:kernel" -> signatures the cases launched it with
        self._original: dict = {}

    def _ttirs(self, names: list[str], against: dict | None = None) -> dict | None:
        """TTIR of every named launched kernel, as the modules hold them now; None if one fails to
        compile. With ``against``, stops at the first TTIR that differs from it (returning what it has)."""
        out = {}
        for name in names:
            module, attr = name.split(":")
            kernel = getattr(importlib.import_module(module), attr)
            for sig in self.launches.get(name, ()):
                try:
                    out[(name, sig)] = ttir(kernel, sig)
                except Exception:  # noqa: BLE001 - a mutant Triton cannot compile is not equivalent
                    return None
                if against is not None and out[(name, sig)] != against[(name, sig)]:
                    return out
        return out

    def decide(self, mutant: Mutant) -> tuple[bool, str]:
        """(equivalent, the test used)."""
        patch = mutant.patches[0]
        module_name, attr = patch.target.split(":")
        module = importlib.import_module(module_name)
        original = getattr(module, attr)
        if not is_kernel(original):
            with planted.applied(mutant):
                mutated = getattr(module, attr)
                return _host_key(mutated) == _host_key(original), "bytecode"
        launched = [p.target for p in mutant.patches if p.target in self.launches]
        if launched:
            key = tuple(launched)
            if key not in self._original:
                self._original[key] = self._ttirs(launched)
            if self._original[key] is not None:
                with planted.applied(mutant):
                    mutated = self._ttirs(launched, against=self._original[key])
                if mutated is None:
                    return False, NOT_COMPILED
                return mutated == self._original[key], "ttir"
        with planted.applied(mutant):
            same = _ast_key(getattr(module, attr)) == _ast_key(original)
        return same, "ast"


# ---------------------------------------------------------------- in a worker process
# The interpreter leaves Triton's language patched after a kernel ran, and the compiler then fails;
# equivalence is decided in a process that never runs a kernel.

_JUDGE: Equivalence | None = None
MAX_SIGNATURES = 4  # launch signatures compared per kernel, unless more are needed to cover every variant


def covering(signatures) -> list[tuple]:
    """The signatures a mutant is compared in: every argument type and constexpr value the cases launched with
    appears in at least one (a mutant of code that only ``HAS_DRAFT_LOGITS=True`` or an int64 stride compiles
    must meet such a launch, or it reads as the same program), then the first by repr up to MAX_SIGNATURES."""
    ordered = sorted(signatures, key=repr)
    uncovered = {entry for sig in ordered for entry in sig}
    chosen = []
    while uncovered:
        best = max(ordered, key=lambda sig: len(uncovered.intersection(sig)))
        chosen.append(best)
        uncovered.difference_update(best)
    chosen += [sig for sig in ordered if sig not in chosen][:max(0, MAX_SIGNATURES - len(chosen))]
    return chosen


def init_worker(slot: int, device: str, launches: dict) -> None:
    global _JUDGE
    os.environ["SPECSAN_DEVICE"] = device
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (it warns otherwise)
    import kernels.runtime  # noqa: F401 - the device decides interpreter or compiler before any kernel exists

    _JUDGE = Equivalence({name: covering(sigs) for name, sigs in launches.items()})


def decide_id(mutant_id: str) -> tuple[bool, str]:
    from stress.mutate import operators as mutate_ops

    return _JUDGE.decide(mutate_ops.resolve(mutant_id))
