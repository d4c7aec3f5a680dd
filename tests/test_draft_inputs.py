"""Draft-input preparation: hand-worked batches for both layouts, docs/contracts/draft_inputs.md#padding padding,
fail-closed, and a property test of kernel == reference over the registry families."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels import draft_inputs
from reference import draft_inputs as ref
from stress import checks
from stress.core import cases, workers
from stress.families.common import SENTINEL

MASK = 900
BONUS = {0: 500, 1: 501, 2: 502}  # last_sampled by slot
PREFILL = {0: 600, 1: 601, 2: 602}  # next_prefill_tokens by slot


def _batch(device, *, k, anchor_first, cached=(0, 3, 8)):
    """Two live rows and one idle slot; buffers sized for 3 slots and 2 padded context rows.

    Batch row 0 = slot 2: a decode step with target positions 10..12 whose last row was rejected
    (n_valid 2, last position 11), 8 cached tokens (2 blocks of 4). Batch row 1 = slot 0: a prefill
    chunk at positions 4..5 with nothing sampled yet. Slot 1 is idle with an unaligned count.
    """
    q = k if anchor_first else 1 + k

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    def fill(n, dtype):
        return torch.full((n,), SENTINEL, dtype=dtype, device=device)

    return dict(
        idx_mapping=t([2, 0], torch.int32), target_query_start_loc=t([0, 3, 5], torch.int32),
        target_positions=t([10, 11, 12, 4, 5], torch.int64), num_sampled=t([2, 0], torch.int32),
        num_rejected=t([1, 0], torch.int32), last_sampled=t([BONUS[s] for s in range(3)], torch.int64),
        next_prefill_tokens=t([PREFILL[s] for s in range(3)], torch.int32),
        num_cached_tokens=t(list(cached), torch.int32),
        block_table=t([[7, 8, 9, 10], [3, 0, 5, 6], [SENTINEL] * 4], torch.int32), block_size=4,
        num_draft_tokens=k, anchor_first=anchor_first, mask_token_id=MASK, max_model_len=14,
        context_positions=fill(7, torch.int64), context_slot_mapping=fill(7, torch.int64),
        input_ids=fill(2 * q + 2, torch.int32), positions=fill(2 * q + 2, torch.int64),
        query_slot_mapping=fill(2 * q + 2, torch.int64), sample_indices=fill(3 * k, torch.int64),
        sample_pos=fill(3 * k, torch.int64), sample_idx_mapping=fill(3 * k, torch.int32),
        query_start_loc=fill(4, torch.int32), seq_lens=fill(3, torch.int32),
        draft_tokens=torch.full((3, k), SENTINEL, dtype=torch.int64, device=device))


# Both layouts below have Q = 3, so only the sampling rows differ.
COMMON = {
    # row 0: positions 10, 11 in block 9 (slots 38, 39); the rejected row is position 0 / PAD.
    # row 1: positions 4, 5 land on the null block; rows 5, 6 are padding.
    "context_positions": [10, 11, 0, 4, 5, 0, 0],
    "context_slot_mapping": [38, 39, -1, -1, -1, -1, -1],
    # queries at positions 12..14 (clamped to 13) and 6..8; padding rows 6, 7 are zero / PAD.
    "input_ids": [BONUS[2], MASK, MASK, PREFILL[0], MASK, MASK, 0, 0],
    "positions": [12, 13, 13, 6, 7, 8, 0, 0],
    "query_slot_mapping": [40, 41, 42, -1, -1, 20, -1, -1],
    "query_start_loc": [0, 3, 6, 6],
    # row 0: 11 + 1 + 3 - 8 cached = 7; row 1: 5 + 1 + 3 = 9; the padded row gets 0.
    "seq_lens": [7, 9, 0],
}
SAMPLING = {
    # DFlash K=2: mask rows sample their own (unclamped) position; bonus rows are not sampled.
    False: {"sample_indices": [1, 2, 4, 5, 0, 0], "sample_pos": [13, 14, 7, 8, 0, 0],
            "sample_idx_mapping": [2, 2, 0, 0, -1, -1]},
    # DSpark K=3: every row samples the next position.
    True: {"sample_indices": [0, 1, 2, 3, 4, 5, 0, 0, 0], "sample_pos": [13, 14, 15, 7, 8, 9, 0, 0, 0],
           "sample_idx_mapping": [2, 2, 2, 0, 0, 0, -1, -1, -1]},
}


@pytest.mark.parametrize("anchor_first", [False, True], ids=["dflash", "dspark"])
def test_hand_worked_batch(device, anchor_first):
    args = _batch(device, k=3 if anchor_first else 2, anchor_first=anchor_first)
    assert draft_inputs.prepare_draft_inputs(**args) is True
    for name, want in {**COMMON, **SAMPLING[anchor_first]}.items():
        assert args[name].tolist() == want, name
    assert (args["draft_tokens"] == SENTINEL).all(), "draft_tokens is the drafter's output, not prep's"


@pytest.mark.parametrize("anchor_first", [False, True], ids=["dflash", "dspark"])
def test_reference_agrees_on_hand_worked_batch(anchor_first):
    args = _batch("cpu", k=3 if anchor_first else 2, anchor_first=anchor_first)
    prepared, *outputs = ref.prepare_draft_inputs(**args)
    assert prepared is True
    got = dict(zip(ref.OUTPUTS, outputs, strict=True))
    for name, want in {**COMMON, **SAMPLING[anchor_first]}.items():
        assert got[name].tolist() == want, name
    assert (args["input_ids"] == SENTINEL).all(), "the reference must not write its inputs"


def test_unaligned_live_slot_fails_closed(device):
    args = _batch(device, k=2, anchor_first=False, cached=(2, 3, 8))  # slot 0 (batch row 1) holds half a block
    before = {name: args[name].clone() for name in ref.OUTPUTS}
    assert draft_inputs.prepare_draft_inputs(**args) is False
    assert args["draft_tokens"][:2].eq(-1).all() and args["draft_tokens"][2].eq(SENTINEL).all()
    for name in ref.OUTPUTS[:-1]:
        assert torch.equal(args[name], before[name]), f"{name} written although the batch was refused"


def test_unaligned_idle_slot_is_ignored(device):
    args = _batch(device, k=2, anchor_first=False, cached=(0, 3, 8))  # slot 1 is unaligned but not in the batch
    assert draft_inputs.prepare_draft_inputs(**args) is True


def test_depth_zero_dflash_has_only_bonus_rows(device):
    args = _batch(device, k=0, anchor_first=False)
    assert draft_inputs.prepare_draft_inputs(**args) is True
    assert args["input_ids"].tolist() == [BONUS[2], PREFILL[0], 0, 0]
    assert args["query_start_loc"].tolist() == [0, 1, 2, 2]
    assert args["seq_lens"].tolist() == [5, 7, 0]


@pytest.mark.parametrize("arg,bad,message", [
    ("input_ids", lambda a: a["input_ids"].to(torch.int64), "input_ids: dtype"),
    ("seq_lens", lambda a: a["seq_lens"][:1], "seq_lens: 1 rows"),
    ("positions", lambda a: a["positions"][:-1], "positions: 7 entries"),
    ("idx_mapping", lambda a: torch.tensor([3, 0], dtype=torch.int32, device=a["idx_mapping"].device),
     "idx_mapping: live batch rows"),
    ("draft_tokens", lambda a: a["draft_tokens"][:, :1].contiguous(), "draft_tokens: 1 columns"),
    ("num_draft_tokens", lambda a: -1, "num_draft_tokens"),
])
def test_launcher_names_the_bad_argument(device, arg, bad, message):
    args = _batch(device, k=2, anchor_first=False)
    args[arg] = bad(args)
    with pytest.raises(ValueError, match=message):
        draft_inputs.prepare_draft_inputs(**args)


def test_anchor_first_needs_a_row(device):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        draft_inputs.prepare_draft_inputs(**_batch(device, k=0, anchor_first=True))


CHECK = checks.get("draft_inputs.prepare")


@given(family=st.sampled_from(sorted(CHECK.families)), seed=st.integers(0, 2**63 - 1))
@pytest.mark.slow
def test_kernel_matches_reference(family, seed, device):
    result = workers.run_case(cases.Task(CHECK.name, family, seed), device.type)
    assert result.verdict == "pass", "\n".join([result.repro(), *result.details])


def test_the_launchers_index_arguments_come_back_in_one_read():
    """prepare_draft_inputs reads its batch rows' slots, the target offsets and the cached counts back together
    (one wait for a shared GPU instead of three): each comes back whole, at its own length, empty ones included,
    as a copy that a later write to the argument does not change."""
    from kernels import runtime

    slots, offsets, cached = (torch.tensor(v, dtype=torch.int32) for v in ([2, 0], [0, 3, 5, 9], [8, 3, 0]))
    got = runtime.read_back(slots, offsets, torch.empty(0, dtype=torch.int32), cached)
    assert [t.tolist() for t in got] == [[2, 0], [0, 3, 5, 9], [], [8, 3, 0]]
    cached[0] = 7
    assert got[3].tolist() == [8, 3, 0]
