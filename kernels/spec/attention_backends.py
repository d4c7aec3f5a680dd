"""The two draft attention backends a captured draft step can run (docs/fixes.md#fix-6).

Both follow the metadata-builder pattern: ``plan(meta)`` runs eagerly before every step (and before
a capture), ``forward`` is what a CUDA graph records. ``meta`` holds views of the draft's static
device buffers, so a value the forward reads from them is read afresh on every replay.

* ``specsan_paged`` keeps every per-step value (query starts, seq_lens, the shifted batch-row block
  table) in those device buffers and calls ``kernels.attention.paged_attention``: replay-safe, so it
  claims full-graph support for causal and non-causal drafting alike.
* ``host_planned`` is built the way a prefill wrapper is: its non-causal path reads the per-step
  lengths to the host at plan time and launches one attention per request with those lengths as
  Python ints (slice bounds, block counts). A captured graph keeps the launches of the plan made at
  capture time, so a replay attends over capture-time lengths whatever the buffers say now. Its causal
  path is the decode path: device metadata, like ``specsan_paged``. The selection functions in
  ``kernels.spec.backends`` must therefore keep its non-causal path out of full graphs.
"""

from dataclasses import dataclass

import torch

from kernels import attention, runtime


@dataclass(frozen=True)
class AttentionMetadata:
    """Views of the static buffers for the first ``num_reqs`` batch rows (live and padded)."""

    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_table: torch.Tensor  # int32 [num_reqs, W], batch-row, already shifted (fix 4)
    block_size: int


class SpecsanPagedBackend:
    """Paged attention over device metadata; nothing to plan."""

    name = "specsan_paged"

    def __init__(self, causal: bool):
        self.causal = causal

    def plan(self, meta: AttentionMetadata) -> None:
        pass  # every per-step value is read by the kernel from device memory

    def forward(self, query, k_cache, v_cache, meta: AttentionMetadata, *, scale: float, out) -> None:
        attention.paged_attention(query, k_cache, v_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
                                  scale=scale, causal=self.causal, out=out)


class HostPlannedBackend:
    """Causal: the decode path (device metadata). Non-causal: a host-planned loop over requests."""

    name = "host_planned"

    def __init__(self, causal: bool):
        self.causal = causal
        self._requests: list[tuple[int, int, int]] | None = None  # (query start, query end, seq_len) per row

    def plan(self, meta: AttentionMetadata) -> None:
        if self.causal:
            return
        # One wait for the device, for both (planning happens outside any capture).
        starts, lens = (t.tolist() for t in runtime.read_back(meta.query_start_loc, meta.seq_lens))
        self._requests = [(starts[b], starts[b + 1], lens[b]) for b in range(len(lens))]

    def forward(self, query, k_cache, v_cache, meta: AttentionMetadata, *, scale: float, out) -> None:
        if self.causal:
            attention.paged_attention(query, k_cache, v_cache, meta.block_table, meta.seq_lens, meta.query_start_loc,
                                      scale=scale, causal=True, out=out)
            return
        if self._requests is None:
            raise ValueError("host_planned: forward before plan; call plan(meta) for this step first")
        group = query.shape[1] // k_cache.shape[2]
        for batch_row, (start, end, seq_len) in enumerate(self._requests):
            if end == start or seq_len == 0:
                continue
            num_blocks = -(-seq_len // meta.block_size)
            blocks = meta.block_table[batch_row, :num_blocks].long()  # device ids, host-sized slice
            keys = k_cache.index_select(0, blocks).flatten(0, 1)[:seq_len].repeat_interleave(group, 1)
            values = v_cache.index_select(0, blocks).flatten(0, 1)[:seq_len].repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", query[start:end], keys) * scale
            out[start:end] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values)


BACKENDS = {backend.name: backend for backend in (SpecsanPagedBackend, HostPlannedBackend)}


def make(name: str, *, causal: bool):
    """The backend called ``name`` for causal or non-causal drafting."""
    try:
        return BACKENDS[name](causal)
    except KeyError:
        raise ValueError(f"backend {name!r}: expected one of {', '.join(BACKENDS)}") from None
