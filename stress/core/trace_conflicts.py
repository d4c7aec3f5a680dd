"""Vectorized analysis of one launch's memory accesses: races, uninitialized reads, shared bytes.

The tracer hands over one row per *run*: consecutive lanes of one op that touch consecutive
elements (a contiguous tile is one row, a gather is one row per lane). Runs are first grouped
by address overlap; only groups where some byte can be shared with a write (or where a declared
unwritten byte is read) are expanded to lanes and then to bytes, sorted by (byte, issue order)
and grouped, so every question becomes a numpy reduction over groups instead of a per-element
loop, and a launch whose programs touch disjoint tiles costs a sort of its runs, not its bytes.
"""

from dataclasses import dataclass, fields

import numpy as np

MAX_PAIRS = 20_000_000  # beyond this the pairing itself would dominate; the caller reports not_checked
RAW, WAR, WAW = "RAW", "WAR", "WAW"


class TooManyPairs(Exception):
    """The launch touches single bytes from so many accesses that pairing them is not affordable."""


@dataclass
class Accesses:
    """One row per run: lane ``lane + i`` (``i < count``) touches bytes ``[addr + i*size, addr + (i+1)*size)``."""

    addr: np.ndarray  # uint64
    size: np.ndarray  # int64, bytes per lane
    prog: np.ndarray  # int64, linear program index
    lane: np.ndarray  # int64, flat index in the op's block of the run's first lane
    shape: np.ndarray  # int64, id of the op's block shape (same lane of same-shaped ops is program order)
    epoch: np.ndarray  # int64, barriers the program had passed
    seq: np.ndarray  # int64, issue order of the op within the launch
    reads: np.ndarray  # bool
    writes: np.ndarray  # bool
    atomic: np.ndarray  # bool
    count: np.ndarray | None = None  # int64, lanes in the run; None: one each

    def __post_init__(self):
        if self.count is None:
            self.count = np.ones(len(self.addr), np.int64)

    def __len__(self) -> int:
        return len(self.addr)

    def ends(self) -> np.ndarray:
        return self.addr + (self.count * self.size).astype(np.uint64)


@dataclass
class Pairs:
    """Conflicting byte pairs: ``first`` happened before ``second`` (rows of ``Analysis.lanes``)."""

    byte: np.ndarray
    first: np.ndarray
    second: np.ndarray
    kind: np.ndarray  # RAW / WAR / WAW
    cross_program: np.ndarray  # bool

    def subset(self, keep: np.ndarray) -> "Pairs":
        return Pairs(*(getattr(self, f.name)[keep] for f in fields(self)))


@dataclass
class Intervals:
    """Disjoint, sorted byte ranges ``[starts[i], ends[i])``."""

    starts: np.ndarray
    ends: np.ndarray

    def contains(self, byte: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.starts, byte, side="right") - 1
        return (k >= 0) & (byte < self.ends[np.maximum(k, 0)]) if len(self.starts) else np.zeros(len(byte), bool)


@dataclass
class Analysis:
    pairs: Pairs
    shared_written: bool  # some byte is written by one program and touched by another (atomics included)
    uninit: np.ndarray  # rows of ``lanes`` that read a declared-unwritten byte before any write to it
    written: Intervals  # every byte a store or atomic wrote
    lanes: Accesses  # the runs that could conflict, one row per lane: what ``pairs`` and ``uninit`` index


def analyze(acc: Accesses, unwritten: np.ndarray | None = None) -> Analysis:
    """``unwritten``: sorted absolute addresses of bytes declared never written."""
    starts, ends = acc.addr, acc.ends()
    written = _union(starts[acc.writes], ends[acc.writes])
    lanes = _per_lane(acc, _conflict_rows(acc, starts, ends, unwritten))
    byte, elem = _bytes(lanes)
    group_starts, group_ends = _groups(byte)
    empty = Pairs(*(np.zeros(0, t) for t in (np.uint64, np.int64, np.int64, "<U3", bool)))
    uninit = _uninit(lanes, byte, elem, group_starts, unwritten)
    if len(group_starts) == 0:
        return Analysis(empty, False, uninit, written, lanes)
    writes = lanes.writes[elem]
    prog = lanes.prog[elem]
    sizes = group_ends - group_starts
    has_write = np.logical_or.reduceat(writes, group_starts) & (sizes > 1)
    multi_prog = np.minimum.reduceat(prog, group_starts) != np.maximum.reduceat(prog, group_starts)
    shared_written = bool((has_write & multi_prog).any())
    pairs = _pairs(lanes, byte, elem, group_starts[has_write], group_ends[has_write]) if has_write.any() else empty
    return Analysis(pairs, shared_written, uninit, written, lanes)


