"""Registry entries of graphs.replay and graphs.lifetime (CUDA-graph replay and graph storage lifetime, GPU only) and
graphs.eager_step (the captured step run eagerly at its padded size, on any device)."""

import dataclasses

import reference.spec.draft_step
import stress.oracles.graph_replay
from stress.checks.common import EVERYWHERE, unreachable_by_engine
from stress.checks.spec import NON_CAUSAL_CLAIMS_FULL
from stress.core.types import RETURN, SANITIZER, Check, Mutant, Patch, Reach, Skip
from stress.families import graph_replay as replay_families

_DRAFT_GRAPHS = "kernels.spec.draft_graphs:DraftGraphs"
_STEP = "kernels.spec.draft_step:DraftStep"
_NO_GRAPHS = "CUDA graphs need a GPU: capture, replay and the graph memory pool exist only on a CUDA device"
_ON_GPU = {"cuda": "divergence"}
# with the caching allocator off, capture fails with cudaErrorStreamCaptureInvalidated
GRAPHS_UNCACHED = ("CUDA graph capture needs the caching allocator's private pool, which "
                    "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (what makes an out-of-bounds access visible) turns off")

_OWN_STEP = "the engine drafts through its own step (kernels.spec.engine), not kernels.spec.draft_step, "
# the warm-up slips of the draft step's capture, from the whole step's side
_OWN_WARM_UP = unreachable_by_engine("the engine's capture warm-up runs its own dummy inputs (kernels.spec.engine), "
                                     "not kernels.spec.draft_step's")
PADDED_ROWS_SLOT_0 = Mutant(
    "padded-draft-rows-slot-0", "fix 3, pre-fix (docs/fixes.md#fix-3) in the draft step: padded sampling rows map to "
    "slot 0 and write its logits cache",
    (Patch(_STEP, "buf.sample_idx_mapping[:num_rows], self.temperature",
           "buf.sample_idx_mapping[:num_rows].clamp(min=0), self.temperature"),),
    oracles=_ON_GPU, families=("padded_graph",), why_not=_NO_GRAPHS,
    path=unreachable_by_engine(_OWN_STEP + "whose padded sampling rows this bug maps to slot 0"))


def _graph_check(name: str, contract: str, driver, reference_driver, families: dict, judge, mutants: tuple[Mutant, ...],
                 unit_tests: tuple[str, ...] = ()) -> Check:
    """A GPU-only check whose ``driver`` (stress.oracles.graph_replay) captures and replays kernels.spec.draft_graphs;
    each case replays its graphs many times already, so it runs once."""
    return Check(name=name, contract=contract, kernel=driver, reference=reference_driver, families=families,
                 outputs=(RETURN,), compare=judge, repeats={"cuda": 1}, mutants=mutants, unit_tests=unit_tests,
                 skips=(Skip(_NO_GRAPHS, device="cpu"), Skip(GRAPHS_UNCACHED, tool=SANITIZER)))


