"""Workloads for ``engine.step``: a seeded request stream, engine settings and the model weights.

A case is ``num_steps`` steps of one workload, replayed by ``kernels.spec.engine`` and by
``reference.spec.engine``. Small on the CPU (the interpreter runs every kernel), bf16 and larger
on the GPU.

The weights are seeded random matrices with a planted circuit, so that every greedy decision is
decided by a margin far wider than bf16 rounding and a draft sharing the weights proposes exactly
what the target emits:
* class: token v belongs to class ``v % C``. Embeddings carry a one-hot class in the first C
  coordinates (the mask token none); the value projection and the output projection copy those
  coordinates through attention, and nothing else writes them. A row's class coordinates hold a
  positive mix of the classes of what it attends to, and ``head_raw`` adds ``ALPHA`` times that
  to every token of the class: a request whose prompt is one class continues in that class.
* position: ``position_codes[t]`` gives one token per class ``BETA`` at predicted position t.
* content: ``head_norm`` adds at most ``GAMMA`` (its columns' norm bound), so attention still
  shows in every logit while never flipping a decision (BETA > 2 GAMMA).
So the target emits, at position t, the class-c token coded for t; the draft, whose mask rows
attend to the request's visible context and bonus (all class c), proposes the same. A draft that
reads another request's KV can change class; one that reads never-written (NaN) KV collapses.
"""

import numpy as np
import torch

from stress.core.types import Case
from stress.families import engine_shapes
from stress.families.common import big, pick

