"""Gumbel-max sampling with per-slot seeds, a position key, inert padded rows and a logits cache.

Index spaces: ``row`` indexes the sampling rows of this launch; ``slot = idx_mapping[row]``
indexes per-request state (temperature, seed, cached logits). Noise for a row comes from
Philox keyed by ``gumbel_seed = randint(seed[slot], position)`` and then
``rand(gumbel_seed, token)`` per vocab entry (docs/contracts/sampling.md#noise-keys), so the verifier and the
drafter can reproduce each other's noise exactly, and a reference can too.

Rows with slot -1 are inert padding (docs/fixes.md#fix-3): temperature 0 and seed 0 are used, and they
write nothing to the logits cache. NaN scores rank below every number (as -inf); ties go to
the lowest token id; a row of -inf/NaN gives token 0. Temperatures that are not > 0 (0, or
NaN) mean greedy.

Work split: one program per (row, vocab split). Few rows over a long vocabulary would leave most of
the GPU idle with one program a row, so a row's vocab tiles are split between programs (the count
depends on the shapes only); each writes its split's best score and lowest best token, and a second
kernel takes the lowest token among the splits holding the row maximum. Both steps are exact, so the
token is the same for every split count.
"""

import torch
import triton
import triton.language as tl

from kernels import runtime, validate  # noqa: F401  (runtime first: it picks compiled vs interpreted)

# Added to the position when drafting, so proposal noise never shares a Philox stream with the
# verifier's accept uniforms and resample noise at the same position.
DRAFT_NOISE_SALT = 1 << 30


@triton.jit
def gumbel_noise(gumbel_seed, tokens):
    """Gumbel noise of each token from ``rand(gumbel_seed, token)``, computed in float64 (an
    accurate log on every device) and rounded once to float32."""
    u = tl.rand(gumbel_seed, tokens).to(tl.float64)
    return (-tl.log(-tl.log(u + 1e-20) + 1e-20)).to(tl.float32)


@triton.jit
def gumbel_scores(logits, temp, gumbel_seed, tokens):
    """``logits / temp + noise``; the division rounds to nearest (plain ``/`` is approximate on GPUs)."""
    return tl.math.div_rn(logits, temp) + gumbel_noise(gumbel_seed, tokens)


@triton.jit
def running_best(scores, tokens, best_scores, best_tokens):
    """Lane-wise running max over vocab blocks, from -inf.

    Strict ``>`` keeps each lane's lowest token, and a NaN score never compares greater, so it
    never wins (it ranks as -inf).
    """
    better = scores > best_scores
    return tl.where(better, scores, best_scores), tl.where(better, tokens, best_tokens)


@triton.jit
def final_best(best_scores, best_tokens, vocab):
    """The lowest token among the lanes holding the row maximum (0 when every score is -inf)."""
    top = tl.max(best_scores, 0)
    return tl.min(tl.where(best_scores == top, best_tokens, vocab), 0)


# Vocab-sized sizes and strides change from batch to batch: no variant per alignment.
@triton.jit(do_not_specialize=["logits_stride", "cache_slot_stride", "cache_col_stride", "vocab", "split_tiles",
                               "num_splits"])
def _gumbel_sample_kernel(logits_ptr, logits_stride, idx_mapping_ptr, temperature_ptr, seeds_ptr, positions_ptr,
                          cache_ptr, cache_slot_stride, cache_col_stride, cache_cols_ptr, out_ptr, split_scores_ptr,
                          split_tokens_ptr, vocab, pos_salt, split_tiles, num_splits,
                          HAS_CACHE: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    slot = tl.load(idx_mapping_ptr + row)
    live = slot >= 0
    live_lanes = (tl.arange(0, BLOCK_V) * 0 + slot) >= 0  # as a block: the interpreter rejects scalar & block masks
    temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)
    seed = tl.load(seeds_ptr + slot, mask=live, other=0)
    pos = tl.load(positions_ptr + row) + pos_salt
    gumbel_seed = (pos * 0).to(tl.uint32)
    if temp > 0:  # greedy rows skip the draw (it costs ~100 ops under the interpreter)
        gumbel_seed = tl.randint(seed, pos)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    if HAS_CACHE:
        col = tl.load(cache_cols_ptr + row).to(tl.int64)
        cache_row_ptr = cache_ptr + slot.to(tl.int64) * cache_slot_stride + col * cache_col_stride
    best_scores = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_tokens = tl.zeros((BLOCK_V,), tl.int32)
    first = split * split_tiles * BLOCK_V
    for v0 in range(first, tl.minimum(vocab, first + split_tiles * BLOCK_V), BLOCK_V):
        tokens = v0 + tl.arange(0, BLOCK_V)
        in_vocab = tokens < vocab
        logits = tl.load(row_ptr + tokens, mask=in_vocab, other=float("-inf"))
        if HAS_CACHE:
            # Bit for bit, before temperature; an inert row stores nothing (docs/fixes.md#fix-3).
            tl.store(cache_row_ptr + tokens, logits, mask=in_vocab & live_lanes)
        scores = logits
        if temp > 0:
            scores = gumbel_scores(logits, temp, gumbel_seed, tokens)
        best_scores, best_tokens = running_best(scores, tokens, best_scores, best_tokens)
    if SPLIT:
        top = tl.max(best_scores, 0)
        part = row.to(tl.int64) * num_splits + split
        tl.store(split_scores_ptr + part, top)
        tl.store(split_tokens_ptr + part, final_best(best_scores, best_tokens, vocab))
    else:
        tl.store(out_ptr + row, final_best(best_scores, best_tokens, vocab).to(tl.int64))


