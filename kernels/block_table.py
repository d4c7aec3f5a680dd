"""Block-table kernels: gather per-request rows into batch order, token slot mappings, and the
in-place left shift that hides prefix-cache-restored blocks from draft attention (fixes 4 and 5, docs/fixes.md).

Index spaces: ``batch_row`` indexes this step's batch, ``slot`` = ``idx_mapping[batch_row]``
indexes persistent per-request state. Block id 0 is the null block; PAD (-1) in a slot mapping
means "write nothing".
"""

import torch
import triton
import triton.language as tl

from kernels import runtime, validate  # noqa: F401  (runtime: device choice before any kernel)

PAD = -1  # a slot-mapping entry that writes nothing

# compute_slot_mappings takes the row tiles when the batch has at most ROW_PATH_TOKENS_PER_ROW tokens per batch
# row (positions over rows: shapes the host knows, never values, so no sync): decode steps, 1 + k tokens a row for
# up to 3 draft tokens. The bound also caps the row tiles' worst case, every token in one tile, whose
# ROW_TILE_SPLIT programs walk T / (ROW_TILE_SPLIT * ROW_TILE_TOKENS) <= B / 256 steps each: past a small mean,
# one long row would cost more than the token tiles' binary searches save.
ROW_PATH_TOKENS_PER_ROW = 4
ROW_TILE = 64  # batch rows per row tile
ROW_TILE_TOKENS = 128  # tokens a row-tile program maps per step
ROW_TILE_SPLIT = 8  # programs sharing a row tile's tokens, so a long row among short ones is walked 8 ways
PAD_TILE = 1024  # output tokens per PAD program of the row tiles


@triton.jit
def _gather_rows_kernel(persistent_ptr, persistent_stride, idx_mapping_ptr, out_ptr, out_stride, width,
                        BLOCK: tl.constexpr):
    batch_row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(idx_mapping_ptr + batch_row).to(tl.int64)
    live = cols < width
    # A negative slot (a padded batch row) gathers a row of null blocks. It reads slot 0's row
    # (always valid) and discards it, which keeps the load mask a plain bound the compiler can
    # vectorize.
    blocks = tl.load(persistent_ptr + tl.maximum(slot, 0) * persistent_stride + cols, mask=live, other=0)
    blocks = tl.where(slot >= 0, blocks, 0)
    tl.store(out_ptr + batch_row.to(tl.int64) * out_stride + cols, blocks, mask=live)


