"""Registry entries of kv_cache.write: K/V writes through a slot mapping."""

import dataclasses

import torch

import kernels.kv_cache
from stress.checks.common import ENGINE_SAMPLED, EVERYWHERE, unreachable_by_engine
from stress.checks.profiles import NO_PAD_SLOTS, NO_REFUSALS
from stress.core.compare import exact_chunked
from stress.core.types import Check, Mutant, Patch, Reach
from stress.families import kv_cache as kv_families
from stress.families.ignored import Region, one_of, past, poisoned, whole_rows
from stress.families.refusals import (
    Corruption,
    every_other,
    moved,
    past_bound,
    refusal_family,
    resized,
    retyped,
    strided,
)

_KV = "kernels.kv_cache:_write_kv_kernel"
PAD_WRITTEN = Mutant(
    "pad-written", "PAD tokens (slot -1) are stored: the row before each cache is overwritten",
    (Patch(_KV, "store = live & (slot >= 0)  # PAD writes nothing", "store = live"),),
    oracles={"cpu": "oob", "cuda": "oob"}, families=("pad",),
    path=Reach(families=ENGINE_SAMPLED))


# ---------------------------------------------------------------- refusals

def _writing_tokens(inputs: dict) -> torch.Tensor:
    """The slot_mapping entries that write: a token's (entries past the tokens are ignored), not negative."""
    slots = inputs["slot_mapping"]
    return (slots >= 0) & (torch.arange(slots.numel()) < inputs["key"].shape[0])


def _slot_0_without_blocks(rng, inputs):
    """The caches cut to no blocks, every token PAD but one at slot 0: the slot that only the check of every
    slot >= 0 (PAD aside) refuses, where a check of slots > 0 lets it through."""
    writing = _writing_tokens(inputs).nonzero().flatten()
    if writing.numel() == 0:
        return False
    slots = torch.where(_writing_tokens(inputs), -1, inputs["slot_mapping"])
    slots[int(writing[int(rng.integers(writing.numel()))])] = 0
    inputs["slot_mapping"] = slots
    inputs["kv_cache"] = inputs["kv_cache"][:, :0].clone()
    return True


def _separate_v_cache(change, what: str) -> Corruption:
    """A V cache of its own (a copy of the case's V half, then ``change``d) that disagrees with the K cache; a
    case whose V half ``change`` turns into None is skipped."""
    def apply(rng, inputs):
        v_cache = change(kv_families.halves(inputs["kv_cache"])[1].clone())
        if v_cache is None:
            return False
        inputs["v_cache"] = v_cache
        return True

    return Corruption("v_cache", what, apply)


WRITE_KV_REFUSALS = refusal_family(kv_families.pad, (
    retyped("value", torch.float16, torch.float32),
    *resized("value", 0, (-1, 1), "value one token off key"),
    *resized("value", 2, (-1, 1), "value one head dim off key"),
    *resized("kv_cache", 3, (-1, 1), "a cache of one KV head fewer or more than key", refused="k_cache"),
    *resized("kv_cache", 4, (-1, 1), "a cache one head dim off key", refused="k_cache"),
    *resized("slot_mapping", 0, (lambda i: i["key"].shape[0] - 1,), "slot_mapping one entry short of the tokens"),
    retyped("slot_mapping", torch.int32),
    past_bound("slot_mapping", lambda i: i["kv_cache"].shape[1] * i["kv_cache"].shape[2],
               "a token's slot past the cache", live=_writing_tokens),
    Corruption("slot_mapping", "a token's slot 0 in caches of no blocks", _slot_0_without_blocks, on_gpu=False),
    # larger than the K cache, so a launcher that lets it through still writes inside it (a smaller one would be
    # written past its end, which under the interpreter may kill the process before any verdict)
    _separate_v_cache(lambda v: torch.cat([v, v[:1]]), "a V cache of one block more than the K cache"),
    _separate_v_cache(lambda v: torch.cat([v, v[:, :, :1]], 2), "a V cache of one KV head more than the K cache"),
    _separate_v_cache(lambda v: v.to(torch.float16 if v.dtype != torch.float16 else torch.float32),
                      "a V cache in another dtype than the K cache"),
    *moved("key", "value", "slot_mapping"), *moved("kv_cache", refused="k_cache"),
    _separate_v_cache(lambda v: v.to("meta"), "a V cache on another device than the K cache"),
    *strided("key", "value"), *strided("kv_cache", refused="k_cache"),
    _separate_v_cache(every_other, "a V cache of innermost stride 2"),
    retyped("kv_cache", torch.float16, torch.float32, refused="k_cache"),
    retyped("key", torch.float16, torch.float32),  # unlike the other three: named, not the first compared with it
    # value's one dimension not covered above (appended: the cases above keep their draws)
    *resized("value", 1, (-1, 1), "value one KV head off key"),
), "write_kv")


# ---------------------------------------------------------------- ignored regions