def _union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    if len(starts) == 0:
        return Intervals(np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    return Intervals(starts[first], np.maximum.reduceat(ends, first))


def _conflict_rows(acc: Accesses, starts: np.ndarray, ends: np.ndarray, unwritten) -> np.ndarray:
    """Rows in a cluster of overlapping runs that holds a write and another run, or a read of a
    declared-unwritten byte: every pair and every uninit read lies inside such a cluster. A
    cluster where one program's same lanes touch the same elements in every run (a tile loaded
    and stored back in place) holds only same-thread pairs, which are ordered: it is skipped."""
    n = len(acc)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    new = np.ones(n, bool)
    new[1:] = s[1:] >= np.maximum.accumulate(e)[:-1]
    first = np.flatnonzero(new)
    cluster = np.cumsum(new) - 1
    size = np.diff(np.append(first, n))
    lane_zero = (acc.addr - (acc.lane * acc.size).astype(np.uint64)).view(np.int64)  # where lane 0 would touch
    one_thread = np.ones(len(first), bool)
    for key in (acc.prog, acc.shape, acc.size, lane_zero):
        one_thread &= np.minimum.reduceat(key[order], first) == np.maximum.reduceat(key[order], first)
    need = (size > 1) & np.logical_or.reduceat(acc.writes[order], first) & ~one_thread
    if unwritten is not None and len(unwritten):
        marked = np.searchsorted(unwritten, e) > np.searchsorted(unwritten, s)
        need |= np.logical_or.reduceat(marked & acc.reads[order], first)
    return np.sort(order[need[cluster]])


def _per_lane(acc: Accesses, rows: np.ndarray) -> Accesses:
    """The chosen runs as one row per lane, in run order."""
    counts = acc.count[rows]
    run = np.repeat(rows, counts)
    i = np.arange(len(run)) - np.repeat(np.cumsum(counts) - counts, counts)
    picked = {f.name: getattr(acc, f.name)[run] for f in fields(Accesses) if f.name != "count"}
    picked["addr"] = picked["addr"] + i.astype(np.uint64) * picked["size"].astype(np.uint64)
    picked["lane"] = picked["lane"] + i
    return Accesses(**picked)


def _bytes(acc: Accesses):
    """Expand lane rows to bytes, sorted by (address, issue order)."""
    n = len(acc)
    elem = np.repeat(np.arange(n), acc.size)
    first_byte = np.repeat(np.cumsum(acc.size) - acc.size, acc.size)
    byte = acc.addr[elem] + (np.arange(len(elem)) - first_byte).astype(np.uint64)
    order = np.lexsort((acc.seq[elem], byte))
    return byte[order], elem[order]


def _groups(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(sorted_keys) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1))
    ends = np.append(starts[1:], len(sorted_keys))
    return starts, ends


def _pairs(acc: Accesses, byte, elem, starts, ends) -> Pairs:
    """Every (write, other access) pair on one byte that no ordering covers."""
    group_of_row = np.repeat(np.arange(len(starts)), ends - starts)
    rows = _ranges(starts, ends)
    is_write = acc.writes[elem[rows]]
    w, w_group = rows[is_write], group_of_row[is_write]
    counts = (ends - starts)[w_group]
    total = int(counts.sum())
    if total > MAX_PAIRS:
        raise TooManyPairs(f"{total} access pairs on shared bytes (limit {MAX_PAIRS})")
    p = np.repeat(w, counts)
    q = np.repeat(starts[w_group], counts) + (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts))
    keep = (q != p) & ~(acc.writes[elem[q]] & (q < p))  # a write-write pair once
    p, q = p[keep], q[keep]
    lo, hi = np.minimum(p, q), np.maximum(p, q)  # rows are in issue order within a byte
    a, b = elem[lo], elem[hi]
    same_prog = acc.prog[a] == acc.prog[b]
    same_thread = (acc.lane[a] == acc.lane[b]) & (acc.shape[a] == acc.shape[b])
    ordered = same_prog & ((acc.epoch[a] != acc.epoch[b]) | same_thread)
    race = ~(acc.atomic[a] & acc.atomic[b]) & ~ordered
    a, b, lo = a[race], b[race], lo[race]
    wa, wb = acc.writes[a], acc.writes[b]
    kind = np.where(wa & wb, WAW, np.where(wa, RAW, WAR))
    return Pairs(byte[lo], a, b, kind, acc.prog[a] != acc.prog[b])


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    counts = ends - starts
    return np.repeat(starts, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))


def _uninit(acc: Accesses, byte, elem, starts, unwritten) -> np.ndarray:
    """Rows that read a declared-unwritten byte before the launch's first write to it."""
    none = np.zeros(0, np.int64)
    if unwritten is None or len(unwritten) == 0 or len(byte) == 0:
        return none
    pos = np.minimum(np.searchsorted(unwritten, byte), len(unwritten) - 1)
    inside = unwritten[pos] == byte
    if not inside.any():
        return none
    seq = acc.seq[elem]
    big = np.iinfo(np.int64).max
    write_seq = np.where(acc.writes[elem], seq, big)
    first_write = np.minimum.reduceat(write_seq, starts)
    group_of_row = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(byte))))
    fw = first_write[group_of_row]
    reads = acc.reads[elem]
    early = (seq < fw) | (acc.writes[elem] & (seq == fw))  # an atomic reads before its own write
    return np.unique(elem[inside & reads & early])
