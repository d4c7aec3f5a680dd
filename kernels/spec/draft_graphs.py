"""CUDA graphs of the draft step: one per FULL descriptor, one shared memory pool, dispatch and replay.

``DraftGraphs`` builds the draft's graph candidates with ``kernels.spec.graphs.build_candidates``
(decode query length Q = 1 + K for DFlash, K for DSpark anchor-first; a DSD schedule gives one
width per band, and a band of depth 0 needs no graph: it drafts nothing). It asks
``kernels.spec.backends.draft_graph_mode`` whether the step's attention backend may be captured at
all (fix 6 (docs/fixes.md#fix-6): a backend whose plan bakes per-step lengths must run eagerly), then captures every
FULL descriptor, largest first, into one pool.

A run dispatches the live batch (B requests, B * Q tokens, uniform Q). Draft-input preparation runs
eagerly for the padded size of the descriptor (``DraftStep.prepare``: it reads host values and clears
the padded rows, docs/contracts/draft_inputs.md#padding); then the graph replays, its padded rows inert, or the
step runs eagerly when no graph fits.

Graph outputs are kept as non-owning views (the pool owns their memory, as vLLM's weak references
do). Fix 8: an output that a graph or the caller reads after capture must not go back to the pool,
where a later capture could be handed the same address; each captured backbone output is therefore
retained in ``_captured_backbone_outputs`` until ``clear()``.
"""

from typing import NamedTuple

import torch

from kernels.spec import backends, graphs
from kernels.spec.draft_step import DraftStep, capturing
from kernels.spec.graphs import BatchDescriptor, Mode


class StepOutputs(NamedTuple):
    hidden: torch.Tensor  # [num_tokens, H, D] the backbone output
    logits: torch.Tensor  # [num_reqs * K, V] logits of the sampling rows


class DraftOutputs(NamedTuple):
    """One run: the live rows' drafts and hidden state, and how the step ran."""

    draft_tokens: torch.Tensor  # [B, K] view of the static buffer; -1 rows when the batch was refused
    hidden: torch.Tensor | None  # [B * Q, H, D]; valid until this descriptor's next run; None if nothing ran
    descriptor: BatchDescriptor  # FULL: padded to its size; NONE: the live batch, eagerly
    replayed: bool