def write_ignored(inputs: dict) -> list[Region]:
    """Slot-mapping entries past the tokens, and the key and value rows of PAD tokens (they write nothing)."""
    slots, tokens = inputs["slot_mapping"], inputs["key"].shape[0]
    pad = slots[:tokens] == kv_families.PAD
    return [Region("slot_mapping", past(tokens, slots.numel())),
            Region("key", whole_rows(pad, inputs["key"])), Region("value", whole_rows(pad, inputs["value"]))]


CHECKS = (
    Check(
        name="kv_cache.write",
        contract="k_cache and v_cache[slot // bs, slot % bs] = key and value[t], bit for bit, for each token whose "
                 "slot is not PAD",
        choices={"no-pad-slots": NO_PAD_SLOTS, "no-refusals": NO_REFUSALS},
        launcher=kernels.kv_cache.write_kv,
        kernel=kv_families.write_kv_pair,  # kernels.kv_cache.write_kv on the halves of one combined cache
        reference=kv_families.write_kv_pair_reference,
        families={**kv_families.FAMILIES, "refused": WRITE_KV_REFUSALS,
                  "ignored_poisoned": poisoned(one_of(kv_families.pad, kv_families.ragged), write_ignored)},
        outputs=("kv_cache",),
        compare=exact_chunked,
        sweep=kv_families.sweep,
        # launch knobs are no input a refusal family corrupts: each knob's refusal is a unit test
        unit_tests=("tests/test_kv_cache.py::test_bad_knob_names_the_knob",),
        mutants=(
            PAD_WRITTEN,
            # the same bug with no guard zones: the write before the K cache leaves its allocation
            dataclasses.replace(PAD_WRITTEN, name="pad-written-memcheck", oracles={"cuda": "memcheck"},
                                why_not="compute-sanitizer runs on the GPU; the CPU tracer kills pad-written",
                                path=Reach(families=ENGINE_SAMPLED)),
            Mutant("int32-offset", "the V-cache row offset is computed in int32: past 2^31 elements it wraps into "
                   "the K cache below it",
                   (Patch(_KV, "v_row = block * v_stride_b + offset * v_stride_t",
                          "v_row = (block * v_stride_b + offset * v_stride_t).to(tl.int32)"),),
                   oracles={"cuda": "divergence"}, families=("big_cache",),
                   why_not="needs a cache past 2^31 elements, big_cache's GPU-only size; a CPU-sized cache cannot "
                           "overflow int32 offsets",
                           path=unreachable_by_engine("the engine's KV caches hold far fewer than 2^31 elements")),
            Mutant("v-row-k-strides", "the V-cache row offset is copied from the K line: V rows are addressed with "
                   "K's block and slot strides, the same numbers whenever both caches share one layout",
                   (Patch(_KV, "v_row = block * v_stride_b + offset * v_stride_t",
                          "v_row = block * k_stride_b + offset * k_stride_t"),),
                   oracles=EVERYWHERE, families=("v_token_major",),
                   path=unreachable_by_engine(
                       "the engine's K and V caches are the halves of one combined cache: one layout")),
            Mutant("v-head-k-stride", "the launcher hands the kernel the K cache's head stride for V: the same number "
                   "whenever both caches share one layout, V's heads written elsewhere when they do not",
                   (Patch("kernels.kv_cache:write_kv", "v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),",
                          "v_cache.stride(0), v_cache.stride(1), k_cache.stride(2),"),),
                   oracles=EVERYWHERE, families=("v_head_major",),
                   path=unreachable_by_engine(
                       "the engine's K and V caches are the halves of one combined cache: one layout")),
            Mutant("v-cache-shape-unchecked", "the launcher never compares the V cache's shape with the K cache's: "
                   "a V cache shaped otherwise is written through the K cache's shape",
                   (Patch("kernels.kv_cache:write_kv", "if v_cache.shape != k_cache.shape:", "if False:"),),
                   oracles={"cpu": "accepted", "cuda": "accepted"}, families=("refused",),
                   path=unreachable_by_engine(
                       "the engine's K and V caches are the halves of one combined cache: one shape")),
            Mutant("value-heads-contiguous", "V rows are read as if their heads lay back to back (head * head_dim, "
                   "not the head stride): the same numbers until value is a view with padded heads, such as a slice "
                   "of a fused projection",
                   (Patch(_KV, "head * value_stride_h + dim", "head * head_dim + dim"),),
                   oracles=EVERYWHERE, families=("head_layouts",),
                   path=unreachable_by_engine(
                       "the engine's values come from a projection viewed as [T, H_kv, D]: heads back to back")),
            Mutant("tail-slots-validated", "the launcher checks every slot_mapping entry, also those past the "
                   "tokens (it forgets the [:T] slice): a stale out-of-range entry there refuses a valid call",
                   (Patch("kernels.kv_cache:write_kv", "writing = slot_mapping[:num_tokens]",
                          "writing = slot_mapping"),),
                   oracles={"cpu": "crash"}, families=("ignored_poisoned", "tail_past_cache"),
                   why_not="the GPU launcher reads no index back (SPECSAN_CHECK_INDICES unset), so nothing refuses",
                   path=unreachable_by_engine(
                       "the engine's slot mappings past the tokens hold PAD or slots of its own cache")),
        ),
    ),
)
