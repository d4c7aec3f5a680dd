"""CPU tracer over the Triton interpreter: races, out-of-bounds and uninitialized reads.

The interpreter runs programs one after another and ignores ``tl.debug_barrier()``, so races
never show in its results and an out-of-bounds load returns heap garbage. The tracer hooks the
interpreter's memory primitives and records, per active lane, the bytes touched, the program,
the lane, the barrier epoch and the source line; the analysis (``stress.trace_conflicts``)
then looks for accesses that no ordering covers. Lanes outside every argument's storage are
reported and masked off instead of touching memory. When programs share written bytes, the
launch is rerun in reversed and shuffled program order and any output change is a finding too.

Hooks are installed only inside ``tracing()`` and always removed on exit. When the
interpreter's internals are not what the hooks expect, every launch gets ``not_checked``.
"""

import inspect  # noqa: I001  (kernels.runtime must choose the interpreter before triton loads)
import linecache
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels import runtime
from stress import trace_conflicts as tc

import triton
import triton.language as tl

_TRITON_DIR = os.path.dirname(triton.__file__)
_OPS = ("load", "store", "atomic", "atomic_load", "atomic_store")
_LOAD, _STORE, _ATOMIC, _ATOMIC_LOAD, _ATOMIC_STORE = range(len(_OPS))
_READS = {_LOAD: True, _STORE: False, _ATOMIC: True, _ATOMIC_LOAD: True, _ATOMIC_STORE: False}
_WRITES = {_LOAD: False, _STORE: True, _ATOMIC: True, _ATOMIC_LOAD: False, _ATOMIC_STORE: True}
PERMUTE = ("auto", "always", "never")


@dataclass(frozen=True)
class Access:
    """One lane of one memory op."""

    program: tuple[int, int, int]
    lane: int
    op: str
    site: str  # kernel file:line
    epoch: int
    where: str  # argument whose storage holds the byte, and the byte offset in it
    code: str = ""  # the source text at ``site``

    def describe(self) -> str:
        code = f"  `{self.code}`" if self.code else ""
        return (f"program {self.program} lane {self.lane} {self.op} at {self.site} "
                f"(barrier epoch {self.epoch}, {self.where}){code}")


@dataclass
class Finding:
    """A race (RAW/WAR/WAW between accesses, or ``order``), an out-of-bounds access or an uninit read."""

    category: str  # race | oob | uninit
    kind: str
    bytes: int
    count: int
    explanation: str
    first: Access | None = None
    second: Access | None = None

    def lines(self) -> list[str]:
        out = [f"{self.category} {self.kind}: {self.bytes} byte(s), {self.count} access(es). {self.explanation}"]
        out += [f"    {tag}: {a.describe()}" for tag, a in (("first", self.first), ("then", self.second)) if a]
        return out


@dataclass
class Report:
    """The verdict of one traced launch."""

    kernel: str
    grid: tuple[int, int, int] = (0, 0, 0)
    races: list[Finding] = field(default_factory=list)
    oob: list[Finding] = field(default_factory=list)
    uninit: list[Finding] = field(default_factory=list)
    not_checked: str | None = None

    @property
    def ok(self) -> bool:
        return self.not_checked is None and not (self.races or self.oob or self.uninit)

    @property
    def verdict(self) -> str:
        if self.not_checked:
            return f"not_checked:{self.not_checked}"
        for kind, found in (("oob", self.oob), ("race", self.races), ("uninit", self.uninit)):
            if found:
                return f"fail:{kind}"
        return "pass"

    def lines(self) -> list[str]:
        head = f"{self.kernel} grid {self.grid}: {self.verdict}"
        return [head] + [line for f in self.oob + self.races + self.uninit for line in f.lines()]


@dataclass
class Recording:
    """Every launch made inside one ``tracing()`` block, in order.

    ``unsupported`` says why the hooks could not be installed: then launches are not even seen.
    """

    reports: list[Report] = field(default_factory=list)
    unsupported: str | None = None

    @property
    def verdict(self) -> str:
        """The first failing launch's verdict, else the first not_checked one, else pass."""
        verdicts = [r.verdict for r in self.reports]
        if self.unsupported:
            verdicts.append(f"not_checked:{self.unsupported}")
        return next((v for v in verdicts if v.startswith("fail:")),
                    next((v for v in verdicts if v.startswith("not_checked:")), "pass"))


