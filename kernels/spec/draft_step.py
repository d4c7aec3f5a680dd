"""A tiny DFlash-style draft layer over static buffers: the step a draft CUDA graph captures.

One step, over the first ``num_reqs`` batch rows of the static buffers (live rows, then padded ones):

    embed the input ids -> Q, K, V projections -> RoPE at the absolute positions -> write the query
    rows' K/V through ``query_slot_mapping`` (PAD writes nothing) -> paged draft attention over the
    shifted batch-row block table: the backbone output -> logits of the sampling rows
    (``sample_indices``) -> Gumbel sampling keyed by ``sample_idx_mapping`` (slot -1 is an inert padded
    row, fix 3 (docs/fixes.md#fix-3)) that caches the raw logits in ``logits_cache[slot, col]`` -> ``draft_tokens``.

Draft-input preparation (``prepare``: ``prepare_draft_inputs``, the fix-4 block-table shift, then the
attention backend's plan) runs eagerly before the step, as upstream's does outside the graph: it reads
host values for its fail-closed test and sizes its launch from them. It fills the static buffers for
the padded size and clears the padded rows (docs/contracts/draft_inputs.md#padding). Everything after it
(``backbone``, ``logits``, ``sample``) reads its per-step values from device memory only, never syncs with the
host, and sizes its launches from ``num_reqs`` and the depth alone, so one CUDA graph per padded size can hold it
(``kernels.spec.draft_graphs``).

Index spaces: batch rows (``query_start_loc``, ``seq_lens``, ``block_table``, ``draft_tokens`` rows),
query rows (``input_ids``, ``positions``, ``query_slot_mapping``), sampling rows (``sample_*``) and
request slots (``temperature``, ``seeds``, ``logits_cache``, ``sample_idx_mapping`` values).
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from kernels import block_table as block_tables
from kernels import draft_inputs, kv_cache, sampling, validate
from kernels.spec.attention_backends import AttentionMetadata


@dataclass(frozen=True)
class DraftConfig:
    """Shapes of the draft layer and of its drafting (K = ``max_draft_tokens``; Q = K or 1 + K)."""

    vocab_size: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    max_draft_tokens: int
    anchor_first: bool = False  # DSpark: Q = K, every row predicts the next position; DFlash: Q = 1 + K
    causal: bool = False  # DFlash full-attention layers are non-causal
    mask_token_id: int = 0
    max_model_len: int = 4096
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "block_size",
                     "max_draft_tokens", "max_model_len"):
            validate.positive_int(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads: {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: {self.head_dim} is odd; RoPE rotates pairs of dimensions")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id: {self.mask_token_id} is not in [0, {self.vocab_size})")

    @property
    def new_tokens(self) -> int:
        """Query rows that are not drafts (docs/contracts/spec.md#specgraph_candidates ``n_new``): the DFlash bonus
        row, none in anchor-first mode."""
        return 0 if self.anchor_first else 1

    def query_len(self, num_draft_tokens: int) -> int:
        return num_draft_tokens + self.new_tokens

    @property
    def max_query_len(self) -> int:
        return self.query_len(self.max_draft_tokens)

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


class DraftWeights(NamedTuple):
    embed: torch.Tensor  # [vocab, hidden]
    wq: torch.Tensor  # [hidden, num_heads * head_dim]
    wk: torch.Tensor  # [hidden, num_kv_heads * head_dim]
    wv: torch.Tensor  # [hidden, num_kv_heads * head_dim]
    w_out: torch.Tensor  # [num_heads * head_dim, vocab]


def random_weights(config: DraftConfig, seed: int) -> DraftWeights:
    """Seeded float32 CPU weights: unit-scale q, k, v and logits spread over several units."""
    gen = torch.Generator().manual_seed(seed)
    h, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    def normal(rows, cols, std):
        return torch.randn(rows, cols, generator=gen) * std

    return DraftWeights(embed=normal(config.vocab_size, h, 1.0), wq=normal(h, q_dim, h ** -0.5),
                        wk=normal(h, kv_dim, h ** -0.5), wv=normal(h, kv_dim, h ** -0.5),
                        w_out=normal(q_dim, config.vocab_size, 1.0))


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dimension by ``position * inv_freq`` (NeoX layout).

    The angles are computed in float64, so cos and sin are right to float32 rounding even at
    positions in the thousands.
    """
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().to(x.dtype)[:, None, :], angles.sin().to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph (never, without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def inverse_frequencies(config: DraftConfig, device) -> torch.Tensor:
    exponents = torch.arange(config.head_dim // 2, dtype=torch.float64, device=device) * 2 / config.head_dim
    return config.rope_theta ** -exponents


class DraftBuffers:
    """Every per-step input and output of the step, allocated once for the largest batch.

    ``S`` batch rows, ``S * Q`` query rows and ``S * K`` sampling rows at the deepest draft;
    ``max_num_tokens`` target rows for the context outputs of draft-input preparation.
    """

    def __init__(self, config: DraftConfig, max_num_reqs: int, max_num_tokens: int, max_blocks_per_req: int,
                 device: torch.device):
        s, q, k = max_num_reqs, config.max_query_len, config.max_draft_tokens
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(s * q, **i32)
        self.positions = torch.zeros(s * q, **i64)
        self.query_slot_mapping = torch.full((s * q,), -1, **i64)
        self.query_start_loc = torch.zeros(s + 1, **i32)
        self.seq_lens = torch.zeros(s, **i32)
        self.block_table = torch.zeros(s, max_blocks_per_req, **i32)
        self.sample_indices = torch.zeros(s * k, **i64)
        self.sample_pos = torch.zeros(s * k, **i64)
        self.sample_idx_mapping = torch.full((s * k,), -1, **i32)  # -1: inert until a batch fills it (fix 3)
        self.context_positions = torch.zeros(max_num_tokens, **i64)
        self.context_slot_mapping = torch.full((max_num_tokens,), -1, **i64)
        self.draft_tokens = torch.full((s, k), -1, **i64)

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(vars(self))


class DraftStep:
    """The draft layer bound to its weights, attention backend, KV cache, sampling state and buffers.

    The KV cache (``[num_blocks, block_size, H_kv, D]`` float32), ``temperature`` [S] float32,
    ``seeds`` [S] int64 and ``logits_cache`` [S, K, V] float32 belong to the caller, who updates them
    in place between steps: a captured graph keeps their addresses.
    """

    def __init__(self, config: DraftConfig, weights: DraftWeights, backend, *, k_cache, v_cache, temperature, seeds,
                 logits_cache, max_num_reqs: int, max_num_tokens: int, max_blocks_per_req: int):
        c = config
        q_dim, kv_dim = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = {"embed": (c.vocab_size, c.hidden_size), "wq": (c.hidden_size, q_dim), "wk": (c.hidden_size, kv_dim),
                  "wv": (c.hidden_size, kv_dim), "w_out": (q_dim, c.vocab_size)}
        for name, shape in shapes.items():
            weight = validate.tensor(name, getattr(weights, name), dtype=torch.float32, ndim=2)
            if tuple(weight.shape) != shape:
                raise ValueError(f"{name}: shape {tuple(weight.shape)}, expected {shape}")
        cache_shape = (c.block_size, c.num_kv_heads, c.head_dim)
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            validate.tensor(name, cache, dtype=torch.float32, ndim=4)
            if tuple(cache.shape[1:]) != cache_shape:
                raise ValueError(f"{name}: shape {tuple(cache.shape)}, expected [num_blocks, *{list(cache_shape)}]")
        validate.tensor("temperature", temperature, dtype=torch.float32, ndim=1)
        validate.tensor("seeds", seeds, dtype=torch.int64, ndim=1)
        validate.tensor("logits_cache", logits_cache, dtype=torch.float32, ndim=3)
        if tuple(logits_cache.shape) != (temperature.numel(), c.max_draft_tokens, c.vocab_size):
            raise ValueError(f"logits_cache: shape {tuple(logits_cache.shape)}, expected "
                             f"[{temperature.numel()}, {c.max_draft_tokens}, {c.vocab_size}] (slots, K, vocab)")
        self.device = validate.on_kernel_device(k_cache=k_cache, v_cache=v_cache, temperature=temperature, seeds=seeds,
                                                logits_cache=logits_cache, **weights._asdict())
        validate.positive_int("max_num_reqs", max_num_reqs)
        self.config, self.weights, self.backend = config, weights, backend
        self.k_cache, self.v_cache = k_cache, v_cache
        self.temperature, self.seeds, self.logits_cache = temperature, seeds, logits_cache
        self.max_num_reqs = max_num_reqs
        self.buffers = DraftBuffers(config, max_num_reqs, max_num_tokens, max_blocks_per_req, self.device)
        self.inv_freq = inverse_frequencies(config, self.device)
        # Logits-cache column of each sampling row, per depth k: 0..k-1 for every request.
        self.cache_cols = {k: (torch.arange(max_num_reqs * k, device=self.device) % k).to(torch.int32)
                           for k in range(1, c.max_draft_tokens + 1)}

    def _sizes(self, num_reqs: int, num_draft_tokens: int) -> tuple[int, int]:
        if not 1 <= num_draft_tokens <= self.config.max_draft_tokens:
            raise ValueError(f"num_draft_tokens: {num_draft_tokens} is not in [1, {self.config.max_draft_tokens}]")
        if not 0 <= num_reqs <= self.max_num_reqs:
            raise ValueError(f"num_reqs: {num_reqs} is not in [0, {self.max_num_reqs}]")
        return num_reqs * self.config.query_len(num_draft_tokens), num_reqs * num_draft_tokens

    def metadata(self, num_reqs: int) -> AttentionMetadata:
        buf = self.buffers
        return AttentionMetadata(buf.query_start_loc[:num_reqs + 1], buf.seq_lens[:num_reqs],
                                 buf.block_table[:num_reqs], self.config.block_size)

    def prepare(self, *, num_reqs: int, num_draft_tokens: int, idx_mapping, target_query_start_loc,
                target_positions, num_sampled, num_rejected, last_sampled, next_prefill_tokens, num_cached_tokens,
                block_table) -> bool:
        """Fill the static buffers for ``num_reqs`` rows (the live batch, then padding); False if refused.

        Eager, before the step: copies the batch-row ``block_table`` [B, <= W] into the static table,
        prepares the draft inputs (a batch with a partial cached block is refused, fix 4: its
        ``draft_tokens`` rows become -1 and nothing else runs), shifts the table by the cached
        blocks and plans the attention backend.
        """
        c, buf = self.config, self.buffers
        num_tokens, num_rows = self._sizes(num_reqs, num_draft_tokens)
        live = idx_mapping.numel()
        if live > num_reqs:
            raise ValueError(f"num_reqs: {num_reqs} rows cannot hold the {live} live batch rows")
        width = block_table.shape[1]
        if width > buf.block_table.shape[1]:
            raise ValueError(f"block_table: {width} columns, the static table has {buf.block_table.shape[1]}")
        buf.block_table[:live, :width].copy_(block_table)
        buf.block_table[:live, width:].zero_()  # the null block: PAD slots, never read below seq_lens
        prepared = draft_inputs.prepare_draft_inputs(
            idx_mapping=idx_mapping, target_query_start_loc=target_query_start_loc,
            target_positions=target_positions, num_sampled=num_sampled, num_rejected=num_rejected,
            last_sampled=last_sampled, next_prefill_tokens=next_prefill_tokens, num_cached_tokens=num_cached_tokens,
            block_table=buf.block_table[:live], block_size=c.block_size, num_draft_tokens=num_draft_tokens,
            anchor_first=c.anchor_first, mask_token_id=c.mask_token_id, max_model_len=c.max_model_len,
            context_positions=buf.context_positions, context_slot_mapping=buf.context_slot_mapping,
            input_ids=buf.input_ids[:num_tokens], positions=buf.positions[:num_tokens],
            query_slot_mapping=buf.query_slot_mapping[:num_tokens], sample_indices=buf.sample_indices[:num_rows],
            sample_pos=buf.sample_pos[:num_rows], sample_idx_mapping=buf.sample_idx_mapping[:num_rows],
            query_start_loc=buf.query_start_loc[:num_reqs + 1], seq_lens=buf.seq_lens[:num_reqs],
            draft_tokens=buf.draft_tokens[:num_reqs, :num_draft_tokens])
        if not prepared:
            return False
        block_tables.shift_block_table_rows(buf.block_table[:live], idx_mapping, num_cached_tokens,
                                            buf.seq_lens[:live], c.block_size)
        self.backend.plan(self.metadata(num_reqs))
        return True

    def reset_for_capture(self, num_reqs: int, num_draft_tokens: int) -> None:
        """Dummy inputs for a capture (whose warm-up really runs): every request a bare query block over
        the null block, no KV write, every sampling row inert (docs/contracts/draft_inputs.md#padding: capture can
        execute the buffers before a real batch has filled them)."""
        buf, q = self.buffers, self.config.query_len(num_draft_tokens)
        num_tokens, num_rows = self._sizes(num_reqs, num_draft_tokens)
        buf.input_ids[:num_tokens] = 0
        buf.positions[:num_tokens] = 0
        buf.query_slot_mapping[:num_tokens] = -1
        buf.query_start_loc[:num_reqs + 1].copy_(torch.arange(0, (num_reqs + 1) * q, q))
        buf.seq_lens[:num_reqs] = q
        buf.block_table[:num_reqs] = 0
        buf.sample_indices[:num_rows] = 0
        buf.sample_pos[:num_rows] = 0
        buf.sample_idx_mapping[:num_rows] = -1

    def backbone(self, num_reqs: int, num_draft_tokens: int) -> torch.Tensor:
        """The draft layer up to its attention output ``[num_tokens, H, D]`` (the hidden state)."""
        c, w, buf = self.config, self.weights, self.buffers
        num_tokens, _ = self._sizes(num_reqs, num_draft_tokens)
        positions = buf.positions[:num_tokens]
        h = w.embed.index_select(0, buf.input_ids[:num_tokens])
        query = rope((h @ w.wq).view(num_tokens, c.num_heads, c.head_dim), positions, self.inv_freq)
        key = rope((h @ w.wk).view(num_tokens, c.num_kv_heads, c.head_dim), positions, self.inv_freq)
        value = (h @ w.wv).view(num_tokens, c.num_kv_heads, c.head_dim)
        kv_cache.write_kv(key, value, buf.query_slot_mapping[:num_tokens], self.k_cache, self.v_cache)
        hidden = torch.zeros_like(query)  # rows outside every request (padding) stay 0
        self.backend.forward(query, self.k_cache, self.v_cache, self.metadata(num_reqs), scale=c.scale, out=hidden)
        return hidden

    def logits(self, hidden: torch.Tensor, num_reqs: int, num_draft_tokens: int) -> torch.Tensor:
        """Logits ``[num_reqs * K, V]`` of the sampling rows, gathered from the hidden state."""
        _, num_rows = self._sizes(num_reqs, num_draft_tokens)
        rows = hidden.flatten(1).index_select(0, self.buffers.sample_indices[:num_rows])
        return rows @ self.weights.w_out

    def sample(self, logits: torch.Tensor, num_reqs: int, num_draft_tokens: int) -> None:
        """Gumbel-sample every sampling row into ``draft_tokens[:num_reqs, :K]``; inert rows write no cache."""
        buf = self.buffers
        _, num_rows = self._sizes(num_reqs, num_draft_tokens)
        tokens = sampling.gumbel_sample(logits, buf.sample_idx_mapping[:num_rows], self.temperature, self.seeds,
                                        buf.sample_pos[:num_rows], draft=True, logits_cache=self.logits_cache,
                                        cache_cols=self.cache_cols[num_draft_tokens][:num_rows])
        buf.draft_tokens[:num_reqs, :num_draft_tokens].copy_(tokens.view(num_reqs, num_draft_tokens))