@triton.jit(do_not_specialize=["num_splits", "vocab"])
def _best_of_splits_kernel(split_scores_ptr, split_tokens_ptr, out_ptr, num_splits, vocab, BLOCK_S: tl.constexpr):
    """A row's token from its splits' bests: the lowest token among the splits holding the row maximum (a split
    of -inf alone reports token 0, as a row of -inf gives)."""
    row = tl.program_id(0)
    splits = tl.arange(0, BLOCK_S)
    mask = splits < num_splits
    part = row.to(tl.int64) * num_splits + splits
    scores = tl.load(split_scores_ptr + part, mask=mask, other=float("-inf"))
    tokens = tl.load(split_tokens_ptr + part, mask=mask, other=vocab)
    tl.store(out_ptr + row, final_best(scores, tokens, vocab).to(tl.int64))


PROGRAMS_WANTED = 512  # programs a launch aims at: a few per SM of a large GPU


def vocab_splits(num_rows: int, vocab: int, block: int) -> tuple[int, int]:
    """(vocab tiles per split, splits per row): up to PROGRAMS_WANTED programs in all, whole tiles each, no split
    empty. Shapes alone decide, so the interpreter runs the GPU's split for the same shapes."""
    tiles = -(-vocab // block)
    per_split = -(-tiles // max(1, min(tiles, PROGRAMS_WANTED // num_rows)))
    return per_split, -(-tiles // per_split)


def gumbel_sample(logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                  positions: torch.Tensor, *, draft: bool = False, logits_cache: torch.Tensor | None = None,
                  cache_cols: torch.Tensor | None = None, block_v: int | None = None,
                  num_warps: int | None = None) -> torch.Tensor:
    """Sample one token per row; returns int64 token ids ``[R]``.

    logits [R, V] float32 (by row); idx_mapping [R] int32 (slot of each row, -1 = inert);
    temperature [S] float32 and seeds [S] int64 (by slot); positions [R] int64 (the noise key
    of each row: the position of the predicted token). ``draft`` adds ``DRAFT_NOISE_SALT`` to
    every position. logits_cache [S, K, V] float32 with cache_cols [R] int32: live row r
    stores its logits, unscaled, at ``logits_cache[idx_mapping[r], cache_cols[r]]`` (live rows
    must name distinct (slot, column) pairs; that is not checked, it lives on the device).
    ``block_v`` (vocab tile) and ``num_warps`` are launch knobs for sweeps (powers of two).
    """
    validate.tensor("logits", logits, dtype=torch.float32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("temperature", temperature, dtype=torch.float32, ndim=1)
    validate.tensor("seeds", seeds, dtype=torch.int64, ndim=1)
    validate.tensor("positions", positions, dtype=torch.int64, ndim=1)
    tensors = {"logits": logits, "idx_mapping": idx_mapping, "temperature": temperature, "seeds": seeds,
               "positions": positions}
    num_rows, vocab = logits.shape
    if idx_mapping.numel() != num_rows:
        raise ValueError(f"idx_mapping: {idx_mapping.numel()} entries for {num_rows} logits rows")
    if positions.numel() != num_rows:
        raise ValueError(f"positions: {positions.numel()} entries for {num_rows} logits rows")
    if seeds.numel() != temperature.numel():
        raise ValueError(f"seeds: {seeds.numel()} slots, but temperature has {temperature.numel()}")
    if (logits_cache is None) != (cache_cols is None):
        raise ValueError("logits_cache: pass it together with cache_cols, or neither")
    if logits_cache is not None:
        validate.tensor("logits_cache", logits_cache, dtype=torch.float32, ndim=3)
        validate.tensor("cache_cols", cache_cols, dtype=torch.int32, ndim=1)
        if logits_cache.shape[0] != temperature.numel() or logits_cache.shape[2] != vocab:
            raise ValueError(f"logits_cache: shape {tuple(logits_cache.shape)}, expected "
                             f"[{temperature.numel()}, K, {vocab}]")
        if cache_cols.numel() != num_rows:
            raise ValueError(f"cache_cols: {cache_cols.numel()} entries for {num_rows} logits rows")
        tensors.update(logits_cache=logits_cache, cache_cols=cache_cols)
    validate.on_kernel_device(**tensors)
    validate.indices("idx_mapping", idx_mapping, -1, temperature.numel(), what="slot")
    if logits_cache is not None:
        validate.indices("cache_cols", cache_cols, 0, logits_cache.shape[1], what="column", where=idx_mapping >= 0)
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    if vocab == 0:
        raise ValueError("logits: vocab size 0; there is no token to sample")
    block = validate.power_of_two("block_v", block_v) if block_v is not None else min(
        1024, triton.next_power_of_2(vocab))
    extra = {} if num_warps is None else {"num_warps": validate.power_of_two("num_warps", num_warps)}
    has_cache = logits_cache is not None
    cache_args = (logits_cache, logits_cache.stride(0), logits_cache.stride(1), cache_cols) if has_cache else (
        logits, 0, 0, idx_mapping)
    split_tiles, num_splits = vocab_splits(num_rows, vocab, block)
    split_scores = torch.empty((num_rows, num_splits), dtype=torch.float32, device=logits.device)
    split_tokens = torch.empty((num_rows, num_splits), dtype=torch.int32, device=logits.device)
    _gumbel_sample_kernel[(num_rows, num_splits)](logits, logits.stride(0), idx_mapping, temperature, seeds,
                                                  positions, *cache_args, out, split_scores, split_tokens, vocab,
                                                  DRAFT_NOISE_SALT if draft else 0, split_tiles, num_splits,
                                                  HAS_CACHE=has_cache, BLOCK_V=block, SPLIT=num_splits > 1, **extra)
    if num_splits > 1:
        _best_of_splits_kernel[(num_rows,)](split_scores, split_tokens, out, num_splits, vocab,
                                            BLOCK_S=triton.next_power_of_2(num_splits))
    return out
