"""KV-cache write: token t's key and value go to physical slot ``slot_mapping[t]`` of a paged cache.

A slot is ``block_id * block_size + offset``; the caches are ``[num_blocks, block_size, H_kv, D]``.
PAD (-1) writes nothing (padded and rejected rows, null blocks). Addresses are int64 end to end:
a cache past 2^31 elements is ordinary at long contexts.

The launcher reads nothing back from the device and its grid depends on shapes only, so it can be
captured in a CUDA graph and replayed with other slot mappings.
"""

import torch
import triton
import triton.language as tl

from kernels import runtime, validate  # noqa: F401  (runtime: device choice before any kernel)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit(do_not_specialize=["num_tokens", "block_size"])
def _write_kv_kernel(key_ptr, value_ptr, slot_mapping_ptr, k_cache_ptr, v_cache_ptr, num_tokens, num_heads,
                     head_dim, block_size,
                     key_stride_t, key_stride_h, value_stride_t, value_stride_h,
                     k_stride_b, k_stride_t, k_stride_h, v_stride_b, v_stride_t, v_stride_h,
                     BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    live = tokens < num_tokens
    slot = tl.load(slot_mapping_ptr + tokens, mask=live, other=-1)
    store = live & (slot >= 0)  # PAD writes nothing
    block = slot // block_size
    offset = slot % block_size
    k_row = block * k_stride_b + offset * k_stride_t  # int64: the cache may pass 2^31 elements
    v_row = block * v_stride_b + offset * v_stride_t

    tok = tokens.to(tl.int64)[:, None, None]
    head = heads[None, :, None]
    dim = dims[None, None, :]
    mask = store[:, None, None] & (head < num_heads) & (dim < head_dim)
    k = tl.load(key_ptr + tok * key_stride_t + head * key_stride_h + dim, mask=mask)
    v = tl.load(value_ptr + tok * value_stride_t + head * value_stride_h + dim, mask=mask)
    tl.store(k_cache_ptr + k_row[:, None, None] + head * k_stride_h + dim, k, mask=mask)
    tl.store(v_cache_ptr + v_row[:, None, None] + head * v_stride_h + dim, v, mask=mask)


def write_kv(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, *, block_t: int | None = None, block_h: int | None = None,
             num_warps: int | None = None) -> None:
    """``k_cache[s // bs, s % bs] = key[t]`` (and the same for values) for every token t with s = slot_mapping[t] >= 0.

    key / value [T, H_kv, D]; k_cache / v_cache [num_blocks, block_size, H_kv, D]; one dtype for all
    four (fp16, bf16 or fp32); slot_mapping int64 [>= T] (entries past T are ignored). Slots must be
    distinct among the tokens that write. ``block_t`` (tokens per program), ``block_h`` (heads per
    program) and ``num_warps`` are launch knobs for stress sweeps.
    """
    for name, t in (("key", key), ("value", value)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=3)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=4)
    validate.tensor("slot_mapping", slot_mapping, dtype=torch.int64, ndim=1)
    validate.on_kernel_device(key=key, value=value, slot_mapping=slot_mapping, k_cache=k_cache, v_cache=v_cache)
    validate.same_dtype("store K and V in one dtype", key=key, value=value, k_cache=k_cache, v_cache=v_cache)
    if value.shape != key.shape:
        raise ValueError(f"value: shape {tuple(value.shape)} differs from key {tuple(key.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    num_tokens, num_heads, head_dim = key.shape
    if tuple(k_cache.shape[2:]) != (num_heads, head_dim):
        raise ValueError(f"k_cache: heads and head dim {tuple(k_cache.shape[2:])}, but key has "
                         f"{(num_heads, head_dim)}")
    if slot_mapping.numel() < num_tokens:
        raise ValueError(f"slot_mapping: {slot_mapping.numel()} entries, fewer than the {num_tokens} tokens")
    writing = slot_mapping[:num_tokens]
    validate.indices("slot_mapping", writing, 0, k_cache.shape[0] * k_cache.shape[1], what="slot",
                     where=lambda: writing >= 0)
    for name, knob in (("block_t", block_t), ("block_h", block_h), ("num_warps", num_warps)):
        if knob is not None:
            validate.power_of_two(name, knob)
    if num_tokens == 0 or num_heads == 0 or head_dim == 0 or k_cache.numel() == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    block_h = block_h or min(triton.next_power_of_2(num_heads), max(1, 2048 // block_d))
    block_t = block_t or max(1, 4096 // (block_h * block_d))
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(num_heads, block_h))
    extra = {} if num_warps is None else {"num_warps": num_warps}
    _write_kv_kernel[grid](key, value, slot_mapping, k_cache, v_cache, num_tokens, num_heads, head_dim,
                           k_cache.shape[1], key.stride(0), key.stride(1), value.stride(0), value.stride(1),
                           k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                           v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                           BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d, **extra)
