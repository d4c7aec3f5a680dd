"""Device choice for every kernel module; import it before anything that defines a kernel.

Triton decides at ``@triton.jit`` time whether a kernel is compiled or interpreted, so the
choice has to be made before the first kernel module is imported. CUDA is used when a device
exists; otherwise ``TRITON_INTERPRET=1`` is set and kernels run on CPU tensors. The
``SPECSAN_DEVICE`` variable (set by ``--device``) overrides the choice where both exist.
"""

import os
import sys

import torch

_ENV = "SPECSAN_DEVICE"
_CHOICES = ("cpu", "cuda")


def _choose() -> str:
    wanted = os.environ.get(_ENV, "").strip().lower()
    if wanted and wanted not in _CHOICES:
        raise ValueError(f"{_ENV}: {wanted!r} is not one of {', '.join(_CHOICES)}; set one of them, or unset it to "
                         "auto-detect")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{_ENV}: cuda, but no CUDA device is visible; set it to cpu or unset it")
    if wanted:
        return wanted
    return "cuda" if torch.cuda.is_available() else "cpu"


def _interpret_triton_library() -> None:
    """Make triton.language's own @jit helpers (tl.cdiv, tl.sum, ...) interpreted.

    When triton was imported before the interpreter was chosen, they were built as compiled
    JITFunctions, and every interpreted kernel that calls one fails with "Cannot call
    @triton.jit'd outside of the scope of a kernel". Each gets an interpreted twin, in every
    triton.language module and on the tensor class (its methods), wherever it is referenced.
    """
    import triton.language
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins: dict[int, InterpretedFunction] = {}

    def swap(namespace) -> None:
        for attr, value in list(vars(namespace).items()):
            if isinstance(value, JITFunction):
                twin = twins.setdefault(id(value), InterpretedFunction(value.fn))
                setattr(namespace, attr, twin)

    for name, module in list(sys.modules.items()):
        if name == "triton.language" or name.startswith("triton.language."):
            swap(module)
    swap(triton.language.core.tensor)


DEVICE: str = _choose()
INTERPRETED: bool = DEVICE == "cpu"
_TRITON_FIRST = "triton.language" in sys.modules  # someone imported triton before the device was chosen
if INTERPRETED:
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402, F401  (must follow the TRITON_INTERPRET decision)

if INTERPRETED and _TRITON_FIRST:
    _interpret_triton_library()


def device() -> torch.device:
    """The device kernels run on (the current CUDA device, or the CPU under the interpreter)."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")


def host_copy(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor of ``data`` (a list, a numpy array or a tensor) that nothing else holds, pinned when ``device``
    is a GPU: a copy from it to the device, in stream order, need not wait for the device (``upload``)."""
    if isinstance(data, torch.Tensor):
        t = data.clone() if dtype is None else data.to(dtype, copy=True)
    else:
        t = torch.tensor(data, dtype=dtype)
    return t.pin_memory() if device.type == "cuda" else t


def upload(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``data`` on ``device``, copied in stream order without waiting for the device. A wait costs a GPU that
    several processes share a turn of their time slices, so host code that runs many small steps avoids it."""
    return host_copy(data, device, dtype).to(device, non_blocking=True)


def read_back(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """CPU copies of one-dimensional tensors of one dtype and device, taken in one wait for the device instead of one
    each: a launcher that checks several index arguments on the host pays a shared GPU's time slice once."""
    host = torch.cat(tensors).cpu()
    return host.split([t.numel() for t in tensors])
