"""CPU tracer over the Triton interpreter: races, out-of-bounds and uninitialized reads.

The interpreter runs programs one after another and ignores ``tl.debug_barrier()``, so races
never show in its results and an out-of-bounds load returns heap garbage. The tracer hooks the
interpreter's memory primitives and records every access as runs of consecutive lanes (a
contiguous tile is one run) with the program, the barrier epoch and the source line; the
analysis (``stress.core.trace_conflicts``) then looks for accesses that no ordering covers. Lanes
outside every storage the launch can reach (its arguments, and the storages that pointers it
loaded from memory point into) are reported and masked off instead of touching memory. When
programs share written bytes, the launch is rerun in reversed and shuffled program order: an
output change is a race, or, when only atomics connect the programs (ticket counters), its own
finding, ``order-dependent``, which a caller may declare expected.

Hooks are installed only inside ``tracing()`` and always removed on exit. When the
interpreter's internals are not what the hooks expect, every launch gets ``not_checked``; a
construct the interpreter cannot run (inline asm, libdevice) ends the block with a
``not_checked`` report naming it and its source line.
"""

import functools  # noqa: I001  (kernels.runtime must choose the interpreter before triton loads)
import gc
import inspect
import linecache
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels import runtime
from stress.core import trace_conflicts as tc

import triton
import triton.language as tl

_TRITON_DIR = os.path.dirname(triton.__file__)
_OPS = ("load", "store", "atomic", "atomic_load", "atomic_store")
_LOAD, _STORE, _ATOMIC, _ATOMIC_LOAD, _ATOMIC_STORE = range(len(_OPS))
_READS = np.array([True, False, True, True, False])
_WRITES = np.array([False, True, True, False, True])
_ATOMICS = np.array([False, False, True, True, True])
PERMUTE = ("auto", "always", "never")
_MAX_GAPS = 64  # unwritten gaps of one storage compared one by one; beyond, through a mask


class Refused(Exception):
    """The interpreter cannot run a construct of the launched kernel; ``tracing()`` ends its
    block there and the launch's report is ``not_checked`` with this reason."""


@dataclass(frozen=True)
class Access:
    """One lane of one memory op."""

    program: tuple[int, int, int]
    lane: int
    op: str
    site: str  # kernel file:line
    epoch: int
    where: str  # storage that holds the byte, and the byte offset in it
    code: str = ""  # the source text at ``site``

    def describe(self) -> str:
        code = f"  `{self.code}`" if self.code else ""
        return (f"program {self.program} lane {self.lane} {self.op} at {self.site} "
                f"(barrier epoch {self.epoch}, {self.where}){code}")


@dataclass
class Finding:
    """A race (RAW/WAR/WAW between accesses, or ``order``), an out-of-bounds access, an uninit
    read, an output that depends on program order through atomics alone, or plain stores of one
    value to the same bytes (benign: whichever lands last, the bytes are the same)."""

    category: str  # race | oob | uninit | order-dependent | duplicate-store
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
    """The verdict of one traced launch.

    ``expected_order_dependence``: why outputs may differ under another program order (a
    reason), or None when they must not; with a reason, ``order_dependent`` findings pass.
    """

    kernel: str
    grid: tuple[int, int, int] = (0, 0, 0)
    races: list[Finding] = field(default_factory=list)
    oob: list[Finding] = field(default_factory=list)
    uninit: list[Finding] = field(default_factory=list)
    order_dependent: list[Finding] = field(default_factory=list)
    duplicate_stores: list[Finding] = field(default_factory=list)  # benign: listed, never a failure
    not_checked: str | None = None
    expected_order_dependence: str | None = None
    runs: int = 0  # rows of the access log: runs of consecutive lanes at consecutive elements
    lanes: int = 0  # active lanes of every load, store and atomic

    @property
    def ok(self) -> bool:
        return self.verdict == "pass"

    @property
    def verdict(self) -> str:
        if self.not_checked:
            return f"not_checked:{self.not_checked}"
        failing = [("oob", self.oob), ("race", self.races), ("uninit", self.uninit)]
        if self.expected_order_dependence is None:
            failing.append(("order-dependent", self.order_dependent))
        return next((f"fail:{kind}" for kind, found in failing if found), "pass")

    def lines(self) -> list[str]:
        head = f"{self.kernel} grid {self.grid}: {self.verdict}"
        if self.runs:
            head += f" ({self.lanes} lane accesses logged as {self.runs} runs)"
        if self.order_dependent and self.expected_order_dependence is not None:
            head += f" (order dependence expected: {self.expected_order_dependence})"
        found = self.oob + self.races + self.uninit + self.order_dependent + self.duplicate_stores
        return [head] + [line for f in found for line in f.lines()]


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


