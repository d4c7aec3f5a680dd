"""Tracer overhead: traced vs plain interpreter time, on the registry's CPU cases and on a
tiled Gumbel/argmax sampler at realistic vocabularies (32k-128k), all measured in one run.

Each case runs once untimed (the interpreter rewrites a kernel on first use), then plain and
traced runs alternate on fresh copies of the inputs so both see the same caches.
"""

import time

import torch

from kernels import runtime  # noqa: F401  - chooses the interpreter before any kernel module imports triton
from stress import checks
from stress.core import cases, guards, oracle
from stress.core import tracer as trace

SEEDS = 3
ROUNDS = 3
# (rows, vocab, vocab tile, sampled). The interpreter's cost is per tile operation, the tracer's
# per run and per byte it must compare, so large tiles and greedy rows (no noise to draw) show the
# tracer's share at its largest; sampled rows also store every logit to the cache.
SAMPLER_TILES = {32000: (1024, 32768), 131072: (1024, 8192, 131072)}
SAMPLER_SHAPES = tuple((4, vocab, tile, sampled) for vocab, tiles in SAMPLER_TILES.items()
                       for tile in tiles for sampled in (False, True))
SAMPLER_ROUNDS = 2
TARGET = 3.0  # the traced run may take at most this many times the plain interpreter's time


def _plain(check, case, seed):
    check.kernel(**guards.fresh_inputs(case), **case.launch)


def _traced(check, case, seed):
    verdict, details = oracle.traced(check, case, seed)
    if verdict != "pass":
        raise RuntimeError(f"{check.name}: traced verdict {verdict}: {details[:3]}")


def _best(fn, *args, rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def report(seeds: int = SEEDS) -> list[str]:
    """Printable lines: per check, plain and traced seconds over its cases and the ratio."""
    lines = [f"tracer overhead, {seeds} seed(s) per family, best of {ROUNDS} runs per case",
             f"{'check':28} {'cases':>5} {'plain s':>9} {'traced s':>9} {'ratio':>6}"]
    total_plain = total_traced = 0.0
    for check in checks.REGISTRY:
        if "cpu" not in check.devices:
            continue
        plain = traced = 0.0
        cases = 0
        for family in check.families:
            for i in range(seeds):
                seed = cases.case_seed(0, check.name, family, i)
                case = cases.build_case(check, family, seed, "cpu")
                _traced(check, case, seed)  # warm-up: rewrite the kernel, run the tracer's self-test
                plain += _best(_plain, check, case, seed)
                traced += _best(_traced, check, case, seed)
                cases += 1
        total_plain, total_traced = total_plain + plain, total_traced + traced
        lines.append(f"{check.name:28} {cases:>5} {plain:>9.3f} {traced:>9.3f} {traced / max(plain, 1e-9):>5.2f}x")
    lines.append(f"{'all':28} {'':>5} {total_plain:>9.3f} {total_traced:>9.3f} "
                 f"{total_traced / max(total_plain, 1e-9):>5.2f}x")
    return lines


def sampler_inputs(rows: int, vocab: int, sampled: bool, seed: int = 0) -> dict:
    """Arguments of ``kernels.sampling.gumbel_sample``: ``rows`` live rows on distinct slots;
    sampled rows (temperature 1) also write the logits cache, greedy ones (temperature 0) do not."""
    gen = torch.Generator().manual_seed(seed)
    inputs = {"logits": torch.randn(rows, vocab, generator=gen),
              "idx_mapping": torch.randperm(rows, generator=gen).to(torch.int32),
              "temperature": torch.full((rows,), 1.0 if sampled else 0.0),
              "seeds": torch.randint(0, 2**62, (rows,), generator=gen),
              "positions": torch.randint(0, 2**33, (rows,), generator=gen)}
    if sampled:
        inputs.update(logits_cache=torch.zeros(rows, 2, vocab), cache_cols=torch.ones(rows, dtype=torch.int32))
    return inputs


def _sample(inputs: dict, tile: int) -> torch.Tensor:
    from kernels import sampling

    return sampling.gumbel_sample(**{k: v.clone() for k, v in inputs.items()}, block_v=tile)


def _sample_traced(inputs: dict, tile: int) -> torch.Tensor:
    with trace.tracing() as recording:
        tokens = _sample(inputs, tile)
    if recording.verdict != "pass":
        raise RuntimeError(f"gumbel_sample traced: {recording.verdict}: "
                           f"{[line for r in recording.reports for line in r.lines()][:3]}")
    return tokens


def sampler_rows(shapes=SAMPLER_SHAPES, rounds: int = SAMPLER_ROUNDS) -> tuple[list[str], list[float]]:
    """Printable lines and the ratio of each shape: the tiled sampler, plain vs traced."""
    lines = [f"tracer overhead on kernels.sampling.gumbel_sample, best of {rounds} runs, target at most {TARGET:.0f}x",
             f"{'rows':>4} {'vocab':>7} {'tile':>7} {'rows are':8} {'plain s':>9} {'traced s':>9} {'ratio':>6}"]
    ratios = []
    for rows, vocab, tile, sampled in shapes:
        inputs = sampler_inputs(rows, vocab, sampled)
        if not torch.equal(_sample_traced(inputs, tile), _sample(inputs, tile)):  # also the warm-up
            raise RuntimeError(f"gumbel_sample at vocab {vocab}: traced tokens differ from plain ones")
        plain = _best(_sample, inputs, tile, rounds=rounds)
        traced = _best(_sample_traced, inputs, tile, rounds=rounds)
        ratios.append(traced / plain)
        kind = "sampled" if sampled else "greedy"
        lines.append(f"{rows:>4} {vocab:>7} {tile:>7} {kind:8} {plain:>9.3f} {traced:>9.3f} {ratios[-1]:>5.2f}x"
                     f"{'' if ratios[-1] <= TARGET else '  (over target)'}")
    return lines, ratios


if __name__ == "__main__":
    print("\n".join(report() + sampler_rows()[0]))