ALPHA, BETA, GAMMA = 40.0, 2.0, 0.5
CLASSES = 4


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16 and back: the GPU engine's weights are then exactly the reference's."""
    return t.to(torch.bfloat16).to(torch.float32)


def model_config(rng, device: str, max_model_len: int, num_spec_tokens: int, dims: dict | None = None) -> dict:
    """Tiny under the interpreter (one layer in most cases: each layer adds three KV writes and two
    attention launches per step), bf16-sized on the GPU; or ``dims`` as given (``engine_shapes``)."""
    if dims is None and big(device):
        dims = {"vocab": 256, "hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 32, "ffn": 128}
    elif dims is None:
        dims = {"vocab": 64, "hidden": 32, "layers": 1 + int(rng.random() < 0.3), "heads": 2, "kv_heads": 1,
                "head_dim": 16, "ffn": 32}
    return {**dims, "rope_theta": 10000.0, "max_position": max_model_len + num_spec_tokens + 2}


def model_weights(rng: np.random.Generator, model: dict) -> dict[str, torch.Tensor]:
    v, h, c = model["vocab"], model["hidden"], CLASSES
    qd, kvd = model["heads"] * model["head_dim"], model["kv_heads"] * model["head_dim"]

    def normal(*shape, std=1.0):
        return torch.from_numpy(rng.standard_normal(shape) * std).to(torch.float32)

    w = {}
    embed = normal(v + 1, h)
    embed[:, :c] = 0
    embed[torch.arange(v), torch.arange(v) % c] = 1.0  # row v (the mask token) has no class
    w["embed"] = embed
    for layer in range(model["layers"]):
        wq, wk = normal(h, qd, std=h ** -0.5), normal(h, kvd, std=h ** -0.5)
        wq[:c], wk[:c] = 0, 0  # attention patterns do not depend on the class
        wv = normal(h, kvd, std=h ** -0.5)
        wv[:, :c] = 0
        wv[:c] = 0
        wv[torch.arange(c), torch.arange(c)] = 1.0  # value dims 0..C-1 of kv head 0: the class, copied
        wo = normal(qd, h, std=0.5 * qd ** -0.5)
        wo[:, :c] = 0
        wo[:c] = 0
        wo[torch.arange(c), torch.arange(c)] = 1.0  # query head 0's class dims back into the class coordinates
        w_up = normal(h, model["ffn"], std=h ** -0.5)
        w_up[:c] = 0
        w_down = normal(model["ffn"], h, std=0.5 * model["ffn"] ** -0.5)
        w_down[:, :c] = 0
        w.update({f"layer{layer}.wq": wq, f"layer{layer}.wk": wk, f"layer{layer}.wv": wv, f"layer{layer}.wo": wo,
                  f"layer{layer}.w_up": w_up, f"layer{layer}.w_down": w_down})
    head_raw = torch.zeros(h, v)
    head_raw[torch.arange(v) % c, torch.arange(v)] = ALPHA
    w["head_raw"] = head_raw
    head_norm = normal(h, v)
    head_norm[:c] = 0
    w["head_norm"] = head_norm * (GAMMA / head_norm.norm(dim=0, keepdim=True) / h ** 0.5)
    codes = torch.zeros(model["max_position"], v)
    per_class = v // c
    for cls in range(c):
        chosen = rng.integers(0, per_class, model["max_position"]) * c + cls
        codes[torch.arange(model["max_position"]), torch.from_numpy(chosen)] = BETA
    w["position_codes"] = codes
    return {name: _bf16(t) for name, t in w.items()}


def prompt(rng: np.random.Generator, vocab: int, cls: int, length: int) -> list[int]:
    return (rng.integers(0, vocab // CLASSES, length) * CLASSES + cls).tolist()


def request(rng, req_no: int, *, arrival: int, prompt_tokens: list[int], max_new: int,
            temperature: float = 0.0) -> dict:
    """Ids sort in an order unrelated to admission, so sorted and set order both differ from it; about
    half the requests have no seed and draw a fallback one (docs/fixes.md#fix-2a)."""
    seed = int(rng.integers(-2**40, 2**40)) if rng.random() < 0.5 else None
    return {"req_id": f"r{int(rng.integers(0, 1000)):03d}-{req_no}", "arrival": arrival, "prompt": prompt_tokens,
            "max_new_tokens": max_new, "temperature": temperature, "seed": seed}


def _sized(device: str, cpu, gpu):
    return gpu if big(device) else cpu


def full_length(request: dict, k: int) -> int:
    """The tokens a request holds at most: its prompt, every new token, and two steps of drafts and bonus."""
    return len(request["prompt"]) + request["max_new_tokens"] + 2 * k + 2


def blocks_at_full_length(requests: list[dict], k: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens every request of ``requests`` holds at full length at once."""
    return sum(-(-full_length(r, k) // block_size) for r in requests)


def engine_case(rng, device, requests_fn, *, num_steps, max_num_reqs, budget, block_sizes, block_share=1.0, k=3,
                anchor_first=False, probabilistic=False, dsd_schedule=None, adaptive_window=2, max_model_len=None,
                cuda_graphs=False, graph_settings=None, num_blocks=None, dims=None, note="") -> Case:
    """One case: settings, weights and ``requests_fn(rng, vocab)``'s request stream (``weights=`` too, for a
    ``requests_fn`` marked ``reads_weights``, which predicts outputs from the planted circuit). Each pool holds
    ``block_share`` of the blocks every request needs at full length at once (1: no preemption), or
    ``num_blocks(requests)``'s (target, draft) counts, the null block included. ``dims``: the model's sizes
    (``engine_shapes.distinct_shape``), else the fixed ones of ``model_config``."""
    max_model_len = max_model_len or _sized(device, 64, 1024)
    model = model_config(rng, device, max_model_len, k, dims)
    weights = model_weights(rng, model)
    requests = requests_fn(rng, model["vocab"], **({"weights": weights} if getattr(requests_fn, "reads_weights", False)
                                                   else {}))
    bs_t, bs_d = block_sizes
    lengths = [min(full_length(r, k), max_model_len + k + 2) for r in requests]
    need = (sum(-(-n // bs_t) for n in lengths), sum(-(-(n + k + 1) // bs_d) for n in lengths))
    num_blocks = num_blocks(requests) if num_blocks else tuple(int(n * block_share) + 1 for n in need)
    config = {
        "model": model,
        "scheduler": {"max_num_reqs": max_num_reqs, "max_num_batched_tokens": budget, "target_block_size": bs_t,
                      "target_num_blocks": num_blocks[0], "draft_block_size": bs_d, "draft_num_blocks": num_blocks[1],
                      "max_model_len": max_model_len},
        "num_spec_tokens": k, "anchor_first": anchor_first, "draft_probabilistic": probabilistic,
        "dsd_schedule": dsd_schedule, "adaptive_window": adaptive_window, "seed": int(rng.integers(0, 2**31)),
        "dtype": "bfloat16" if big(device) else "float32", "cuda_graphs": cuda_graphs,
    }
    config.update(graph_settings or _graph_settings(rng, max_num_reqs, k, anchor_first))
    layout = "dspark" if anchor_first else "dflash"
    return Case(inputs={"config": config, "weights": weights, "requests": requests, "num_steps": num_steps,
                        "global_seed": int(rng.integers(0, 2**31))},
                note=f"{layout} K={k} L={model['layers']} bs={bs_t}/{bs_d} S={max_num_reqs} {len(requests)} requests "
                     f"{note}".strip())


# The attention backends a case's engine offers its draft (the engine picks by capability and causality,
# fix 6, docs/fixes.md#fix-6): ours may always be captured, FlashAttention on SM90 too and on SM100 for
# uniform batches, FlashInfer and the host-planned backend only for single-token decode when non-causal (eager
# drafts). The last offer holds none of the auto-selected backends: the engine falls back to the first offered.
BACKEND_OFFERS = (("specsan_paged",), ("flash_attn", "flashinfer"), ("host_planned",), ("flashinfer",),
                  ("host_planned", "specsan_paged"))
CAPTURABLE_OFFERS = (("specsan_paged",), ("flash_attn", "flashinfer"))  # the offers whose pick claims FULL graphs


def _graph_settings(rng, max_num_reqs: int, k: int, anchor_first: bool) -> dict:
    """Capture sizes (in tokens) with no small-batch grid, so most batches replay padded to a larger
    graph; the GPU generation the backend choice is made for; the backends offered."""
    q = k if anchor_first else k + 1
    sizes = sorted({q, 2 * q, max_num_reqs * q} - {0})
    return {"capture_sizes": sizes, "small_grid": 0, "capability_major": int(pick(rng, (9, 10))),
            "draft_backends": list(pick(rng, BACKEND_OFFERS))}


def shared_prefix(rng, device, launch):
    """Requests over one long common prefix, arriving a step apart: each later one restores the prefix
    from the cache and must draft over its own tokens only (the upstream acceptance collapse). More
    requests than slots, finishing together, so freed slots are recycled in one go."""
    n, slots = _sized(device, (5, 3), (12, 8))
    bs = _sized(device, 4, 16)

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        common = prompt(rng, vocab, cls, int(rng.integers(*_sized(device, (12, 28), (100, 400)))))
        max_new = int(rng.integers(3, 7))
        return [request(rng, i, arrival=i * int(rng.integers(0, 2)),
                        prompt_tokens=common + prompt(rng, vocab, cls, int(rng.integers(1, 2 * bs))), max_new=max_new)
                for i in range(n)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 10), max_num_reqs=slots,
                       budget=_sized(device, 40, 2048), block_sizes=(bs, bs), note="shared prefix")


def unaligned_prefix(rng, device, launch):
    """The draft block is twice the target's: a prefix hit of an odd number of target blocks leaves a
    partial draft block restored, and every batch holding that request is refused (fail closed). The
    first request samples: its drafts are verified with rejections in the refused steps too."""
    bs = _sized(device, 4, 16)
    odd = bool(rng.integers(2))

    def requests(rng, vocab):
        a, b = rng.choice(CLASSES, 2, replace=False).tolist()
        blocks = 2 * int(rng.integers(1, _sized(device, 4, 12))) + (1 if odd else 0)
        common = prompt(rng, vocab, b, blocks * bs + int(rng.integers(0, bs)))
        return [request(rng, 0, arrival=0, prompt_tokens=prompt(rng, vocab, a, int(rng.integers(4, 12))), max_new=12,
                        temperature=1.0),
                request(rng, 1, arrival=0, prompt_tokens=common, max_new=2),
                request(rng, 2, arrival=1, prompt_tokens=common + prompt(rng, vocab, b, int(rng.integers(1, 6))),
                        max_new=int(rng.integers(1, 4))),
                request(rng, 3, arrival=2, prompt_tokens=prompt(rng, vocab, a, int(rng.integers(4, 12))), max_new=10)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 7, 10), max_num_reqs=4,
                       budget=_sized(device, 48, 2048), block_sizes=(bs, 2 * bs),
                       note="odd prefix hit (unaligned)" if odd else "even prefix hit")


def preempt_resume(rng, device, launch):
    """Too few blocks for every running request: the last admitted is preempted, and resumes later from
    its own blocks still in the prefix cache (a restored prefix to mask, a new slot, a new seed)."""
    bs = _sized(device, 4, 16)
    n = _sized(device, 3, 6)

    def requests(rng, vocab):
        return [request(rng, i, arrival=0 if i < n - 1 else 1,
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                             int(rng.integers(*_sized(device, (6, 14), (60, 200))))),
                        max_new=int(rng.integers(*_sized(device, (12, 20), (30, 60))))) for i in range(n)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 7, 12), max_num_reqs=n,
                       budget=_sized(device, 40, 2048), block_sizes=(bs, bs), block_share=0.6, note="block pressure")


def _flat(blocks: list[list[int]]) -> list[int]:
    return [token for block in blocks for token in block]


def prefix_chain(rng, device, launch):
    """A chain of full blocks, then the same chain with one inner block changed, then that variant as a prompt
    of whole blocks and one token longer, arriving a step apart (each after the one before is cached). A block
    past the change must be found by its whole prefix, never by its own tokens; a prompt of whole blocks
    restores all but its last block (the last token is recomputed), one token more restores them all."""
    bs = _sized(device, 4, 16)
    m = int(rng.integers(3, _sized(device, 6, 10)))  # blocks in the chain
    changed = int(rng.integers(1, m - 1))  # an inner block: at least one block follows it

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        chain = [prompt(rng, vocab, cls, bs) for _ in range(m)]
        variant = [list(block) for block in chain]
        variant[changed][0] = (variant[changed][0] + CLASSES) % vocab  # another token of the same class

        def tail():
            return prompt(rng, vocab, cls, int(rng.integers(1, bs)))

        prompts = (_flat(chain) + tail(), _flat(variant) + tail(), _flat(variant), _flat(variant) + tail()[:1])
        return [request(rng, i, arrival=i, prompt_tokens=p, max_new=int(rng.integers(2, 5)))
                for i, p in enumerate(prompts)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 5, 6), max_num_reqs=4,
                       budget=_sized(device, 48, 2048), block_sizes=(bs, bs),
                       note=f"{m}-block chain, block {changed} changed")


def mid_prefill_hit(rng, device, launch):
    """A prompt prefilled in two chunks, the first ending inside a block, and a second request over the same
    prefix admitted beside the second chunk: only the blocks the first chunk filled are cached yet (a block
    whose tokens are known but not all computed must not be)."""
    bs = _sized(device, 4, 16)
    full = int(rng.integers(1, _sized(device, 4, 8)))  # full blocks the first chunk computes
    partial = int(rng.integers(1, bs))  # and tokens of the next block
    budget = full * bs + partial
    rest = int(rng.integers(bs - partial, budget))  # the second chunk: past that block, within the budget

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        first = prompt(rng, vocab, cls, budget + rest)
        second = first[:(full + 1) * bs] + prompt(rng, vocab, cls, int(rng.integers(1, bs + 1)))
        return [request(rng, 0, arrival=0, prompt_tokens=first, max_new=3),
                request(rng, 1, arrival=1, prompt_tokens=second, max_new=3)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 4, 5), max_num_reqs=2, budget=budget,
                       block_sizes=(bs, bs), note=f"first chunk {budget} tokens ({full} blocks + {partial})")


def tight_pools(rng, device, launch):
    """Pools with no block to spare. Either one block besides the null block, which two requests take in turn;
    or prompts of ``m`` blocks prefilled a block per step into a target pool of exactly ``m`` blocks, so the
    last chunk's block is the last free one (the second request reuses the first one's freed blocks)."""
    k = 2
    if rng.integers(2):
        bs = 16  # one block holds a whole request: prompt, outputs, drafts and the draft's lookahead

        def requests(rng, vocab):
            return [request(rng, i, arrival=0, prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                                                    int(rng.integers(2, 6))), max_new=3)
                    for i in range(2)]

        return engine_case(rng, device, requests, num_steps=6, max_num_reqs=2, budget=_sized(device, 16, 64),
                           block_sizes=(bs, bs), k=k, num_blocks=lambda requests: (2, 2), note="one-block pools")
    bs = _sized(device, 4, 16)
    m = int(rng.integers(2, _sized(device, 4, 6)))
    length = m * bs - int(rng.integers(0, bs))

    def requests(rng, vocab):
        return [request(rng, i, arrival=0, prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), length),
                        max_new=1) for i in range(2)]

    def exact(requests):  # the target pool as full as a prompt makes it; the draft's never short
        return m + 1, -(-(length + k + 1) // bs) + 1

    return engine_case(rng, device, requests, num_steps=2 * m, max_num_reqs=2, budget=bs, block_sizes=(bs, bs),
                       k=k, num_blocks=exact, note=f"{m}-block prompts in a {m}-block target pool")


def blocked_head(rng, device, launch):
    """Admission in queue order: the head of the waiting queue needs more target blocks for its first chunk than
    a running request leaves free, and a short request queued behind it would fit. Slots and budget are left and
    nothing is preempted, so only the queue order keeps the short one waiting; the head is admitted once the
    running request finishes, and the short one with it."""
    k, bs = int(rng.integers(1, 4)), _sized(device, 4, 16)
    bs_d = bs * int(pick(rng, (1, 2)))
    held = int(rng.integers(2, 4))
    len_a = held * bs - int(rng.integers(0, bs // 2))  # the running request's prompt: `held` blocks
    new_a, new_c = int(rng.integers(3, 7)), int(rng.integers(2, 5))
    len_c = int(rng.integers(1, bs))  # one block
    at_step1 = -(-(len_a + 1 + k) // bs)  # the running request's blocks in its first decode
    total = -(-(len_a + new_a + k) // bs) + -(-(len_c + new_c + k) // bs) + int(rng.integers(0, 2))
    len_b = (total - at_step1 + 1) * bs - int(rng.integers(0, bs // 2))  # one block more than is free at step 1
    budget = max(len_a, 1 + k + len_b + len_c) + int(rng.integers(0, 4))

    def requests(rng, vocab):
        return [request(rng, 0, arrival=0, prompt_tokens=prompt(rng, vocab, 0, len_a), max_new=new_a),
                request(rng, 1, arrival=1, prompt_tokens=prompt(rng, vocab, 1, len_b), max_new=1),
                request(rng, 2, arrival=1, prompt_tokens=prompt(rng, vocab, 2, len_c), max_new=new_c)]

    def pools(requests):  # the target pool as computed above; the draft's never short
        return total + 1, sum(-(-(full_length(r, k) + k + 1) // bs_d) for r in requests) + 1

    return engine_case(rng, device, requests, num_steps=_sized(device, 7, 8), max_num_reqs=int(rng.integers(2, 4)),
                       budget=budget, block_sizes=(bs, bs_d), k=k, num_blocks=pools,
                       note=f"head needs {total - at_step1 + 1} of {total - at_step1} free target blocks")


def _four_decodes(rng, device, k: int, budget: int, note: str, temperature: float = 0.0,
                  probabilistic: bool = False, num_steps: int = 6) -> Case:
    """Four requests admitted (and running) at step 0, prompts of a quarter of the ``budget``, each decoding
    K drafts a step at ``temperature``: a budget of about two decodes leaves the later ones cut or out."""
    slots = 4

    def requests(rng, vocab):
        return [request(rng, i, arrival=0, prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                                                budget // slots),
                        max_new=int(rng.integers(6, 12)), temperature=temperature) for i in range(slots)]

    return engine_case(rng, device, requests, num_steps=_sized(device, num_steps, 8), max_num_reqs=slots,
                       budget=budget, block_sizes=(4, 4) if not big(device) else (16, 16), k=k,
                       probabilistic=probabilistic, note=note)


def budget_bound(rng, device, launch):
    """A token budget of two decodes (two requests' bonus token and drafts), often exactly, and more requests
    running behind them: a step spends the budget to the last token, and the requests after that must get
    nothing that step, not a batch row of zero tokens. Otherwise one or k tokens more: the third request's
    decode is cut to its bonus token alone or to part of its drafts (the rest dropped). Prompts of a quarter
    of the budget, so all four are admitted (and running) at step 0."""
    k = _sized(device, 3, 4)
    budget = 2 * (k + 1) + int(pick(rng, (0, 0, 1, k)))
    return _four_decodes(rng, device, k, budget, f"budget {budget} tokens")


def budget_cut_cache(rng, device, launch):
    """Sampled requests verified against the draft-logits cache under a budget of two decodes and 2..k tokens
    more: the third request's decode is cut to its bonus token and fewer drafts than it proposed, so its
    verification reads the first of its cached columns, not all K."""
    k = _sized(device, 3, 4)
    budget = 2 * (k + 1) + int(rng.integers(2, k + 1))
    temperature = float(pick(rng, (0.5, 0.7, 1.0)))
    return _four_decodes(rng, device, k, budget, f"budget {budget} tokens, temperature {temperature}",
                         temperature=temperature, probabilistic=True, num_steps=8)


def greedy_output(weights: dict, prompt_tokens: list[int], count: int) -> list[int]:
    """The ``count`` tokens the target emits after ``prompt_tokens`` (greedy): the circuit gives position t the
    token of the prompt's class that ``position_codes[t]`` codes."""
    codes = weights["position_codes"]
    of_class = torch.arange(codes.shape[1]) % CLASSES == prompt_tokens[0] % CLASSES
    start = len(prompt_tokens)
    return [int(torch.where(of_class, codes[t], -1.0).argmax()) for t in range(start, start + count)]


def multi_turn(rng, device, launch):
    """A conversation's next turn: a request finishes, and a later one's prompt is that request's prompt and
    answer plus a new message, so the prefix cache restores blocks that hold generated tokens. Each turn ends
    on a block boundary with its last step's tokens all emitted, so its final token (whose KV was never
    computed) closes a full block: that block must not be cached."""
    bs, k = _sized(device, 4, 16), 3
    steps = int(rng.integers(1, 4))  # decode steps of the first turn, each emitting k + 1 tokens
    answer = 1 + steps * (k + 1)  # the prefill's token, then whole steps: the last lands exactly on the limit
    first_len = bs * int(rng.integers(1, _sized(device, 4, 8))) + (-answer) % bs

    def requests(rng, vocab, weights):
        cls = int(rng.integers(CLASSES))
        first = prompt(rng, vocab, cls, first_len)
        history = first + greedy_output(weights, first, answer)
        return [request(rng, 0, arrival=0, prompt_tokens=first, max_new=answer),
                request(rng, 1, arrival=steps + 1, prompt_tokens=history + prompt(rng, vocab, cls,
                                                                                   int(rng.integers(1, bs + 1))),
                        max_new=int(rng.integers(2, 6)))]

    requests.reads_weights = True
    return engine_case(rng, device, requests, num_steps=steps + 4, max_num_reqs=2, budget=_sized(device, 64, 2048),
                       block_sizes=(bs, bs), k=k, note=f"first turn {first_len} + {answer} tokens")


def crowded_preemption(rng, device, launch):
    """More requests than slots and blocks for about 60% of what the running ones need at full length:
    requests are preempted while others still wait, and each goes back to the front of the queue."""
    bs = _sized(device, 4, 16)
    slots = _sized(device, 3, 6)
    n = 2 * slots + 1

    def requests(rng, vocab):
        return [request(rng, i, arrival=0,
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                             int(rng.integers(*_sized(device, (6, 14), (60, 200))))),
                        max_new=int(rng.integers(*_sized(device, (12, 20), (30, 60))))) for i in range(n)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 7, 12), max_num_reqs=slots,
                       budget=_sized(device, 40, 2048), block_sizes=(bs, bs), block_share=0.6 * slots / n,
                       note="preemption with requests waiting")