@dataclass
class _Storage:
    start: int
    end: int
    name: str
    storage: torch.UntypedStorage
    before: np.ndarray  # its bytes before the launch touched it


def _bytes_of(storage: torch.UntypedStorage) -> np.ndarray:
    """The storage's bytes, shared (numpy compares and copies these several times faster than torch)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def _snapshot(start: int, name: str, storage: torch.UntypedStorage) -> _Storage:
    return _Storage(start, start + storage.nbytes(), name, storage, _bytes_of(storage).copy())


def _runs(addr: np.ndarray, lanes: np.ndarray | None, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """Split active lanes into runs of consecutive lanes at consecutive elements: (first index, length)."""
    n = len(addr)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.diff(addr) != np.uint64(itemsize)  # a decreasing address wraps around: a break too
    if lanes is not None:
        breaks |= np.diff(lanes) != 1
    first = np.concatenate(([0], np.flatnonzero(breaks) + 1))
    return first, np.diff(np.append(first, n))


class _Launch:
    """Per-launch state the hooks write into: storages, current program, access log."""

    def __init__(self, storages: list[_Storage]):
        self.storages: list[_Storage] = []
        self.starts = self.ends = np.zeros(0, np.uint64)
        for s in storages:
            self.add(s)
        self.grid = (1, 1, 1)
        self.order: np.ndarray | None = None
        self.recording = True
        self.prog = self.epoch = self.programs_run = 0
        self.atomic_depth = 0
        self.atomics = False  # some atomic op ran: programs may hand each other values
        self.shared_written = False
        self.sites: dict[tuple[str, int], int] = {}  # (file, line) -> site id
        self.site_keys: list[tuple[str, int]] = []
        self.shapes: dict[tuple, int] = {}
        self.ops: list[tuple] = []  # (prog, epoch, op, site, shape, itemsize) per op, index = issue order
        self.run_addr: list[np.ndarray] = []  # per op: first address, lane count and first lane of each run
        self.run_count: list[np.ndarray] = []
        self.run_lane: list[np.ndarray] = []
        self.oob: list[tuple[int, np.ndarray, np.ndarray]] = []  # (op index, addresses, lanes)
        self.stored: dict[int, np.ndarray] = {}  # op index of a plain store -> the values of its block, flat
        self.unresolved: dict[int, int] = {}  # site of a pointer made from loaded bits -> an address in no storage
        self.live: tuple | None = None  # (starts, ends, storages) of every live CPU tensor, found when needed
        self.scratch = np.zeros(2, dtype=np.uint64)  # target of out-of-bounds atomic CAS lanes

    def add(self, storage: _Storage) -> None:
        self.storages = sorted(self.storages + [storage], key=lambda s: s.start)
        self.starts = np.array([s.start for s in self.storages], dtype=np.uint64)
        self.ends = np.array([s.end for s in self.storages], dtype=np.uint64)

    def inside(self, addr: np.ndarray, nbytes) -> np.ndarray:
        """Whether ``[addr, addr + nbytes)`` (``nbytes >= 1``) lies in one storage the launch can reach.

        Tested as ``nbytes <= end - addr``: ``addr + nbytes`` wraps in uint64 for an address just below 2^64
        (index -1 off an empty tensor, whose address is 0) and would pass as in bounds."""
        if not len(self.starts):
            return np.zeros(len(addr), bool)
        k = np.searchsorted(self.starts, addr, side="right") - 1
        end = self.ends[np.maximum(k, 0)]
        return (k >= 0) & (addr < end) & (np.asarray(nbytes, np.uint64) <= end - np.minimum(addr, end))

    def access(self, ptrs: np.ndarray, mask, itemsize: int, op: int, value: np.ndarray | None = None):
        """Record the active lanes (and a plain store's ``value``); return the lanes to mask off (None: none)."""
        shape = np.shape(ptrs)
        flat = np.asarray(ptrs, dtype=np.uint64).reshape(-1)
        lanes = None  # None: every lane is active
        if mask is not None:
            active = np.broadcast_to(mask, shape).reshape(-1)
            if not active.all():
                lanes = np.flatnonzero(active)
        addr = flat if lanes is None else flat[lanes]
        first, count = _runs(addr, lanes, itemsize)
        off_lanes = off_addr = None
        if not self.inside(addr[first], (count * itemsize).astype(np.uint64)).all():
            every = np.arange(len(flat)) if lanes is None else lanes
            ok = self.inside(addr, itemsize)
            off_lanes, off_addr = every[~ok], addr[~ok]
            lanes, addr = every[ok], addr[ok]
            first, count = _runs(addr, lanes, itemsize)
        if self.recording:
            if self.atomic_depth and op in (_LOAD, _STORE):
                op = _ATOMIC_LOAD if op == _LOAD else _ATOMIC_STORE
            self.atomics |= bool(_ATOMICS[op])
            self.ops.append((self.prog, self.epoch, op, self.site(), self._shape(shape), itemsize))
            self.run_addr.append(addr[first])
            self.run_count.append(count)
            self.run_lane.append(first if lanes is None else lanes[first])
            if op == _STORE and value is not None:
                self.stored[len(self.ops) - 1] = np.ascontiguousarray(np.broadcast_to(value, shape)).reshape(-1)
            if off_lanes is not None:
                self.oob.append((len(self.ops) - 1, off_addr, off_lanes))
        # Behind a pointer no storage holds, a lane outside every storage may be legal: let it
        # through as the plain interpreter would; the launch is then not_checked.
        return None if self.unresolved else off_lanes

    def resolve(self, pointers: np.ndarray) -> None:
        """Pointers made from loaded bits: reach the storage each points into, or note that none does."""
        values = np.unique(np.asarray(pointers, dtype=np.uint64))
        values = values[(values != 0) & ~self.inside(values, 1)]
        if not len(values):
            return
        site = self.site()
        starts, ends, storages = self._live()
        k = np.searchsorted(starts, values, side="right") - 1
        hit = (k >= 0) & (values < ends[np.maximum(k, 0)])
        for i in np.unique(k[hit]):
            self.add(_snapshot(int(starts[i]), f"storage behind the pointer made at {self.site_name(site)}",
                               storages[i]))
        if not hit.all():
            self.unresolved.setdefault(site, int(values[~hit][0]))

    def _live(self) -> tuple:
        if self.live is None:
            found = {}
            for obj in gc.get_objects():
                # type(), not isinstance(): some module objects warn when their __class__ is read
                if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided:
                    s = obj.untyped_storage()
                    if s.nbytes():
                        found.setdefault(s.data_ptr(), s)
            order = sorted(found)
            self.live = (np.array(order, dtype=np.uint64),
                         np.array([p + found[p].nbytes() for p in order], dtype=np.uint64), [found[p] for p in order])
        return self.live

    def site(self) -> int:
        """The kernel source line that issued the current op (called from a hook, two frames down)."""
        frame = sys._getframe(3)  # past site, the launch method and the hook
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
        if k >= 0 and addr < self.storages[k].end:
            return f"{self.storages[k].name} +{addr - self.storages[k].start} B"
        if not self.storages:
            return f"address {addr:#x}, no tensor argument"
        _, s = min((s.start - addr if addr < s.start else addr - s.end + 1, s) for s in self.storages)
        return f"{s.name} {addr - s.start:+d} B, outside its {s.end - s.start} B storage"

    def accesses(self) -> tc.Accesses:
        """The log as one row per run."""
        runs = np.array([len(a) for a in self.run_addr], dtype=np.int64)
        meta = np.array(self.ops, dtype=np.int64).reshape(-1, 6)
        op_of_run = np.repeat(np.arange(len(self.ops)), runs)
        m = meta[op_of_run]
        ops = m[:, 2]

        def joined(parts, dtype):
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        return tc.Accesses(addr=joined(self.run_addr, np.uint64), size=m[:, 5], prog=m[:, 0],
                           lane=joined(self.run_lane, np.int64), shape=m[:, 4], epoch=m[:, 1], seq=op_of_run,
                           reads=_READS[ops], writes=_WRITES[ops], atomic=_ATOMICS[ops],
                           count=joined(self.run_count, np.int64))

    def stored_bytes(self, lanes: tc.Accesses, rows: np.ndarray, byte: np.ndarray) -> np.ndarray:
        """The byte each plain-store row wrote at ``byte`` (int16, -1 where the row is no recorded store)."""
        out = np.full(len(rows), -1, np.int16)
        seq = lanes.seq[rows]
        for op in np.unique(seq):
            values = self.stored.get(int(op))
            if values is None:
                continue
            sel = np.flatnonzero(seq == op)
            r = rows[sel]
            at = lanes.lane[r] * lanes.size[r] + (byte[sel] - lanes.addr[r]).astype(np.int64)
            out[sel] = values.view(np.uint8)[at]
        return out

    def describe(self, lanes: tc.Accesses, row: int, addr: int | None = None) -> Access:
        prog, epoch, op, site, _, _ = self.ops[int(lanes.seq[row])]
        return Access(self.program(prog), int(lanes.lane[row]), _OPS[op], self.site_name(site), epoch,
                      self.where(int(lanes.addr[row]) if addr is None else addr), self.site_code(site))

    def site_code(self, site: int) -> str:
        return linecache.getline(*self.site_keys[site]).strip()

    def site_name(self, site: int) -> str:
        return _short(*self.site_keys[site])

    def unexplained(self, written: tc.Intervals) -> int | None:
        """The address of the first byte of a reachable storage that changed although no traced
        store or atomic wrote it (an unhooked write path), or None. Only bytes outside the
        written ranges are compared."""
        for s in self.storages:
            lo = np.searchsorted(written.ends, np.uint64(s.start), side="right")
            hi = np.searchsorted(written.starts, np.uint64(s.end), side="left")
            inner = [(np.clip(edge[lo:hi], s.start, s.end) - np.uint64(s.start)).astype(np.int64)
                     for edge in (written.starts, written.ends)]
            gaps = np.stack([np.append(0, inner[1]), np.append(inner[0], s.end - s.start)], axis=1)
            gaps = gaps[gaps[:, 1] > gaps[:, 0]]
            now = _bytes_of(s.storage)
            if len(gaps) > _MAX_GAPS:  # many scattered writes: one pass over a mask of the gaps
                edges = np.zeros(s.end - s.start + 1, np.int8)
                np.add.at(edges, gaps[:, 0], 1)
                np.add.at(edges, gaps[:, 1], -1)
                stray = np.flatnonzero((now != s.before) & (np.cumsum(edges[:-1], dtype=np.int8) > 0))
                if len(stray):
                    return s.start + int(stray[0])
                continue
            for a, b in gaps:
                if not np.array_equal(now[a:b], s.before[a:b]):
                    return s.start + int(a) + int(np.flatnonzero(now[a:b] != s.before[a:b])[0])
        return None


def _short(path: str, line: int) -> str:
    return f"{os.path.relpath(path) if os.path.isabs(path) else path}:{line}"


# ---------------------------------------------------------------- findings


def _duplicate_stores(launch: _Launch, lanes: tc.Accesses, pairs: tc.Pairs) -> np.ndarray:
    """Which byte pairs belong to two plain stores that write the same value on every byte they share: whichever
    lands last, memory holds those bytes, so the two race on nothing (a reader pairs with each store on its own)."""
    waw = np.flatnonzero(pairs.kind == tc.WAW)
    same = np.zeros(len(pairs.first), bool)
    if len(waw):
        first = launch.stored_bytes(lanes, pairs.first[waw], pairs.byte[waw])
        second = launch.stored_bytes(lanes, pairs.second[waw], pairs.byte[waw])
        _, store_pair = np.unique(np.stack([pairs.first[waw], pairs.second[waw]]), axis=1, return_inverse=True)
        differs = np.bincount(store_pair.ravel(), weights=(first < 0) | (first != second)) > 0
        same[waw] = ~differs[store_pair.ravel()]
    return same


def _race_findings(launch: _Launch, lanes: tc.Accesses, pairs: tc.Pairs, duplicate: bool = False) -> list[Finding]:
    if len(pairs.first) == 0:
        return []
    site = np.array([o[3] for o in launch.ops], dtype=np.int64)[lanes.seq]
    opk = np.array([o[2] for o in launch.ops], dtype=np.int64)[lanes.seq]
    a, b = pairs.first, pairs.second
    kind_code = np.searchsorted(np.array([tc.RAW, tc.WAR, tc.WAW]), pairs.kind)
    keys = np.stack([kind_code, pairs.cross_program, site[a], site[b], opk[a], opk[b]], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    findings = []
    for g in range(int(inverse.max()) + 1):
        sel = np.flatnonzero(inverse.ravel() == g)
        i = sel[np.argmin(lanes.seq[a[sel]])]
        first = launch.describe(lanes, a[i], int(pairs.byte[i]))
        second = launch.describe(lanes, b[i], int(pairs.byte[i]))
        if duplicate:
            why = ("plain stores of the same value to the same bytes, unordered; whichever lands last, the bytes "
                   "are the same: benign, not a race")
        elif pairs.cross_program[i]:
            why = (f"programs {first.program} and {second.program} touch the same bytes, at least one writing and "
                   "not both atomically; programs are not ordered on a GPU")
        else:
            why = (f"lanes {first.lane} and {second.lane} of program {first.program} touch the same bytes in "
                   f"barrier epoch {first.epoch}, one with a write; warps are not in lock step, so a "
                   "tl.debug_barrier() must separate them")
        pair_ids = a[sel].astype(np.int64) * len(lanes) + b[sel]
        findings.append(Finding("duplicate-store" if duplicate else "race", str(pairs.kind[i]),
                                len(np.unique(pairs.byte[sel])), len(np.unique(pair_ids)), why, first, second))
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
                                "lanes outside every storage the launch can reach (its tensor arguments and the "
                                "storages its loaded pointers point into); the tracer masked them off (the plain "
                                "interpreter would have read heap garbage or corrupted memory)", example))
    return findings