# ---------------------------------------------------------------- one launch


class _Launch:
    """Per-launch state the hooks write into: storages, current program, access log."""

    def __init__(self, storages: list[tuple[int, int, str, torch.UntypedStorage]]):
        self.storages = sorted(storages)
        self.starts = np.array([s[0] for s in self.storages], dtype=np.uint64)
        self.ends = np.array([s[1] for s in self.storages], dtype=np.uint64)
        self.grid = (1, 1, 1)
        self.order: np.ndarray | None = None
        self.recording = True
        self.prog = self.epoch = self.programs_run = 0
        self.atomic_depth = 0
        self.shared_written = False
        self.sites: dict[tuple[str, int], int] = {}  # (file, line) -> site id
        self.site_keys: list[tuple[str, int]] = []
        self.shapes: dict[tuple, int] = {}
        self.ops: list[tuple] = []  # (prog, epoch, op, site, shape, itemsize) per op, index = issue order
        self.addrs: list[np.ndarray] = []
        self.lanes: list[np.ndarray] = []
        self.oob: list[tuple[int, np.ndarray, np.ndarray]] = []  # (op index, addresses, lanes)
        self.scratch = np.zeros(2, dtype=np.uint64)  # target of out-of-bounds atomic CAS lanes

    def access(self, ptrs: np.ndarray, mask, itemsize: int, op: int):
        """Record the active lanes; return the lanes that stay inside the arguments' storages."""
        shape = np.shape(ptrs)
        flat = np.asarray(ptrs, dtype=np.uint64).ravel()
        active = np.ones(flat.size, bool) if mask is None else np.broadcast_to(mask, shape).ravel()
        lanes = np.flatnonzero(active)
        addr = flat[lanes]
        k = np.searchsorted(self.starts, addr, side="right") - 1
        inside = (k >= 0) & (addr + np.uint64(itemsize) <= self.ends[np.maximum(k, 0)]) \
            if len(self.starts) else np.zeros(len(addr), bool)
        clean = bool(inside.all())
        if self.recording:
            if self.atomic_depth and op in (_LOAD, _STORE):
                op = _ATOMIC_LOAD if op == _LOAD else _ATOMIC_STORE
            index = len(self.ops)
            self.ops.append((self.prog, self.epoch, op, self._site(), self._shape(shape), itemsize))
            self.addrs.append(addr if clean else addr[inside])
            self.lanes.append(lanes if clean else lanes[inside])
            if not clean:
                self.oob.append((index, addr[~inside], lanes[~inside]))
        return None if clean else lanes[~inside]

    def _site(self) -> int:
        frame = sys._getframe(3)  # past _site, access and the _Memory method
        while frame is not None and frame.f_code.co_filename.startswith(_TRITON_DIR):
            frame = frame.f_back
        key = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("?", 0)
        if key not in self.sites:
            self.sites[key] = len(self.site_keys)
            self.site_keys.append(key)
        return self.sites[key]

    def _shape(self, shape: tuple) -> int:
        return self.shapes.setdefault(shape, len(self.shapes))

    def program(self, index: int) -> tuple[int, int, int]:
        _, ny, nz = self.grid
        return index // (ny * nz), (index // nz) % ny, index % nz

    def where(self, addr: int) -> str:
        k = int(np.searchsorted(self.starts, np.uint64(addr), side="right")) - 1
        if k >= 0 and addr < self.storages[k][1]:
            return f"{self.storages[k][2]} +{addr - self.storages[k][0]} B"
        if not self.storages:
            return f"address {addr:#x}, no tensor argument"
        _, s, e, name = min((s - addr if addr < s else addr - e + 1, s, e, name) for s, e, name, _ in self.storages)
        return f"{name} {addr - s:+d} B, outside its {e - s} B storage"

    def accesses(self) -> tuple[tc.Accesses, np.ndarray]:
        """The log as one row per lane, plus each row's op index."""
        counts = np.array([len(a) for a in self.addrs], dtype=np.int64)
        meta = np.array(self.ops, dtype=np.int64).reshape(-1, 6)
        op_of_row = np.repeat(np.arange(len(self.ops)), counts)
        m = meta[op_of_row]
        ops = m[:, 2]
        reads, writes = (np.array([table[o] for o in range(len(_OPS))])[ops] for table in (_READS, _WRITES))
        acc = tc.Accesses(
            addr=np.concatenate(self.addrs) if self.addrs else np.zeros(0, np.uint64),
            size=m[:, 5], prog=m[:, 0], lane=np.concatenate(self.lanes).astype(np.int64) if self.lanes
            else np.zeros(0, np.int64), shape=m[:, 4], epoch=m[:, 1], seq=op_of_row,
            reads=reads, writes=writes, atomic=(ops == _ATOMIC) | (ops == _ATOMIC_LOAD) | (ops == _ATOMIC_STORE))
        return acc, op_of_row

    def describe(self, acc: tc.Accesses, row: int, op_index: int, addr: int | None = None) -> Access:
        prog, epoch, op, site, _, _ = self.ops[op_index]
        return Access(self.program(prog), int(acc.lane[row]), _OPS[op], self.site_name(site), epoch,
                      self.where(int(acc.addr[row]) if addr is None else addr), self.site_code(site))

    def site_code(self, site: int) -> str:
        return linecache.getline(*self.site_keys[site]).strip()

    def site_name(self, site: int) -> str:
        path, line = self.site_keys[site]
        return f"{os.path.relpath(path) if os.path.isabs(path) else path}:{line}"


