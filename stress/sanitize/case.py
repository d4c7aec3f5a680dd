"""The process compute-sanitizer watches: one registry case, or one positive control, on the GPU.

``python -m stress.sanitize.case case CHECK FAMILY SEED --record FILE [--mutant M] [--launch K=V,...]``
``python -m stress.sanitize.case control NAME --record FILE``

A sanitizer error aborts the kernel and poisons the process's CUDA context, so each case gets a
process of its own (``stress.sanitize.runner`` starts it). Inputs are plain device copies, one
allocation each, with no guard zones: a lane that leaves its tensor must leave the allocation,
which is what memcheck sees (the caller sets ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so every tensor
is its own ``cudaMalloc``). The kernel runs once; outputs are not compared here (``run`` does that).

Before the launch the record file gets every input tensor's address range, so the parent can
name the tensor nearest to a faulting address even when this process dies; after it, how many
Triton kernels were launched (none: the check is host logic, nothing for a sanitizer to see).
"""

import argparse
import ctypes
import json
import os
import signal
import sys
import traceback

CONTROLS = ("overread", "uninit", "bad-warp-sync", "clean")


def _die_with_parent() -> None:
    """SIGKILL this process when compute-sanitizer (its parent) dies, e.g. killed at a deadline."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Record:
    """The JSON side file the parent reads: written whole after every update, so it survives a crash."""

    def __init__(self, path: str):
        self.path, self.data = path, {"tensors": {}, "launches": 0, "error": None}

    def update(self, **fields) -> None:
        self.data.update(fields)
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.data, f)
        os.replace(self.path + ".tmp", self.path)


def _count_launches(record: _Record) -> None:
    from triton import knobs

    def entered(*_args, **_kwargs):
        record.data["launches"] += 1

    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):
        hook.add(entered)
    else:  # a Triton whose hook is a single optional callable
        knobs.runtime.launch_enter_hook = entered


def _on_device(value, device):
    """A contiguous copy in an allocation of its own (tensors), the value itself otherwise."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty(value.shape, dtype=value.dtype, device=device)
    copy.copy_(value)
    return copy


def run_case(args, record: _Record) -> None:
    import torch

    from stress import checks
    from stress.core import cases, oracle
    from stress.core import patches as mutants

    check = checks.get(args.check)
    mutant = checks.find_mutant(args.mutant, check) if args.mutant else None
    case = cases.build_case(check, args.family, args.seed, "cuda", args.launch)
    device = torch.device("cuda", torch.cuda.current_device())
    inputs = {name: _on_device(value, device) for name, value in case.inputs.items()}
    case.inputs.clear()  # a device-built input (big_cache's) is freed, not held twice
    record.update(launch=case.launch, note=case.note,
                  tensors={name: [t.data_ptr(), t.numel() * t.element_size()]
                           for name, t in inputs.items() if isinstance(t, torch.Tensor)})
    _count_launches(record)
    with mutants.applied(mutant):
        oracle._current(check.kernel)(**inputs, **case.launch)
    torch.cuda.synchronize()


def run_control(name: str, record: _Record) -> None:
    """A planted bug in a tiny kernel that the tool must report (``clean``: one it must not)."""
    import torch

    from stress.sanitize import controls as sanitizer_controls

    n = 1000
    device = torch.device("cuda", torch.cuda.current_device())
    src = torch.empty(n, dtype=torch.int32, device=device)
    if name != "uninit":
        src.copy_(torch.arange(n, dtype=torch.int32))
    dst = torch.zeros(n, dtype=torch.int32, device=device)
    record.update(launch={}, note=f"positive control {name}",
                  tensors={"src": [src.data_ptr(), n * 4], "dst": [dst.data_ptr(), n * 4]})
    _count_launches(record)
    sanitizer_controls.launch(name, src, dst)
    torch.cuda.synchronize()


def _launch(text: str) -> dict:
    return {k: int(v) for k, v in (part.split("=") for part in text.split(",") if part)}


def main(argv=None) -> int:
    _die_with_parent()
    p = argparse.ArgumentParser(prog="python -m stress.sanitize.case")
    p.add_argument("--record", required=True)
    sub = p.add_subparsers(dest="what", required=True)
    case = sub.add_parser("case")
    case.add_argument("check")
    case.add_argument("family")
    case.add_argument("seed", type=int)
    case.add_argument("--mutant")
    case.add_argument("--launch", type=_launch)
    control = sub.add_parser("control")
    control.add_argument("name", choices=CONTROLS)
    args = p.parse_args(argv)
    os.environ["SPECSAN_DEVICE"] = "cuda"
    os.environ["SPECSAN_NO_LOAD"] = "1"
    record = _Record(args.record)
    try:
        if args.what == "case":
            run_case(args, record)
        else:
            run_control(args.name, record)
    except Exception as exc:  # noqa: BLE001 - expected after a sanitizer error; the parent decides
        record.update(error=traceback.format_exception_only(exc)[-1].strip(),
                      traceback=traceback.format_exc().splitlines()[-12:])
        return 3
    record.update()
    return 0


if __name__ == "__main__":
    sys.exit(main())