def draft_pool_pressure(rng, device, launch):
    """The draft pool is the one that runs short (the target's has room for everything): decoding requests
    grow their draft blocks every step, and after a drawn number of steps one finds none left, preempts
    the last running request and takes the draft block it freed in that same step. DSpark's layout
    (Q = K): a verified decode of K + 1 tokens reaches one position past the draft's lookahead, so its last
    verified token's context KV lands in the block just taken, which the next step's draft reads (DFlash's
    lookahead of 1 + K keeps every verified position in blocks held since an earlier step). A greedy decode
    of K + 1 tokens advances one whole draft block and every prompt is K short of a block boundary, so every
    decode takes exactly one new block, whose first position is the last verified one."""
    k, bs_d = 3, 4  # K + 1 = the draft block
    n = _sized(device, 3, 6)
    full_steps = int(rng.integers(1, 3))  # decode steps every request grows in before the pool runs dry
    spare = int(rng.integers(0, 2))  # blocks left then: the first request takes it, the second preempts

    def requests(rng, vocab):
        lengths = [bs_d * int(rng.integers(*_sized(device, (2, 4), (5, 15)))) - k for _ in range(n)]
        return [request(rng, i, arrival=0, max_new=int(rng.integers(*_sized(device, (16, 24), (40, 60)))),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), length))
                for i, length in enumerate(lengths)]

    def pools(requests):  # (target, draft), null blocks included: a prefill takes (L + K) / 4 draft blocks
        target = blocks_at_full_length(requests, k, 4)
        prefilled = sum((len(r["prompt"]) + k) // bs_d for r in requests)
        return target + 1, prefilled + n * full_steps + spare + 1

    return engine_case(rng, device, requests, num_steps=_sized(device, 7, 12), max_num_reqs=n,
                       budget=_sized(device, 40, 2048), block_sizes=(4, bs_d), k=k, anchor_first=True,
                       num_blocks=pools, note=f"draft pool dry after {full_steps} decode steps, {spare} spare")


def mixed_prefill_decode(rng, device, launch):
    """A small token budget: prompts are prefilled in chunks (the bonus is the next prompt token) while
    earlier requests decode with drafts; DFlash or DSpark layout. The first two prompts arrive together
    and are exactly one decode width long: a prefill batch shaped like decode (never a decode graph)."""
    bs = _sized(device, 4, 16)
    k = int(rng.integers(2, 4))

    def requests(rng, vocab):
        lengths = _sized(device, (6, 20), (100, 400))
        return [request(rng, i, arrival=max(i - 1, 0), max_new=int(rng.integers(4, 10)),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                             k + 1 if i < 2 else int(rng.integers(*lengths))))
                for i in range(3)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 10), max_num_reqs=3,
                       budget=_sized(device, int(rng.integers(8, 14)), 256), block_sizes=(bs, bs), k=k,
                       anchor_first=bool(rng.integers(2)), note="chunked prefill")