def _non_owning(t: torch.Tensor) -> torch.Tensor:
    """A view of ``t``'s memory that does not keep it allocated (the graph pool owns it)."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(alias, t.storage_offset(), t.shape, t.stride())


class DraftGraphs:
    """Capture, dispatch and replay the draft step; ``clear()`` releases graphs and retained outputs.

    ``capture_sizes`` are token counts, ``schedule`` an optional DSD schedule
    ``[(first_batch_size, last_batch_size, depth), ...]``; ``small_grid`` bounds the exact
    small-batch descriptors (0: only the capture sizes, so smaller batches replay padded).
    ``pool`` lets several owners share one graph memory pool. ``capability_major`` (default: the
    step's GPU) is what the backend selection judges the backend's graph support on.
    """

    def __init__(self, step: DraftStep, *, capture_sizes, max_num_reqs: int, schedule=None, small_grid: int = 32,
                 pool=None, capability_major: int | None = None):
        config = step.config
        if max_num_reqs > step.max_num_reqs:
            raise ValueError(f"max_num_reqs: {max_num_reqs} rows, but the step's buffers hold {step.max_num_reqs}")
        self.step = step
        self.candidates = graphs.build_candidates(capture_sizes, max_num_reqs, config.max_query_len,
                                                  config.max_draft_tokens, schedule, small_grid=small_grid)
        if capability_major is None:  # the GPU's; under the CPU interpreter, where nothing is captured, an H200's
            capability_major = torch.cuda.get_device_capability(step.device)[0] if step.device.type == "cuda" else 9
        self.mode = backends.draft_graph_mode(step.backend.name, capability_major, not config.causal)
        self.pool = pool
        self._graphs: dict[BatchDescriptor, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[BatchDescriptor, StepOutputs] = {}  # non-owning views of each graph's outputs
        self._captured_backbone_outputs: list[torch.Tensor] = []

    def depth(self, descriptor: BatchDescriptor) -> int:
        return descriptor.uniform - self.step.config.new_tokens

    @property
    def descriptors(self) -> list[BatchDescriptor]:
        """The FULL descriptors this owner captures: none when the backend may not be captured, and
        none of depth 0 (such a band drafts nothing)."""
        if self.mode is not Mode.FULL:
            return []
        kmax = self.step.config.max_draft_tokens
        return [d for d in self.candidates.full if 1 <= self.depth(d) <= kmax]

    def descriptor_for(self, num_reqs: int, num_draft_tokens: int) -> BatchDescriptor:
        """A FULL descriptor to replay (padded to its size), or NONE: run the live batch eagerly."""
        q = self.step.config.query_len(num_draft_tokens)
        if self.mode is Mode.FULL and 0 < num_reqs <= self.candidates.max_num_reqs:
            found = graphs.dispatch(self.candidates, num_reqs, num_reqs * q, q)
            if found.mode is Mode.FULL:
                return found
        return BatchDescriptor(Mode.NONE, num_reqs * q)

    @property
    def captured(self) -> dict[BatchDescriptor, StepOutputs]:
        """Each captured graph's outputs (non-owning views)."""
        return dict(self._outputs)

    @property
    def retained(self) -> tuple[torch.Tensor, ...]:
        return tuple(self._captured_backbone_outputs)

    def forward(self, num_reqs: int, num_draft_tokens: int) -> StepOutputs:
        """The step over the static buffers, eagerly or under capture."""
        hidden = self.step.backbone(num_reqs, num_draft_tokens)
        if capturing():
            self._captured_backbone_outputs.append(hidden)  # fix 8: the tail reads it after capture
        logits = self.step.logits(hidden, num_reqs, num_draft_tokens)
        self.step.sample(logits, num_reqs, num_draft_tokens)
        return StepOutputs(hidden, logits)

    def capture(self) -> None:
        """Capture every FULL descriptor, largest first, into the shared pool (created if none was given).

        Each capture is preceded by a warm-up run on a side stream (it compiles the Triton kernels, and
        allocates outside the pool) over dummy inputs that write no KV and no logits cache.
        """
        if not self.descriptors:
            return  # the backend may not be captured (it runs eagerly), or no size fits
        if self.step.device.type != "cuda":
            raise ValueError(f"capture: CUDA graphs need a CUDA device; the step runs on {self.step.device}")
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        for desc in sorted(self.descriptors, key=lambda d: (d.num_tokens, d.uniform), reverse=True):
            if desc in self._graphs:
                continue
            k = self.depth(desc)
            self.step.reset_for_capture(desc.num_reqs, k)
            self.step.backend.plan(self.step.metadata(desc.num_reqs))
            side = torch.cuda.Stream(self.step.device)
            side.wait_stream(torch.cuda.current_stream(self.step.device))
            with torch.cuda.stream(side):
                self.forward(desc.num_reqs, k)
            torch.cuda.current_stream(self.step.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.forward(desc.num_reqs, k)
            self._graphs[desc] = graph
            self._outputs[desc] = StepOutputs(*(_non_owning(t) for t in outputs))

    def run(self, *, num_draft_tokens: int, replay: bool = True, **target) -> DraftOutputs:
        """Draft ``num_draft_tokens`` tokens for each request of the live batch.

        ``target`` holds the target-side inputs of ``DraftStep.prepare`` (``idx_mapping`` [B], the
        target CSR and positions, per-slot state, the batch-row ``block_table``). A depth of 0 drafts
        nothing and runs nothing. ``replay=False`` runs the step eagerly at the size the batch would be
        replayed at (the same padded shapes): the comparison run of a replay.
        """
        num_reqs = target["idx_mapping"].numel()
        buf = self.step.buffers
        if num_draft_tokens == 0 or num_reqs == 0:
            return DraftOutputs(buf.draft_tokens[:num_reqs, :0], None, BatchDescriptor(Mode.NONE, 0), False)
        desc = self.descriptor_for(num_reqs, num_draft_tokens)
        padded = desc.num_reqs if desc.mode is Mode.FULL else num_reqs
        tokens = buf.draft_tokens[:num_reqs, :num_draft_tokens]
        if not self.step.prepare(num_reqs=padded, num_draft_tokens=num_draft_tokens, **target):
            return DraftOutputs(tokens, None, desc, False)
        graph = self._graphs.get(desc) if replay else None
        if graph is not None:
            graph.replay()
            hidden = self._outputs[desc].hidden
        else:
            hidden = self.forward(padded, num_draft_tokens).hidden
        live_tokens = num_reqs * self.step.config.query_len(num_draft_tokens)
        return DraftOutputs(tokens, hidden[:live_tokens], desc, graph is not None)

    def clear(self) -> None:
        """Drop every graph, then the outputs retained for them (their memory returns to the pool)."""
        self._graphs.clear()
        self._outputs.clear()
        self._captured_backbone_outputs.clear()
