"""Philox4x32-10 exactly as ``tl.randint`` / ``tl.rand`` compute it, on CPU tensors.

Sampling kernels draw all their noise from Triton's Philox; a reference that reproduces it bit
for bit lets every sampled token be compared exactly. Key: the int64 seed as two 32-bit halves
(low half first). Counter: the offset's low and high 32 bits, then two zero words. Only the
first output word is used, as ``tl.randint`` does. Arithmetic runs in numpy uint64, where a
32x32-bit product is exact.
"""

import numpy as np
import torch

_ROUNDS = 10
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
# Triton's uint -> [0, 1) scale: the largest float32 with (2^31 - 1) * scale < 1.
_UNIFORM_SCALE = np.float32(4.6566127342e-10)


def _words(values, shift: int) -> np.ndarray:
    """32-bit word ``shift`` bits up of each int64 value, as uint64 (two's complement)."""
    as_u64 = values.reshape(-1).numpy().astype(np.uint64)
    return (as_u64 >> np.uint64(shift)) & _MASK32


def _mul(a: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    product = np.uint64(a) * b
    return product >> _SHIFT, product & _MASK32


def randint(seed, offset) -> torch.Tensor:
    """``tl.randint(seed, offset)`` element for element (broadcast), as uint32 values in int64."""
    seed_t, offset_t = torch.broadcast_tensors(torch.as_tensor(seed, dtype=torch.int64),
                                               torch.as_tensor(offset, dtype=torch.int64))
    k0, k1 = _words(seed_t, 0), _words(seed_t, 32)
    c0, c1 = _words(offset_t, 0), _words(offset_t, 32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    with np.errstate(over="ignore"):
        for _ in range(_ROUNDS):
            hi_b, lo_b = _mul(_ROUND_B, c2)
            hi_a, lo_a = _mul(_ROUND_A, c0)
            c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
            k0 = (k0 + np.uint64(_KEY_A)) & _MASK32
            k1 = (k1 + np.uint64(_KEY_B)) & _MASK32
    return torch.from_numpy(c0.astype(np.int64)).reshape(seed_t.shape)


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """Triton's uint32 -> float32 in [0, 1): read as int32, fold negatives with ~x, scale."""
    as_int32 = bits.to(torch.int64)
    as_int32 = torch.where(as_int32 >= 2**31, as_int32 - 2**32, as_int32)
    folded = torch.where(as_int32 < 0, ~as_int32, as_int32)
    return torch.from_numpy(folded.reshape(-1).to(torch.float32).numpy() * _UNIFORM_SCALE).reshape(bits.shape)


def rand(seed, offset) -> torch.Tensor:
    """``tl.rand(seed, offset)`` element for element: float32 in [0, 1)."""
    return uniform(randint(seed, offset))