def dsd_bands(rng, device, launch):
    """A DSD schedule whose top band disables drafting (K = 0): the batch grows across its edge and
    shrinks back; adaptive depth per band, the drafting band at times of depth 1 (the narrowest logits-cache
    column table). DFlash or DSpark (whose K = 0 graph width is 0, fix 1). The first request arrives alone
    and samples, as about half the others do, so drafts proposed below the edge are verified with
    rejections in a step at depth 0: the context rows the engine then writes itself must leave the
    rejected suffix at PAD."""
    bs = _sized(device, 4, 16)
    s = _sized(device, 3, 8)
    edge = int(rng.integers(2, s + 1))
    top = int(pick(rng, (1, _sized(device, 2, 4))))
    schedule = [(1, edge - 1, top), (edge, s, 0)] if rng.integers(2) else [(1, 1, top), (2, edge - 1, 1), (edge, s, 0)]
    schedule = [band for band in schedule if band[0] <= band[1]]

    def requests(rng, vocab):
        return [request(rng, i, arrival=int(rng.integers(1, 4)) if i else 0,
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(4, 12))),
                        max_new=int(rng.integers(3, 10)) + (0 if i else 4),
                        temperature=float(pick(rng, (0.0, 1.0, 2.0) if i else (1.0, 2.0)))) for i in range(s)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 10), max_num_reqs=s,
                       budget=_sized(device, 48, 2048), block_sizes=(bs, bs), k=_sized(device, 2, 4),
                       anchor_first=bool(rng.integers(2)), probabilistic=bool(rng.integers(2)), dsd_schedule=schedule,
                       note=f"DSD {schedule}")


