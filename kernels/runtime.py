"""Device choice for every kernel module; import it before anything that defines a kernel.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, so the
choice has to be made before the first kernel module is imported. CUDA is used when a device
exists; otherwise ``TRITON_INTERPRET=1`` is set and kernels run on CPU tensors. The
``SPECSAN_DEVICE`` variable (set by ``--device``) overrides the choice where both exist.
"""

import os

import torch

_ENV = "SPECSAN_DEVICE"
_CHOICES = ("cpu", "cuda")


def _choose() -> str:
    wanted = os.environ.get(_ENV, "").strip().lower()
    if wanted and wanted not in _CHOICES:
        raise ValueError(f"{_ENV}={wanted!r}: expected one of {_CHOICES} (or unset to auto-detect)")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{_ENV}=cuda but no CUDA device is visible; use {_ENV}=cpu or unset it")
    if wanted:
        return wanted
    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE: str = _choose()
INTERPRETED: bool = DEVICE == "cpu"
if INTERPRETED:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402  (must follow the TRITON_INTERPRET decision)

if INTERPRETED and not getattr(getattr(triton, "knobs", None), "runtime", None).interpret:
    raise RuntimeError(
        "triton was imported before kernels.runtime chose the CPU interpreter; "
        "import kernels.runtime first or set TRITON_INTERPRET=1 in the environment"
    )


def device() -> torch.device:
    """The device kernels run on (the current CUDA device, or the CPU under the interpreter)."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")

