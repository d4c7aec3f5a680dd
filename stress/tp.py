"""TP determinism: N rank processes, each with its own PYTHONHASHSEED and global-RNG state, replay one
admission schedule and the same kernels, and all-gather a digest of every per-step field.

Upstream runs the scheduler-driven worker loop redundantly on every TP rank, so slot maps, seeds and
draft metadata must agree bit for bit (spec fix 2). A difference stops every rank at the same step
(they all see the same gathered digests) and names the first differing field. Ranks talk over gloo
on CPU, or NCCL when there is a GPU per rank.

Usage: ``run_ranks(world)`` (or ``python -m stress tp --ranks N [--mutant NAME]``) spawns
``python -m stress.tp --rank R ...`` once per rank.
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

MUTANT_ENV = "SPECSAN_TP_MUTANT"
NUM_DRAFT_TOKENS = 3
BLOCK_SIZE = 4
TABLE_WIDTH = 8


@dataclass
class Outcome:
    agreed: bool
    message: str  # the first divergence, or a summary of the agreement
    seconds: float


# ---------------------------------------------------------------- inside one rank


def _digest(value) -> int:
    data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() \
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
    max_tokens = num_slots * max(q, k + 1)

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
    payload.update({f"draft_inputs.{name}": value for name, value in _draft_inputs(state, step_index, seed,
                                                                                      device).items()})
    # A sampling kernel adds one line here, e.g. payload["sampled"] = gumbel_sample(...).
    return payload


def _find_mutant(name: str | None):
    from stress import checks

    if not name:
        return None
    for check in checks.REGISTRY:
        for mutant in check.mutants:
            if mutant.name == name:
                return mutant
    raise ValueError(f"{MUTANT_ENV}={name!r}: no such mutant; `python -m stress list` shows them")


def _backend(world: int) -> tuple[str, torch.device]:
    from kernels import runtime

    if runtime.DEVICE == "cuda":
        return ("nccl" if torch.cuda.device_count() >= world else "gloo"), runtime.device()
    return "gloo", torch.device("cpu")


def rank_main(rank: int, world: int, init_file: str, seed: int, num_steps: int, max_num_reqs: int) -> int:
    """One rank: replay the schedule, all-gather the digests each step; 1 on the first divergence."""
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    from kernels.spec import slots
    from stress import mutants, schedule

    backend, device = _backend(world)
    gather_device = device if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    np.random.seed(1000 + rank)  # a rank-local global-RNG state, as any process has its own
    steps = schedule.random_schedule(np.random.default_rng(seed), max_num_reqs=max_num_reqs, num_steps=num_steps,
                                     preempt_p=0.3, block_size=BLOCK_SIZE, unaligned_p=0.05)
    try:
        with mutants.applied(_find_mutant(os.environ.get(MUTANT_ENV))):
            state = slots.RequestSlots(max_num_reqs, seed)
            for step_index, step in enumerate(steps):
                schedule.apply_step(state, step)
                payload = step_payload(state, step_index, seed, device)
                local = torch.tensor([_digest(v) for v in payload.values()], dtype=torch.int64, device=gather_device)
                gathered = [torch.empty_like(local) for _ in range(world)]
                dist.all_gather(gathered, local)
                table = torch.stack(gathered).cpu()
                for field_index, name in enumerate(payload):
                    column = table[:, field_index]
                    if (column != column[0]).any():
                        other = int((column != column[0]).nonzero()[0])
                        print(f"DIVERGED step {step_index} field {name}: rank 0 digest {int(column[0]):#x}, "
                              f"rank {other} digest {int(column[other]):#x}", flush=True)
                        return 1
        print(f"AGREED {len(steps)} steps, {len(payload)} fields", flush=True)
        return 0
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher


def run_ranks(world: int, *, mutant: str | None = None, seed: int = 0, num_steps: int = 8, max_num_reqs: int = 6,
              timeout: float = 120) -> Outcome:
    """Spawn ``world`` rank processes (PYTHONHASHSEED = rank + 1) and report whether they agreed."""
    import time

    if world < 2:
        raise ValueError(f"world: TP determinism needs at least 2 ranks, got {world}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specsan-tp-") as tmp:
        procs = []
        for rank in range(world):
            env = {**os.environ, "PYTHONHASHSEED": str(rank + 1), "OMP_NUM_THREADS": "1"}
            env.pop(MUTANT_ENV, None)
            if mutant:
                env[MUTANT_ENV] = mutant
            cmd = [sys.executable, "-m", "stress.tp", "--rank", str(rank), "--world", str(world), "--init-file",
                   os.path.join(tmp, "rendezvous"), "--seed", str(seed), "--steps", str(num_steps),
                   "--max-num-reqs", str(max_num_reqs)]
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
    lines = [line for out in outputs for line in out.splitlines() if line.startswith(("DIVERGED", "AGREED"))]
    if all(c == 0 for c in codes) and lines:
        return Outcome(True, f"{world} ranks: {lines[0]}", seconds)
    diverged = [line for line in lines if line.startswith("DIVERGED")]
    if diverged:
        return Outcome(False, diverged[0], seconds)
    tails = "\n".join(f"rank {r} (exit {c}):\n{out[-2000:]}"
                      for r, (c, out) in enumerate(zip(codes, outputs, strict=True)))
    return Outcome(False, f"a rank failed before agreeing:\n{tails}", seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one TP rank of the determinism test (spawned by run_ranks)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init-file", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--max-num-reqs", type=int, default=6)
    a = p.parse_args(argv)
    return rank_main(a.rank, a.world, a.init_file, a.seed, a.steps, a.max_num_reqs)


if __name__ == "__main__":
    sys.exit(main())
