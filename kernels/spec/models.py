"""The engine's tiny target model and its DFlash/DSpark-style draft, which shares the target's weights.

Dense parts are plain torch; KV writes and paged attention go through the project's kernels.
Activations run in ``dtype`` (bf16 on the GPU, fp32 on the CPU); logits are always fp32, the
dtype the sampling and verification kernels take.

The architecture is a pre-norm transformer (RMSNorm without gain, RoPE, GQA attention, a tanh
MLP) whose logits are ``x @ head_raw + rms_norm(x) @ head_norm + position_codes[predicted]``:
the head is told the position of the token it predicts (the target row at position i predicts
i + 1; a DFlash mask row predicts its own position; a DSpark row the next one; the sampling
rows carry that position). The weights (``stress.families.engine`` draws them) are seeded
random matrices with a planted structure that makes every greedy decision decided by a wide
margin, so a bf16 engine and a float64 reference agree token for token and a draft sharing
the weights predicts what the target emits. ``weights`` is a dict of float32 CPU tensors:

    embed [V + 1, H] (row V is the mask token), layer{l}.wq [H, Hq*D], .wk / .wv [H, Hkv*D],
    .wo [Hq*D, H], .w_up [H, F], .w_down [F, H], head_raw / head_norm [H, V],
    position_codes [P, V]

The draft (docs/contracts/draft_inputs.md#layouts): its context KV for layer l is projected from the target's input
to layer l (the aux hidden state) at each context row's absolute position, written through the draft
group's context slot mapping; its query block (bonus or anchor, then mask tokens) writes its own
KV and attends non-causally to the visible context and the whole block.
"""

import math
from dataclasses import dataclass

import torch

from kernels import attention, kv_cache, runtime

