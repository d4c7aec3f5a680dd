"""The vectorized conflict analysis against a pair-by-pair loop that is obviously right."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stress.core import trace_conflicts as tc

# (reads, writes, atomic) per op kind: load, store, atomic RMW, atomic load
KINDS = ((True, False, False), (False, True, False), (True, True, True), (True, False, True))

# (program, epoch, shape, kind, element size, runs of (first address, lanes)): runs of one op take
# consecutive lanes with a gap between runs, and may overlap in memory (a scatter's duplicates)
op = st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1), st.sampled_from(range(len(KINDS))),
               st.sampled_from((1, 2, 4)), st.lists(st.tuples(st.integers(0, 12), st.integers(1, 3)), max_size=3))
TYPES = (np.uint64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, bool, bool, bool, np.int64)


def _table(rows):
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(TYPES)
    return tc.Accesses(*(np.array(c, dtype=t) for c, t in zip(cols, TYPES, strict=True)))


def _log(ops):
    """The runs as the tracer records them, and the same accesses one row per lane, in issue order."""
    runs, lanes = [], []
    for seq, (prog, epoch, shape, kind, size, spans) in enumerate(ops):
        lane = 0
        for addr, count in spans:
            runs.append((addr, size, prog, lane, shape, epoch, seq, *KINDS[kind], count))
            lanes += [(addr + i * size, size, prog, lane + i, shape, epoch, seq, *KINDS[kind], 1) for i in range(count)]
            lane += count + 1
    return _table(runs), _table(lanes)


def _expected_pairs(acc):
    found = set()
    for i in range(len(acc)):
        for j in range(i + 1, len(acc)):
            shared = set(range(int(acc.addr[i]), int(acc.addr[i] + acc.size[i]))) & \
                set(range(int(acc.addr[j]), int(acc.addr[j] + acc.size[j])))
            if not shared or not (acc.writes[i] or acc.writes[j]) or (acc.atomic[i] and acc.atomic[j]):
                continue
            same_thread = acc.lane[i] == acc.lane[j] and acc.shape[i] == acc.shape[j]
            if acc.prog[i] == acc.prog[j] and (acc.epoch[i] != acc.epoch[j] or same_thread):
                continue
            kind = "WAW" if acc.writes[i] and acc.writes[j] else "RAW" if acc.writes[i] else "WAR"
            found |= {(b, i, j, kind) for b in shared}
    return found


def _expected_shared(acc):
    """Some byte written by one program (atomics included) and touched by another."""
    def touched(r):
        return set(range(int(acc.addr[r]), int(acc.addr[r] + acc.size[r])))

    return any(acc.writes[i] and acc.prog[i] != acc.prog[j] and touched(i) & touched(j)
               for i in range(len(acc)) for j in range(len(acc)))


def _expected_uninit(acc, unwritten):
    rows = set()
    for b in unwritten:
        touching = [r for r in range(len(acc)) if acc.addr[r] <= b < acc.addr[r] + acc.size[r]]
        first_write = min((acc.seq[r] for r in touching if acc.writes[r]), default=None)
        for r in touching:
            if acc.reads[r] and (first_write is None or acc.seq[r] < first_write
                                 or (acc.writes[r] and acc.seq[r] == first_write)):
                rows.add(r)
    return rows


def _who(acc, row):
    """A lane's identity independent of table layout: (op issue order, lane)."""
    return int(acc.seq[row]), int(acc.lane[row])


@given(st.lists(op, max_size=8), st.sets(st.integers(0, 24), max_size=6))
def test_analysis_of_runs_matches_the_pairwise_loop_over_lanes(ops, unwritten):
    runs, lanes = _log(ops)
    marked = np.array(sorted(unwritten), dtype=np.uint64)
    result = tc.analyze(runs, marked)
    got = {(int(b), *_who(result.lanes, i), *_who(result.lanes, j), str(k)) for b, i, j, k in
           zip(result.pairs.byte, result.pairs.first, result.pairs.second, result.pairs.kind, strict=True)}
    want = {(b, *_who(lanes, i), *_who(lanes, j), k) for b, i, j, k in _expected_pairs(lanes)}
    assert got == want
    uninit = {_who(lanes, r) for r in _expected_uninit(lanes, unwritten)}
    assert {_who(result.lanes, r) for r in result.uninit} == uninit
    assert result.shared_written == _expected_shared(lanes)
    every_written = {b for r in range(len(lanes)) if lanes.writes[r]
                     for b in range(int(lanes.addr[r]), int(lanes.addr[r] + lanes.size[r]))}
    probe = np.arange(40, dtype=np.uint64)
    assert set(probe[result.written.contains(probe)].tolist()) == every_written


def test_a_tile_loaded_and_stored_back_in_place_expands_nothing_and_a_shifted_one_races():
    def tile(addr, seq, kind, lane=0):
        return (addr, 4, 0, lane, 0, 0, seq, *KINDS[kind], 256)

    in_place = tc.analyze(_table([tile(1000, 0, 0), tile(1000, 1, 1)]))
    assert len(in_place.lanes) == 0 and len(in_place.pairs.first) == 0
    shifted = tc.analyze(_table([tile(1004, 0, 0), tile(1000, 1, 1)]))  # x[i] = x[i + 1], no barrier
    assert len(shifted.lanes) == 512 and set(shifted.pairs.kind) == {tc.WAR}