def _uninit_findings(launch: _Launch, lanes: tc.Accesses, rows: np.ndarray) -> list[Finding]:
    if len(rows) == 0:
        return []
    site = np.array([o[3] for o in launch.ops], dtype=np.int64)[lanes.seq[rows]]
    findings = []
    for s in np.unique(site):
        sel = rows[site == s]
        example = launch.describe(lanes, sel[0])
        findings.append(Finding("uninit", example.op, int(lanes.size[sel].sum()), len(sel),
                                "reads memory the case declares never written, before anything in this launch "
                                "wrote it", example))
    return findings


def _order_findings(launch: _Launch, label: str, after: dict[int, np.ndarray], through_atomics: bool):
    """Storages whose bytes differ from the default order's after a rerun in ``label`` order."""
    findings = []
    for s in launch.storages:
        want = after.get(s.start)
        diff = np.flatnonzero(_bytes_of(s.storage) != want) if want is not None else []
        if not len(diff):
            continue
        change = (f"running the programs in {label} order changes {len(diff)} byte(s) of {s.name} "
                  f"(first at +{int(diff[0])} B)")
        if through_atomics:
            findings.append(Finding("order-dependent", label, len(diff), 1, change + ": no plain access races, so "
                                    "atomics hand out order-dependent values (e.g. a ticket counter); valid only "
                                    "where another layout is acceptable, which the caller must declare"))
        else:
            findings.append(Finding("race", "order", len(diff), 1, change + ": the result depends on program order"))
    return findings


