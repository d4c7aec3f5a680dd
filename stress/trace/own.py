"""Trace a kernel of your own engine: resolve ``module:name``, read its arguments from a script,
launch it once under the CPU tracer (``python -m stress trace --kernel ... --args ...``).

The arguments script is plain Python run in a fresh namespace after the interpreter is chosen.
It must set ``args`` (a tuple of positional arguments) and may set ``kwargs`` (a dict, e.g.
constexprs) and ``unwritten`` (argument name -> bool mask of elements never written). Tensors
it creates stay alive for the launch, so a table of their addresses resolves.
"""

import importlib
import importlib.util
import os
import runpy
from dataclasses import dataclass

from stress.core import tracer as trace


def _first_line(exc: BaseException) -> str:
    """``Type: message`` on one line: a usage error names what went wrong without the traceback."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def load_target(spec: str):
    """``package.module:name`` or ``path/to/file.py:name`` -> the object (a @triton.jit kernel or a launcher).
    Anything that stops it (no such module, a module that raises on import, no such name) is a ValueError
    in the command line's ``ARGUMENT: problem; fix`` form."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--kernel: {spec!r} is not MODULE:NAME; e.g. my_engine.kernels:fused_gather or "
                         f"path/to/file.py:fused_gather")
    from_file = module_name.endswith(".py") or os.sep in module_name
    if from_file and not os.path.isfile(module_name):
        raise ValueError(f"--kernel: no file {module_name}; give an existing .py path, or a dotted module")
    try:
        if from_file:
            loaded = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0],
                                                            module_name)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"--kernel: cannot import {module_name} ({_first_line(exc)}); give a module this python "
                         f"can import (see PYTHONPATH) or a .py path") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--kernel: {module_name} has no {attr}; name a kernel or launcher it defines") from None


@dataclass
class Arguments:
    """What an arguments script set; ``namespace`` keeps everything it made alive (tensors that a
    table of addresses points at have no other owner)."""

    args: tuple
    kwargs: dict
    unwritten: dict
    namespace: dict


def load_args(path: str) -> Arguments:
    """Run the arguments script; a missing file, one that is not Python or raises, or one that does not set
    ``args`` is a ValueError in the command line's ``ARGUMENT: problem; fix`` form."""
    if not os.path.isfile(path):
        raise ValueError(f"--args: {path!r}: no such file; give a Python file that sets `args`")
    try:
        namespace = runpy.run_path(path, run_name="__specsan_args__")
    except Exception as exc:
        raise ValueError(f"--args: {path} does not run as Python ({_first_line(exc)}); give a Python file that "
                         f"sets `args`") from None
    args, kwargs, unwritten = namespace.get("args"), namespace.get("kwargs", {}), namespace.get("unwritten", {})
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"--args: {path} sets no `args` tuple; set `args` to the kernel's positional arguments")
    if not isinstance(kwargs, dict) or not isinstance(unwritten, dict):
        raise ValueError(f"--args: {path} sets `kwargs` or `unwritten` to a non-dict; make both dicts")
    return Arguments(tuple(args), kwargs, unwritten, namespace)


def parse_grid(text: str) -> tuple[int, ...]:
    try:
        grid = tuple(int(part) for part in text.split(","))
    except ValueError:
        grid = ()
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise ValueError(f"--grid: {text!r} is not one to three positive integers; e.g. 8 or 8,4")
    return grid


def run(target, grid: tuple[int, ...] | None, arguments: Arguments, *, seed: int = 0, permute: str = "auto",
        expected_order_dependence: str | None = None) -> trace.Recording:
    """Launch ``target[grid](*args, **kwargs)`` (a kernel) or call ``target(*args, **kwargs)`` (a
    launcher, every launch of which is traced) under the tracer."""
    args, kwargs = arguments.args, arguments.kwargs
    is_kernel = hasattr(target, "fn") and hasattr(target, "__getitem__")
    if not is_kernel and not callable(target):
        raise ValueError(f"--kernel: {target!r} is neither a @triton.jit kernel nor a function that launches one; "
                         "name one of those")
    if is_kernel != (grid is not None):
        raise ValueError("--grid: needed for a @triton.jit kernel; give its grid, e.g. 8 or 8,4" if is_kernel else
                         "--grid: a launcher chooses its own grids; drop --grid or name the kernel itself")
    pairs = trace.unwritten_pairs(target.fn if is_kernel else target, args, kwargs, arguments.unwritten)
    with trace.tracing(pairs, seed=seed, permute=permute,
                       expected_order_dependence=expected_order_dependence) as recording:
        if is_kernel:
            target[grid](*args, **kwargs)
        else:
            target(*args, **kwargs)
    return recording
