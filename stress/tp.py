"""TP determinism: N rank processes, each with its own PYTHONHASHSEED and global-RNG state, replay one
workload and all-gather a digest of every per-step field: an admission schedule through the slots and
the draft-input kernel, or a request stream through the whole engine (``kernels.spec.engine``).

Upstream runs the scheduler-driven worker loop redundantly on every TP rank, so slot maps, seeds and
draft metadata must agree bit for bit (docs/fixes.md#fix-2). A difference stops every rank at the same step
(they all see the same gathered digests) and names the first differing field. Ranks talk over gloo
(digests as CPU tensors) or NCCL (digests as CUDA tensors, rank r on GPU r); ``choose_backend``
picks NCCL when there is a GPU per rank, or refuses an explicit nccl without one.

Usage: ``run_ranks(world, mutants=(None, "set-order-recycling"))`` (or ``python -m stress tp --ranks N
[--mutant NAME]``) spawns ``python -m stress.tp --rank R ...`` once per rank; the scenarios (the
production code, or a mutant applied inside every rank) run one after the other in those processes.
"""

import argparse
import datetime
import hashlib
import os
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass

import numpy as np
import torch

CLEAN = "none"  # the scenario name of the production code
NUM_DRAFT_TOKENS = 3
BLOCK_SIZE = 4
TABLE_WIDTH = 8
SAMPLE_VOCAB = 97  # draft vocabulary of the sampled rows


@dataclass
class Outcome:
    agreed: bool
    message: str  # the first divergence, or a summary of the agreement
    seconds: float
    backend: str = ""  # the process group's backend: nccl or gloo
    ranks: tuple[str, ...] = ()  # where each rank ran, e.g. "rank 1 on cuda:1 (NVIDIA H200)"


# ---------------------------------------------------------------- inside one rank


def _digest(value) -> int:
    data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() \
        if isinstance(value, torch.Tensor) else value
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def _draft_inputs(state, step_index: int, seed: int, device: torch.device) -> dict:
    """Run draft-input preparation on the live batch (sorted by request id) with slot-indexed state.

    Target rows come from a generator keyed by (seed, step), identical on every rank; the block table
    and last sampled tokens are indexed by slot, so a rank whose slots differ gets different outputs.
    """
    from kernels import block_table, draft_inputs

    rng = np.random.default_rng([seed, step_index])
    live = sorted(state.slot_of)
    num_slots = len(state.seeds)
    k, q = NUM_DRAFT_TOKENS, NUM_DRAFT_TOKENS + 1
    lens = [int(rng.integers(1, k + 2)) for _ in live]
    positions = []
    for req_id, n in zip(live, lens, strict=True):
        first = int(state.num_cached_tokens[state.slot_of[req_id]]) + int(rng.integers(0, 8))
        positions += range(first, first + n)
    max_tokens = num_slots * q  # a request verifies at most K drafts + the bonus: K + 1 = Q target rows

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    persistent = torch.arange(1, num_slots * TABLE_WIDTH + 1, dtype=torch.int32, device=device)
    batch_table = torch.zeros(max(1, num_slots), TABLE_WIDTH, dtype=torch.int32, device=device)
    idx_mapping = t([state.slot_of[r] for r in live], torch.int32)
    block_table.gather_block_tables(persistent.view(num_slots, TABLE_WIDTH), idx_mapping, batch_table)
    out = {
        "context_positions": torch.zeros(max_tokens, dtype=torch.int64, device=device),
        "context_slot_mapping": torch.zeros(max_tokens, dtype=torch.int64, device=device),
        "input_ids": torch.zeros(num_slots * q, dtype=torch.int32, device=device),
        "positions": torch.zeros(num_slots * q, dtype=torch.int64, device=device),
        "query_slot_mapping": torch.zeros(num_slots * q, dtype=torch.int64, device=device),
        "sample_indices": torch.zeros(num_slots * k, dtype=torch.int64, device=device),
        "sample_pos": torch.zeros(num_slots * k, dtype=torch.int64, device=device),
        "sample_idx_mapping": torch.zeros(num_slots * k, dtype=torch.int32, device=device),
        "query_start_loc": torch.zeros(num_slots + 1, dtype=torch.int32, device=device),
        "seq_lens": torch.zeros(num_slots, dtype=torch.int32, device=device),
        "draft_tokens": torch.zeros(num_slots, k, dtype=torch.int64, device=device),
    }
    last_sampled = np.zeros(num_slots, dtype=np.int64)
    for req_id, slot in state.slot_of.items():
        last_sampled[slot] = zlib.crc32(req_id.encode()) % 50_000  # str hash() is salted per process
    draft_inputs.prepare_draft_inputs(
        idx_mapping=idx_mapping, target_query_start_loc=t(np.concatenate([[0], np.cumsum(lens)]), torch.int32),
        target_positions=t(positions, torch.int64), num_sampled=t([1] * len(live), torch.int32),
        num_rejected=t([0] * len(live), torch.int32), last_sampled=t(last_sampled, torch.int64),
        next_prefill_tokens=t(np.zeros(num_slots), torch.int32),
        num_cached_tokens=t(state.num_cached_tokens, torch.int32), block_table=batch_table, block_size=BLOCK_SIZE,
        num_draft_tokens=k, anchor_first=False, mask_token_id=7, max_model_len=1 << 20, **out)
    return out



