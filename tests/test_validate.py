"""Index inputs a kernel follows (slots, offsets, cache columns) are refused when out of range: always
for CPU tensors, on a GPU only when asked (SPECSAN_CHECK_INDICES=1), since checking there would
synchronize the stream on every launch."""

import pytest
import torch

from kernels import validate
from stress import checks
from stress.core import cases, guards

# (check, family, input, the value that is one past the end, the launcher's name for it)
OUT_OF_RANGE = [
    ("block_table.gather", "basic", "idx_mapping", lambda i: i["persistent"].shape[0], "slot"),
    ("block_table.shift", "overlap", "idx_mapping", lambda i: i["num_cached_tokens"].numel(), "slot"),
    ("block_table.slot_mapping", "basic", "query_start_loc", lambda i: i["positions"].numel() + 1, "offset"),
    ("sampling.gumbel", "mixed", "idx_mapping", lambda i: i["temperature"].numel(), "slot"),
    ("sampling.gumbel", "mixed", "cache_cols", lambda i: i["logits_cache"].shape[1], "column"),
    ("rejection.verify", "mixed", "idx_mapping", lambda i: i["temperature"].numel(), "slot"),
]


def _case_with(check_name, family, name, value, device):
    check = checks.get(check_name)
    for seed in range(50):  # a case whose last entry is live (cache columns are only followed for live rows)
        inputs = guards.fresh_inputs(cases.build_case(check, family, seed, "cpu"))
        if "idx_mapping" not in inputs or int(inputs["idx_mapping"][-1]) >= 0:
            break
    inputs[name][-1] = value(inputs)
    return check, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.parametrize("check_name,family,name,value,what", OUT_OF_RANGE, ids=[f"{c}-{n}" for c, _, n, _, _ in
                                                                                  OUT_OF_RANGE])
def test_an_index_past_the_end_is_refused_on_the_cpu(check_name, family, name, value, what, device):
    if device.type != "cpu":
        pytest.skip("kernels run on the GPU here; see the opt-in test")
    check, inputs = _case_with(check_name, family, name, value, "cpu")
    with pytest.raises(ValueError, match=rf"^{name}: {what} -?\d+ at \[\d+\] is outside \[-?\d+, \d+\)"):
        check.kernel(**inputs)


def test_a_slot_below_minus_one_is_refused():
    with pytest.raises(ValueError, match=r"idx_mapping: slot -2 at \[1\] is outside \[-1, 4\)"):
        validate.indices("idx_mapping", torch.tensor([0, -2, 3], dtype=torch.int32), -1, 4, what="slot")
    with pytest.raises(ValueError, match="offsets must not decrease"):
        validate.offsets("query_start_loc", torch.tensor([0, 3, 2], dtype=torch.int32), 5)


@pytest.mark.gpu
def test_on_the_gpu_indices_are_not_read_back_unless_asked(monkeypatch):
    """By default the check costs nothing on a GPU: no synchronization at all (sync debug mode
    would raise); with SPECSAN_CHECK_INDICES=1 it refuses the bad slot like on the CPU."""
    slots = torch.tensor([0, 9], dtype=torch.int32, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        validate.indices("idx_mapping", slots, -1, 4, what="slot")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setattr(validate, "CHECK_INDICES_ON_GPU", True)
    with pytest.raises(ValueError, match=r"idx_mapping: slot 9 at \[1\] is outside \[-1, 4\)"):
        validate.indices("idx_mapping", slots, -1, 4, what="slot")


@pytest.mark.parametrize("misplaced", ["first", "middle", "last"])
def test_the_device_check_names_the_tensor_off_the_device_wherever_it_stands(misplaced):
    """A tensor on another device is named, also when it comes first: comparing every tensor with the first
    one named the first that differed from it (the next, well placed, argument)."""
    from kernels import runtime

    names = ["first", "middle", "last"]
    here = torch.zeros(2, device=runtime.DEVICE)
    tensors = {name: torch.zeros(2, device="meta") if name == misplaced else here for name in names}
    with pytest.raises(ValueError, match=f"^{misplaced}: on meta"):
        validate.on_kernel_device(**tensors)
    with pytest.raises(ValueError, match=f"^{misplaced}: on meta, but"):
        validate.same_device(**tensors)
    assert validate.on_kernel_device(**{name: here for name in names}) == here.device


def test_a_tensor_on_another_device_is_handed_over_unguarded():
    """A refusal case's tensor on the meta device has no data to copy or guard: the call gets it as it is."""
    placed, args = guards.guarded({"a": torch.zeros(3), "b": torch.zeros(3, device="meta")}, torch.device("cpu"))
    assert list(placed) == ["a"] and args["b"].is_meta and not args["a"].is_meta


def test_the_dtype_check_names_the_tensor_unlike_the_others():
    """A key unlike value and both caches is named itself (comparing with the first tensor named value); on a
    tie the first tensor's dtype is the one meant, as before."""
    half, full = torch.zeros(2, dtype=torch.float16), torch.zeros(2)
    with pytest.raises(ValueError, match="^key: dtype torch.float32, but value is torch.float16; fix it$"):
        validate.same_dtype("fix it", key=full, value=half, k_cache=half, v_cache=half)
    with pytest.raises(ValueError, match="^k_cache: dtype torch.float16, but key is torch.float32"):
        validate.same_dtype("fix it", key=full, value=full, k_cache=half, v_cache=half)
    assert validate.same_dtype("fix it", key=half, value=half) == torch.float16


def test_a_size_one_innermost_dimension_takes_any_stride_and_a_wider_one_only_one():
    """An innermost dimension of one element is read at index 0 alone, so its stride cannot mislead a kernel: a
    ``[N, 1]`` transposed view is accepted (torch calls it contiguous, and ``.contiguous()`` would hand it back
    unchanged, so refusing it would give advice that cannot be followed); a wider one of stride 2 is refused."""
    column = torch.arange(3, dtype=torch.int32).view(1, 3).t()  # [3, 1], strides (1, 3)
    assert column.stride(-1) == 3 and column.is_contiguous() and column.contiguous().stride() == column.stride()
    assert validate.tensor("persistent", column, dtype=torch.int32, ndim=2) is column
    with pytest.raises(ValueError, match=r"^persistent: innermost stride 2, expected 1; pass \.contiguous\(\)$"):
        validate.tensor("persistent", torch.zeros(3, 4, dtype=torch.int32)[:, ::2])


def test_a_launcher_reads_a_one_wide_table_of_any_innermost_stride(device):
    """``gather_block_tables`` on one-block-wide tables laid out as transposed ``[S, 1]`` and ``[R, 1]`` views:
    the reference's rows, written in the output's own layout."""
    from kernels.block_table import gather_block_tables
    from reference.block_table import gather_block_tables as reference

    persistent = torch.tensor([[7, 8, 9, 10]], dtype=torch.int32, device=device).t()  # [4, 1], strides (1, 4)
    idx_mapping = torch.tensor([2, -1, 0], dtype=torch.int32, device=device)
    out = torch.full((1, 4), -5, dtype=torch.int32, device=device).t()
    gather_block_tables(persistent, idx_mapping, out)
    expected = reference(persistent.cpu().contiguous(), idx_mapping.cpu(), torch.full((4, 1), -5, dtype=torch.int32))
    assert out.stride() == (1, 4)
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)
    assert out.cpu().flatten().tolist() == [9, 0, 7, -5]