def long_context(rng, device, launch):
    """Prompts near max_model_len, prefilled over several chunks, decoding up to the length limit (query
    positions clamped to max_model_len - 1)."""
    bs = _sized(device, 8, 16)
    max_len = _sized(device, 128, 2048)

    def requests(rng, vocab):
        return [request(rng, i, arrival=i, prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)),
                                                                max_len - int(rng.integers(6, 30))), max_new=40)
                for i in range(_sized(device, 2, 3))]

    return engine_case(rng, device, requests, num_steps=_sized(device, 5, 8), max_num_reqs=_sized(device, 2, 3),
                       budget=_sized(device, 64, 1024), block_sizes=(bs, bs), max_model_len=max_len,
                       note="long context")


def seeded_sampling(rng, device, launch):
    """Temperatures above 0: Gumbel drafts from per-slot seeds (explicit or fallback), probabilistic
    verification with or without the draft-logits cache; acceptance below 100% by design. Every third
    request samples, and the first arrives alone: the adaptive depth (one band up to K, a window of one
    step) drops on its verification, then sees two greedy requests' drafts, proposed before the drop,
    accepted whole: it must climb back one step at a time."""
    bs = _sized(device, 4, 16)

    def requests(rng, vocab):
        return [request(rng, i, arrival=i // 3 + (i % 3 > 0), max_new=int(rng.integers(4, 10)),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(4, 14))),
                        temperature=float(pick(rng, (0.7, 1.0, 1.4))) if i % 3 == 0 else 0.0)
                for i in range(_sized(device, 4, 9))]

    probabilistic = bool(rng.integers(2))
    slots, k = _sized(device, 3, 8), _sized(device, 3, 4)
    return engine_case(rng, device, requests, num_steps=_sized(device, 5, 10), max_num_reqs=slots,
                       budget=_sized(device, 40, 2048), block_sizes=(bs, bs), k=k, dsd_schedule=[(1, slots, k)],
                       adaptive_window=1, probabilistic=probabilistic,
                       note="draft logits cache" if probabilistic else "one-hot q")


def slot_churn(rng, device, launch):
    """The TP workload: full batches that finish in one step and are replaced at once, twice (freed slots
    are recycled in one go, fix 2B (docs/fixes.md#fix-2b)), every other request without a seed (fallback seeds, fix
    2A)."""
    slots = _sized(device, 5, 8)

    def requests(rng, vocab):
        made = [request(rng, i, arrival=0, prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), 8),
                        max_new=4) for i in range(3 * slots)]
        for r in made[::2]:
            r["seed"] = None
        return made

    return engine_case(rng, device, requests, num_steps=7, max_num_reqs=slots, budget=_sized(device, 64, 512),
                       block_sizes=(4, 4), note="slot churn")


def sampling_churn(rng, device, launch):
    """Sampled and greedy requests alternating in arrival order, three for every slot, all waiting from step 0:
    as requests finish, their freed slots go to requests of the other kind, so a slot's temperature and seed
    must be its new holder's. The greedy model's margins make a sampled decision almost always the argmax, so
    the recorded per-slot state is what shows a value kept from the previous holder."""
    slots = _sized(device, 3, 8)

    def requests(rng, vocab):
        return [request(rng, i, arrival=0, max_new=int(rng.integers(2, 6)),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(4, 10))),
                        temperature=float(pick(rng, (0.7, 1.0, 2.0))) if i % 2 == 0 else 0.0)
                for i in range(3 * slots)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 8, 12), max_num_reqs=slots,
                       budget=_sized(device, 64, 2048), block_sizes=(4, 4) if not big(device) else (16, 16),
                       k=_sized(device, 2, 4), probabilistic=bool(rng.integers(2)), note="sampled and greedy churn")