def gather_block_tables(persistent: torch.Tensor, idx_mapping: torch.Tensor, out: torch.Tensor) -> None:
    """``out[b] = persistent[idx_mapping[b]]`` for ``b < len(idx_mapping)``; later rows untouched.

    persistent [S, W] int32 (indexed by slot), idx_mapping [B] int32, out [R >= B, W] int32
    (indexed by batch row). A negative slot gives a row of null blocks (0).
    """
    validate.tensor("persistent", persistent, dtype=torch.int32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("out", out, dtype=torch.int32, ndim=2)
    validate.on_kernel_device(persistent=persistent, idx_mapping=idx_mapping, out=out)
    if out.shape[1] != persistent.shape[1]:
        raise ValueError(f"out: width {out.shape[1]} differs from persistent width {persistent.shape[1]}")
    num_rows = idx_mapping.numel()
    if num_rows > out.shape[0]:
        raise ValueError(f"out: {out.shape[0]} rows, but idx_mapping has {num_rows} batch rows")
    width = persistent.shape[1]
    if num_rows == 0 or width == 0:
        return
    if persistent.shape[0] == 0:
        raise ValueError("persistent: has no slot rows, but idx_mapping has batch rows")
    validate.indices("idx_mapping", idx_mapping, -1, persistent.shape[0], what="slot")
    block = min(1024, triton.next_power_of_2(width))
    grid = (num_rows, triton.cdiv(width, block))
    _gather_rows_kernel[grid](persistent, persistent.stride(0), idx_mapping, out, out.stride(0), width, BLOCK=block)


# Only the token counts are specialized (their divisibility keeps positions and out vectorized); the
# rest change from batch to batch and would each double the compiled variants.
@triton.jit(do_not_specialize=["block_table_stride", "width", "block_size", "num_batch_rows", "search_steps"])
def _slot_mapping_kernel(block_table_ptr, block_table_stride, width, query_start_loc_ptr, positions_ptr,
                         num_positions, out_ptr, num_out, block_size, num_batch_rows, search_steps,
                         BLOCK: tl.constexpr):
    # The token-tile path: one program per tile of output tokens, whatever the batch rows' lengths: a
    # long prefill row is spread over many programs, and the padding tail is just tokens past the batch.
    first = tl.program_id(0).to(tl.int64) * BLOCK
    tokens = first + tl.arange(0, BLOCK)
    end_of_batch = tl.load(query_start_loc_ptr + num_batch_rows)
    live = (tokens >= tl.load(query_start_loc_ptr)) & (tokens < end_of_batch)
    # A token's batch row is the last b with query_start_loc[b] <= token (empty rows share a start;
    # the last of them owns the tokens). The tile's first token's row comes from one scalar binary
    # search; when the whole tile lies in that row (prefill-sized rows) every lane takes it.
    lo = first.to(tl.int32) * 0
    hi = lo + num_batch_rows - 1
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        right = tl.load(query_start_loc_ptr + mid) <= first
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid - 1)
    rows = tl.zeros((BLOCK,), tl.int32) + lo
    row_end = tl.load(query_start_loc_ptr + lo + 1, mask=num_batch_rows > 0, other=0)
    if (first + BLOCK > row_end) & (first < end_of_batch):
        # Several rows in the tile (decode-sized rows): a binary search per lane, from the first row on.
        hi_lanes = rows * 0 + num_batch_rows - 1
        for _ in range(search_steps):
            mid = (rows + hi_lanes + 1) // 2
            right = tl.load(query_start_loc_ptr + mid, mask=live, other=0) <= tokens
            rows = tl.where(right, mid, rows)
            hi_lanes = tl.where(right, hi_lanes, mid - 1)
    # The bounds are kernel arguments (not loaded values), so these accesses stay vectorized.
    pos = tl.load(positions_ptr + tokens, mask=tokens < num_positions, other=0)
    block_idx = pos // block_size
    # Never read outside the row: an index past the width (or a negative position) is PAD.
    in_row = live & (pos >= 0) & (block_idx < width)
    block_id = tl.load(block_table_ptr + rows.to(tl.int64) * block_table_stride + block_idx, mask=in_row,
                       other=0).to(tl.int64)
    slot_id = tl.where(in_row & (block_id != 0), block_id * block_size + pos % block_size, -1)
    tl.store(out_ptr + tokens, slot_id, mask=tokens < num_out)  # tokens past the batch: PAD


# The row tiles, for decode-sized batches (a few tokens per batch row). There the token tiles are pure load
# latency: each finds its rows by binary searches of query_start_loc, log2(B) dependent loads. A row tile owns
# ROWS consecutive batch rows and their tokens, from its first row's start to its last row's end; it loads the
# rows' starts as one vector (no search), and SPLIT programs walk its tokens in steps of TOKENS, each token's
# row being the last of the tile's rows that starts at or before it (so an empty row sharing a start owns
# nothing). A long row among short ones lengthens only its own tile's walk, shared by the SPLIT programs.
# Tokens outside every row (before query_start_loc[0], from query_start_loc[B] up to num_out) get PAD from
# PAD_BLOCK-token programs after the row tiles', in the same launch. num_out alone is specialized (it keeps the
# PAD stores vectorized).
@triton.jit(do_not_specialize=["block_table_stride", "width", "block_size", "num_batch_rows"])
def _slot_mapping_rows_kernel(block_table_ptr, block_table_stride, width, query_start_loc_ptr, positions_ptr,
                              out_ptr, num_out, block_size, num_batch_rows, ROWS: tl.constexpr,
                              TOKENS: tl.constexpr, SPLIT: tl.constexpr, PAD_BLOCK: tl.constexpr):
    row_programs = tl.cdiv(num_batch_rows, ROWS) * SPLIT
    pid = tl.program_id(0)
    if pid < row_programs:
        first_row = pid // SPLIT * ROWS
        rows = first_row + tl.arange(0, ROWS)
        # rows past the batch start past every token: they own none
        starts = tl.load(query_start_loc_ptr + rows, mask=rows < num_batch_rows, other=2**31 - 1)
        tile_end = tl.load(query_start_loc_ptr + tl.minimum(first_row + ROWS, num_batch_rows))
        walk_start = tl.load(query_start_loc_ptr + first_row) + pid % SPLIT * TOKENS
        for step in range(walk_start, tile_end, SPLIT * TOKENS):
            tokens = step + tl.arange(0, TOKENS)
            live = tokens < tile_end
            token_rows = first_row - 1 + tl.sum((starts[None, :] <= tokens[:, None]).to(tl.int32), axis=1)
            pos = tl.load(positions_ptr + tokens, mask=live, other=0)
            block_idx = pos // block_size
            # Never read outside the row: an index past the width (or a negative position) is PAD.
            in_row = live & (pos >= 0) & (block_idx < width)
            block_id = tl.load(block_table_ptr + token_rows.to(tl.int64) * block_table_stride + block_idx,
                               mask=in_row, other=0).to(tl.int64)
            slot_id = tl.where(in_row & (block_id != 0), block_id * block_size + pos % block_size, -1)
            tl.store(out_ptr + tokens, slot_id, mask=live)
    else:
        tokens = (pid - row_programs).to(tl.int64) * PAD_BLOCK + tl.arange(0, PAD_BLOCK)
        outside = (tokens < tl.load(query_start_loc_ptr)) | (tokens >= tl.load(query_start_loc_ptr + num_batch_rows))
        tl.store(out_ptr + tokens, -1, mask=outside & (tokens < num_out))


