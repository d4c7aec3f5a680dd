"""Reference model: the same architecture as ``kernels.spec.models``, float64, one request at a time,
over one contiguous KV per request and layer (``kv[layer] = (k, v)``, ``[positions, Hkv, D]``,
NaN where nothing was written). No paging, no padding, no kernels.

A row's logits are ``x @ head_raw + rms_norm(x) @ head_norm + position_codes[predicted position]``;
the target row at position i predicts i + 1; draft rows predict the positions they are given.
"""

import math

import torch

EPS = 1e-6
# Query rows per attention chunk. Rows are independent: the chunking bounds memory and changes no value beyond
# BLAS rounding (a chunk of a few rows may take another MKL path). A chunk's [rows, heads, positions] float64
# temporaries (scores, masked scores, weights) stay a few MB at 64 rows, where at 512 rows of a GPU-sized prefill
# (~2000 positions) each was 60 MB and freshly mapped every time: its page faults cost more than the arithmetic.
ROWS_PER_CHUNK = 64


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def rope(x: torch.Tensor, positions: list[int], theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding of ``x [N, heads, D]``; angles from float32 inverse
    frequencies and positions (as the engine computes them), the rotation in float64."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = (torch.tensor(positions, dtype=torch.float32)[:, None] * freqs[None, :]).to(torch.float64)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    lo, hi = x[..., :half], x[..., half:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)


class Model:
    def __init__(self, config: dict, weights: dict):
        self.c = config
        self.w = {name: t.to(torch.float64) for name, t in weights.items()}

    def empty_kv(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (length, self.c["kv_heads"], self.c["head_dim"])
        return [(torch.full(shape, float("nan"), dtype=torch.float64),
                 torch.full(shape, float("nan"), dtype=torch.float64)) for _ in range(self.c["layers"])]

    def kv_of(self, layer: int, x: torch.Tensor, positions: list[int]):
        """The key and value a layer stores for rows ``x`` (that layer's input) at ``positions``."""
        c, w, n = self.c, self.w, rms_norm(x)
        k = rope((n @ w[f"layer{layer}.wk"]).view(-1, c["kv_heads"], c["head_dim"]), positions, c["rope_theta"])
        return k, (n @ w[f"layer{layer}.wv"]).view(-1, c["kv_heads"], c["head_dim"])

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, spans: list[range]) -> torch.Tensor:
        """Softmax attention of query rows ``[N, Hq, D]``, row i over the positions ``spans[i]`` of
        ``keys`` / ``values`` ``[L, Hkv, D]`` (GQA: head h reads kv head h // (Hq / Hkv)). A NaN that a
        row sees (never-written KV) makes its output NaN; one it does not see has no effect."""
        c = self.c
        group = c["heads"] // c["kv_heads"]
        out = []
        for first in range(0, len(spans), ROWS_PER_CHUNK):  # bounded memory (ROWS_PER_CHUNK)
            rows = slice(first, first + ROWS_PER_CHUNK)
            chunk = spans[rows]
            lo, hi = min(s.start for s in chunk), max(s.stop for s in chunk)  # the positions these rows see
            k, v = keys[lo:hi], values[lo:hi]
            at = torch.arange(lo, hi)[None, :]
            starts = torch.tensor([s.start for s in chunk])[:, None]
            stops = torch.tensor([s.stop for s in chunk])[:, None]
            seen = (at >= starts) & (at < stops)  # [n, L]
            qg = q[rows].view(-1, c["kv_heads"], group, c["head_dim"])
            scores = torch.einsum("nhgd,lhd->nhgl", qg, k) / math.sqrt(c["head_dim"])
            weights = torch.softmax(scores.masked_fill(~seen[:, None, None, :], float("-inf")), dim=-1)
            o = torch.einsum("nhgl,lhd->nhgd", weights, v.nan_to_num(0.0))
            nan_v = torch.isnan(v).any(-1).T  # [Hkv, L]
            poisoned = (seen[:, None, :] & nan_v[None]).any(-1)  # [n, Hkv]
            out.append(o.masked_fill(poisoned[:, :, None, None], float("nan")).reshape(-1, c["heads"], c["head_dim"]))
        return torch.cat(out)

    def forward(self, token_ids: list[int], positions: list[int], stored_at: list, kv: list,
                visible) -> tuple[torch.Tensor, list]:
        """Rows ``token_ids`` at (RoPE) ``positions``: each layer stores row i's KV at ``stored_at[i]`` in
        ``kv`` (None: nowhere), then in layer l row i attends to the positions ``visible(l, i)`` (a
        range). Returns the final hidden states and each layer's input (the aux hidden states)."""
        c, w = self.c, self.w
        x = w["embed"][torch.tensor(token_ids)]
        rows = torch.tensor([i for i, at in enumerate(stored_at) if at is not None], dtype=torch.int64)
        at = torch.tensor([at for at in stored_at if at is not None], dtype=torch.int64)
        aux = []
        for layer in range(c["layers"]):
            aux.append(x)
            n = rms_norm(x)
            q = rope((n @ w[f"layer{layer}.wq"]).view(-1, c["heads"], c["head_dim"]), positions, c["rope_theta"])
            k, v = self.kv_of(layer, x, positions)
            keys, values = kv[layer]
            keys[at], values[at] = k[rows], v[rows]
            out = self.attend(q, keys, values, [visible(layer, i) for i in range(len(positions))])
            x = x + out.reshape(len(positions), -1) @ w[f"layer{layer}.wo"]
            x = x + torch.tanh(rms_norm(x) @ w[f"layer{layer}.w_up"]) @ w[f"layer{layer}.w_down"]
        return x, aux

    def logit_error(self, hidden: torch.Tensor, eps: float) -> "LogitError":
        """Bounds on the engine's error in the logits of these rows, given that its hidden states are
        within ``eps * (|x| + rms(x))`` of ``hidden`` element by element (its normed ones within
        ``eps * (|n| + 1)``). Position codes are exact on both sides."""
        return LogitError(eps * (hidden.abs() + hidden.pow(2).mean(-1, keepdim=True).sqrt()),
                          eps * (rms_norm(hidden).abs() + 1), self.w["head_raw"], self.w["head_norm"])

    def logits(self, hidden: torch.Tensor, predicted_positions: list[int]) -> torch.Tensor:
        w = self.w
        return hidden @ w["head_raw"] + rms_norm(hidden) @ w["head_norm"] + w["position_codes"][predicted_positions]


class LogitError:
    """How far the engine's logits may be from the reference's: per element, and per difference of
    two logits of a row (a term two tokens share cancels there: a greedy or sampled decision
    depends on differences only)."""

    def __init__(self, raw_scale, norm_scale, head_raw, head_norm):
        self.raw_scale, self.norm_scale = raw_scale, norm_scale  # [N, H] error bounds of x and rms_norm(x)
        self.head_raw, self.head_norm = head_raw, head_norm
        self._bound = None

    def bound(self) -> torch.Tensor:
        """[N, V]: |engine logit - reference logit| <= bound."""
        if self._bound is None:
            self._bound = self.raw_scale @ self.head_raw.abs() + self.norm_scale @ self.head_norm.abs() + 1e-9
        return self._bound

    def pairs(self, row: int, tokens: torch.Tensor, of: torch.Tensor | None = None) -> torch.Tensor:
        """[m, m]: bound on the error of ``logit[a] - logit[b]`` for tokens a, b of ``tokens`` in ``row``;
        ``[len(of), m]`` for tokens a of ``of`` only, when given."""
        of = tokens if of is None else of

        def spread(head, scale):  # [len(of), m]: sum over h of scale[h] * |head[h, a] - head[h, b]|
            return torch.einsum("h,hab->ab", scale, (head[:, of][:, :, None] - head[:, tokens][:, None, :]).abs())

        return spread(self.head_raw, self.raw_scale[row]) + spread(self.head_norm, self.norm_scale[row]) + 1e-9
