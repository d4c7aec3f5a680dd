"""The KV-cache write of ``kernels.kv_cache`` in plain tensor ops: token t's key and value go to physical slot
``slot_mapping[t]`` of a paged cache ``[num_blocks, block_size, H_kv, D]``; PAD (-1) writes nothing.

The argument checks repeat the launcher's (same helpers, same messages): they are inline there, where its
planted refusal bugs patch them.
"""

import torch

from kernels import validate

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def write_kv(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> None:
    """``k_cache[s // bs, s % bs] = key[t]`` (and the same for values) for every token t with
    ``s = slot_mapping[t] >= 0``; entries of ``slot_mapping`` past the tokens are ignored. Bit for bit: an
    indexed copy, no arithmetic on the values."""
    for name, t in (("key", key), ("value", value)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=3)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=4)
    validate.tensor("slot_mapping", slot_mapping, dtype=torch.int64, ndim=1)
    validate.same_device(key=key, value=value, slot_mapping=slot_mapping, k_cache=k_cache, v_cache=v_cache)
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
    if num_tokens == 0 or num_heads == 0 or head_dim == 0 or k_cache.numel() == 0:
        return
    stored = writing >= 0
    slots = writing[stored]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[stored]
    v_cache[blocks, offsets] = value[stored]
