"""Model shapes and block sizes for engine cases in which no two dimensions coincide.

The planted circuit (``stress.families.engine``) needs only ``head_dim >= CLASSES`` and
``hidden >= CLASSES``; everything else is free. Drawn with equal values, a host slip that reads one
dimension for another (head_dim for hidden / heads, kv_heads for heads, the draft block size for the
target's) computes the same numbers and cannot show. So every size below is drawn until it differs
from every other, and the head dim is never hidden / heads: grouped-query attention (kv_heads below
heads, neither 1), a head dim unrelated to the hidden size, and block sizes of the two KV groups
that differ (the draft's half or twice the target's, both contract-legal).
"""

import numpy as np

from stress.families.common import big, pick


def _sizes(rng: np.random.Generator, device: str) -> dict:
    if big(device):
        heads = int(pick(rng, (8, 12)))
        return {"vocab": int(rng.integers(200, 320)), "hidden": int(pick(rng, (96, 112, 144, 160))),
                "layers": int(pick(rng, (2, 3))), "heads": heads, "kv_heads": int(pick(rng, (2, 4))),
                "head_dim": int(pick(rng, (20, 24, 40))), "ffn": int(pick(rng, (72, 136, 200))),
                "block_size": int(pick(rng, (16, 32)))}
    return {"vocab": int(rng.integers(40, 80)), "hidden": int(pick(rng, (20, 28, 36, 44))),
            "layers": int(pick(rng, (1, 1, 1, 2, 3))), "heads": int(pick(rng, (6, 8))),
            "kv_heads": int(pick(rng, (2, 3))),
            "head_dim": int(pick(rng, (6, 10, 14))), "ffn": int(pick(rng, (18, 26, 34))),
            "block_size": int(pick(rng, (4, 8, 8, 16)))}


def named_sizes(dims: dict, block_sizes: tuple[int, int]) -> dict[str, int]:
    """Every size a host slip could read in place of another, by name."""
    group = dims["heads"] // dims["kv_heads"]
    return {"vocab": dims["vocab"], "hidden": dims["hidden"], "layers": dims["layers"], "heads": dims["heads"],
            "kv_heads": dims["kv_heads"], "group": group, "head_dim": dims["head_dim"], "ffn": dims["ffn"],
            "hidden / heads": dims["hidden"] // dims["heads"], "q width": dims["heads"] * dims["head_dim"],
            "kv width": dims["kv_heads"] * dims["head_dim"], "target block": block_sizes[0],
            "draft block": block_sizes[1]}


def coinciding(dims: dict, block_sizes: tuple[int, int]) -> list[tuple[str, str]]:
    """Pairs of named sizes that are equal (none in a drawn shape)."""
    sizes = list(named_sizes(dims, block_sizes).items())
    return [(a, b) for i, (a, x) in enumerate(sizes) for b, y in sizes[i + 1:] if x == y]


def distinct_shape(rng: np.random.Generator, device: str) -> tuple[dict, tuple[int, int]]:
    """Model dims (``model_config``'s keys less rope and positions) and (target, draft) block sizes, all
    distinct. Redrawn from the same generator until so: a seed still gives one shape."""
    while True:
        sizes = _sizes(rng, device)
        bs = sizes.pop("block_size")
        block_sizes = (bs, bs // 2 if rng.integers(2) else 2 * bs)
        if sizes["heads"] % sizes["kv_heads"] == 0 and not coinciding(sizes, block_sizes):
            return sizes, block_sizes
