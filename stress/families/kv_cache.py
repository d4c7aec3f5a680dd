"""Case families for the KV-cache write: PAD tokens, partial and null blocks, ragged tiles, dtypes, default
tiles at Triton's size limit, and (on the GPU) a cache past 2^31 elements and keys spread past 2^31.

A case holds both caches in one ``kv_cache [2, num_blocks, block_size, H_kv, D]`` tensor (K then V,
a combined KV allocation as engines keep it), so the runner guards and compares them as one buffer:
a V write whose offset wraps below the V cache lands in the K cache, where the comparison sees it.
Every slot a case does not write holds NaN and must come back bit for bit; slot-mapping entries
past the token count name real slots, so a kernel that reads past T writes where it must not.
"""

import numpy as np
import torch

import reference.kv_cache
from kernels.kv_cache import write_kv
from stress.core.types import Case
from stress.families.common import big, int64, laid_out, offset_reach, own_launch, pick, spread


def halves(kv_cache: torch.Tensor, v_token_major: bool = False, v_head_major: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V caches of a combined cache. ``v_token_major`` hands V over as a view of its half laid out
    token-major (memory ``[block_size, num_blocks, H_kv, D]``), ``v_head_major`` head-major (memory
    ``[num_blocks, H_kv, block_size, D]``): strides unlike K's (the block and token strides, or the head and
    token strides), as separately allocated caches may have, so V addressed with K's strides writes elsewhere."""
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_blocks, block_size, heads, dim = v_cache.shape
    if v_token_major:
        v_cache = v_cache.view(block_size, num_blocks, heads, dim).transpose(0, 1)
    elif v_head_major:
        v_cache = v_cache.view(num_blocks, heads, block_size, dim).transpose(1, 2)
    return k_cache, v_cache


def write_kv_pair(key, value, slot_mapping, kv_cache, v_token_major=False, v_head_major=False, v_cache=None,
                  **launch) -> None:
    """The production write into the K and V halves of a combined cache. ``v_cache``, a cache of its own in
    place of the V half, is how a refusal case hands over caches that disagree (two halves of one cache
    cannot)."""
    k_half, v_half = halves(kv_cache, v_token_major, v_head_major)
    write_kv(key, value, slot_mapping, k_half, v_half if v_cache is None else v_cache, **launch)


def write_kv_pair_reference(key, value, slot_mapping, kv_cache, v_token_major=False, v_head_major=False,
                            v_cache=None) -> torch.Tensor:
    """The reference write, as a new combined cache. It runs where the case's tensors are: a cache past
    2^31 elements stays on the GPU (its loop indexes a handful of rows; no float math)."""
    if v_cache is not None:
        raise ValueError("v_cache: only a refusal case hands over a V cache of its own; it has no reference output")
    expected = kv_cache.clone()
    written = reference.kv_cache.write_kv(key, value, slot_mapping, *halves(kv_cache, v_token_major, v_head_major))
    for half, values in zip(halves(expected, v_token_major, v_head_major), written, strict=True):
        half.copy_(values)
    return expected

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PAD = -1


def sweep(device: str) -> list[dict]:
    """Tokens and heads per program, warps: tile edges fall in different places."""
    if device == "cuda":
        return [{}] + [{"block_t": t, "block_h": h, "num_warps": w} for t in (1, 4, 16) for h in (1, 8) for w in (1, 4)]
    return [{}, {"block_t": 4, "block_h": 1}, {"block_t": 16}]


def kv_case(rng, *, slots, num_blocks, block_size, heads, head_dim, dtype, tail=(), on=None, note="") -> Case:
    """Tokens write ``slots`` (PAD for none); ``tail`` lists slot-mapping entries past the tokens.

    ``on`` builds every input on that device (a multi-GB cache is never copied through the host: the
    runner guards, runs the reference and compares where the tensors are).
    """
    kv_cache = torch.full((2, num_blocks, block_size, heads, head_dim), float("nan"), dtype=dtype, device=on)
    num_tokens = len(slots)
    key = torch.from_numpy(rng.standard_normal((num_tokens, heads, head_dim), dtype=np.float32)).to(on, dtype)
    value = torch.from_numpy(rng.standard_normal((num_tokens, heads, head_dim), dtype=np.float32)).to(on, dtype)
    return Case(inputs={"key": key, "value": value, "slot_mapping": int64(list(slots) + list(tail)).to(on),
                        "kv_cache": kv_cache},
                note=f"T={num_tokens} H={heads} D={head_dim} bs={block_size} {str(dtype)[6:]} {note}".strip())