def step_payload(state, step_index: int, seed: int, device: torch.device) -> dict:
    """Every field the ranks must agree on after a step, by name (same names, same order on all ranks)."""
    payload = {
        "slot_map": repr(sorted(state.slot_of.items())).encode(),
        "free_slots": repr(state.free_slots).encode(),
        "seeds": torch.from_numpy(state.seeds),
        "seeds_set": torch.from_numpy(state.seeds_set),
        "num_cached_tokens": torch.from_numpy(state.num_cached_tokens),
    }
    prepared = _draft_inputs(state, step_index, seed, device)
    payload.update({f"draft_inputs.{name}": value for name, value in prepared.items()})
    payload["sampled"] = _draft_samples(state, prepared, step_index, seed, device)
    return payload


def _draft_samples(state, prepared: dict, step_index: int, seed: int, device: torch.device) -> torch.Tensor:
    """Gumbel-sample every draft sampling row (padded rows stay inert) with the slots' seeds."""
    from kernels import sampling

    rows = prepared["sample_idx_mapping"].numel()
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step_index)  # same logits on every rank
    logits = torch.randn(rows, SAMPLE_VOCAB, generator=gen).to(device)
    num_slots = state.seeds.size
    temperature = torch.where(torch.arange(num_slots) % 2 == 0, 0.7, 0.0).to(torch.float32).to(device)
    return sampling.gumbel_sample(logits, prepared["sample_idx_mapping"], temperature,
                                  torch.from_numpy(state.seeds).to(device), prepared["sample_pos"], draft=True)


def _find_mutant(name: str | None):
    from stress import checks

    if name is None:
        return None
    for check in checks.REGISTRY:
        for mutant in check.mutants:
            if mutant.name == name:
                return mutant
    raise ValueError(f"mutant: no mutant named {name!r}; `python -m stress list` shows them")