# ---------------------------------------------------------------- refusals


def _libdevice_unavailable(*args, **kwargs):
    raise NotImplementedError("a libdevice function has no interpreter implementation")


_UNAVAILABLE = _libdevice_unavailable.__code__


@functools.cache
def _libdevice_stubs() -> tuple:
    """(stub, raising code) for each generic ``libdevice`` function: empty stubs that the compiler
    maps to a backend's library and that return None in the interpreter, so a kernel fails later
    and elsewhere. While tracing, their code raises at the call instead (every import style
    shares the function object)."""
    try:
        from triton.language.extra import libdevice
    except ImportError:
        return ()
    return tuple((f, _UNAVAILABLE.replace(co_name=f.__name__)) for f in vars(libdevice).values()
                 if inspect.isfunction(f) and f.__module__ == libdevice.__name__)


def _refusal(exc: BaseException) -> str | None:
    """A reason naming the construct and its kernel line when ``exc`` says the interpreter
    cannot run a construct; None for any other error (a bug in the kernel or its arguments)."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 16:
        chain.append(chain[-1].__cause__)
    frames = [frame for e in chain for frame, _ in _tb_frames(e.__traceback__)]
    root = chain[-1]
    construct = None
    for frame in reversed(frames):
        code = frame.f_code
        if code is _UNAVAILABLE or (code.co_filename == _UNAVAILABLE.co_filename
                                    and code.co_firstlineno == _UNAVAILABLE.co_firstlineno):
            construct = f"libdevice.{code.co_name}"
        elif isinstance(root, NotImplementedError) and code.co_name == "create_inline_asm":
            construct = f"inline asm `{frame.f_locals.get('inlineAsm', '?')}`"
        elif isinstance(root, NotImplementedError) and code.co_name == "create_extern_elementwise":
            construct = f"the extern function {frame.f_locals.get('symbol', '?')}"
        elif "Did you forget to add @triton.jit" in str(root) and code.co_name == "wrapper":
            fn = frame.f_locals.get("fn")
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}"
            construct = f"{name} (the interpreter does not map it)"
        if construct:
            break
    if construct is None and isinstance(root, NotImplementedError):
        construct = str(root) or "an op it does not implement"
    if construct is None and isinstance(root, AttributeError) and "InterpreterBuilder" in str(root):
        construct = f"{getattr(root, 'name', None) or root} (the interpreter's builder lacks it)"
    if construct is None:
        return None
    user = [f for f in frames if not f.f_code.co_filename.startswith(_TRITON_DIR)
            and f.f_code.co_filename != __file__]
    if not user:
        return f"the Triton interpreter cannot run {construct}"
    path, line = user[-1].f_code.co_filename, user[-1].f_lineno
    code = linecache.getline(path, line).strip()
    return f"the Triton interpreter cannot run {construct}, used at {_short(path, line)}" + (
        f" `{code}`" if code else "")


def _tb_frames(tb):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


# ---------------------------------------------------------------- the tracer and its hooks


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
    def __init__(self, unwritten, seed: int, permute: str, unsupported: str | None,
                 expected_order_dependence: str | None):
        self.unwritten = _unwritten_bytes(unwritten)
        self.seed = seed
        self.permute = permute
        self.unsupported = unsupported
        self.expected_order_dependence = expected_order_dependence
        self.launch: _Launch | None = None
        self.recording = Recording()

    def run(self, call, executor, args, kwargs):
        fn = executor.fn
        report = Report(getattr(fn, "__name__", "kernel"), expected_order_dependence=self.expected_order_dependence)
        self.recording.reports.append(report)
        tensors = _tensor_args(fn, args, kwargs)
        off_cpu = next((name for name, t in tensors if t.device.type != "cpu"), None)
        report.not_checked = self.unsupported or (
            f"{off_cpu} is on another device; the tracer follows host pointers of CPU tensors" if off_cpu else None)
        if report.not_checked:
            return _refusing(report, lambda: call(executor, *args, **kwargs))
        storages = {}
        for name, t in tensors:
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in storages:
                storages[s.data_ptr()] = _snapshot(s.data_ptr(), name, s)
        launch = self.launch = _Launch(list(storages.values()))
        try:
            returned = _refusing(report, lambda: call(executor, *args, **kwargs))
            launch.recording = False
            report.grid = launch.grid
            self._judge(launch, report)
            if not report.not_checked and self._permute(launch):
                self._reorder(launch, report, lambda: call(executor, *args, **kwargs))
            return returned
        finally:
            self.launch = None

    def _permute(self, launch: _Launch) -> bool:
        if self.permute == "never" or int(np.prod(launch.grid)) < 2:
            return False
        return self.permute == "always" or launch.shared_written

    def _reorder(self, launch: _Launch, report: Report, rerun) -> None:
        """Rerun from the same inputs in reversed and shuffled program order; keep the default order's result."""
        after = {s.start: _bytes_of(s.storage).copy() for s in launch.storages}
        through_atomics = launch.atomics and not report.races
        n = int(np.prod(launch.grid))
        for label, order in (("reversed", np.arange(n)[::-1]),
                             ("shuffled", np.random.default_rng(self.seed).permutation(n))):
            for s in launch.storages:
                np.copyto(_bytes_of(s.storage), s.before)
            launch.order = order
            rerun()
            found = _order_findings(launch, label, after, through_atomics)
            (report.order_dependent if through_atomics else report.races).extend(found)
        for s in launch.storages:
            np.copyto(_bytes_of(s.storage), after.get(s.start, s.before))

    def _judge(self, launch: _Launch, report: Report) -> None:
        if launch.programs_run != int(np.prod(launch.grid)):
            report.not_checked = (f"the program-id hook saw {launch.programs_run} of {int(np.prod(launch.grid))} "
                                  "programs; the interpreter's grid loop is not what the tracer expects")
            return
        log = launch.accesses()
        report.runs, report.lanes = len(log), int(log.count.sum())
        try:
            found = tc.analyze(log, self.unwritten)
        except tc.TooManyPairs as exc:
            report.not_checked = str(exc)
            return
        stray = launch.unexplained(found.written)
        if stray is not None:
            report.not_checked = (f"bytes changed that no traced store wrote (first at {launch.where(stray)}): "
                                  "the interpreter wrote memory through a path the tracer does not hook")
            return
        if launch.unresolved and launch.oob:
            site, addr = next(iter(launch.unresolved.items()))
            index, first_addr, _ = launch.oob[0]
            report.not_checked = (f"a pointer made at {launch.site_name(site)} from loaded bits holds {addr:#x}, "
                                  "inside no live tensor's storage, and accesses fall outside every storage the "
                                  f"tracer knows (first {int(first_addr[0]):#x} at "
                                  f"{launch.site_name(launch.ops[index][3])}): they cannot be judged")
            return
        launch.shared_written = found.shared_written
        self.unwritten = self.unwritten[~found.written.contains(self.unwritten)]
        duplicate = _duplicate_stores(launch, found.lanes, found.pairs)
        report.races = _race_findings(launch, found.lanes, found.pairs.subset(~duplicate))
        report.duplicate_stores = _race_findings(launch, found.lanes, found.pairs.subset(duplicate),
                                                 duplicate=True)
        report.oob = _oob_findings(launch)
        report.uninit = _uninit_findings(launch, found.lanes, found.uninit)


