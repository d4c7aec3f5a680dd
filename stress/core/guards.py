"""Guard zones: every tensor a kernel sees sits inside a larger buffer with canary bytes before
and after it, so a write past either end is caught even where no sanitizer runs.

On a GPU the whole round trip of a case costs one host synchronization: inputs go up from pinned
staging copies without waiting, and ``settle`` queues every canary count and every copy back to the
host before it waits once. A GPU shared by several worker processes serves each context in turn, so
every wait is a wait for the others' time slices too. What must come back unchanged (read-only inputs,
everything a refusal is handed) is compared on its device with a copy taken there before the launch
(``snapshot``): a flag per tensor crosses to the host, and a tensor's values only where it changed.
"""

import contextlib
import copy
from dataclasses import dataclass

import numpy as np
import torch

CANARY = 0xA5
GUARD_BYTES = 512
CANARY_WORD = int.from_bytes(bytes([CANARY]) * 8, "little", signed=True)  # eight canary bytes as one int64
CHUNK = 1 << 28  # bytes compared at a time: a view spread past 2^31 elements leaves gigabytes of gaps
STAGED_BYTES = 64 << 20  # larger host tensors are copied to the GPU directly (no pinned twin of GBs per worker)
HOST_COPY_BYTES = 256 << 20  # larger device tensors stay on the device for comparison (compare.exact_chunked)


@contextlib.contextmanager
def scratch_poisoned(dev: torch.device):
    """While the block runs on the CPU, memory the code under test allocates uninitialized (``torch.empty``
    scratch: attention's split partials, a launcher's work buffers) comes filled with NaN, or an integer
    type's largest value. A read of scratch that no program wrote then shows as NaN or a wild index in the
    outputs, every time, instead of as whatever the allocator happened to leave there. (torch fills such
    memory only under its deterministic-algorithms mode, set here with warnings instead of errors.) On a GPU
    it stays off: the fill is one more launch per allocation, inside captured graphs too, and has not been
    measured there."""
    if dev.type != "cpu":
        yield
        return
    deterministic = torch.utils.deterministic
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        deterministic.fill_uninitialized_memory = before[2]


@dataclass
class Guarded:
    name: str
    buffer: torch.Tensor  # the whole allocation
    view: torch.Tensor  # what the kernel gets
    pad: int  # elements of canary on each side

    def damage_counts(self) -> torch.Tensor:
        """Canary damage outside the view, as a tensor ``[bytes before, bytes after, gaps touched]`` on the
        buffer's device (no host synchronization). The gaps are those a strided view leaves between its rows
        (the row padding a kernel must not touch); they are only flagged here, and ``gap_bytes`` counts them
        once they are known to be touched."""
        raw, first, end = self._raw()
        counts = [(raw[:first] != CANARY).sum(), (raw[end:] != CANARY).sum()]
        if self.view.is_contiguous():
            return torch.stack([*counts, torch.zeros((), dtype=torch.int64, device=raw.device)])
        with self._view_as_canary():
            touched = torch.stack([_altered(chunk) for chunk in _chunks(raw, first, end)]).any()
        return torch.stack([*counts, touched.to(torch.int64)])

    def gap_bytes(self) -> int:
        """Canary bytes overwritten in the gaps between the view's rows (waits for the device)."""
        raw, first, end = self._raw()
        with self._view_as_canary():
            return sum(int((chunk != CANARY).sum()) for chunk in _chunks(raw, first, end))

    def _raw(self) -> tuple[torch.Tensor, int, int]:
        """The buffer's bytes, and where the view's extent begins and ends in them."""
        raw = self.buffer.view(torch.uint8)
        step = self.buffer.element_size()
        return raw, self.pad * step, raw.numel() - self.pad * step

    @contextlib.contextmanager
    def _view_as_canary(self):
        """The view's own bytes read as canary while the buffer is checked, then come back."""
        values = self.view.clone()
        fill(self.view, canary_like(self.view))
        try:
            yield
        finally:
            fill(self.view, values)


def _chunks(raw: torch.Tensor, first: int, end: int) -> list[torch.Tensor]:
    """``raw[first:end]`` in slices of CHUNK bytes (bounded scratch for a view spread over gigabytes)."""
    return [raw[i:min(i + CHUNK, end)] for i in range(first, end, CHUNK)]


def _altered(raw: torch.Tensor) -> torch.Tensor:
    """Whether any byte of ``raw`` (uint8, contiguous) is not CANARY, as a one-element tensor on its device,
    compared eight bytes at a time where they align: a byte count's sum casts every byte to int64 first,
    nine times the traffic of the scan itself."""
    head = min(-raw.storage_offset() % 8, raw.numel())
    body = (raw.numel() - head) // 8 * 8
    flags = [(part != CANARY).any() for part in (raw[:head], raw[head + body:]) if part.numel()]
    if body:
        flags.append((raw[head:head + body].view(torch.int64) != CANARY_WORD).any())
    return torch.stack(flags).any()


