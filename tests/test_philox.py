"""reference.philox against tl.randint / tl.rand in a tiny kernel, over seeds and offsets of every sign."""

import torch
import triton
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from reference import philox

INT64 = st.integers(-(2**63), 2**63 - 1)


@triton.jit
def _philox_kernel(seed_ptr, offset_ptr, bits_ptr, uniform_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    live = i < n
    seed = tl.load(seed_ptr)
    offsets = tl.load(offset_ptr + i, mask=live, other=0)
    tl.store(bits_ptr + i, tl.randint(seed, offsets).to(tl.int64) & 0xFFFFFFFF, mask=live)
    tl.store(uniform_ptr + i, tl.rand(seed, offsets), mask=live)


def _kernel_draws(device: torch.device, seed: int, offsets: list[int]):
    offs = torch.tensor(offsets, dtype=torch.int64, device=device)
    bits = torch.empty_like(offs)
    uniform = torch.empty(len(offsets), dtype=torch.float32, device=device)
    block = triton.next_power_of_2(len(offsets))
    _philox_kernel[(1,)](torch.tensor([seed], dtype=torch.int64, device=device), offs, bits, uniform, len(offsets),
                         BLOCK=block)
    return bits.cpu(), uniform.cpu()


def test_known_values_are_stable(device):
    """Seed 0, offset 0 and a negative seed: the reference must agree with the kernel."""
    for seed in (0, 1, -1, 2**62 + 12345):
        bits, uniform = _kernel_draws(device, seed, [0, 1, 2**31, -1])
        assert torch.equal(philox.randint(seed, torch.tensor([0, 1, 2**31, -1])), bits)
        assert torch.equal(philox.rand(seed, torch.tensor([0, 1, 2**31, -1])), uniform)


@given(seed=INT64, offsets=st.lists(INT64 | st.integers(0, 2**31), min_size=1, max_size=16))
def test_reference_matches_triton(seed, offsets, device):
    bits, uniform = _kernel_draws(device, seed, offsets)
    offs = torch.tensor(offsets, dtype=torch.int64)
    assert torch.equal(philox.randint(seed, offs), bits)
    assert torch.equal(philox.rand(seed, offs), uniform)
    assert bool(((uniform >= 0) & (uniform < 1)).all())


def test_uint32_seed_chain_matches(device):
    """The Gumbel key chain: rand(randint(seed, pos), token) with a uint32 seed."""
    pos_bits = philox.randint(-5, torch.tensor([7]))
    bits, uniform = _kernel_draws(device, int(pos_bits), list(range(10)))
    assert torch.equal(philox.rand(pos_bits, torch.arange(10)), uniform)
    assert torch.equal(philox.randint(pos_bits, torch.arange(10)), bits)