EPS = 1e-6
GUARD = -1024.0  # fills the guard blocks around every KV cache (exact in bf16)
GUARD_BLOCKS = 1
FP32_WEIGHTS = ("head_raw", "head_norm", "position_codes")  # the head and what feeds it stay fp32


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    max_position: int  # rows of position_codes: the largest predicted position + 1

    def __post_init__(self):
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim: {self.head_dim}; the rotary embedding rotates pairs of dimensions, so it "
                             "must be even and at least 2")

    @property
    def mask_token_id(self) -> int:
        return self.vocab

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """RMSNorm without gain, computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half) of ``x [N, heads, D]`` at absolute ``positions [N]``."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    xf = x.float()
    lo, hi = xf[..., :half], xf[..., half:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1).to(x.dtype)


class Model:
    """The weights on the engine's device and dtype, and the forward passes that use them."""

    def __init__(self, config: ModelConfig, weights: dict, device: torch.device, dtype: torch.dtype):
        self.config, self.device, self.dtype = config, device, dtype
        # The head runs in fp32: the sampling kernels take fp32 logits.
        self.w = {name: runtime.upload(t, device, torch.float32 if name in FP32_WEIGHTS else dtype)
                  for name, t in weights.items()}
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self._guarded: list[torch.Tensor] = []  # every cache with its guard blocks

    def new_kv_caches(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (k, v) cache per layer, ``[num_blocks, block_size, Hkv, D]``, NaN: never-written KV is poison.

        Each lies between guard blocks holding ``GUARD`` (``guards_intact`` checks them), so a write
        past either end of a cache (a PAD slot stored as -1, say) shows instead of landing elsewhere. Its
        block 0 is the null block, never handed out: ``guards_intact`` checks that it stays NaN too, so a
        write to slot 0 (a PAD row, a capture's warm-up) shows although no request reads it."""
        c, g = self.config, GUARD_BLOCKS
        shape = (num_blocks + 2 * g, block_size, c.kv_heads, c.head_dim)
        caches = []
        for _ in range(c.layers):
            pair = []
            for _ in range(2):
                whole = torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
                whole[:g], whole[-g:] = GUARD, GUARD
                self._guarded.append(whole)
                pair.append(whole[g:-g])
            caches.append(tuple(pair))
        return caches

    def guards_intact(self) -> bool:
        """Whether every guard block still holds ``GUARD`` and every null block NaN: one wait for the device."""
        g = GUARD_BLOCKS
        intact = [t for whole in self._guarded
                  for t in ((whole[:g] == GUARD).all(), (whole[-g:] == GUARD).all(), whole[g].isnan().all())]
        return bool(torch.stack(intact).all()) if intact else True

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.w["embed"][token_ids.long()]

    def _qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor):
        c, w = self.config, self.w
        n = rms_norm(x)
        q = rope((n @ w[f"layer{layer}.wq"]).view(-1, c.heads, c.head_dim), positions, c.rope_theta)
        k, v = self._kv(layer, n, positions)
        return q, k, v

    def _kv(self, layer: int, normed: torch.Tensor, positions: torch.Tensor):
        c, w = self.config, self.w
        k = rope((normed @ w[f"layer{layer}.wk"]).view(-1, c.kv_heads, c.head_dim), positions, c.rope_theta)
        v = (normed @ w[f"layer{layer}.wv"]).view(-1, c.kv_heads, c.head_dim)
        return k, v

    def _finish_layer(self, layer: int, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        w = self.w
        x = x + attn_out.reshape(x.shape[0], -1) @ w[f"layer{layer}.wo"]
        return x + torch.tanh(rms_norm(x) @ w[f"layer{layer}.w_up"]) @ w[f"layer{layer}.w_down"]

    def _layer(self, layer, x, positions, slot_mapping, cache, attn, causal):
        """One layer over the rows of ``x``: write their KV through ``slot_mapping``, attend through ``attn``."""
        q, k, v = self._qkv(layer, x, positions)
        k_cache, v_cache = cache
        kv_cache.write_kv(k, v, slot_mapping, k_cache, v_cache)
        out = torch.empty_like(q)
        attention.paged_attention(q, k_cache, v_cache, attn["block_table"], attn["seq_lens"],
                                  attn["query_start_loc"], scale=self.scale, causal=causal, out=out)
        return self._finish_layer(layer, x, out)

    def target_forward(self, token_ids, positions, slot_mapping, caches, attn) -> tuple[torch.Tensor, list]:
        """Causal forward of the scheduled target tokens; returns the final hidden states and, per
        layer, its input (the aux hidden states the draft's context KV is projected from)."""
        x = self.embed(token_ids)
        aux = []
        for layer in range(self.config.layers):
            aux.append(x)
            x = self._layer(layer, x, positions, slot_mapping, caches[layer], attn, causal=True)
        return x, aux

    def write_context_kv(self, aux: list, context_positions, context_slot_mapping, caches) -> None:
        """Project every context row's aux hidden states into the draft KV (PAD rows write nothing)."""
        for layer, states in enumerate(aux):
            k, v = self._kv(layer, rms_norm(states), context_positions)
            kv_cache.write_kv(k, v, context_slot_mapping, *caches[layer])

    def draft_forward(self, input_ids, positions, query_slot_mapping, caches, attn, causal: list[bool]) -> torch.Tensor:
        """Forward of the draft query rows; layer l attends causally when ``causal[l]`` (DFlash full-attention
        layers do not: each query sees its whole block)."""
        x = self.embed(input_ids)
        for layer in range(self.config.layers):
            x = self._layer(layer, x, positions, query_slot_mapping, caches[layer], attn, causal[layer])
        return x

    def logits(self, hidden: torch.Tensor, predicted_positions: torch.Tensor) -> torch.Tensor:
        """fp32 logits of rows that predict the tokens at ``predicted_positions``."""
        w = self.w
        h = hidden.float()
        return h @ w["head_raw"] + rms_norm(h) @ w["head_norm"] + w["position_codes"][predicted_positions.long()]