def _disagreement(world, step_index, payload, gather_device) -> str | None:
    """All-gather the digest of every field (same names, same order on every rank); the first field the
    ranks disagree on, as a line, or None."""
    import torch.distributed as dist

    local = torch.tensor([_digest(v) for v in payload.values()], dtype=torch.int64, device=gather_device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    table = torch.stack(gathered).cpu()
    for field_index, name in enumerate(payload):
        column = table[:, field_index]
        if (column != column[0]).any():
            other = int((column != column[0]).nonzero()[0])
            return (f"DIVERGED step {step_index} field {name}: rank 0 digest {int(column[0]):#x}, "
                    f"rank {other} digest {int(column[other]):#x}")
    return None


def _replay(world, steps, seed, max_num_reqs, device, gather_device) -> str:
    """One replay in lockstep with the other ranks; the first divergence, or the agreement, as a line."""
    from kernels.spec import slots
    from stress.families import schedule

    state = slots.RequestSlots(max_num_reqs, seed)  # looked up now, so an applied mutant is the one used
    for step_index, step in enumerate(steps):
        schedule.apply_step(state, step)
        payload = step_payload(state, step_index, seed, device)
        if (line := _disagreement(world, step_index, payload, gather_device)) is not None:
            return line
    return f"AGREED {len(steps)} steps, {len(payload)} fields"


def _replay_engine(world, seed, num_steps, device, gather_device) -> str:
    """The whole engine over ``stress.families.engine.slot_churn`` (a full batch replaced at once, half
    the requests without a seed), every record field digested after every step."""
    from kernels.spec import engine
    from stress.families import engine as workloads

    case = workloads.slot_churn(np.random.default_rng(seed), device.type, {})
    inputs = case.inputs
    replay = engine.Engine(inputs["config"], inputs["weights"], inputs["requests"], device=device)
    for step_index in range(num_steps):
        np.random.random(step_index + 1)  # a rank-local consumer of the global RNG
        record = replay.step()
        payload = {name: record.get(name, b"absent") for name in engine.RECORD_FIELDS}
        if (line := _disagreement(world, step_index, payload, gather_device)) is not None:
            return line
    return f"AGREED {num_steps} steps, {len(engine.RECORD_FIELDS)} fields"


def rank_main(rank: int, world: int, init_file: str, seed: int, num_steps: int, max_num_reqs: int,
              scenarios: list[str | None], workload: str = "slots", backend: str = "gloo") -> int:
    """One rank: replay the workload once per scenario (a mutant name, or None for production code).

    ``workload``: "slots" replays an admission schedule through the slots and the draft-input kernel;
    "engine" replays a request stream through the whole engine. ``backend``: "gloo" gathers the
    digests as CPU tensors, "nccl" as CUDA tensors on this rank's own GPU. The rank prints
    ``PLACED <backend> <device>`` first.

    Every scenario starts from the same rank-local global-RNG state; its result is printed as
    ``RESULT <scenario> <line>``. All ranks see the same gathered digests, so they leave a scenario
    at the same step and stay in lockstep for the next.
    """
    import torch.distributed as dist

    from kernels import runtime
    from stress.core import gpus
    from stress.core import patches as mutants
    from stress.families import schedule

    device = torch.device("cpu")
    if runtime.DEVICE == "cuda":  # rank r takes GPU r mod count: one GPU per rank whenever there are enough
        device = torch.device("cuda", gpus.gpu_of(rank, gpus.count()))
        torch.cuda.set_device(device)
    gather_device = device if backend == "nccl" else torch.device("cpu")  # NCCL gathers CUDA tensors
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120),
                            **({"device_id": device} if backend == "nccl" else {}))
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"
    print(f"PLACED {backend} {where}", flush=True)
    steps = schedule.random_schedule(np.random.default_rng(seed), max_num_reqs=max_num_reqs, num_steps=num_steps,
                                     preempt_p=0.3, block_size=BLOCK_SIZE, unaligned_p=0.05)
    try:
        for scenario in scenarios:
            np.random.seed(1000 + rank)  # a rank-local global-RNG state, as any process has its own
            with mutants.applied(_find_mutant(scenario)):
                if workload == "engine":
                    line = _replay_engine(world, seed, num_steps, device, gather_device)
                else:
                    line = _replay(world, steps, seed, max_num_reqs, device, gather_device)
            print(f"RESULT {scenario or CLEAN} {line}", flush=True)
        return 0
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher


WORKLOADS = ("slots", "engine")
BACKENDS = ("auto", "nccl", "gloo")


def choose_backend(requested: str, world: int) -> str:
    """The process group's backend for ``world`` ranks on this machine's device.

    "auto": NCCL when the kernels run on CUDA and there is a GPU per rank, else gloo. "nccl" without
    a GPU per rank is refused: two ranks on one GPU is not a supported NCCL set-up.
    """
    from kernels import runtime
    from stress.core import gpus

    if requested not in BACKENDS:
        raise ValueError(f"--backend: {requested!r} is not one of {', '.join(BACKENDS)}; pick one of them")
    count = gpus.count() if runtime.DEVICE == "cuda" else 0
    if requested == "auto":
        return "nccl" if count >= world else "gloo"
    if requested == "nccl" and runtime.DEVICE != "cuda":
        raise ValueError("--backend: nccl gathers CUDA tensors, but the ranks run on the cpu; "
                         "use --backend gloo (or auto), or run where a GPU is visible")
    if requested == "nccl" and count < world:
        raise ValueError(f"--backend: nccl needs one GPU per rank, but {world} ranks and {count} GPU(s) are visible; "
                         f"pass --ranks {count} (or fewer), or --backend gloo")
    return requested


