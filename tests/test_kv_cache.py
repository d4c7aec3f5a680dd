"""KV-cache write: hand-worked slots, PAD, entries past T, strided views, argument checks, CUDA-graph replay."""

import numpy as np
import pytest
import torch
import triton
from hypothesis import given
from hypothesis import strategies as st

import kernels.kv_cache as kkv
import reference.kv_cache as rkv
from stress.families.kv_cache import tile_limit


def write_both(device, key, value, slots, k_cache, v_cache, **launch):
    """Write with the kernel (on the kernel device) and the reference; both must agree bit for bit."""
    expected = rkv.write_kv(key, value, slots, k_cache, v_cache)
    k_dev, v_dev = k_cache.clone().to(device), v_cache.clone().to(device)
    kkv.write_kv(key.to(device), value.to(device), slots.to(device), k_dev, v_dev, **launch)
    for got, want in zip((k_dev.cpu(), v_dev.cpu()), expected, strict=True):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    return expected


def test_hand_worked_slots_pad_and_tail(device):
    key = torch.arange(4 * 2 * 3, dtype=torch.float32).view(4, 2, 3)
    value = -key
    k_cache = torch.full((3, 4, 2, 3), float("nan"))
    # token 0 -> block 2 offset 1; token 1 PAD; token 2 -> block 1 offset 3; token 3 -> block 0 offset 0;
    # the fifth entry lies past T and must be ignored
    slots = torch.tensor([9, -1, 7, 0, 5])
    k_out, v_out = write_both(device, key, value, slots, k_cache, k_cache.clone())
    assert torch.equal(k_out[2, 1], key[0]) and torch.equal(v_out[1, 3], value[2])
    assert torch.equal(k_out[0, 0], key[3])
    written = torch.zeros(3, 4, dtype=torch.bool)
    written[2, 1] = written[1, 3] = written[0, 0] = True
    assert k_out[~written].isnan().all() and v_out[~written].isnan().all()  # PAD and slot 5 wrote nothing


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("launch", [{}, {"block_t": 1, "block_h": 1}, {"block_t": 8, "block_h": 2}])
def test_dtypes_and_tiles(dtype, launch, device):
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(11, 3, 20, generator=gen).to(dtype)
    slots = torch.randperm(6 * 16, generator=gen)[:11]
    slots[::4] = -1
    write_both(device, key, key * 2, slots, torch.zeros(6, 16, 3, 20, dtype=dtype),
               torch.zeros(6, 16, 3, 20, dtype=dtype), **launch)


def test_strided_views(device):
    """Key and value as slices of a fused QKV projection, caches as halves of one [blocks, 2, bs, H, D] tensor."""
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(9, 3, 4, 16, generator=gen)
    kv = torch.zeros(5, 2, 8, 4, 16)
    slots = torch.randperm(5 * 8, generator=gen)[:9]
    expected = rkv.write_kv(qkv[:, 1], qkv[:, 2], slots, kv[:, 0], kv[:, 1])
    qkv_dev, kv_dev = qkv.to(device), kv.clone().to(device)
    kkv.write_kv(qkv_dev[:, 1], qkv_dev[:, 2], slots.to(device), kv_dev[:, 0], kv_dev[:, 1])
    assert torch.equal(kv_dev[:, 0].cpu(), expected[0]) and torch.equal(kv_dev[:, 1].cpu(), expected[1])


def _args(device, **changes):
    args = {"key": torch.zeros(2, 1, 4), "value": torch.zeros(2, 1, 4),
            "slot_mapping": torch.zeros(2, dtype=torch.long), "k_cache": torch.zeros(1, 4, 1, 4),
            "v_cache": torch.zeros(1, 4, 1, 4)}
    args.update(changes)
    return {k: v.to(device) for k, v in args.items()}


@pytest.mark.parametrize("changes,needle", [
    ({"slot_mapping": torch.zeros(2, dtype=torch.int32)}, "slot_mapping: dtype int32"),
    ({"slot_mapping": torch.zeros(1, dtype=torch.long)}, "slot_mapping: 1 entries"),
    ({"value": torch.zeros(2, 1, 4, dtype=torch.float16)}, "value: dtype"),
    ({"k_cache": torch.zeros(1, 4, 2, 4), "v_cache": torch.zeros(1, 4, 2, 4)}, "k_cache: heads and head dim"),
    ({"v_cache": torch.zeros(2, 4, 1, 4)}, "v_cache: shape"),
    ({"key": torch.zeros(2, 4)}, "key: expected 3-D"),
    ({"key": torch.zeros(2, 1, 4, dtype=torch.int32)}, "key: dtype int32"),
])
def test_bad_arguments_name_the_argument(changes, needle, device):
    with pytest.raises(ValueError, match=needle):
        kkv.write_kv(**_args(device, **changes))


