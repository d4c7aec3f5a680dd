"""Hand-worked block-table cases (the upstream tests of fixes 4 and 5, docs/fixes.md), each checked on kernel and
reference alike."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kernels.block_table as kbt
import reference.block_table as rbt


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def shift_both(device, table, idx_mapping, cached, seq_lens, block_size, **launch):
    """Shift with the kernel (on the kernel device) and the reference; both must agree."""
    expected = rbt.shift_block_table_rows(table, idx_mapping, cached, seq_lens, block_size)
    on_dev = table.clone().to(device)
    kbt.shift_block_table_rows(on_dev, idx_mapping.to(device), cached.to(device), seq_lens.to(device), block_size,
                               **launch)
    assert torch.equal(on_dev.cpu(), expected)
    return expected


@pytest.mark.parametrize("num_cached,shift", [(0, 0), (15, 0), (31, 1), (32, 2), (33, 2), (47, 2), (48, 3),
                                              (49, 3), (53, 3)])
def test_shift_floors_cached_count(num_cached, shift, device):
    orig = torch.arange(64, dtype=torch.int32).view(1, 64)
    row = shift_both(device, orig, i32([0]), i32([num_cached]), i32([64 * 16]), 16)
    assert torch.equal(row[0, :64 - shift], orig[0, shift:])
    assert torch.equal(row[0, 64 - shift:], orig[0, 64 - shift:])


def test_shift_count_by_slot_row_by_batch_row(device):
    orig = torch.arange(4 * 64, dtype=torch.int32).view(4, 64)
    idx_mapping = i32([3, 2, 1, 0])
    cached_by_slot = i32([0, 16, 32, 48])
    out = shift_both(device, orig, idx_mapping, cached_by_slot, i32([64 * 16] * 4), 16)
    for batch_row, slot in enumerate([3, 2, 1, 0]):
        assert torch.equal(out[batch_row, :64 - slot], orig[batch_row, slot:])


def test_shift_long_row_in_place_overlap(device):
    orig = torch.arange(4096, dtype=torch.int32).view(1, 4096)
    out = shift_both(device, orig, i32([0]), i32([7 * 16]), i32([4096 * 16]), 16)
    assert torch.equal(out[0, :4089], orig[0, 7:])


@pytest.mark.parametrize("chunk", [16, 64, 1024])
def test_shift_across_chunks(chunk, device):
    orig = torch.arange(300, dtype=torch.int32).view(1, 300)
    out = shift_both(device, orig, i32([0]), i32([5 * 16]), i32([300 * 16]), 16, chunk=chunk)
    assert torch.equal(out[0, :295], orig[0, 5:])


def test_shift_bounded_by_seq_len(device):
    orig = torch.arange(64, dtype=torch.int32).view(1, 64)
    out = shift_both(device, orig, i32([0]), i32([4 * 16]), i32([56]), 16)  # 3.5 blocks -> 4 entries copied
    assert torch.equal(out[0, :4], orig[0, 4:8])
    assert torch.equal(out[0, 4:], orig[0, 4:])


def test_shift_zero_writes_nothing(device):
    orig = torch.arange(32, dtype=torch.int32).view(2, 16)
    out = shift_both(device, orig, i32([1, 0]), i32([15, 3]), i32([256, 256]), 16)
    assert torch.equal(out, orig)


def test_gather_rows_by_slot(device):
    persistent = torch.arange(40, dtype=torch.int32).view(5, 8)
    out = torch.full((4, 8), -9, dtype=torch.int32)
    expected = rbt.gather_block_tables(persistent, i32([4, 0, -1]), out)
    assert torch.equal(expected[0], persistent[4]) and torch.equal(expected[1], persistent[0])
    assert torch.equal(expected[2], torch.zeros(8, dtype=torch.int32))
    assert torch.equal(expected[3], out[3])  # past the batch: untouched
    on_dev = out.clone().to(device)
    kbt.gather_block_tables(persistent.to(device), i32([4, 0, -1]).to(device), on_dev)
    assert torch.equal(on_dev.cpu(), expected)


def test_slot_mapping_hand_worked(device):
    table = i32([[0, 5, 9, 0], [7, 0, 0, 0]])
    qsl = i32([0, 4, 6])
    positions = torch.tensor([15, 16, 33, 70, 3, 17], dtype=torch.int64)
    out = torch.full((9,), -5, dtype=torch.int64)
    # row 0: pos 15 -> null block 0; 16 -> 5*16+0; 33 -> 9*16+1; 70 -> block index 4 past width 4
    # row 1: pos 3 -> 7*16+3; 17 -> null block; tokens 6..8 are padding
    want = torch.tensor([-1, 80, 145, -1, 115, -1, -1, -1, -1])
    assert torch.equal(rbt.compute_slot_mappings(table, qsl, positions, 16, out), want)
    on_dev = out.clone().to(device)
    kbt.compute_slot_mappings(table.to(device), qsl.to(device), positions.to(device), 16, on_dev)
    assert torch.equal(on_dev.cpu(), want)


@pytest.mark.parametrize("fn", [kbt.has_unaligned_cached_prefix, rbt.has_unaligned_cached_prefix])
def test_unaligned_prefix_detection(fn):
    cached = i32([32, 35, 64])
    assert fn(cached, i32([0, 2]), [16]) is False
    assert fn(cached, i32([0, 1]), [16]) is True
    for count, unaligned in [(31, True), (33, True), (47, True), (49, True), (32, False), (48, False)]:
        assert fn(i32([count]), i32([0]), [16]) is unaligned
    assert fn(i32([32, 35]), i32([0, 1]), [16]) is True
    assert fn(i32([32, 48]), i32([0, 1]), [16]) is False
    assert fn(i32([32, 48]), i32([0, 1]), [16, 32]) is True  # 48 is not a multiple of 32


@pytest.mark.parametrize("call,needle", [
    (lambda dev: kbt.shift_block_table_rows(torch.zeros(2, 4, dtype=torch.int64, device=dev), i32([0]).to(dev),
                                            i32([0]).to(dev), i32([0]).to(dev), 16), "block_table: dtype int64"),
    (lambda dev: kbt.shift_block_table_rows(torch.zeros(2, 4, dtype=torch.int32, device=dev), i32([0]).to(dev),
                                            i32([0]).to(dev), i32([0]).to(dev), 0), "block_size"),
    (lambda dev: kbt.shift_block_table_rows(torch.zeros(2, 4, dtype=torch.int32, device=dev), i32([0]).to(dev),
                                            i32([0]).to(dev), i32([0]).to(dev), 16, chunk=100), "chunk"),
    (lambda dev: kbt.shift_block_table_rows(torch.zeros(1, 4, dtype=torch.int32, device=dev), i32([0, 0]).to(dev),
                                            i32([0]).to(dev), i32([0, 0]).to(dev), 16), "block_table: 1 rows"),
    (lambda dev: kbt.gather_block_tables(torch.zeros(2, 4, dtype=torch.int32, device=dev), i32([0]).to(dev),
                                         torch.zeros(2, 5, dtype=torch.int32, device=dev)), "out: width 5"),
    (lambda dev: kbt.compute_slot_mappings(torch.zeros(2, 4, dtype=torch.int32, device=dev), i32([0, 1]).to(dev),
                                           torch.zeros(4, dtype=torch.int64, device=dev), 16,
                                           torch.zeros(2, dtype=torch.int64, device=dev)), "out: 2 entries"),
    (lambda dev: kbt.has_unaligned_cached_prefix(i32([16]), i32([0]), []), "block_sizes"),
])
def test_bad_arguments_name_the_argument(call, needle, device):
    with pytest.raises(ValueError, match=needle):
        call(device)


@given(width=st.integers(1, 96), rows=st.integers(1, 4), block_size=st.sampled_from([1, 3, 16]),
       chunk=st.sampled_from([16, 32, 1024]), data=st.data())
def test_shift_matches_reference(width, rows, block_size, chunk, data, device):
    table = torch.arange(rows * width, dtype=torch.int32).view(rows, width) + 1
    slots = data.draw(st.permutations(range(rows)))
    cached = i32(data.draw(st.lists(st.integers(0, width * block_size + 5), min_size=rows, max_size=rows)))
    seq_lens = i32(data.draw(st.lists(st.integers(0, width * block_size + 5), min_size=rows, max_size=rows)))
    shift_both(device, table, i32(slots), cached, seq_lens, block_size, chunk=chunk)


@given(rows=st.integers(0, 4), width=st.integers(1, 40), block_size=st.sampled_from([1, 16]), data=st.data())
def test_slot_mapping_matches_reference(rows, width, block_size, data, device):
    table = i32(data.draw(st.lists(st.integers(0, 50), min_size=max(rows, 1) * width,
                                   max_size=max(rows, 1) * width))).view(max(rows, 1), width)
    lens = data.draw(st.lists(st.integers(0, 6), min_size=rows, max_size=rows))
    qsl = i32([0] + [sum(lens[:i + 1]) for i in range(rows)])
    total = int(qsl[-1])
    positions = torch.tensor(data.draw(st.lists(st.integers(-3, width * block_size + 20), min_size=total,
                                                max_size=total)), dtype=torch.int64)
    out = torch.full((total + data.draw(st.integers(0, 5)),), -5, dtype=torch.int64)
    expected = rbt.compute_slot_mappings(table, qsl, positions, block_size, out)
    on_dev = out.clone().to(device)
    kbt.compute_slot_mappings(table.to(device), qsl.to(device), positions.to(device), block_size, on_dev)
    assert torch.equal(on_dev.cpu(), expected)


@pytest.mark.parametrize("lens,first", [([700], 0), ([0, 300, 0, 0, 2, 513, 1], 0), ([1] * 300 + [260, 0], 0),
                                        ([5, 400], 3)])
def test_slot_mapping_rows_across_and_within_tiles(lens, first, device):
    """Rows longer than a tile (one row per tile), many short rows in a tile, empty rows sharing a start,
    and tokens before query_start_loc[0] (PAD: no row owns them)."""
    gen = torch.Generator().manual_seed(len(lens))
    width, block_size = 64, 16
    table = torch.randint(0, 1000, (len(lens), width), dtype=torch.int32, generator=gen)
    qsl = i32([first + sum(lens[:i]) for i in range(len(lens) + 1)])
    total = int(qsl[-1])
    positions = torch.randint(-2, width * block_size + 8, (total,), generator=gen)
    out = torch.full((total + 37,), -5, dtype=torch.int64)
    expected = rbt.compute_slot_mappings(table, qsl, positions, block_size, out)
    on_dev = out.clone().to(device)
    kbt.compute_slot_mappings(table.to(device), qsl.to(device), positions.to(device), block_size, on_dev)
    assert torch.equal(on_dev.cpu(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("num_warps", [1, 4, 8, 16])
@pytest.mark.parametrize("chunk", [128, 1024, 4096])
def test_shift_race_free_on_gpu(chunk, num_warps, device):
    """The fixed kernel under the launch shapes where the barrier-less one fails (anchors 2.5)."""
    orig = torch.arange(16384, dtype=torch.int32).view(1, 16384)
    for shift in (1, 7, chunk - 1, chunk + 1):
        for _ in range(20):
            shift_both(device, orig, i32([0]), i32([shift * 16]), i32([16384 * 16]), 16, chunk=chunk,
                       num_warps=num_warps)


@pytest.mark.gpu
def test_the_slot_mapping_bench_times_an_eager_equivalent_that_agrees(device):
    """Each workload of make bench's slot-mapping rows, small: the kernel and the eager code it is timed against
    compute the same slots (the bench raises where they differ), one row per workload."""
    from stress.bench import kernels as bench

    rows = bench.slot_mapping_rows(device, torch.Generator().manual_seed(0), tokens=1 << 12, rows_b=64,
                                   table_width=64)
    assert [r.split(" (")[1].split(")")[0] for r in rows] == ["random positions", "prefill rows", "decode, 64 rows"]