def padded_graphs(rng, device, launch):
    """The draft through ``DraftGraphs``: captured once per graph shape and replayed at padded sizes on the
    GPU (the same padded path eagerly elsewhere). Batches grow and shrink across coarse capture sizes
    and two DSD bands of different depth; greedy and sampled requests share the graphs. The first
    request arrives alone: step 0 drafts a batch of exactly one live request."""
    slots, k = _sized(device, 4, 12), _sized(device, 3, 4)
    q = k + 1

    def requests(rng, vocab):
        return [request(rng, i, arrival=int(rng.integers(1, 4)) if i else 0, max_new=int(rng.integers(3, 12)),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(4, 16))),
                        temperature=float(pick(rng, (0.0, 0.0, 1.0)))) for i in range(slots + 2)]

    sizes = sorted({q, (slots // 2 + 1) * q, slots * q})  # coarse: most batches replay padded
    settings = {"capture_sizes": sizes, "small_grid": 0, "capability_major": 9, "draft_backends": ["specsan_paged"]}
    half = slots // 2
    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 12), max_num_reqs=slots,
                       budget=_sized(device, 64, 2048), block_sizes=(4, 4) if not big(device) else (16, 16), k=k,
                       dsd_schedule=[(1, half, k), (half + 1, slots, 2)], probabilistic=bool(rng.integers(2)),
                       cuda_graphs=True, graph_settings=settings, note=f"graphs at {sizes} tokens")


def adaptive_graphs(rng, device, launch):
    """The DSpark draft through ``DraftGraphs`` under one adaptive band up to K: every request samples and is
    verified against one-hot draft probabilities with a window of one step, so the depth falls below K and
    climbs back. A depth below K has a graph only because the depth adapts (the band's cap alone stages K's
    width); DSpark's draft widths are the depths themselves, while the target verifies 1 + drafts tokens a
    request, so its graphs are staged for that width, not the draft's."""
    slots, k = _sized(device, 3, 8), _sized(device, 3, 4)

    def requests(rng, vocab):
        return [request(rng, i, arrival=int(rng.integers(1, 3)) if i else 0, max_new=int(rng.integers(6, 12)),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(4, 12))),
                        temperature=float(pick(rng, (1.0, 2.0)))) for i in range(slots)]

    sizes = sorted({k, (slots // 2 + 1) * k, slots * k})
    settings = {"capture_sizes": sizes, "small_grid": 0, "capability_major": 9, "draft_backends": ["specsan_paged"]}
    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 10), max_num_reqs=slots,
                       budget=_sized(device, 64, 2048), block_sizes=(4, 4) if not big(device) else (16, 16), k=k,
                       anchor_first=True, dsd_schedule=[(1, slots, k)], adaptive_window=1, cuda_graphs=True,
                       graph_settings=settings, note=f"adaptive DSpark graphs at {sizes} tokens")


def budget_bands(rng, device, launch):
    """Adaptive depth per DSD band under a budget of two decodes: every request is admitted at step 0 (prompts of
    a token or two), then no step holds more than 1 + K of them (a decode is at least two tokens). The band up to
    1 + K and the band above it have their own controllers, and sampled verification against one-hot draft
    probabilities rejects drafts, so each step's acceptance must move the lower band's depth, never the band of
    every running request."""
    k = _sized(device, 3, 4)
    slots, budget = k + 3, 2 * (1 + k)
    small = int(rng.integers(2, k + 1))  # the batch's band: a depth that can fall
    large = int(pick(rng, [d for d in range(1, k + 1) if d != small]))  # another run, so another controller
    lengths = [1] * slots  # all fit step 0: a prompt of two tokens for some of the budget's spare ones
    for i in rng.choice(slots, size=int(rng.integers(0, budget - slots + 1)), replace=False):
        lengths[i] = 2

    def requests(rng, vocab):
        return [request(rng, i, arrival=0, max_new=int(rng.integers(8, 14)), temperature=float(pick(rng, (1.0, 2.0))),
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), n))
                for i, n in enumerate(lengths)]

    return engine_case(rng, device, requests, num_steps=_sized(device, 6, 10), max_num_reqs=slots, budget=budget,
                       block_sizes=(4, 4) if not big(device) else (16, 16), k=k,
                       dsd_schedule=[(1, 1 + k, small), (2 + k, slots, large)], adaptive_window=1,
                       note=f"bands 1-{1 + k}: {small}, {2 + k}-{slots}: {large}, budget {budget}")


# The features a combined case draws, each independently of the others: every pair of settings meets.
FEATURES = {
    "layout": ("dflash", "dspark"),
    "depth": ("fixed", "bands", "adaptive"),  # K always; a DSD band per batch size (depths 0..K); one adaptive band
    "budget": ("loose", "tight"),  # tight: one decode and a little, so running requests go unscheduled
    "blocks": ("ample", "pressed"),  # pressed: pools for half or 70% of every request at full length (preemption)
    "prefix": ("none", "shared"),  # shared: the later half's prompts over a common prefix of whole blocks
    "prompts": ("short", "chunked"),  # chunked: the last third's prompts over half the budget, up to past it
    "length": ("free", "limit"),  # limit: max_model_len a few tokens past the longest prompt (drafts cut to room)
    "sampling": ("greedy", "mixed"),
    "verify": ("one-hot", "cached"),  # the draft-logits cache in probabilistic verification
    "graphs": ("eager", "graphs"),  # the draft through DraftGraphs (replayed on the GPU, eager elsewhere)
    "arrivals": ("together", "staggered"),
}


def draw_features(rng: np.random.Generator) -> dict[str, str]:
    return {name: str(pick(rng, values)) for name, values in FEATURES.items()}


def _depth_schedule(rng, depth_mode: str, slots: int, k: int) -> list | None:
    """None (always K), one band up to K, or a band per batch size, each of a drawn depth 0..K other than its
    neighbour's: the depth changes with every request a step gains or loses."""
    if depth_mode == "fixed":
        return None
    if depth_mode == "adaptive":
        return [(1, slots, k)]
    bands, depth = [], None
    for size in range(1, slots + 1):
        depth = int(pick(rng, [d for d in range(k + 1) if d != depth]))
        bands.append((size, size, depth))
    return bands


def combined(rng, device, launch):
    """Every feature at once, each setting drawn independently (``FEATURES``), over a model whose sizes all
    differ (``engine_shapes``): head dim unrelated to hidden / heads, grouped-query attention, draft blocks
    half or twice the target's. Slips that need two features together (a DSD depth in a step whose budget
    leaves running requests out, preemption of a request on a shared prefix, graphs over chunked
    prefill, drafts cut at the length limit) meet them here."""
    return _combined_case(rng, device, draw_features(rng))


def dspark_dispatch(rng, device, launch):
    """The combined draws with DSpark's layout (Q = K, no bonus row) and the draft dispatched eagerly on a
    backend that may be captured: every draft step looks up a FULL graph of width depth, where the target's
    graphs have width depth + 1 and DFlash's draft the same as the target's, so a slip between the two
    widths (or between K, Q and 1 + K) shows only here and in the rare combined case that draws both. Its depth is
    K at every step: with depths that vary (bands, adaptive) the draft's widths and the target's overlap, and a
    step whose width both have dispatches alike."""
    features = draw_features(rng) | {"layout": "dspark", "graphs": "eager", "depth": "fixed"}
    return _combined_case(rng, device, features, backends=CAPTURABLE_OFFERS)