def compute_slot_mappings(block_table: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
                          block_size: int, out: torch.Tensor) -> None:
    """Physical KV slot of every token: ``block_table[b, pos // bs] * bs + pos % bs``.

    Token t of batch row b lies in ``[query_start_loc[b], query_start_loc[b+1])``. Tokens from
    ``query_start_loc[-1]`` up to ``len(out)`` get PAD, as do positions whose block index is
    negative or at/past the row width, and positions that land on the null block.
    block_table [R, W] int32 (batch rows), query_start_loc [B+1] int32, positions [T] int64,
    out [N >= T] int64.
    """
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, min_numel=1)
    validate.tensor("positions", positions, dtype=torch.int64, ndim=1)
    validate.tensor("out", out, dtype=torch.int64, ndim=1)
    validate.positive_int("block_size", block_size)
    validate.on_kernel_device(block_table=block_table, query_start_loc=query_start_loc, positions=positions, out=out)
    num_batch_rows = query_start_loc.numel() - 1
    if num_batch_rows > block_table.shape[0]:
        raise ValueError(f"block_table: {block_table.shape[0]} rows, but query_start_loc describes {num_batch_rows}")
    if out.numel() < positions.numel():
        raise ValueError(f"out: {out.numel()} entries, fewer than the {positions.numel()} positions")
    validate.offsets("query_start_loc", query_start_loc, positions.numel())
    if out.numel() == 0:
        return
    if positions.numel() <= ROW_PATH_TOKENS_PER_ROW * num_batch_rows:
        grid = (triton.cdiv(num_batch_rows, ROW_TILE) * ROW_TILE_SPLIT + triton.cdiv(out.numel(), PAD_TILE),)
        _slot_mapping_rows_kernel[grid](block_table, block_table.stride(0), block_table.shape[1], query_start_loc,
                                        positions, out, out.numel(), block_size, num_batch_rows, ROWS=ROW_TILE,
                                        TOKENS=ROW_TILE_TOKENS, SPLIT=ROW_TILE_SPLIT, PAD_BLOCK=PAD_TILE,
                                        num_warps=4)
        return
    block = 256  # on an H200, tiles of 256 tokens beat 512 to 4096
    _slot_mapping_kernel[(triton.cdiv(out.numel(), block),)](
        block_table, block_table.stride(0), block_table.shape[1], query_start_loc, positions, positions.numel(), out,
        out.numel(), block_size, num_batch_rows, max(1, num_batch_rows).bit_length(), BLOCK=block, num_warps=4)