@pytest.mark.parametrize("knob", ["block_t", "block_h", "num_warps"])
def test_bad_knob_names_the_knob(knob, device):
    with pytest.raises(ValueError, match=f"^{knob}: expected a power of two"):
        kkv.write_kv(**_args(device), **{knob: 3})


@given(tokens=st.integers(0, 12), heads=st.integers(1, 3), head_dim=st.integers(1, 9),
       block_size=st.sampled_from([1, 4]), dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       data=st.data())
def test_matches_reference(tokens, heads, head_dim, block_size, dtype, data, device):
    num_blocks = tokens // block_size + 2
    picks = data.draw(st.permutations(range(num_blocks * block_size)))
    slots = [s if data.draw(st.booleans()) else -1 for s in picks[:tokens]] + list(picks[tokens:tokens + 2])
    key = torch.arange(tokens * heads * head_dim, dtype=torch.float32).view(tokens, heads, head_dim).to(dtype)
    cache = torch.full((num_blocks, block_size, heads, head_dim), float("nan"), dtype=dtype)
    write_both(device, key, key + 1, torch.tensor(slots, dtype=torch.long), cache, cache.clone())


@pytest.mark.gpu
def test_graph_replay_with_new_slots(device):
    """Captured once, replayed with other slot mappings: no host read on the launch path, shape-only grid."""
    gen = torch.Generator().manual_seed(9)
    key, value = torch.randn(16, 2, 64, generator=gen), torch.randn(16, 2, 64, generator=gen)
    k_cache, v_cache = torch.zeros(8, 16, 2, 64, device=device), torch.zeros(8, 16, 2, 64, device=device)
    static = {"key": key.to(device), "value": value.to(device),
              "slots": torch.full((16,), -1, dtype=torch.long, device=device)}
    kkv.write_kv(static["key"], static["value"], static["slots"], k_cache, v_cache)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kkv.write_kv(static["key"], static["value"], static["slots"], k_cache, v_cache)
    for step in range(3):
        slots = torch.randperm(8 * 16, generator=gen)[:16]
        slots[step::3] = -1
        k_cache.zero_()
        v_cache.zero_()
        static["slots"].copy_(slots)
        graph.replay()
        expected = rkv.write_kv(key, value, slots, torch.zeros(8, 16, 2, 64), torch.zeros(8, 16, 2, 64))
        assert torch.equal(k_cache.cpu(), expected[0]) and torch.equal(v_cache.cpu(), expected[1])


def test_tile_limit_cases_sit_at_tritons_tile_limit():
    """One head of the case fills at most a 2^20-element tile, more than one passes it (what the family meets)."""
    limit = triton.language.TRITON_MAX_TENSOR_NUMEL
    assert tile_limit.own_launch_on == ("cpu", "cuda")
    for device in ("cpu", "cuda"):
        heads, head_dim = tile_limit(np.random.default_rng(0), device, {}).inputs["key"].shape[1:]
        one_head = triton.next_power_of_2(head_dim)
        assert one_head <= limit < 2 * one_head if device == "cpu" else one_head <= limit < heads * one_head


@pytest.mark.parametrize("head_dim", [1, 2])
def test_the_strided_v_cache_refusal_leaves_a_one_wide_head_dim_alone(head_dim):
    """The refusal family's "V cache of innermost stride 2" asks a launcher to refuse what its argument check must
    accept when the head dim is 1 (a one-element innermost dimension is read at index 0 alone): such a case is
    skipped, a wider one gets the stride-2 view."""
    from stress.checks.kv_cache import WRITE_KV_REFUSALS

    corruption = next(c for c in WRITE_KV_REFUSALS.corruptions if c.what == "a V cache of innermost stride 2")
    inputs = {"kv_cache": torch.zeros(2, 3, 4, 2, head_dim)}
    applied = corruption.apply(np.random.default_rng(0), inputs)
    if head_dim == 1:
        assert applied is False and "v_cache" not in inputs
    else:
        assert applied is not False and inputs["v_cache"].stride()[-1] == 2
        assert inputs["v_cache"].shape == (3, 4, 2, head_dim)