CHECKS = (
    _graph_check(
        "graphs.replay", "a padded CUDA-graph replay of the draft step equals the eager step bit for bit, and the "
                         "eager step the float64 reference (GPU)",
        stress.oracles.graph_replay.replay_draft_graphs, reference.spec.draft_step.expected_replay,
        replay_families.REPLAY_FAMILIES, stress.oracles.graph_replay.judge_replay,
        (
            Mutant("replay-skipped", "a graph that does nothing: the dispatched graph is never replayed",
                   (Patch(_DRAFT_GRAPHS, "graph.replay()", "pass"),), oracles=_ON_GPU, why_not=_NO_GRAPHS,
                   path=Reach(families=("padded_graphs",), unreachable={
                       "cpu": "CUDA graphs exist only on a GPU: the CPU drafts eagerly, no replay to skip"})),
            Mutant("kv-write-not-captured", "the capture misses a kernel: the query rows' K/V write runs eagerly "
                   "but is left out of the graph",
                   (Patch(_STEP, "kv_cache.write_kv(", "capturing() or kv_cache.write_kv("),),
                   oracles=_ON_GPU, why_not=_NO_GRAPHS,
                   path=unreachable_by_engine(_OWN_STEP + "whose KV write this bug leaves out of the capture")),
            PADDED_ROWS_SLOT_0,
            # the spec.backends patch, hunted where its effect shows: host-planned attention captured for
            # non-causal drafting replays with the lengths of the capture batch
            dataclasses.replace(NON_CAUSAL_CLAIMS_FULL, oracles=_ON_GPU, families=("non_causal_draft",),
                                why_not=_NO_GRAPHS),
        ),
        # the backends on rows no draft step builds for the host-planned loop: queries without keys, keys
        # without queries, a single key
        unit_tests=("tests/test_draft_graphs.py::"
                    "test_each_backend_attends_like_the_reference_on_rows_without_keys_or_queries",),
    ),
    _graph_check(
        "graphs.lifetime", "a captured graph's backbone output is not handed to a later capture in the shared pool "
                           "(fix 8, GPU)",
        stress.oracles.graph_replay.lifetime_experiment, reference.spec.draft_step.expected_lifetime,
        replay_families.LIFETIME_FAMILIES, stress.oracles.graph_replay.judge_lifetime,
        (
            Mutant("backbone-not-retained", "fix 8, pre-fix (docs/fixes.md#fix-8): captured backbone outputs are "
                                            "not retained, so "
                   "a later capture in the shared pool is handed their memory",
                   (Patch(_DRAFT_GRAPHS, "self._captured_backbone_outputs.append(hidden)", "pass"),),
                   oracles=_ON_GPU, why_not=_NO_GRAPHS,
                   path=unreachable_by_engine(
                       "the engine reads a replay's results only from static buffers the graph copies its logits and "
                       'tokens into, never a backbone output after the replay: an address a later capture reuses '
                       'changes nothing it reads')),
        ),
    ),
    Check(
        name="graphs.eager_step",
        contract="the draft step that graphs capture, run eagerly at the padded size its dispatch picks, equals the "
                 "float64 reference: drafts, live hidden rows, logits cache, KV writes, the graph dispatched and the "
                 "graphs to capture, whose warm-ups write nothing (CPU and GPU)",
        kernel=stress.oracles.graph_replay.eager_draft_step, reference=reference.spec.draft_step.expected_eager_step,
        families=replay_families.REPLAY_FAMILIES, outputs=(RETURN,), compare=stress.oracles.graph_replay.judge_eager,
        repeats={"cpu": 1, "cuda": 1}, iteration_share=0.5,  # a case runs 5 to 12 batches of the whole draft step
        # what clear drops, which no driver calls: the graphs and the outputs retained for them
        unit_tests=("tests/test_draft_graphs.py::test_a_cleared_graph_is_never_replayed",
                    "tests/test_draft_graphs.py::test_backbone_outputs_are_retained_only_while_capturing"),
        mutants=(
            dataclasses.replace(PADDED_ROWS_SLOT_0, oracles=EVERYWHERE),
            Mutant("query-kv-not-written", "the draft step forgets the query rows' K/V write: its attention reads "
                   "the NaN the cache holds at the block's own positions",
                   (Patch(_STEP, "kv_cache.write_kv(", "None and kv_cache.write_kv("),), oracles=EVERYWHERE,
                   path=unreachable_by_engine(_OWN_STEP + "whose KV write this bug forgets")),
            Mutant("depth-0-graphs-captured", "fix 1's other half in DraftGraphs: the graphs of a depth-0 band "
                   "(DFlash's bonus-only width 1) are staged for capture, whose warm-up of a 0-token draft fails",
                   (Patch(_DRAFT_GRAPHS, "1 <= self.depth(d) <= kmax", "0 <= self.depth(d) <= kmax"),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("zero_width_band",),
                   path=unreachable_by_engine("the engine's CPU steps capture nothing, and on the GPU a graph "
                                              "that is never dispatched changes no recorded field")),
            Mutant("warm-up-writes-null-block", "a capture's dummy inputs map the query rows to slot 0 instead of "
                   "PAD: every warm-up writes K/V into the null block",
                   (Patch(_STEP, "buf.query_slot_mapping[:num_tokens] = -1",
                          "buf.query_slot_mapping[:num_tokens] = 0"),),
                   oracles=EVERYWHERE,
                   path=_OWN_WARM_UP),
            Mutant("warm-up-last-sample-row-kept", "a capture's dummy inputs reset the sampling rows' slots one row "
                   "short: the last row keeps whatever slot the buffer held, and the warm-up samples into that "
                   "slot's logits cache",
                   (Patch(_STEP, "buf.sample_idx_mapping[:num_rows] = -1",
                          "buf.sample_idx_mapping[:num_rows - 1] = -1"),),
                   oracles=EVERYWHERE,
                   path=_OWN_WARM_UP),
            Mutant("draft-scale-from-hidden", "the draft attention's scale is taken from hidden_size / num_heads "
                   "instead of head_dim: the same number only in a model whose head dim is its hidden size over its "
                   "heads", (Patch(_STEP, "scale=c.scale", "scale=(c.hidden_size // c.num_heads) ** -0.5"),),
                   oracles=EVERYWHERE,
                   path=unreachable_by_engine(_OWN_STEP + "whose attention scale this bug changes")),
            Mutant("host-planned-values-from-keys", "the host-planned backend gathers its values from the key cache "
                   "(the line above's): its attention weights the keys instead of the values",
                   (Patch("kernels.spec.attention_backends:HostPlannedBackend", "values = v_cache.index_select(",
                          "values = k_cache.index_select("),),
                   oracles=EVERYWHERE, families=("non_causal_draft",),
                   path=unreachable_by_engine(_OWN_STEP + "whose attention backends this bug reaches")),
            Mutant("rope-frequencies-float32", "the draft's inverse rotary frequencies are computed in float32: at "
                   "positions in the tens of thousands the angles move a key by more than float32's own error",
                   (Patch("kernels.spec.draft_step:inverse_frequencies", "dtype=torch.float64",
                          "dtype=torch.float32"),),
                   oracles=EVERYWHERE, families=("long_positions",),
                   path=unreachable_by_engine(_OWN_STEP + "whose rotary frequencies this bug rounds")),
            Mutant("draft-clamp-one-short", "the draft step clamps its query positions at max_model_len - 2: the "
                   "rows of a query block that runs past the limit are written and attended one position early",
                   (Patch(_STEP, "max_model_len=c.max_model_len,", "max_model_len=c.max_model_len - 1,"),),
                   oracles=EVERYWHERE, families=("length_limit",),
                   path=unreachable_by_engine(_OWN_STEP + "whose length limit this bug moves")),
            Mutant("table-past-batch-width-kept", "the draft step copies a narrower batch's block table into the "
                   "static table without clearing the columns past it: a query block that runs past its row writes its "
                   "K/V into the block an earlier, wider batch (or the poison) left there instead of nothing (PAD)",
                   (Patch(_STEP, "buf.block_table[:live, width:].zero_()", "buf.block_table[:live, width:]"),),
                   oracles=EVERYWHERE, families=("narrow_tables",),
                   path=unreachable_by_engine(_OWN_STEP + "and hands it the whole static table, never a narrower one")),
            Mutant("draft-graphs-default-small-grid", "DraftGraphs builds its candidates without the small grid it "
                   "was given (the default 32): small batches dispatch to exact graphs instead of padding to a "
                   "capture size; the drafts are the same, the dispatch is not",
                   (Patch(_DRAFT_GRAPHS, "schedule, small_grid=small_grid)", "schedule)"),), oracles=EVERYWHERE,
                   families=("padded_graph",),
                   path=unreachable_by_engine("the engine hands DraftGraphs its own candidate table, built with "
                                              "the small grid it was configured with")),
        ),
    ),
)