# Widths, strides and block sizes change from case to case: one compiled variant for all of them.
@triton.jit(do_not_specialize=["block_table_stride", "width", "block_size"])
def _shift_rows_kernel(block_table_ptr, block_table_stride, width, idx_mapping_ptr, num_cached_tokens_ptr,
                       seq_lens_ptr, block_size, CHUNK: tl.constexpr):
    batch_row = tl.program_id(0)
    slot = tl.load(idx_mapping_ptr + batch_row)
    num_cached = tl.load(num_cached_tokens_ptr + slot, mask=slot >= 0, other=0)
    shift = num_cached // block_size
    if shift > 0:
        row_ptr = block_table_ptr + batch_row.to(tl.int64) * block_table_stride
        # int64: cdiv adds block_size - 1 first, which wraps an int32 seq_len near 2^31 negative
        needed = tl.cdiv(tl.load(seq_lens_ptr + batch_row).to(tl.int64), block_size)
        n = tl.minimum(width - shift, needed)
        # Ascending chunks, never pipelined or unrolled: a chunk's sources lie to its right and
        # must be read before the next chunk overwrites them.
        for start in tl.range(0, n, CHUNK, num_stages=1, loop_unroll_factor=1):
            cols = start + tl.arange(0, CHUNK)
            keep = cols < n
            blocks = tl.load(row_ptr + cols + shift, mask=keep)
            # Source and destination overlap when shift < CHUNK: every lane of the program must
            # finish its loads before any lane stores (warps are not in lock step). The barrier
            # also keeps a fast warp from storing chunk i+1 before a slow one loaded chunk i.
            tl.debug_barrier()
            tl.store(row_ptr + cols, blocks, mask=keep)


def shift_block_table_rows(block_table: torch.Tensor, idx_mapping: torch.Tensor, num_cached_tokens: torch.Tensor,
                           seq_lens: torch.Tensor, block_size: int, *, chunk: int = 1024,
                           num_warps: int | None = None) -> None:
    """Shift batch row b left, in place, by ``num_cached_tokens[idx_mapping[b]] // block_size``.

    ``n = min(width - shift, ceil(seq_lens[b] / block_size))`` entries are copied
    (``row[j] = old_row[j + shift]`` for j < n); entries from n on are untouched; a shift of 0
    (or a negative slot) writes nothing. The count is looked up by request slot, the row and
    seq_lens by batch row. ``chunk`` and ``num_warps`` are launch knobs for stress sweeps.
    """
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("num_cached_tokens", num_cached_tokens, dtype=torch.int32, ndim=1)
    validate.tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1)
    validate.positive_int("block_size", block_size)
    validate.power_of_two("chunk", chunk)
    if num_warps is not None:
        validate.power_of_two("num_warps", num_warps)
    validate.on_kernel_device(block_table=block_table, idx_mapping=idx_mapping, num_cached_tokens=num_cached_tokens,
                      seq_lens=seq_lens)
    num_batch_rows = idx_mapping.numel()
    if num_batch_rows > block_table.shape[0]:
        raise ValueError(f"block_table: {block_table.shape[0]} rows, but idx_mapping has {num_batch_rows} batch rows")
    if seq_lens.numel() < num_batch_rows:
        raise ValueError(f"seq_lens: {seq_lens.numel()} entries, but idx_mapping has {num_batch_rows} batch rows")
    if num_batch_rows == 0:
        return
    validate.indices("idx_mapping", idx_mapping, -1, num_cached_tokens.numel(), what="slot")
    # 8 warps keep more of a row's loads in flight than 4: 0.85x of copy bandwidth on an H200 against 0.80x.
    extra = {"num_warps": 8 if num_warps is None else num_warps}
    _shift_rows_kernel[(num_batch_rows,)](block_table, block_table.stride(0), block_table.shape[1], idx_mapping,
                                          num_cached_tokens, seq_lens, block_size, CHUNK=chunk, **extra)


def has_unaligned_cached_prefix(num_cached_tokens, idx_mapping, block_sizes) -> bool:
    """True when a live slot's cached count is not a multiple of some block size (fail closed).

    A whole-block shift cannot hide a partial restored block, so such a batch must not draft.
    Negative entries of ``idx_mapping`` are padded rows and are ignored.
    """
    sizes = list(block_sizes)
    if not sizes:
        raise ValueError("block_sizes: empty; pass the kernel block size of every draft KV group")
    for bs in sizes:
        validate.positive_int("block_sizes", bs)
    slots = torch.as_tensor(idx_mapping).to(torch.int64).flatten()
    cached = torch.as_tensor(num_cached_tokens).to(torch.int64).flatten()
    slots = slots[slots >= 0]
    if slots.numel() and int(slots.max()) >= cached.numel():
        raise ValueError(f"idx_mapping: slot {int(slots.max())} out of range for {cached.numel()} num_cached_tokens")
    live = cached.cpu()[slots.cpu()]
    return any(bool((live % bs != 0).any()) for bs in sizes)
