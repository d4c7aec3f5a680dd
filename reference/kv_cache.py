"""Reference KV-cache write: a loop over tokens on copies of the caches."""

import torch


def write_kv(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns new ``(k_cache, v_cache)``: token t stored at slot ``slot_mapping[t]`` unless it is negative (PAD)."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping[:key.shape[0]].tolist()):
        if slot >= 0:
            k_out[slot // block_size, slot % block_size] = key[token]
            v_out[slot // block_size, slot % block_size] = value[token]
    return k_out, v_out