def _refusing(report: Report, launch):
    """Run the launch; a construct the interpreter cannot run makes the report not_checked and
    raises ``Refused`` (which ``tracing()`` swallows); any other error propagates as it is."""
    try:
        return launch()
    except Exception as exc:
        reason = _refusal(exc)
        if reason is None:
            raise
        report.not_checked = reason
        raise Refused(reason) from exc


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
        if launch is not None and (off := launch.access(ptrs, mask, value.dtype.itemsize, _STORE, value)) is not None:
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
              (builder, "create_masked_load"), (builder, "create_masked_store"), (builder, "create_int_to_ptr"),
              (builder, "create_bitcast"), (executor, "__call__")]
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

    def to_pointer(real):
        """Integers (or other bits) that become pointers: the kernel loaded them, e.g. from a table."""
        def hook(self, src, dst_type):
            made = real(self, src, dst_type)
            launch = _STATE.launch if _STATE else None
            if launch is not None and isinstance(made.dtype, tl.pointer_type) and not isinstance(
                    src.dtype, tl.pointer_type):
                launch.resolve(made.data)
            return made
        return hook

    def call(real):
        def hook(self, *args, **kwargs):
            if _STATE is None or _STATE.launch is not None:
                return real(self, *args, **kwargs)
            return _STATE.run(real, self, args, kwargs)
        return hook

    plan = [(builder, "set_grid_dim", set_grid_dim), (builder, "set_grid_idx", set_grid_idx),
            (builder, "create_barrier", create_barrier), (builder, "create_int_to_ptr", to_pointer),
            (builder, "create_bitcast", to_pointer), (executor, "__call__", call)]
    plan += [(builder, name, atomic_scope) for name in ("create_atomic_load", "create_atomic_store",
                                                         "create_atomic_poll") if hasattr(builder, name)]
    hooks = [(owner, name, make(getattr(owner, name))) for owner, name, make in plan]
    hooks += [(stub, "__code__", code) for stub, code in _libdevice_stubs()]
    return hooks + [(interpreter, "_interpreter", _Memory(memory))]


