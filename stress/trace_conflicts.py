"""Vectorized analysis of one launch's memory accesses: races, uninitialized reads, shared bytes.

The tracer hands over one row per active lane of every load, store and atomic. Rows are
expanded to bytes (kernels may mix element sizes), sorted by (byte, issue order) and grouped,
so every question becomes a numpy reduction over groups instead of a per-element loop.
"""

from dataclasses import dataclass

import numpy as np

MAX_PAIRS = 20_000_000  # beyond this the pairing itself would dominate; the caller reports not_checked
RAW, WAR, WAW = "RAW", "WAR", "WAW"


class TooManyPairs(Exception):
    """The launch touches single bytes from so many accesses that pairing them is not affordable."""


@dataclass
class Accesses:
    """One row per active lane: the bytes ``[addr, addr + size)`` touched by one lane of one op."""

    addr: np.ndarray  # uint64
    size: np.ndarray  # int64
    prog: np.ndarray  # int64, linear program index
    lane: np.ndarray  # int64, flat index in the op's block
    shape: np.ndarray  # int64, id of the op's block shape (same lane of same-shaped ops is program order)
    epoch: np.ndarray  # int64, barriers the program had passed
    seq: np.ndarray  # int64, issue order of the op within the launch
    reads: np.ndarray  # bool
    writes: np.ndarray  # bool
    atomic: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.addr)


@dataclass
class Pairs:
    """Conflicting byte pairs: ``first`` happened before ``second`` (element row indices)."""

    byte: np.ndarray
    first: np.ndarray
    second: np.ndarray
    kind: np.ndarray  # RAW / WAR / WAW
    cross_program: np.ndarray  # bool


@dataclass
class Analysis:
    pairs: Pairs
    shared_written: bool  # some byte is written by one program and touched by another (atomics included)
    uninit: np.ndarray  # element rows that read a declared-unwritten byte before any write to it
    written: np.ndarray  # every byte a store or atomic wrote, sorted


def _bytes(acc: Accesses):
    """Expand rows to bytes, sorted by (address, issue order)."""
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


def analyze(acc: Accesses, unwritten: np.ndarray | None = None) -> Analysis:
    byte, elem = _bytes(acc)
    starts, ends = _groups(byte)
    empty = Pairs(*(np.zeros(0, t) for t in (np.uint64, np.int64, np.int64, "<U3", bool)))
    uninit = _uninit(acc, byte, elem, starts, unwritten)
    written = np.unique(byte[acc.writes[elem]])
    if len(starts) == 0:
        return Analysis(empty, False, uninit, written)
    writes = acc.writes[elem]
    prog = acc.prog[elem]
    sizes = ends - starts
    has_write = np.logical_or.reduceat(writes, starts) & (sizes > 1)
    multi_prog = np.minimum.reduceat(prog, starts) != np.maximum.reduceat(prog, starts)
    shared_written = bool((has_write & multi_prog).any())
    return Analysis(_pairs(acc, byte, elem, starts[has_write], ends[has_write]) if has_write.any() else empty,
                    shared_written, uninit, written)


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
