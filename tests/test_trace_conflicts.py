"""The vectorized conflict analysis against a pair-by-pair loop that is obviously right."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stress import trace_conflicts as tc

# (reads, writes, atomic) per op kind: load, store, atomic RMW, atomic load
KINDS = ((True, False, False), (False, True, False), (True, True, True), (True, False, True))

op = st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 1), st.sampled_from(range(len(KINDS))),
               st.sampled_from((1, 2, 4)), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12)), max_size=4))


def _log(ops):
    """Rows in issue order; every lane of one op shares its program, epoch, shape, kind and size."""
    rows = []
    for seq, (prog, epoch, shape, kind, size, lanes) in enumerate(ops):
        for lane, addr in dict(lanes).items():
            rows.append((addr, size, prog, lane, shape, epoch, seq, *KINDS[kind]))
    cols = list(zip(*rows, strict=True)) if rows else [()] * 10
    types = (np.uint64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, bool, bool, bool)
    return tc.Accesses(*(np.array(c, dtype=t) for c, t in zip(cols, types, strict=True)))


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


@given(st.lists(op, max_size=8), st.sets(st.integers(0, 16), max_size=6))
def test_analysis_matches_the_pairwise_loop(ops, unwritten):
    acc = _log(ops)
    marked = np.array(sorted(unwritten), dtype=np.uint64)
    result = tc.analyze(acc, marked)
    got = {(int(b), int(i), int(j), str(k)) for b, i, j, k in
           zip(result.pairs.byte, result.pairs.first, result.pairs.second, result.pairs.kind, strict=True)}
    assert got == _expected_pairs(acc)
    assert set(result.uninit.tolist()) == _expected_uninit(acc, unwritten)
    assert result.shared_written == _expected_shared(acc)