def _distinct_slots(rng, count: int, num_blocks: int, block_size: int, low_block: int = 1) -> list[int]:
    """``count`` distinct slots outside the null block (and below ``low_block`` none)."""
    pool = (num_blocks - low_block) * block_size
    return [int(s) + low_block * block_size for s in rng.choice(pool, size=count, replace=False)]


def pad(rng, device, launch):
    """Many PAD tokens. A K/V row stays within the 512 guard bytes, so a PAD write lands in the guard zone."""
    dtype = pick(rng, DTYPES)
    heads = int(rng.integers(1, 3))
    head_dim = int(rng.integers(1, 256 // (heads * dtype.itemsize) + 1))
    tokens = int(rng.integers(1, 64 if big(device) else 12))
    bs = pick(rng, (1, 16, 32))
    slots = _distinct_slots(rng, tokens, tokens // bs + 3, bs)
    share = rng.random()
    slots = [PAD if rng.random() < share else s for s in slots]
    return kv_case(rng, slots=slots, num_blocks=tokens // bs + 3, block_size=bs, heads=heads, head_dim=head_dim,
                   dtype=dtype, note=f"{sum(s == PAD for s in slots)} PAD")


def partial_block(rng, device, launch):
    """Requests' consecutive positions through shuffled block-table rows: runs start and end mid-block."""
    bs = pick(rng, (16, 32, 64))
    rows = int(rng.integers(1, 4))
    width = 16 if big(device) else 4
    table = rng.permutation(rows * width) + 1
    slots = []
    for row in range(rows):
        first = int(rng.integers(0, width * bs // 2))
        count = int(rng.integers(1, (3 * bs if big(device) else 24) + 2))
        for pos in range(first, min(first + count, width * bs)):
            slots.append(int(table[row * width + pos // bs]) * bs + pos % bs)
    heads, head_dim = (int(rng.integers(1, 9)), pick(rng, (64, 128))) if big(device) else (1, 8)
    return kv_case(rng, slots=slots, num_blocks=rows * width + 1, block_size=bs, heads=heads, head_dim=head_dim,
                   dtype=pick(rng, DTYPES), note=f"{rows} requests")


def null_block(rng, device, launch):
    """Positions on null-block table entries map to PAD (as compute_slot_mappings gives): block 0 stays poisoned."""
    bs = pick(rng, (1, 16))
    width = int(rng.integers(2, 6))
    table = rng.permutation(width) + 1
    table[rng.random(width) < 0.5] = 0
    slots = [int(table[pos // bs]) * bs + pos % bs if table[pos // bs] else PAD
             for pos in range(int(rng.integers(1, width * bs + 1)))]
    return kv_case(rng, slots=slots, num_blocks=width + 1, block_size=bs, heads=int(rng.integers(1, 3)),
                   head_dim=int(rng.integers(1, 17)), dtype=pick(rng, DTYPES),
                   note=f"{int((table == 0).sum())} null entries")


def ragged(rng, device, launch):
    """A token count that no tile divides; slot-mapping entries past the tokens name real slots."""
    tile = launch.get("block_t") or 4
    tokens = tile * int(rng.integers(0, 4)) + int(rng.integers(1, tile)) if tile > 1 else int(rng.integers(1, 9))
    bs = 16
    num_blocks = tokens // bs + 4
    slots = _distinct_slots(rng, tokens + 5, num_blocks, bs)
    return kv_case(rng, slots=slots[:tokens], tail=slots[tokens:], num_blocks=num_blocks, block_size=bs,
                   heads=int(rng.integers(1, 4)), head_dim=int(rng.integers(1, 20)), dtype=pick(rng, DTYPES),
                   note="5 slots past T")


def tail_past_cache(rng, device, launch):
    """``ragged`` whose slot-mapping entries past the tokens all lie past the cache (the first one too): they are
    never read, so a bound check or a tile that reaches one entry past the tokens refuses or writes what it must
    not."""
    case = ragged(rng, device, launch)
    kv_cache, slots = case.inputs["kv_cache"], case.inputs["slot_mapping"]
    capacity, tokens = kv_cache.shape[1] * kv_cache.shape[2], case.inputs["key"].shape[0]
    slots[tokens:] = torch.from_numpy(capacity + rng.integers(0, 2**40, slots.numel() - tokens))
    case.note += ", all past the cache"
    return case


def dtypes(rng, device, launch):
    """Every dtype, head dims that are not powers of two, more heads than a program holds."""
    dtype = pick(rng, DTYPES)
    heads = int(rng.integers(1, 17 if big(device) else 4))
    head_dim = pick(rng, (64, 80, 128, 256) if big(device) else (3, 16, 24))
    bs = pick(rng, (16, 32))
    tokens = int(rng.integers(1, 256 if big(device) else 8))
    num_blocks = tokens // bs + 2
    return kv_case(rng, slots=_distinct_slots(rng, tokens, num_blocks, bs), num_blocks=num_blocks, block_size=bs,
                   heads=heads, head_dim=head_dim, dtype=dtype)


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def bit_patterns(rng, device, launch):
    """Keys and values of random bits: NaNs with payloads of both signs, infinities, -0.0, subnormals and
    the largest finite values, which a copy must store bit for bit (no arithmetic, no flush to zero)."""
    case = dtypes(rng, device, launch)
    for name in ("key", "value"):
        t = case.inputs[name]
        info = torch.iinfo(_BITS[t.dtype])
        bits = rng.integers(info.min, info.max, tuple(t.shape), dtype=np.int64, endpoint=True)
        case.inputs[name] = torch.from_numpy(bits).to(_BITS[t.dtype]).view(t.dtype)
    case.note += " random bits"
    return case


def empty(rng, device, launch):
    """Nothing to write: tokens with no KV heads (one time in two), a head dim of 0, a cache of no blocks (every
    slot PAD) or no tokens. Slot mappings past the tokens name real slots where there are any."""
    dtype = pick(rng, DTYPES)
    tokens, heads, head_dim, num_blocks, bs = int(rng.integers(1, 6)), int(rng.integers(1, 3)), 4, 3, 16
    what = pick(rng, ("no heads", "no heads", "head dim 0", "no blocks", "no tokens"))
    if what == "no heads":
        heads = 0
    elif what == "head dim 0":
        head_dim = 0
    elif what == "no blocks":
        num_blocks = 0
    else:
        tokens = 0
    slots = _distinct_slots(rng, tokens + 2, num_blocks, bs) if num_blocks else [PAD] * (tokens + 2)
    return kv_case(rng, slots=slots[:tokens], tail=slots[tokens:], num_blocks=num_blocks, block_size=bs,
                   heads=heads, head_dim=head_dim, dtype=dtype, note=what)


def smallest(rng, device, launch):
    """The smallest cache that holds anything: one block of one slot, one head of one element, written by its
    one token (slot 0: the launcher writes whatever slot it is given; the null block is the engine's
    convention), after PAD tokens one time in two."""
    slots = [PAD] * int(rng.integers(0, 2) * rng.integers(1, 4)) + [0]
    return kv_case(rng, slots=slots, num_blocks=1, block_size=1, heads=1, head_dim=1, dtype=pick(rng, DTYPES),
                   note="one-element cache")


def many_heads(rng, device, launch):
    """More KV heads than one head tile holds, a count that is not a power of two: the last head tile is partial.
    Head dim 1, so the default tile is 2048 heads (under a swept block_h, two tiles and a part: few programs)."""
    tile = launch.get("block_h") or 2048
    heads = tile + 1 + int(rng.integers(0, tile + 8))
    tokens = int(rng.integers(1, 3))
    return kv_case(rng, slots=_distinct_slots(rng, tokens, 3, 1), num_blocks=3, block_size=1, heads=heads,
                   head_dim=1, dtype=pick(rng, DTYPES), note="heads past the default head tile")


@own_launch()
def capped_heads(rng, device, launch):
    """More heads than the default head tile's cap of 2048 // block_d, always at the default launch: head dim 1
    (2048 heads a tile) in three cases of four, else a wider head (up to 512). A slip in the cap's constant
    gives a head tile that is no power of two and does not compile, or one that the sweep never forces; for
    2049 // block_d that takes head dim 1, hence three cases in four (a GPU runs few cases of a family)."""
    head_dim = 1 if rng.random() < 0.75 else int(pick(rng, (3, 16, 100, 512)))
    cap = 2048 // (1 << (head_dim - 1).bit_length())
    tokens = int(rng.integers(1, 3))
    return kv_case(rng, slots=_distinct_slots(rng, tokens, 3, 1), num_blocks=3, block_size=1,
                   heads=cap + 1 + int(rng.integers(0, cap)), head_dim=head_dim, dtype=pick(rng, DTYPES),
                   note="heads past the default tile's cap")


@own_launch()
def one_lane(rng, device, launch):
    """One head of one lane at the default launch: the token tile is the whole 4096 // (block_h * block_d)
    budget, 4096 tokens a program (a slip in that constant gives a tile that is no power of two)."""
    tokens = int(rng.integers(1, 9))
    return kv_case(rng, slots=_distinct_slots(rng, tokens, 9, 1), num_blocks=9, block_size=1, heads=1, head_dim=1,
                   dtype=pick(rng, DTYPES), note="one lane, the default token tile")


@own_launch()
def wide_heads(rng, device, launch):
    """A head dim past 4096: the default tiles hold one head of one token (2048 // block_d is 0). Its point
    is that default, so it runs no forced tile: on an H200 a forced 16 x 8 x 8192 tile at one warp keeps ptxas
    busy past the 300 s case deadline."""
    tokens = int(rng.integers(1, 3))
    return kv_case(rng, slots=_distinct_slots(rng, tokens, 3, 1), num_blocks=3, block_size=1, heads=1,
                   head_dim=int(rng.integers(4097, 4200)), dtype=pick(rng, DTYPES), note="head dim past 4096")


@own_launch()
def tile_limit(rng, device, launch):
    """Default tiles next to Triton's limit of 2^20 elements a tile: a head dim just past 2^19 on the CPU
    (2 heads: one head of 2^20 lanes a program, at the limit) and past 4096 on the GPU (129 to 256 heads of
    8192 lanes, one head a program). The launcher must not widen the head tile there: two heads of 2^20
    lanes, or every head at once, pass the limit and do not compile. On the GPU no 2^20-lane tile is
    compiled (ptxas takes minutes over one; see wide_heads)."""
    heads, head_dim = (int(rng.integers(129, 257)), int(rng.integers(4097, 4200))) if big(device) \
        else (2, (1 << 19) + int(rng.integers(1, 64)))
    return kv_case(rng, slots=_distinct_slots(rng, 1, 2, 1), num_blocks=2, block_size=1, heads=heads,
                   head_dim=head_dim, dtype=torch.float16, note="head tile at Triton's 2^20-element limit")


@own_launch()
def model_heads(rng, device, launch):
    """Model shapes at the default launch: 9 to 32 KV heads of head dim 64 to 128, where the head tile (16 or 32
    heads) is wider than the token tile (4096 // (block_h * block_d): 2 or 4 tokens), and tokens over several
    token tiles: the token axis of the grid must count token tiles, not head tiles."""
    head_dim = int(pick(rng, (64, 100, 128)))
    heads = int(rng.integers(9, 33))
    tokens = int(rng.integers(9, 40))
    bs = pick(rng, (1, 16))
    num_blocks = tokens // bs + 2
    return kv_case(rng, slots=_distinct_slots(rng, tokens, num_blocks, bs), num_blocks=num_blocks, block_size=bs,
                   heads=heads, head_dim=head_dim, dtype=pick(rng, DTYPES), note="model-sized heads, default tiles")


def spread_tokens(rng, device, launch):
    """Keys or values whose tokens lie far apart, every token writing. On the GPU three or four tokens spread
    over 2^31 elements: the stride fits int32 and the last token's offset, the token index times it, passes
    2^31, which int32 arithmetic wraps (a view of 4.3 GB; only its tokens are written). The CPU runs the same
    layout a few thousand elements apart."""
    tokens = int(rng.integers(3, 5))
    case = kv_case(rng, slots=_distinct_slots(rng, tokens, 3, 16), num_blocks=3, block_size=16,
                   heads=int(rng.integers(1, 3)), head_dim=pick(rng, (8, 64)), dtype=pick(rng, DTYPES))
    reach = offset_reach(rng, device)
    name = pick(rng, ("key", "value"))
    case.inputs[name] = spread(case.inputs[name], 0, reach)
    case.note += f", {name} spread over {reach} elements"
    return case


BIG_ELEMENTS = (1 << 31) + (1 << 16)  # per cache, just past 2^31: offsets of the top blocks overflow int32
BIG_SHARE = 4  # one GPU case in BIG_SHARE is past 2^31 elements: ~35 GB of device memory at its peak (the case's
# 8.6 GB combined cache, the reference's copies, the guarded copy), so several workers rarely hold one at once


def v_token_major(rng, device, launch):
    """A V cache laid out unlike the K cache (token-major, ``halves``): every other family hands over the two
    halves of one combined cache, whose strides agree, so only here do V's offsets come from V's own strides."""
    case = partial_block(rng, device, launch)
    case.inputs["v_token_major"] = True
    case.note += ", V token-major"
    return case


def v_head_major(rng, device, launch):
    """A V cache laid out head-major (``halves``): its head stride is block_size * D where K's is D, so only here
    does a launcher that hands the kernel K's head stride for V write V's heads elsewhere (two to eight heads)."""
    case = few_heads(rng, device, launch)
    case.inputs["v_head_major"] = True
    case.note += ", V head-major"
    return case


def few_heads(rng, device, launch):
    """Two to eight KV heads of a model-sized (GPU) or small head dim, tokens spread over a few blocks: the base
    of ``head_layouts``, whose padded views give every head of key, value and the caches its own stride."""
    heads = int(rng.integers(2, 9 if big(device) else 5))
    head_dim = pick(rng, (64, 128) if big(device) else (4, 8))
    bs = pick(rng, (16, 32) if big(device) else (4, 8))
    tokens = int(rng.integers(2, 3 * bs + 1))
    return kv_case(rng, slots=_distinct_slots(rng, tokens, 4, bs), num_blocks=4, block_size=bs, heads=heads,
                   head_dim=head_dim, dtype=pick(rng, DTYPES), note="several heads")


def big_cache(rng, device, launch):
    """Writes near the end of the caches (the highest offsets) and near their start. On the GPU one case in
    BIG_SHARE has caches past 2^31 elements each, built on the device; the others, and every CPU case, are
    the same pattern on a small cache.

    Where int32 offsets overflow is deterministic: V slot offset E in [2^31, BIG_ELEMENTS) wraps to
    E - 2^32, which from the V cache's start is E - 2^31 + (BIG_ELEMENTS - 2^31) elements into the K cache
    just below it (same allocation), a NaN slot this case never writes: the comparison sees it."""
    heads, head_dim, bs = (8, 128, 16) if big(device) else (2, 8, 16)
    dtype = pick(rng, (torch.float16, torch.bfloat16))
    per_block = bs * heads * head_dim
    huge = big(device) and int(rng.integers(BIG_SHARE)) == 0
    num_blocks = -(-BIG_ELEMENTS // per_block) if huge else 8
    high = _distinct_slots(rng, int(rng.integers(1, 6)), num_blocks, bs, low_block=num_blocks - 2)
    low = _distinct_slots(rng, 2, 3, bs)
    slots = [int(s) for s in rng.permutation(high + low)]
    return kv_case(rng, slots=slots, num_blocks=num_blocks, block_size=bs, heads=heads, head_dim=head_dim,
                   dtype=dtype, on=torch.device("cuda", torch.cuda.current_device()) if huge else None,
                   note=f"{num_blocks * per_block} elements" if huge else "small cache")


FAMILIES = {"pad": pad, "partial_block": partial_block, "null_block": null_block, "ragged": ragged,
            "tail_past_cache": tail_past_cache,
            "dtypes": dtypes, "big_cache": big_cache, "bit_patterns": bit_patterns, "empty": empty,
            "smallest": smallest, "many_heads": many_heads, "capped_heads": capped_heads, "one_lane": one_lane,
            "wide_heads": wide_heads, "tile_limit": tile_limit, "spread_tokens": spread_tokens,
            "v_token_major": v_token_major, "v_head_major": v_head_major, "model_heads": model_heads,
            # key and value as slices of a fused projection, and a padded combined cache
            "layouts": laid_out(partial_block, "key", "value", "kv_cache"),
            # the same over several heads: a head's stride is no longer its head dim anywhere
            "head_layouts": laid_out(few_heads, "key", "value", "kv_cache")}