# ---------------------------------------------------------------- findings


def _race_findings(launch: _Launch, acc: tc.Accesses, op_of_row: np.ndarray, pairs: tc.Pairs) -> list[Finding]:
    if len(pairs.first) == 0:
        return []
    site = np.array([o[3] for o in launch.ops], dtype=np.int64)[op_of_row]
    opk = np.array([o[2] for o in launch.ops], dtype=np.int64)[op_of_row]
    a, b = pairs.first, pairs.second
    kind_code = np.searchsorted(np.array([tc.RAW, tc.WAR, tc.WAW]), pairs.kind)
    keys = np.stack([kind_code, pairs.cross_program, site[a], site[b], opk[a], opk[b]], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    findings = []
    for g in range(int(inverse.max()) + 1):
        sel = np.flatnonzero(inverse.ravel() == g)
        i = sel[np.argmin(op_of_row[a[sel]])]
        first = launch.describe(acc, a[i], op_of_row[a[i]], int(pairs.byte[i]))
        second = launch.describe(acc, b[i], op_of_row[b[i]], int(pairs.byte[i]))
        if pairs.cross_program[i]:
            why = (f"programs {first.program} and {second.program} touch the same bytes, at least one writing and "
                   "not both atomically; programs are not ordered on a GPU")
        else:
            why = (f"lanes {first.lane} and {second.lane} of program {first.program} touch the same bytes in "
                   f"barrier epoch {first.epoch}, one with a write; warps are not in lock step, so a "
                   "tl.debug_barrier() must separate them")
        pair_ids = a[sel].astype(np.int64) * len(acc) + b[sel]
        findings.append(Finding("race", str(pairs.kind[i]), len(np.unique(pairs.byte[sel])), len(np.unique(pair_ids)),
                                why, first, second))
    return findings


def _oob_findings(launch: _Launch) -> list[Finding]:
    by_site: dict[int, list] = {}
    for index, addr, lanes in launch.oob:
        by_site.setdefault(launch.ops[index][3], []).append((index, addr, lanes))
    findings = []
    for entries in by_site.values():
        index, addr, lanes = entries[0]
        prog, epoch, op, site, _, itemsize = launch.ops[index]
        count = sum(len(e[1]) for e in entries)
        example = Access(launch.program(prog), int(lanes[0]), _OPS[op], launch.site_name(site), epoch,
                         launch.where(int(addr[0])), launch.site_code(site))
        findings.append(Finding("oob", _OPS[op], count * itemsize, count,
                                "lanes outside every tensor argument's storage; the tracer masked them off "
                                "(the plain interpreter would have read heap garbage or corrupted memory)",
                                example))
    return findings


def _uninit_findings(launch: _Launch, acc: tc.Accesses, op_of_row: np.ndarray, rows: np.ndarray) -> list[Finding]:
    if len(rows) == 0:
        return []
    site = np.array([o[3] for o in launch.ops], dtype=np.int64)[op_of_row[rows]]
    findings = []
    for s in np.unique(site):
        sel = rows[site == s]
        example = launch.describe(acc, sel[0], op_of_row[sel[0]])
        findings.append(Finding("uninit", example.op, int(acc.size[sel].sum()), len(sel),
                                "reads memory the case declares never written, before anything in this launch "
                                "wrote it", example))
    return findings


def _order_findings(launch: _Launch, label: str, expected: list[torch.Tensor]) -> list[Finding]:
    findings = []
    for (_, _, name, storage), want in zip(launch.storages, expected, strict=True):
        got = _bytes_of(storage)
        diff = torch.nonzero(got != want).flatten()
        if len(diff):
            findings.append(Finding("race", "order", len(diff), 1,
                                    f"running the programs in {label} order changes {len(diff)} byte(s) of {name} "
                                    f"(first at +{int(diff[0])} B): the result depends on program order"))
    return findings


# ---------------------------------------------------------------- the tracer and its hooks


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _changed(launch: _Launch, before: list[torch.Tensor]) -> np.ndarray:
    """Sorted addresses of every byte of the arguments' storages that differs from ``before``."""
    parts = [np.zeros(0, np.uint64)]
    for (start, _, _, storage), saved in zip(launch.storages, before, strict=True):
        offsets = torch.nonzero(_bytes_of(storage) != saved).flatten().numpy().astype(np.uint64)
        parts.append(np.uint64(start) + offsets)
    return np.concatenate(parts)


def _unwritten_bytes(unwritten) -> np.ndarray:
    """Absolute byte addresses of every element a ``(tensor, bool mask)`` pair marks unwritten."""
    parts = [np.zeros(0, np.uint64)]
    for tensor, mask in unwritten:
        mask = torch.as_tensor(mask, dtype=torch.bool)
        if not isinstance(tensor, torch.Tensor) or tuple(mask.shape) != tuple(tensor.shape):
            raise ValueError(f"unwritten: mask of shape {tuple(mask.shape)} does not match its tensor "
                             f"{tuple(getattr(tensor, 'shape', ()))}; give one bool per element")
        index = np.nonzero(mask.numpy())
        offset = tensor.storage_offset() + sum(i * s for i, s in zip(index, tensor.stride(), strict=True))
        start = np.uint64(tensor.untyped_storage().data_ptr()) + np.asarray(offset, np.uint64) * np.uint64(
            tensor.element_size())
        parts.append((start[:, None] + np.arange(tensor.element_size(), dtype=np.uint64)).ravel())
    return np.unique(np.concatenate(parts))


class _Tracer:
    def __init__(self, unwritten, seed: int, permute: str, unsupported: str | None):
        self.unwritten = _unwritten_bytes(unwritten)
        self.seed = seed
        self.permute = permute
        self.unsupported = unsupported
        self.launch: _Launch | None = None
        self.recording = Recording()

    def run(self, call, executor, args, kwargs):
        fn = executor.fn
        report = Report(getattr(fn, "__name__", "kernel"))
        self.recording.reports.append(report)
        tensors = _tensor_args(fn, args, kwargs)
        off_cpu = next((name for name, t in tensors if t.device.type != "cpu"), None)
        report.not_checked = self.unsupported or (
            f"{off_cpu} is on another device; the tracer follows host pointers of CPU tensors" if off_cpu else None)
        if report.not_checked:
            return call(executor, *args, **kwargs)
        storages = {}
        for name, t in tensors:
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in storages:
                storages[s.data_ptr()] = (s.data_ptr(), s.data_ptr() + s.nbytes(), name, s)
        launch = self.launch = _Launch(list(storages.values()))
        try:
            before = [_bytes_of(s[3]).clone() for s in launch.storages]
            returned = call(executor, *args, **kwargs)
            launch.recording = False
            report.grid = launch.grid
            self._judge(launch, report, _changed(launch, before))
            if not report.not_checked and self._permute(launch):
                after = [_bytes_of(s[3]).clone() for s in launch.storages]
                n = int(np.prod(launch.grid))
                for label, order in (("reversed", np.arange(n)[::-1]),
                                     ("shuffled", np.random.default_rng(self.seed).permutation(n))):
                    for s, saved in zip(launch.storages, before, strict=True):
                        _bytes_of(s[3]).copy_(saved)
                    launch.order = order
                    call(executor, *args, **kwargs)
                    report.races += _order_findings(launch, label, after)
                for s, saved in zip(launch.storages, after, strict=True):
                    _bytes_of(s[3]).copy_(saved)
            return returned
        finally:
            self.launch = None

    def _permute(self, launch: _Launch) -> bool:
        if self.permute == "never" or int(np.prod(launch.grid)) < 2:
            return False
        return self.permute == "always" or launch.shared_written

    def _judge(self, launch: _Launch, report: Report, changed: np.ndarray) -> None:
        if launch.programs_run != int(np.prod(launch.grid)):
            report.not_checked = (f"the program-id hook saw {launch.programs_run} of {int(np.prod(launch.grid))} "
                                  "programs; the interpreter's grid loop is not what the tracer expects")
            return
        acc, op_of_row = launch.accesses()
        try:
            found = tc.analyze(acc, self.unwritten)
        except tc.TooManyPairs as exc:
            report.not_checked = str(exc)
            return
        missed = np.setdiff1d(changed, found.written, assume_unique=True)
        if len(missed):
            report.not_checked = (f"{len(missed)} byte(s) changed that no traced store wrote "
                                  f"({launch.where(int(missed[0]))}): the interpreter wrote memory through a "
                                  "path the tracer does not hook")
            return
        launch.shared_written = found.shared_written
        self.unwritten = np.setdiff1d(self.unwritten, found.written, assume_unique=True)
        report.races = _race_findings(launch, acc, op_of_row, found.pairs)
        report.oob = _oob_findings(launch)
        report.uninit = _uninit_findings(launch, acc, op_of_row, found.uninit)


def _tensor_args(fn, args, kwargs) -> list[tuple[str, torch.Tensor]]:
    from triton.runtime import interpreter

    unwrap = getattr(interpreter, "_unwrap_tensor", lambda t: t)
    params = list(inspect.signature(fn).parameters)
    found = []

    def walk(name, value):
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                walk(f"{name}[{i}]", v)
        elif hasattr(value, "data_ptr"):
            found.append((name, unwrap(value)))
        elif hasattr(value, "base") and hasattr(value, "block_shape"):  # a tensor descriptor
            walk(name, value.base)

    for name, value in list(zip(params, args, strict=False)) + [(k, v) for k, v in kwargs.items() if k in params]:
        walk(name, value)
    return found


_STATE: _Tracer | None = None
_INHERITED = object()  # a hooked attribute the owner only inherits: restored by deleting the hook


class _Memory:
    """Stands in for the interpreter's C++ memory module: every access passes the tracer first."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def load(self, ptrs, mask, other, dtype):
        launch = _STATE.launch if _STATE else None
        if launch is not None and (off := launch.access(ptrs, mask, np.dtype(dtype).itemsize, _LOAD)) is not None:
            mask = _without(mask, off, np.shape(ptrs))
        return self._real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        launch = _STATE.launch if _STATE else None
        if launch is not None and (off := launch.access(ptrs, mask, value.dtype.itemsize, _STORE)) is not None:
            mask = _without(mask, off, np.shape(ptrs))
        return self._real.store(ptrs, value, mask)

    def atomic_rmw(self, rmw_op, ptrs, value, mask, sem):
        launch = _STATE.launch if _STATE else None
        if launch is not None and (off := launch.access(ptrs, mask, value.dtype.itemsize, _ATOMIC)) is not None:
            mask = _without(mask, off, np.shape(ptrs))
        return self._real.atomic_rmw(rmw_op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        launch = _STATE.launch if _STATE else None
        if launch is not None and (off := launch.access(ptrs, None, cmp.dtype.itemsize, _ATOMIC)) is not None:
            ptrs = np.array(ptrs, dtype=np.uint64)
            launch.scratch[:] = 0
            ptrs.ravel()[off] = launch.scratch.ctypes.data
        return self._real.atomic_cas(ptrs, cmp, value, sem)


def _without(mask, lanes, shape):
    mask = np.array(np.broadcast_to(mask, shape), dtype=bool)
    mask.ravel()[lanes] = False
    return mask


def _hooks(interpreter):
    """(owner, attribute, replacement) for every hook, or a reason the interpreter does not fit."""
    builder, executor = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "GridExecutor", None)
    memory = getattr(interpreter, "_interpreter", None)
    needed = [(builder, "set_grid_idx"), (builder, "set_grid_dim"), (builder, "create_barrier"),
              (builder, "create_masked_load"), (builder, "create_masked_store"), (executor, "__call__")]
    needed += [(memory, name) for name in ("load", "store", "atomic_rmw", "atomic_cas")]
    missing = [name for owner, name in needed if owner is None or not hasattr(owner, name)]
    if missing:
        return f"triton {triton.__version__} interpreter lacks {', '.join(missing)}"

    def set_grid_dim(real):
        def hook(self, nx, ny, nz):
            if _STATE and _STATE.launch:
                _STATE.launch.grid = (nx, ny, nz)
            return real(self, nx, ny, nz)
        return hook

    def set_grid_idx(real):
        def hook(self, x, y, z):
            launch = _STATE.launch if _STATE else None
            if launch is not None:
                _, ny, nz = launch.grid
                index = (x * ny + y) * nz + z
                if launch.order is not None:
                    index = int(launch.order[index])
                    x, y, z = launch.program(index)
                launch.prog, launch.epoch = index, 0
                if launch.recording:
                    launch.programs_run += 1
            return real(self, x, y, z)
        return hook

    def create_barrier(real):
        def hook(self, *args, **kwargs):
            if _STATE and _STATE.launch:
                _STATE.launch.epoch += 1
            return real(self, *args, **kwargs)
        return hook

    def atomic_scope(real):
        def hook(self, *args, **kwargs):
            launch = _STATE.launch if _STATE else None
            if launch is None:
                return real(self, *args, **kwargs)
            launch.atomic_depth += 1
            try:
                return real(self, *args, **kwargs)
            finally:
                launch.atomic_depth -= 1
        return hook

    def call(real):
        def hook(self, *args, **kwargs):
            if _STATE is None or _STATE.launch is not None:
                return real(self, *args, **kwargs)
            return _STATE.run(real, self, args, kwargs)
        return hook

    plan = [(builder, "set_grid_dim", set_grid_dim), (builder, "set_grid_idx", set_grid_idx),
            (builder, "create_barrier", create_barrier), (executor, "__call__", call)]
    plan += [(builder, name, atomic_scope) for name in ("create_atomic_load", "create_atomic_store",
                                                         "create_atomic_poll") if hasattr(builder, name)]
    hooks = [(owner, name, make(getattr(owner, name))) for owner, name, make in plan]
    return hooks + [(interpreter, "_interpreter", _Memory(memory))]


@contextmanager
def tracing(unwritten=(), seed: int = 0, permute: str = "auto"):
    """Trace every interpreted launch in the block; yields a ``Recording`` of per-launch Reports.

    ``unwritten``: ``(tensor, bool mask over its elements)`` pairs whose marked elements must be
    written before they are read. ``permute``: rerun in reversed and shuffled program order
    when programs share written bytes (``auto``), always, or never.
    """
    global _STATE
    if permute not in PERMUTE:
        raise ValueError(f"permute: {permute!r}, expected one of {PERMUTE}")
    if _STATE is not None:
        raise RuntimeError("tracing() blocks do not nest")
    hooks, unsupported = [], None
    if not runtime.INTERPRETED:
        unsupported = "kernels are compiled here; the tracer needs the Triton interpreter (CPU)"
    else:
        from triton.runtime import interpreter

        found = _hooks(interpreter)
        if isinstance(found, str):
            unsupported = found
        else:
            hooks = found
    saved = [(owner, name, vars(owner).get(name, _INHERITED)) for owner, name, _ in hooks]
    _STATE = _Tracer(unwritten, seed, permute, unsupported)
    try:
        for owner, name, replacement in hooks:
            setattr(owner, name, replacement)
        if hooks:
            _STATE.unsupported = _probe()
        _STATE.recording.unsupported = _STATE.unsupported
        yield _STATE.recording
    finally:
        _STATE = None
        for owner, name, original in reversed(saved):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def trace(kernel, grid, *args, unwritten=None, seed: int = 0, permute: str = "auto", **kwargs) -> Report:
    """Launch ``kernel[grid](*args, **kwargs)`` once under the tracer and return its Report.

    ``unwritten`` maps a kernel argument name to a bool mask over that tensor's elements.
    """
    fn = getattr(kernel, "fn", None)
    if fn is None or not hasattr(kernel, "__getitem__"):
        raise ValueError(f"kernel: expected a @triton.jit function, got {type(kernel).__name__}")
    bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                          if k in inspect.signature(fn).parameters})
    pairs = []
    for name, mask in (unwritten or {}).items():
        if not isinstance(bound.arguments.get(name), torch.Tensor):
            raise ValueError(f"unwritten: {name!r} is not a tensor argument of {fn.__name__}")
        pairs.append((bound.arguments[name], mask))
    with tracing(pairs, seed=seed, permute=permute) as recording:
        kernel[grid](*args, **kwargs)
    if recording.unsupported:
        return Report(fn.__name__, not_checked=recording.unsupported)
    if len(recording.reports) != 1:
        raise RuntimeError(f"expected one launch of {fn.__name__}, saw {len(recording.reports)}")
    return recording.reports[0]


# ---------------------------------------------------------------- self-test of the hooks

_PROBED: list[str | None] = []


@triton.jit
def _probe_kernel(x_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    values = tl.load(x_ptr + lanes, mask=lanes < 3)
    tl.debug_barrier()
    tl.store(x_ptr + (tl.program_id(0) + 1) * BLOCK + lanes, values, mask=lanes < 2)


def _probe() -> str | None:
    """Run a known kernel through the hooks once per process: None when they saw what they must."""
    if not _PROBED:
        tracer = _STATE
        launch_log = []
        real_judge = tracer._judge
        tracer._judge = lambda launch, report, changed: launch_log.append(launch)
        try:
            _probe_kernel[(2,)](torch.zeros(12, dtype=torch.int32), BLOCK=4)
        except Exception as exc:  # noqa: BLE001 - any failure means the hooks cannot be trusted
            launch_log.append(f"the probe kernel failed under the hooks: {exc!r}")
        finally:
            tracer._judge = real_judge
            tracer.recording.reports.clear()
        _PROBED.append(_probe_verdict(launch_log))
    return _PROBED[0]


def _probe_verdict(launches: list) -> str | None:
    if launches and isinstance(launches[-1], str):
        return launches[-1]
    if len(launches) != 1:
        return f"the launch hook saw {len(launches)} launches of the probe kernel instead of 1"
    launch = launches[0]
    seen = [(prog, epoch, _OPS[op], len(addr))
            for (prog, epoch, op, *_), addr in zip(launch.ops, launch.addrs, strict=True)]
    want = [(0, 0, "load", 3), (0, 1, "store", 2), (1, 0, "load", 3), (1, 1, "store", 2)]
    files = {path for path, _ in launch.sites}
    if seen != want or files != {__file__}:
        return f"interpreter hooks saw {seen} in {sorted(files)} for the probe kernel, expected {want}"
    if launch.oob:
        return "the probe kernel's accesses fell outside its argument: the interpreter copies tensors elsewhere"
    return None