def damage_text(name: str, counts: list[int]) -> str | None:
    """What ``Guarded.damage_counts`` found, in words; None when every canary byte is intact."""
    bad_before, bad_after, bad_gaps = counts
    if not (bad_before or bad_after or bad_gaps):
        return None
    gaps = f", {bad_gaps} in the gaps between its rows" if bad_gaps else ""
    return f"{name}: guard zone overwritten ({bad_before} byte(s) before, {bad_after} after the tensor{gaps})"


def canary_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype whose every byte is CANARY (broadcast, no copy per element)."""
    one = torch.full((t.element_size(),), CANARY, dtype=torch.uint8, device=t.device).view(t.dtype)
    return one.reshape((1,) * t.dim()).expand(t.shape)


def span(t: torch.Tensor) -> int:
    """Elements from a view's first to its last, as its strides lay it out (its storage extent)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _broadcast_dims(t: torch.Tensor) -> list[int]:
    """The dimensions of ``t`` whose rows share memory (stride 0, more than one row)."""
    return [dim for dim in range(t.dim()) if t.stride(dim) == 0 and t.shape[dim] > 1]


def _first_rows(t: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``t`` narrowed to its first row along each of ``dims``."""
    for dim in dims:
        t = t.narrow(dim, 0, 1)
    return t


def fill(view: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``view.copy_(t)``, also where ``view`` broadcasts (a stride-0 dimension: rows sharing memory, which
    copy_ refuses): such a dimension's one row is written once, from ``t``'s first (they are all equal).
    A host tensor bound for a GPU goes through a pinned copy, so the upload does not wait for the GPU."""
    dims = _broadcast_dims(view)
    target, source = _first_rows(view, dims), _first_rows(t, dims)
    if target.is_cuda and source.device.type == "cpu" and source.numel() * source.element_size() <= STAGED_BYTES:
        staged = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
        target.copy_(staged.copy_(source), non_blocking=True)
    else:
        target.copy_(source)
    return view


def place(name: str, t: torch.Tensor, device: torch.device) -> Guarded:
    """A copy of ``t`` on ``device`` between two canary zones, in ``t``'s layout: a contiguous tensor
    stays contiguous, a strided view (row-padded, every other row) keeps its strides, and the bytes
    its rows skip hold canaries too. Launchers accept such views, so the runner must not hide them."""
    buffer = torch.empty(_buffer_elements(t), dtype=t.dtype, device=device)
    buffer.view(torch.uint8).fill_(CANARY)
    guarded = _laid_out(name, t, buffer)
    fill(guarded.view, t)
    return guarded


def _buffer_elements(t: torch.Tensor) -> int:
    """Elements of the buffer ``place`` puts ``t`` in: its extent and the canaries on each side."""
    return (t.numel() if t.is_contiguous() else span(t)) + 2 * _pad(t)


def _laid_out(name: str, t: torch.Tensor, buffer: torch.Tensor) -> Guarded:
    """``t``'s place in ``buffer`` (``_buffer_elements(t)`` of its dtype, 1-D): the view between the canaries, in
    ``t``'s layout."""
    pad = _pad(t)
    if t.is_contiguous():
        view = buffer[pad:pad + t.numel()].view(t.shape)
    else:
        view = buffer.as_strided(t.shape, t.stride(), buffer.storage_offset() + pad)
    return Guarded(name, buffer, view, pad)


def device_bytes(inputs: dict) -> int:
    """Bytes the guarded copies of ``inputs`` take on a device (``place``: a strided view's whole extent, the
    canaries around it): what a case needs of its GPU's memory before anything else it allocates."""
    return sum((span(t) + 2 * _pad(t)) * t.element_size()
               for t in inputs.values() if isinstance(t, torch.Tensor) and not t.is_meta)


def _pad(t: torch.Tensor) -> int:
    """Elements of canary ``place`` puts on each side of ``t``."""
    return max(1, GUARD_BYTES // t.element_size())


def torch_device(device: str) -> torch.device:
    """Where a case runs: this process's current GPU, or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def guarded(inputs: dict, dev: torch.device) -> tuple[dict, dict]:
    """Guarded copies of the tensor ``inputs`` on ``dev``, and the call's arguments: those copies' views,
    and fresh copies of every other input. A tensor on the meta device (a refusal case's tensor on another
    device, ``stress.families.refusals.moved``) is handed over as it is: it has no data to guard."""
    placed = {k: place(k, v, dev) for k, v in _placeable(inputs).items()}
    return placed, _call_args(inputs, placed)


def _call_args(inputs: dict, placed: dict) -> dict:
    """A call's arguments: the views of the ``placed`` guarded copies, and fresh copies of every other input."""
    return {**copy.deepcopy({k: v for k, v in inputs.items() if k not in placed}),
            **{k: g.view for k, g in placed.items()}}


ALIGN = 512  # bytes: where each buffer of a shared allocation begins (a CUDA allocation's own alignment)
TOGETHER_BYTES = 64 << 20  # a call's guarded copies up to this size share one allocation (``together``)


def together_bytes(inputs: dict) -> int:
    """Bytes of the one allocation ``together`` lays ``inputs``' tensors out in."""
    return sum(_aligned(_buffer_elements(t) * t.element_size()) for t in _placeable(inputs).values())


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _placeable(inputs: dict) -> dict[str, torch.Tensor]:
    """The tensors of ``inputs`` that get guarded copies (not those on the meta device: no data to guard)."""
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and not v.is_meta}


@dataclass
class Together:
    """Guarded copies of one call's tensors in one allocation (``together``): each in a buffer laid out as ``place``
    lays it, the buffers ALIGN bytes apart, every byte outside the views canary. A call that must write nothing (a
    refusal) is judged by one comparison of the whole allocation with a copy taken before it (``snapshot``,
    ``changed``); only a call that did write pays for the per-tensor account (``settle`` with ``kept``, ``stray``)."""

    memory: torch.Tensor  # uint8, every buffer and the canary between them
    placed: dict[str, Guarded]
    tensors: dict[str, torch.Tensor]  # what was placed, for the layout
    offsets: dict[str, int]  # where each buffer begins in ``memory``

    def snapshot(self) -> torch.Tensor:
        if self.memory.is_cuda:
            return self.memory.clone()
        return torch.from_numpy(self.memory.numpy().copy())  # one thread: see ``together``

    def changed(self, before: torch.Tensor) -> "Flag":
        """Whether any byte differs from ``before`` (``snapshot``), on its way to the host (no synchronization)."""
        if self.memory.is_cuda:
            return Flag((self.memory.view(torch.int64) != before.view(torch.int64)).any())
        return Flag(not np.array_equal(self.memory.numpy().view(np.int64), before.numpy().view(np.int64)))

    def kept(self, before: torch.Tensor) -> dict:
        """``settle``'s ``kept`` for the views: each with its values in ``before``."""
        then = _lay_out(before, self.tensors, self.offsets)
        return {name: (g.view, distinct(then[name].view)) for name, g in self.placed.items()}

    def stray(self, before: torch.Tensor) -> list[str]:
        """Bytes changed between the buffers (the slack to the next ALIGN boundary, past a tensor's guard zone), in
        words, by the buffer they follow (waits for the device)."""
        differ = (self.memory != before).cpu()
        lines = []
        for name, g in self.placed.items():
            end = self.offsets[name] + g.buffer.numel() * g.buffer.element_size()
            if n := int(differ[end:_aligned(end)].sum()):
                lines.append(f"{name}: {n} byte(s) overwritten past the guard zone after the tensor")
        return lines


def _lay_out(memory: torch.Tensor, tensors: dict[str, torch.Tensor], offsets: dict[str, int]) -> dict[str, Guarded]:
    """Each of ``tensors`` laid out in ``memory`` (uint8) from its offset on, as ``place`` lays it out."""
    placed = {}
    for name, t in tensors.items():
        nbytes = _buffer_elements(t) * t.element_size()
        placed[name] = _laid_out(name, t, memory[offsets[name]:offsets[name] + nbytes].view(t.dtype))
    return placed


def together(inputs: dict, dev: torch.device) -> tuple[Together, dict]:
    """``guarded``'s copies and call arguments, the copies in one allocation (``Together``). For a GPU, the host
    tensors are laid out, canaries and all, in pinned host memory and go up in one copy without waiting; a tensor
    already on the device is copied there."""
    tensors = _placeable(inputs)
    offsets, total = {}, 0
    for name, t in tensors.items():
        offsets[name], total = total, total + _aligned(_buffer_elements(t) * t.element_size())
    image = torch.empty(total, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    image.numpy().fill(CANARY)  # numpy's one thread: torch would split a buffer past 32 KiB over the worker's threads
    on_host = {name: t for name, t in tensors.items() if t.device.type == "cpu"}
    for name, g in _lay_out(image, on_host, offsets).items():
        fill(g.view, on_host[name])
    memory = image if dev.type == "cpu" else torch.empty(total, dtype=torch.uint8, device=dev).copy_(image,
                                                                                                     non_blocking=True)
    placed = _lay_out(memory, tensors, offsets)
    for name, t in tensors.items():
        if name not in on_host:
            fill(placed[name].view, t)
    return Together(memory, placed, tensors, offsets), _call_args(inputs, placed)


class Flag:
    """A one-element device tensor on its way to the host (or a host bool): ``ready`` asks without waiting whether
    the device is done with it, ``value`` waits for the device (one synchronization, as ``settle``'s) and reads it."""

    def __init__(self, t: torch.Tensor | bool):
        self.host = _to_host(t)
        self.event = None
        if isinstance(t, torch.Tensor) and t.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def value(self) -> bool:
        if self.event is not None:
            torch.cuda.synchronize()
        return bool(self.host)


def _to_host(value):
    """A device tensor small enough, copied into pinned host memory without waiting (the copy is done at the
    next synchronization); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.is_cuda and value.numel() * value.element_size() <= HOST_COPY_BYTES:
        return torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value.detach(), non_blocking=True)
    return value


def distinct(t: torch.Tensor) -> torch.Tensor:
    """``t`` less the repeats of a broadcast (stride-0) dimension: the elements that have memory of their own."""
    return _first_rows(t, _broadcast_dims(t))


def snapshot(views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of ``views`` on their device, taken before a launch that must leave them as they are (``settle``'s
    ``kept``): compact (a view spread over gigabytes copies only its elements), one element per broadcast row."""
    return {name: distinct(v).clone(memory_format=torch.contiguous_format) for name, v in views.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of their width, so equality is bitwise (-0.0 is not 0.0; NaN equals its own
    payload)."""
    return t.view(_INTEGER_OF_WIDTH[t.element_size()])


_INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _changed(view: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Whether ``view`` differs anywhere from its ``snapshot``, as a one-element tensor on their device. Elements of
    a width with no integer twin (complex128) count as changed: the host comparison then decides, exactly."""
    after = distinct(view)
    if after.numel() == 0 or after.element_size() not in _INTEGER_OF_WIDTH:
        return torch.tensor(after.numel() > 0, device=view.device)
    return (_bits(after) != _bits(before)).any()


def settle(placed: dict[str, Guarded], values: dict, kept: dict | None = None) -> tuple[list[str], dict, dict]:
    """After a launch: every guard zone's damage in words, ``values`` (outputs) on the host, and of ``kept``
    (name -> its view and its ``snapshot``) the views that changed, on the host, at the cost of one
    synchronization (device tensors past HOST_COPY_BYTES stay on the device). A kept view that is unchanged
    never leaves its device."""
    kept = kept or {}
    counts = _to_host(torch.stack([g.damage_counts() for g in placed.values()])) if placed else None
    flags = _to_host(torch.stack([_changed(view, before) for view, before in kept.values()])) if kept else None
    host = {name: _to_host(v) for name, v in values.items()}
    if any(g.buffer.is_cuda for g in placed.values()) or any(
            isinstance(v, torch.Tensor) and v.is_cuda for v in [*values.values(), *(v for v, _ in kept.values())]):
        torch.cuda.synchronize()
    found = [(name, row[:2] + [g.gap_bytes() if row[2] else 0])
             for (name, g), row in zip(placed.items(), counts.tolist(), strict=True)] if placed else ()
    changed = {name: view.cpu() for (name, (view, _)), flag in zip(kept.items(), flags.tolist() if kept else (),
                                                                    strict=True) if flag}
    return [d for name, row in found if (d := damage_text(name, row))], host, changed


def same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy with ``t``'s shape and strides (``clone`` makes a row-padded view contiguous)."""
    if t.is_contiguous():
        return t.clone()
    return fill(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device), t)


def fresh_inputs(case) -> dict:
    """Private copies of a case's inputs, so no run can change what the next one sees; a strided
    view stays one (same strides), so the tracer sees the layout the kernel was given."""
    return {k: same_layout(v) if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in case.inputs.items()}


def shared_inputs(case) -> tuple[dict, dict]:
    """A case's inputs for a call that must not write them (a reference asked whether it refuses): the tensors
    themselves, no copies (a refusal case's GPU-sized inputs are a gigabyte), with their version counters, which
    every in-place write through torch moves (``written_in_place``); every other value a private copy."""
    inputs = {k: v if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in case.inputs.items()}
    return inputs, {k: v._version for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def written_in_place(inputs: dict, versions: dict) -> list[str]:
    """The tensors of ``shared_inputs`` written in place since it handed them out."""
    return [name for name, version in versions.items() if inputs[name]._version != version]
