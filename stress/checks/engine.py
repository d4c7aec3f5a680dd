"""Registry entries of engine.step: whole spec-decode steps against a reference engine."""



from stress.checks.common import EVERYWHERE
from stress.checks.graphs import _DRAFT_GRAPHS, GRAPHS_UNCACHED
from stress.core.types import RETURN, SANITIZER, Check, Mutant, Patch, Skip
from stress.families import engine as engine_families
from stress.families.refusals import (
    Corruption,
    refusal_family,
)
from stress.oracles import engine as engine_check

_ENGINE = "kernels.spec.engine:Engine"


# The step from its schedule to its finish: a planted bug moves the poisoning of freed draft blocks across it.
_POISON_FIRST = """        self._poison_freed_draft_blocks()
        self._assign_slots(plan, record)
        batch = plan.batch
        record["batch.request"] = torch.tensor([r.index for r, _ in batch], dtype=torch.int64)
        record["batch.num_tokens"] = torch.tensor([n for _, n in batch], dtype=torch.int32)
        if batch:
            slot_ids = [self.slots.slot_of[r.req_id] for r, _ in batch]
            idx_mapping = self._upload(slot_ids, torch.int32)
            record["idx_mapping"] = _snap(idx_mapping)
            step_depth = self._depth(len(batch))  # chosen at schedule time, from what was observed so far
            target = self._target_step(batch, idx_mapping, record)
            verified = self._verify(batch, slot_ids, target, record)
            self._propose(batch, slot_ids, idx_mapping, target, verified, step_depth, record)
            if self.schedule is not None:
                self.depth_controller.observe(len(batch), *verified["acceptance"])
        record["kv.guards_intact"] = torch.tensor(self.model.guards_intact())
        self.scheduler.finish_step()
"""


# ---------------------------------------------------------------- refusals

def _one_block_pool(pool: str, blocks: int) -> Corruption:
    """The engine's ``pool`` (``target_num_blocks`` or ``draft_num_blocks``) of ``blocks`` blocks."""
    def apply(rng, inputs):
        config = dict(inputs["config"])
        config["scheduler"] = {**config["scheduler"], pool: blocks}
        inputs["config"] = config

    return Corruption("num_blocks", f"{pool} {blocks}: no block besides the null block", apply)


ENGINE_REFUSALS = refusal_family(engine_families.shared_prefix, tuple(
    _one_block_pool(pool, blocks) for pool in ("target_num_blocks", "draft_num_blocks") for blocks in (1, 0)),
    "the engine's BlockPool")


