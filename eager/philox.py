"""Philox4x32-10 as ``tl.randint`` / ``tl.rand`` draw it, in torch integer ops on the device of its inputs.

The eager samplers draw their noise where their logits are: a GPU-sized verification of 20,000 trials at a
128k vocabulary needs billions of draws, which ``reference/philox.py`` (numpy, on the host) can neither hold
nor draw in time. Same interface and the same numbers as that module (tests/test_eager.py compares them).
Arithmetic runs in int64: a 32x32-bit product is formed from 16-bit halves of the constant, so no
intermediate passes 2**49. The round and key constants and the uniform scale are that module's.
"""

import torch

from reference.philox import _KEY_A, _KEY_B, _ROUND_A, _ROUND_B, _ROUNDS, _UNIFORM_SCALE

_MASK32 = 0xFFFFFFFF


def _mul(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for a 32-bit constant ``a`` and 32-bit values ``b``."""
    low_part = (a & 0xFFFF) * b  # < 2**48
    high_part = (a >> 16) * b  # < 2**48, weighs 2**16
    lower = ((high_part & 0xFFFF) << 16) + low_part  # the product less high_part's bits from 2**32 up, < 2**49
    return (high_part >> 16) + (lower >> 32), lower & _MASK32


def randint(seed, offset) -> torch.Tensor:
    """``tl.randint(seed, offset)`` element for element (broadcast), as uint32 values in int64."""
    seed_t = torch.as_tensor(seed, dtype=torch.int64)
    offset_t = torch.as_tensor(offset, dtype=torch.int64, device=seed_t.device)
    k0, k1 = seed_t & _MASK32, (seed_t >> 32) & _MASK32  # arithmetic shift: the masked high word is two's complement
    c0, c1 = torch.broadcast_tensors(offset_t & _MASK32, (offset_t >> 32) & _MASK32)
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(_ROUNDS):
        hi_b, lo_b = _mul(_ROUND_B, c2)
        hi_a, lo_a = _mul(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return torch.broadcast_tensors(c0, seed_t)[0].contiguous()


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """Triton's uint32 -> float32 in [0, 1): read as int32, fold negatives with ~x, scale in float32."""
    as_int32 = torch.where(bits >= 2**31, bits - 2**32, bits)
    folded = torch.where(as_int32 < 0, ~as_int32, as_int32)
    return folded.to(torch.float32) * torch.tensor(float(_UNIFORM_SCALE), dtype=torch.float32, device=bits.device)


def rand(seed, offset) -> torch.Tensor:
    """``tl.rand(seed, offset)`` element for element: float32 in [0, 1)."""
    return uniform(randint(seed, offset))