def run_ranks(world: int, *, mutants: tuple[str | None, ...] = (None,), seed: int = 0, num_steps: int = 8,
              max_num_reqs: int = 6, timeout: float = 180, workload: str = "slots",
              backend: str = "auto") -> dict[str | None, Outcome]:
    """Spawn ``world`` rank processes (PYTHONHASHSEED = rank + 1); one Outcome per scenario.

    A scenario is a mutant name applied inside every rank, or None for the production code. The
    scenarios run one after the other in the same processes, which pays the start-up cost once.
    One rank agrees with itself by construction: it runs the production code only, to exercise the
    process group (NCCL on one GPU).
    """
    import time

    from kernels import runtime

    if world < 1:
        raise ValueError(f"--ranks: TP determinism needs at least 1 rank, got {world}; pass --ranks 2 or more")
    if workload not in WORKLOADS:
        raise ValueError(f"workload: {workload!r} is not one of {WORKLOADS}")
    for name in mutants:
        if name == CLEAN:
            raise ValueError(f"mutants: {CLEAN!r} names the production code; pass None")
        _find_mutant(name)  # an unknown name fails here, not in every rank
    if world == 1 and any(mutants):
        raise ValueError("--mutant: one rank has no other rank to disagree with, so no mutant can diverge; "
                         "pass --ranks 2 or more")
    backend = choose_backend(backend, world)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specsan-tp-") as tmp:
        procs = []
        for rank in range(world):
            env = {**os.environ, "PYTHONHASHSEED": str(rank + 1), "OMP_NUM_THREADS": "1",
                   "SPECSAN_DEVICE": runtime.DEVICE}
            cmd = [sys.executable, "-m", "stress.tp", "--rank", str(rank), "--world", str(world), "--init-file",
                   os.path.join(tmp, "rendezvous"), "--seed", str(seed), "--steps", str(num_steps),
                   "--max-num-reqs", str(max_num_reqs), "--workload", workload, "--backend", backend,
                   "--mutants", *[m or CLEAN for m in mutants]]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        outputs, codes = [], []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - start)))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                out += "\n(rank timed out)"
            outputs.append(out)
            codes.append(proc.returncode)
    seconds = time.perf_counter() - start
    results = dict(line.split(" ", 2)[1:] for line in outputs[0].splitlines() if line.startswith("RESULT "))
    ranks = tuple(f"rank {r} on {line.split(' ', 2)[2]}" for r, out in enumerate(outputs)
                  for line in out.splitlines() if line.startswith("PLACED "))
    failure = "\n".join(f"rank {r} (exit {c}):\n{out[-2000:]}"
                        for r, (c, out) in enumerate(zip(codes, outputs, strict=True)) if c != 0)
    outcomes = {}
    for name in mutants:
        line = results.get(name or CLEAN)
        if line is None or failure:
            outcomes[name] = Outcome(False, f"a rank failed before this scenario finished:\n{failure}", seconds,
                                     backend, ranks)
        else:
            outcomes[name] = Outcome(line.startswith("AGREED"), f"{world} rank(s): {line}", seconds, backend, ranks)
    return outcomes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one TP rank of the determinism test (spawned by run_ranks)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init-file", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--max-num-reqs", type=int, default=6)
    p.add_argument("--workload", choices=WORKLOADS, default="slots")
    p.add_argument("--backend", choices=BACKENDS[1:], default="gloo")
    p.add_argument("--mutants", nargs="+", default=[CLEAN], help=f"scenarios in order; {CLEAN!r} = production code")
    a = p.parse_args(argv)
    scenarios = [None if m == CLEAN else m for m in a.mutants]
    return rank_main(a.rank, a.world, a.init_file, a.seed, a.steps, a.max_num_reqs, scenarios, a.workload, a.backend)


if __name__ == "__main__":
    sys.exit(main())