# Offers whose first backend is not the one picked (non-causal drafts: FlashAttention or Triton comes first), and
# whose first backend may not be captured where the picked one may, on SM90 and SM100 alike.
UNORDERED_OFFERS = (("flashinfer", "flash_attn"), ("host_planned", "triton_attn"), ("host_planned", "flash_attn"))
# Offers that pick the host-planned backend: graphs only for a causal draft (fix 6), so its non-causal draft
# dispatched through DraftGraphs runs eagerly.
HOST_PLANNED_OFFERS = (("host_planned",), ("host_planned", "specsan_paged"))


def offer_order(rng, device, launch):
    """The combined draws, drafted eagerly at a fixed depth, with backends offered out of priority order: the
    backend picked is not the first offered, and only the picked one may be captured, so the draft's FULL graph
    dispatch is decided by the pick, never by the offer's order."""
    features = draw_features(rng) | {"graphs": "eager", "depth": "fixed"}
    return _combined_case(rng, device, features, backends=UNORDERED_OFFERS)


def uncapturable_graphs(rng, device, launch):
    """The combined draws through DraftGraphs at a fixed depth on the host-planned backend, which may be captured
    only for a causal draft: the DFlash/DSpark draft is non-causal, so every step dispatches to eager (fix 6) though
    FULL graphs of its widths are staged."""
    features = draw_features(rng) | {"graphs": "graphs", "depth": "fixed"}
    return _combined_case(rng, device, features, backends=HOST_PLANNED_OFFERS)