def _saved(owner, name):
    if name == "__code__":
        return owner.__code__
    return vars(owner).get(name, _INHERITED)


@contextmanager
def tracing(unwritten=(), seed: int = 0, permute: str = "auto", expected_order_dependence: str | None = None):
    """Trace every interpreted launch in the block; yields a ``Recording`` of per-launch Reports.

    ``unwritten``: ``(tensor, bool mask over its elements)`` pairs whose marked elements must be
    written before they are read. ``permute``: rerun in reversed and shuffled program order
    when programs share written bytes (``auto``), always, or never.
    ``expected_order_dependence``: the reason outputs may legitimately differ under another
    program order (atomic tickets); None means they must not (``fail:order-dependent``).
    A launch of a construct the interpreter cannot run ends the block without an exception:
    its report is ``not_checked`` and says what and where.
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
    saved = [(owner, name, _saved(owner, name)) for owner, name, _ in hooks]
    _STATE = _Tracer(unwritten, seed, permute, unsupported, expected_order_dependence)
    try:
        for owner, name, replacement in hooks:
            setattr(owner, name, replacement)
        if hooks:
            _STATE.unsupported = _probe()
        _STATE.recording.unsupported = _STATE.unsupported
        yield _STATE.recording
    except Refused:
        pass  # the refused launch's report says why; nothing after it in the block ran
    finally:
        _STATE = None
        for owner, name, original in reversed(saved):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def unwritten_pairs(fn, args: tuple, kwargs: dict, unwritten: dict) -> list:
    """``tracing()``'s ``unwritten`` from a map of ``fn``'s argument names to bool masks."""
    params = inspect.signature(fn).parameters
    bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
    pairs = []
    for name, mask in unwritten.items():
        if not isinstance(bound.arguments.get(name), torch.Tensor):
            raise ValueError(f"unwritten: {name!r} is not a tensor argument of {fn.__name__}")
        pairs.append((bound.arguments[name], mask))
    return pairs


def trace(kernel, grid, *args, unwritten=None, seed: int = 0, permute: str = "auto",
          expected_order_dependence: str | None = None, **kwargs) -> Report:
    """Launch ``kernel[grid](*args, **kwargs)`` once under the tracer and return its Report.

    ``unwritten`` maps a kernel argument name to a bool mask over that tensor's elements;
    ``expected_order_dependence`` is as for ``tracing()``.
    """
    fn = getattr(kernel, "fn", None)
    if fn is None or not hasattr(kernel, "__getitem__"):
        raise ValueError(f"kernel: expected a @triton.jit function, got {type(kernel).__name__}")
    pairs = unwritten_pairs(fn, args, kwargs, unwritten or {})
    with tracing(pairs, seed=seed, permute=permute, expected_order_dependence=expected_order_dependence) as recording:
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
        tracer._judge = lambda launch, report: launch_log.append(launch)
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
    seen = [(prog, epoch, _OPS[op], int(counts.sum()))
            for (prog, epoch, op, *_), counts in zip(launch.ops, launch.run_count, strict=True)]
    want = [(0, 0, "load", 3), (0, 1, "store", 2), (1, 0, "load", 3), (1, 1, "store", 2)]
    files = {path for path, _ in launch.sites}
    if seen != want or files != {__file__}:
        return f"interpreter hooks saw {seen} in {sorted(files)} for the probe kernel, expected {want}"
    if launch.oob:
        return "the probe kernel's accesses fell outside its argument: the interpreter copies tensors elsewhere"
    return None