CHECKS = (
    Check(
        name="engine.step",
        contract="the whole spec-decode step, every recorded field against a reference engine after every step, "
                 "plus the step's own invariants",
        kernel=engine_check.run_engine,  # drives the production kernels.spec.engine.Engine step by step
        reference=engine_check.reference,
        families={**engine_families.FAMILIES, "refused": ENGINE_REFUSALS},
        outputs=(RETURN,),
        compare=engine_check.compare,
        metrics=engine_check.metrics,
        repeats={"cpu": 1, "cuda": 2},
        host_heavy=True,  # its reference replays every step: a third of a second a case on a GPU's host
        whole_path=True,
        iteration_share=engine_check.ITERATION_SHARE,
        # the scheduler alone against the reference's, over 40 workloads of random outcomes: far more shapes of
        # admission, eviction and preemption than engine cases can afford; the model config's refusals; the
        # KV guards' own check, which no production run trips
        unit_tests=("tests/test_engine.py::test_engine_and_reference_schedulers_agree",
                    "tests/test_engine.py::test_prefix_cache_hits_full_blocks_and_evicts_in_free_order",
                    "tests/test_engine.py::test_a_model_config_refuses_an_odd_head_dim_naming_it",
                    "tests/test_engine.py::test_guards_intact_sees_a_write_to_a_guard_or_the_null_block"),
        skips=(Skip("a whole-path check: its kernels are sanitized through their own checks, and its graph "
                    "families need the caching allocator (" + GRAPHS_UNCACHED + ")", tool=SANITIZER),),
        mutants=(
            Mutant("prefix-blocks-visible", "fix 4, pre-fix (docs/fixes.md#fix-4): no restored counts reach the "
                                            "draft: seq_lens not "
                   "shortened, no shift, no fail-closed; the draft reads never-written (NaN) KV",
                   (Patch(_ENGINE, "self._upload(self.slots.num_cached_tokens)",
                          "self._upload(np.zeros_like(self.slots.num_cached_tokens))"),),
                   oracles=EVERYWHERE, families=("shared_prefix", "preempt_resume", "unaligned_prefix")),
            Mutant("refused-batch-skips-context-kv", "upstream order: a batch that drafts nothing (refused for an "
                   "unaligned prefix, or at depth 0) returns before its context KV is written, so later drafts "
                   "read never-written KV",
                   (Patch(_ENGINE, "        self.model.write_context_kv(",
                          "        prepared and self.model.write_context_kv("),),
                   oracles=EVERYWHERE, families=("unaligned_prefix", "dsd_bands")),
            # the step's own invariants (stress.oracles.engine_invariants), each killing a slip that no recorded field
            # shows until a workload happens to make it decide something
            Mutant("free-count-per-hit-twice", "the target pool's free count for an admission takes two blocks "
                   "per unreferenced cache hit: admission refuses too early only when it is tight to that block",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "sum(1 for b in hits if self.refs[b] == 0)",
                          "sum(2 for b in hits if self.refs[b] == 0)"),),
                   oracles={"cpu": "accounting", "cuda": "accounting"}, families=("preempt_resume",)),
            Mutant("partial-block-under-stale-key", "a request's chain keys from before its preemption are kept one "
                   "block past its full computed blocks: while it recomputes in chunks, the block being recomputed, "
                   "not yet full, is entered in the prefix cache under the key of the full block that position held",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "list(known[:num_blocks])",
                          "list(known[:num_blocks + 1])"),),
                   oracles={"cpu": "accounting", "cuda": "accounting"}, families=("evicted_resume",)),
            Mutant("lookup-past-a-miss", "a prefix-cache lookup skips a missing chain key and goes on: a chain "
                   "whose first block was evicted while a later one stayed cached restores that later block at the "
                   "first position",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "break\n            hits.append(block)",
                          "continue\n            hits.append(block)"),),
                   oracles={"cpu": "kv", "cuda": "kv"}, families=("gapped_chain",)),
            Mutant("draft-mode-of-first-offered", "the eager draft's graph mode is judged on the first backend "
                   "offered instead of the one picked: the same unless the offer lists a backend the priorities "
                   "put later first",
                   (Patch(_ENGINE, "draft_graph_mode(self.draft_backend, cap, non_causal)",
                          "draft_graph_mode(offered[0], cap, non_causal)"),),
                   oracles=EVERYWHERE, families=("offer_order",)),
            Mutant("graph-step-causal-inverted", "the draft step DraftGraphs drives is described as causal when the "
                   "draft is not: a backend whose graphs hold only causal drafts (host-planned) claims full graphs "
                   "for the non-causal one (fix 6)",
                   (Patch("kernels.spec.engine:_GraphStep", "not engine.non_causal)", "engine.non_causal)"),),
                   oracles=EVERYWHERE, families=("uncapturable_graphs",)),
            Mutant("freed-draft-blocks-never-poisoned", "a request's freed draft blocks are listed for poisoning "
                   "after its block list is emptied: no freed draft block is ever poisoned, which a correct step "
                   "never shows (it reads no freed block)",
                   (Patch("kernels.spec.scheduler:Scheduler",
                          "        self.freed_draft_blocks += req.draft_blocks\n"
                          "        req.target_blocks, req.draft_blocks = [], []",
                          "        req.target_blocks, req.draft_blocks = [], []\n"
                          "        self.freed_draft_blocks += req.draft_blocks"),),
                   oracles={"cpu": "accounting", "cuda": "accounting"}, families=("draft_pool_pressure",)),
            Mutant("one-request-drafts-nothing", "a batch of one request runs no draft step through DraftGraphs "
                   "(the empty-batch test reads num_reqs == 1)",
                   (Patch(_DRAFT_GRAPHS, "if num_draft_tokens == 0 or num_reqs == 0:",
                          "if num_draft_tokens == 0 or num_reqs == 1:"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("padded_graphs",)),
            # host slips that equal model sizes or one feature at a time hide: the combined family, whose sizes all
            # differ and whose features meet, kills them (host code: the same on the GPU); the step's invariants,
            # judged before the lockstep comparison, see the length cut (drafts kept) and the stale cache (kv)
            Mutant("scale-from-hidden", "attention scaled by 1/sqrt(hidden / heads) instead of the model's "
                   "1/sqrt(head_dim): the same number whenever head_dim == hidden / heads",
                   (Patch("kernels.spec.models:Model", "math.sqrt(config.head_dim)",
                          "math.sqrt(config.hidden // config.heads)"),),
                   oracles=EVERYWHERE, families=("combined",)),
            Mutant("verify-q-last-columns", "verification reads the last num_drafts columns of the draft-logits "
                   "cache instead of the first: the same columns only when a request verifies all K drafts, so only "
                   "a cut draft (budget, adaptive depth, a DSD band) shows it",
                   (Patch(_ENGINE, "cached_q = self.draft_logits[:, :num_drafts]",
                          "cached_q = self.draft_logits[:, -num_drafts:]"),),
                   oracles=EVERYWHERE, families=("budget_cut_cache", "dsd_bands", "combined")),
            Mutant("depth-by-running-count", "the step's depth looked up for every running request instead of the "
                   "batch's rows: the same unless the token budget leaves running requests out of a DSD step",
                   (Patch(_ENGINE, "step_depth = self._depth(len(batch))",
                          "step_depth = self._depth(len(self.scheduler.running))"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("combined",)),
            Mutant("drafts-past-the-limit", "a request keeps one draft more than the room left before max_model_len: "
                   "the next step's budget cut or the request's finish usually hides it",
                   (Patch(_ENGINE, "req.drafts = [t for t in row if t >= 0][:room]",
                          "req.drafts = [t for t in row if t >= 0][:room + 1]"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("combined", "long_context")),
            Mutant("evicted-block-still-cached", "a target block popped from the free queue keeps its prefix-cache "
                   "entry: a later hit restores KV another request has overwritten",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "del self.block_of[key]", "pass"),),
                   oracles={"cpu": "kv", "cuda": "kv"}, families=("combined", "prefix_chain", "crowded_preemption")),
            Mutant("graphs-without-adaptive-depths", "the engine keeps the candidates DraftGraphs built from the "
                   "band caps alone: a depth the controller lowered below the cap finds no graph and drafts eagerly",
                   (Patch(_ENGINE, "            self.graphs.candidates = self.draft_candidates", "            pass"),),
                   oracles=EVERYWHERE, families=("adaptive_graphs",)),
            Mutant("target-graphs-at-draft-width", "the target's graph candidates are built for the draft's query "
                   "length: the same for DFlash, K instead of 1 + K for DSpark",
                   (Patch(_ENGINE, "graphs.build_candidates(decode_query_len=1 + self.k, **shape)",
                          "graphs.build_candidates(decode_query_len=self.q, **shape)"),),
                   oracles=EVERYWHERE, families=("adaptive_graphs",)),
            Mutant("cached-q-last-columns", "verification reads the last cached draft-logits columns instead of "
                   "the first: the same unless a request verifies fewer drafts than K with the cache",
                   (Patch(_ENGINE, "cached_q = self.draft_logits[:, :num_drafts]",
                          "cached_q = self.draft_logits[:, -num_drafts:]"),),
                   oracles=EVERYWHERE, families=("budget_cut_cache",)),
            Mutant("temperature-of-first-holder", "a slot keeps the first non-zero temperature it was given: a "
                   "request admitted to a slot a sampled request freed samples at that request's temperature",
                   (Patch(_ENGINE, "temperatures.append(req.temperature)",
                          "temperatures.append(float(self.temperature[slot]) or req.temperature)"),),
                   oracles=EVERYWHERE, families=("sampling_churn",)),
            Mutant("draft-width-with-bonus", "the eager draft dispatch takes every layout's query width as depth "
                   "+ 1: right for DFlash, one too many for DSpark",
                   (Patch(_ENGINE, "q = step_depth + self.new_tokens", "q = step_depth + 1"),),
                   oracles=EVERYWHERE, families=("dspark_dispatch",)),
            Mutant("freed-draft-blocks-poisoned-late", "the draft blocks freed since the last step are poisoned after "
                   "the step instead of before its writes: blocks a preemption frees and the growing request takes "
                   "in the same step are written, then poisoned under the context KV it reads next step",
                   (Patch(_ENGINE, _POISON_FIRST,
                          _POISON_FIRST.replace("        self._poison_freed_draft_blocks()\n", "")
                          .replace("self.scheduler.finish_step()\n", "self.scheduler.finish_step()\n"
                                                                      "        self._poison_freed_draft_blocks()\n")),),
                   oracles=EVERYWHERE, families=("draft_pool_pressure",)),
            Mutant("next-prefill-token-past-prompt-lost", "the next token of a chunk that ends mid-way is stored "
                   "only while the chunk is inside the prompt: a resumed request whose recompute chunk ends past its "
                   "prompt leaves the draft's bonus row the token its slot held before",
                   (Patch(_ENGINE, "elif req.num_computed < len(req.tokens):",
                          "elif req.num_computed < len(req.prompt):"),),
                   oracles=EVERYWHERE, families=("chunked_resume",)),
            Mutant("draft-graphs-never-captured", "the engine builds its draft graphs but never captures them: "
                   "every step dispatched to a FULL graph drafts the same tokens eagerly, without the replay",
                   (Patch(_ENGINE, "self.graphs.capture()", "self.graphs.clear()"),),
                   oracles={"cuda": "graphs"}, families=("padded_graphs",),
                   why_not="CUDA graphs exist only on a GPU: the CPU drafts eagerly, nothing is captured"),
            Mutant("blocked-head-sent-back", "a waiting request whose blocks do not fit goes to the back of the "
                   "queue and the next one is tried: a short request admitted past a long one at the head",
                   (Patch("kernels.spec.scheduler:Scheduler",
                          "                break\n            self.target_pool.touch(hits)",
                          "                if req is self.waiting[-1]:\n                    break\n"
                          "                self.waiting.append(self.waiting.pop(0))\n                continue\n"
                          "            self.target_pool.touch(hits)"),),
                   oracles=EVERYWHERE, families=("blocked_head",)),
            Mutant("observe-under-running-count", "a step's acceptance is recorded in the band of every running "
                   "request instead of the batch's rows: the same unless the token budget leaves running requests "
                   "out of a step under bands with their own controllers",
                   (Patch(_ENGINE, "self.depth_controller.observe(len(batch),",
                          "self.depth_controller.observe(len(self.scheduler.running),"),),
                   oracles=EVERYWHERE, families=("budget_bands",)),
        ),
    ),
)