def chunked_resume(rng, device, launch):
    """Two requests with short prompts under a budget of one decode and one or two tokens more, and a target pool
    that runs dry after a few steps: the second request (growing by what the first one's decode leaves) is
    preempted, the first takes its freed blocks (evicting them from the prefix cache) and finishes soon after,
    and the second resumes alone with nothing restored, its prompt and outputs recomputed in chunks of the budget.
    A chunk that ends past the prompt and short of the last token samples nothing: the draft's bonus row reads
    the next token to compute, not a sampled one."""
    bs, k = _sized(device, 4, 16), int(rng.integers(2, 4))
    budget, press = k + 1 + int(rng.integers(1, 3)), int(rng.integers(3, 6))

    def requests(rng, vocab):
        return [request(rng, i, arrival=0, max_new=(press + 2) * (k + 1) if i == 0 else 4 * bs,
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), int(rng.integers(2, 5))))
                for i in range(2)]

    def pools(requests):  # (target, draft), null blocks included: the target's runs dry after about `press`
        # steps (the first request gains k + 1 tokens a step, the second what the budget leaves), the draft's has
        # room for both at full length
        first, second = (len(r["prompt"]) + press * n for r, n in zip(requests, (k + 1, budget - k - 1), strict=True))
        return -(-first // bs) + -(-second // bs) + 1, blocks_at_full_length(requests, k, bs) + 1

    return engine_case(rng, device, requests, num_steps=press + 7, max_num_reqs=2, budget=budget,
                       block_sizes=(bs, bs), k=k, anchor_first=bool(rng.integers(2)), num_blocks=pools,
                       note=f"budget {budget} tokens, target pool dry after about {press} steps")


def evicted_resume(rng, device, launch):
    """A request preempted mid-prefill over a prefix of whole blocks that later requests share. The request ahead of
    it decodes K + 1 tokens a step under a budget that leaves the prefill a few, until the target pool runs dry with
    three or more full blocks of the prefill cached; then it takes the freed blocks from the last one back (evicting
    all but the first) and finishes. The preempted request resumes from its first block, still cached, and
    recomputes the rest in chunks of a budget that is no multiple of the block, so chunks end inside blocks its
    chain keys from before the preemption still cover. Requests over the same prefix arrive meanwhile and restore
    it from the cache."""
    bs, k = _sized(device, 4, 16), int(rng.integers(2, 4))
    rest = int(pick(rng, [r for r in range(2, bs) if (k + 1 + r) % bs]))  # the prefill's share of a step's budget
    budget, ahead_len = k + 1 + rest, int(rng.integers(2, 5))
    # steps both run before the pool is dry: the prefill has three full blocks one step before
    press = -(-(3 * bs - (budget - ahead_len)) // rest) + 1 + int(rng.integers(0, 2))
    ahead_blocks = -(-(ahead_len + press * (k + 1)) // bs)
    prefill_blocks = -(-(budget - ahead_len + press * rest) // bs)
    # step j of the request ahead reaches position ahead_len + j (K + 1) (greedy: every draft accepted); its last
    # step reaches into every block but one of the prefill's
    last_step = ((ahead_blocks + prefill_blocks - 1) * bs - ahead_len) // (k + 1)
    ahead_new, evict_steps = 1 + last_step * (k + 1), last_step - press
    common_len = bs * (prefill_blocks + int(rng.integers(1, 3)))
    num_later = int(rng.integers(1, 3))

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        common = prompt(rng, vocab, cls, common_len)
        ahead = request(rng, 0, arrival=0, max_new=ahead_new,
                        prompt_tokens=prompt(rng, vocab, int(rng.integers(CLASSES)), ahead_len))
        resumed = request(rng, 1, arrival=0, max_new=int(rng.integers(2, 5)),
                          prompt_tokens=common + prompt(rng, vocab, cls, int(rng.integers(1, bs))))
        return [ahead, resumed] + [
            request(rng, 2 + i, arrival=press + int(rng.integers(1, evict_steps + 3)), max_new=int(rng.integers(2, 5)),
                    prompt_tokens=common + prompt(rng, vocab, cls, int(rng.integers(1, bs)))) for i in range(num_later)]

    def pools(requests):  # (target, draft), null blocks included; the draft's has room for everything at once
        return ahead_blocks + prefill_blocks + 1, blocks_at_full_length(requests, k, bs) + 1

    return engine_case(rng, device, requests, num_steps=press + evict_steps + -(-common_len // budget) + 4,
                       max_num_reqs=2 + num_later, budget=budget, block_sizes=(bs, bs), k=k,
                       anchor_first=bool(rng.integers(2)), num_blocks=pools,
                       note=f"budget {budget} tokens, target pool dry after about {press} steps, "
                            f"{prefill_blocks - 1} block(s) evicted")


def gapped_chain(rng, device, launch):
    """A prefix chain cached from its second block on while its first is evicted: a later lookup must stop at the
    first block and restore nothing. Two requests over one prompt of two full blocks and a token are admitted
    together (both miss), so the first one's blocks enter the cache and the second's are skipped as duplicates.
    The first finishes at once; a request over another prompt then takes its last two blocks (evicting its second
    block's entry) while the second, decoding within its blocks, is running: the second's second block is entered
    in its place, and the second finishes. A request of one block takes the first one's first block (evicting the
    chain's first key), then a request over the prompt and a few tokens more arrives: its chain's second key is
    cached, its first is not. The target pool has no block to spare."""
    bs = _sized(device, 4, 16)
    k = int(rng.integers(1, min(bs - 1, 4)))  # the second request's first decode stays in its three blocks

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        other = (cls + 1 + int(rng.integers(CLASSES - 1))) % CLASSES
        common = prompt(rng, vocab, cls, 2 * bs + 1)
        return [request(rng, 0, arrival=0, max_new=1, prompt_tokens=common),
                request(rng, 1, arrival=0, max_new=2, prompt_tokens=common),
                request(rng, 2, arrival=1, max_new=int(rng.integers(2, 5)),  # two blocks, its first decode in them
                        prompt_tokens=prompt(rng, vocab, other, int(rng.integers(bs + 1, 2 * bs - k)))),
                request(rng, 3, arrival=2, max_new=int(rng.integers(2, 5)),
                        prompt_tokens=prompt(rng, vocab, other, int(rng.integers(1, bs + 1)))),
                request(rng, 4, arrival=2, max_new=int(rng.integers(2, 5)),
                        prompt_tokens=common + prompt(rng, vocab, cls, int(rng.integers(1, bs))))]

    def pools(requests):  # (target, draft), null blocks included: the target's holds the first two prompts exactly
        return 2 * 3 + 1, blocks_at_full_length(requests, k, bs) + 1

    return engine_case(rng, device, requests, num_steps=5, max_num_reqs=4, budget=_sized(device, 48, 2048),
                       block_sizes=(bs, bs), k=k, anchor_first=bool(rng.integers(2)), num_blocks=pools,
                       note="a cached chain whose first block is evicted")


def _combined_case(rng, device, f: dict[str, str], backends=None):
    """The combined case of the features ``f``; ``backends``: the draft backend offers drawn from (None: ours
    through graphs, every offer eagerly)."""
    dims, block_sizes = engine_shapes.distinct_shape(rng, device)
    bs = block_sizes[0]
    k = int(rng.integers(*_sized(device, (2, 4), (3, 6))))
    slots = int(rng.integers(*_sized(device, (3, 6), (6, 11))))
    num_requests = slots + int(rng.integers(0, slots))
    decode = k + 1  # a decode's verification width: the bonus token and k drafts
    budget = (decode + int(pick(rng, (0, 1, k))) if f["budget"] == "tight"
              else _sized(device, 48, 2048))
    # whole draft blocks too (a restored prefix the draft's blocks cut is refused: at most by a preemption)
    common = max(block_sizes) * int(rng.integers(1, 3)) if f["prefix"] == "shared" else 0
    # Each feature touches part of the stream, so the others still meet: the later half starts with the
    # common prefix and (staggered) arrives late, the last third is long (chunked). The first requests are
    # short, one or two tokens under a tight budget: step 0 admits more of them than a step can then decode.
    short = (1, 3) if f["budget"] == "tight" else (2, 2 * bs + 2)
    long = (budget // 2 + 1, budget + bs) if f["prompts"] == "chunked" else short
    max_new = int(rng.integers(3, 10))  # under "limit", requests run to max_model_len instead

    def requests(rng, vocab):
        cls = int(rng.integers(CLASSES))
        shared = prompt(rng, vocab, cls, common)
        made = []
        for i in range(num_requests):
            head = shared if 2 * i + 1 >= num_requests else []  # at least two requests
            own_cls = cls if head else int(rng.integers(CLASSES))
            arrival = int(rng.integers(1, 4)) if f["arrivals"] == "staggered" and 2 * i >= num_requests else 0
            temperature = float(pick(rng, (0.0, 0.7, 1.0))) if f["sampling"] == "mixed" else 0.0
            length = int(rng.integers(*(long if 3 * i >= 2 * num_requests else short)))
            made.append(request(rng, i, arrival=arrival, temperature=temperature,
                                max_new=max_model_len if f["length"] == "limit" else max_new,
                                prompt_tokens=head + prompt(rng, vocab, own_cls, length)))
        return made

    longest = common + max(short[1], long[1])
    max_model_len = longest + (int(rng.integers(1, 2 * k + 2)) if f["length"] == "limit"
                               else max(max_new + 2 * k, _sized(device, 64, 1024) - longest))
    anchor_first = f["layout"] == "dspark"
    settings = None
    if f["graphs"] == "graphs" or backends is not None:
        q = k if anchor_first else k + 1
        offered = ["specsan_paged"] if backends is None else list(pick(rng, backends))
        settings = {"capture_sizes": sorted({q, (slots // 2 + 1) * q, slots * q}), "small_grid": 0,
                    "capability_major": int(pick(rng, (9, 10))), "draft_backends": offered}
    return engine_case(rng, device, requests, num_steps=_sized(device, 8, 12), max_num_reqs=slots, budget=budget,
                       block_sizes=block_sizes, block_share=float(pick(rng, (0.5, 0.7))) if f["blocks"] == "pressed"
                       else 1.0, k=k, anchor_first=anchor_first, probabilistic=f["verify"] == "cached",
                       dsd_schedule=_depth_schedule(rng, f["depth"], slots, k), adaptive_window=int(pick(rng, (1, 2))),
                       max_model_len=max_model_len, cuda_graphs=f["graphs"] == "graphs", graph_settings=settings,
                       dims=dims, note=" ".join(f"{name}={value}" for name, value in f.items()))


FAMILIES = {"shared_prefix": shared_prefix, "unaligned_prefix": unaligned_prefix, "preempt_resume": preempt_resume,
            "mixed_prefill_decode": mixed_prefill_decode, "dsd_bands": dsd_bands, "long_context": long_context,
            "seeded_sampling": seeded_sampling, "padded_graphs": padded_graphs, "prefix_chain": prefix_chain,
            "mid_prefill_hit": mid_prefill_hit, "tight_pools": tight_pools, "crowded_preemption": crowded_preemption,
            "budget_bound": budget_bound, "multi_turn": multi_turn, "combined": combined,
            "draft_pool_pressure": draft_pool_pressure, "chunked_resume": chunked_resume,
            "adaptive_graphs": adaptive_graphs, "budget_cut_cache": budget_cut_cache,
            "dspark_dispatch": dspark_dispatch, "sampling_churn": sampling_churn,
            "evicted_resume": evicted_resume, "gapped_chain": gapped_chain,
            "offer_order": offer_order, "uncapturable_graphs": uncapturable_graphs,
            "blocked_head": blocked_head, "budget_bands": budget_bands}
