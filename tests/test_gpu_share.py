"""Workers sharing one GPU: cases hold it shared, a rerun after running out of memory holds it alone, and
new cases queue behind a waiting rerun instead of starving it."""

import dataclasses
import threading
import time

import pytest
import torch

from kernels import runtime
from stress import checks
from stress.core import cases, gpu_share, oracle, workers
from stress.core.types import OUTSIDE, PHASES


def _holding(enter, hold: threading.Event, log: list, name: str):
    """A thread inside ``enter()`` (a context manager) until ``hold`` is set, logging when it gets in and out."""
    def run():
        with enter():
            log.append(f"{name} in")
            hold.wait(5)
            log.append(f"{name} out")
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_cases_share_a_gpu_and_a_rerun_waits_for_them_then_runs_before_new_cases(tmp_path):
    shares = [gpu_share.GpuShare(str(tmp_path), 0) for _ in range(4)]  # own open files: as separate processes
    log: list[str] = []
    first_done, rerun_done, later_done = threading.Event(), threading.Event(), threading.Event()
    a = _holding(shares[0].shared, first_done, log, "a")
    b = _holding(shares[1].shared, first_done, log, "b")
    time.sleep(0.2)
    assert sorted(log) == ["a in", "b in"], "two cases hold one GPU at once"
    rerun = _holding(shares[2].alone, rerun_done, log, "rerun")
    time.sleep(0.2)
    later = _holding(shares[3].shared, later_done, log, "later")
    time.sleep(0.2)
    assert "rerun in" not in log and "later in" not in log, "the rerun waits for the running cases; new ones queue"
    first_done.set()
    a.join(), b.join()
    time.sleep(0.2)
    assert log[-1] == "rerun in" and "later in" not in log, "the rerun runs alone, before the case queued behind it"
    rerun_done.set()
    rerun.join()
    later_done.set()
    later.join()
    assert log.index("later in") > log.index("rerun out")


def _gather_once_short_of_memory(monkeypatch, tmp_path, part: str) -> tuple[list, str]:
    """block_table.gather whose ``part`` (kernel or reference) runs out of device memory on its first call only,
    run by a worker holding a share of its GPU; returns the calls made and the check's name."""
    calls = []
    base = checks.get("block_table.gather")
    original = getattr(base, part)

    def once_short_of_memory(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return original(**kwargs)

    check = dataclasses.replace(base, repeats={"cpu": 1, "cuda": 1}, **{part: once_short_of_memory})
    monkeypatch.setitem(checks.BY_NAME, check.name, check)
    monkeypatch.setattr(workers, "_SHARE", gpu_share.GpuShare(str(tmp_path), 0))
    if runtime.DEVICE == "cpu":
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return calls, check.name


def test_a_case_that_runs_out_of_device_memory_runs_again_alone(tmp_path, monkeypatch):
    calls, name = _gather_once_short_of_memory(monkeypatch, tmp_path, "kernel")
    result = workers.run_case(cases.Task(name, "basic", 1), runtime.DEVICE, trace=False)
    assert result.verdict == "pass" and len(calls) == 2, result.details
    assert "ran again alone on its GPU" in result.details[-1]

    calls.clear()
    monkeypatch.setattr(workers, "_SHARE", None)  # no share (one process): the out-of-memory case is a crash
    result = workers.run_case(cases.Task(name, "basic", 1), runtime.DEVICE, trace=False)
    assert result.verdict == "fail:crash" and "OutOfMemoryError" in result.details[0] and len(calls) == 1


def test_a_reference_that_runs_out_of_device_memory_runs_again_alone(tmp_path, monkeypatch):
    calls, name = _gather_once_short_of_memory(monkeypatch, tmp_path, "reference")
    result = workers.run_case(cases.Task(name, "basic", 1), runtime.DEVICE, trace=False)
    assert result.verdict == "pass" and len(calls) == 2, result.details
    assert "ran again alone on its GPU" in result.details[-1]


def test_a_result_says_where_its_time_went():
    result = workers.run_case(cases.Task("block_table.gather", "basic", 3), runtime.DEVICE)
    timed = {"build", "reference", "place", "launch", "settle", "compare", "release"}
    assert timed <= set(result.phases) <= set(PHASES)
    assert sum(v for p, v in result.phases.items() if p not in OUTSIDE) <= result.seconds + 1e-3
    refused = workers.run_case(cases.Task("block_table.gather", "refused", 3), runtime.DEVICE)
    assert refused.verdict == "pass" and set(refused.phases) <= {"build", "refusal", "gpu_wait", "release"}
    assert {"build", "refusal"} <= set(refused.phases)


@pytest.mark.gpu
def test_a_repeat_waits_for_the_gpu_once(monkeypatch):
    """Every wait is a wait for the other workers' time slices on a shared GPU: a repeat's guard checks and
    read-backs are queued and fetched with one synchronization."""
    if runtime.DEVICE != "cuda":
        pytest.skip("needs a GPU")
    check = checks.get("block_table.gather")
    case = cases.build_case(check, "padded", 5, "cuda", {})
    expected = cases.expected_outputs(check, case)
    waits = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (waits.append(1), real(*a))[1])
    verdict, _ = oracle.differential(check, case, expected, "cuda")
    assert verdict == "pass" and len(waits) == check.repeats["cuda"]


def test_compiles_are_timed_apart_from_launches_and_hooks_already_installed_keep_running(monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    from stress.core import compiles

    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append("cache") or False)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append("post"))
    before = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    phases = {}
    with compiles.timed(phases):
        assert knobs.runtime.jit_cache_hook(key="k") is False  # the hook's answer is passed on
        time.sleep(0.02)
        knobs.runtime.jit_post_compile_hook(key="k")
    assert seen == ["cache", "post"] and phases["compile"] >= 0.02
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == before
    with compiles.timed(phases := {}):
        pass
    assert phases == {}  # nothing compiled, nothing counted


def _compile_variant(directory: str, key: str, holding, finish) -> None:
    """A worker compiling one variant: it holds the variant's lock until ``finish`` is set."""
    from triton import knobs

    from stress.core import compiles

    compiles.share(directory)
    knobs.runtime.jit_cache_hook(key=key, repr="kernel[num_warps=4]", fn=None)
    holding.set()
    finish.wait(30)
    knobs.runtime.jit_post_compile_hook(key=key, repr="kernel[num_warps=4]", fn=None)


def test_workers_compile_each_variant_once_the_others_wait_for_it(tmp_path, monkeypatch):
    """A variant another worker is compiling holds this one's compile back until that one is done; another
    variant does not wait; a cache hook already installed keeps its answer, and a skipped compile (the
    hook said so) holds no lock."""
    import multiprocessing

    knobs = pytest.importorskip("triton").knobs
    from stress.core import compiles

    context = multiprocessing.get_context("spawn")
    holding, finish = context.Event(), context.Event()
    worker = context.Process(target=_compile_variant, args=(str(tmp_path), "k", holding, finish))
    worker.start()
    try:
        assert holding.wait(60)
        monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: kw["key"] == "skipped")
        monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
        compiles.share(str(tmp_path))
        hook, done = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
        assert hook(key="other", repr="", fn=None) is False and compiles._held  # another variant: no wait
        done(key="other", repr="", fn=None)
        assert not compiles._held
        assert hook(key="skipped", repr="", fn=None) is True and not compiles._held
        waited = []
        thread = threading.Thread(target=lambda: waited.append(hook(key="k", repr="kernel[num_warps=4]", fn=None)))
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive() and not waited  # positive control: the variant being compiled waits
        finish.set()
        thread.join(30)
        assert waited == [False]
        compiles.release()  # as the end of a case does after a compile that raised
        assert not compiles._held
    finally:
        finish.set()
        worker.join(30)


def test_big_cases_share_the_gpus_budget_and_small_ones_take_none(tmp_path):
    """A GPU of 200 bytes shared by 10 workers: a worker's share is 10 bytes, the budget for big cases 50."""
    shares = [gpu_share.GpuShare(str(tmp_path), 0, memory=200, sharing=10) for _ in range(4)]
    log: list[str] = []
    a_done, b_done, c_done, d_done = (threading.Event() for _ in range(4))
    a = _holding(lambda: shares[0].room(30), a_done, log, "a")
    time.sleep(0.1)
    b = _holding(lambda: shares[1].room(30), b_done, log, "b")
    c = _holding(lambda: shares[2].room(10), c_done, log, "small")
    time.sleep(0.2)
    assert sorted(log) == ["a in", "small in"], "30 + 30 bytes outgrow the budget; a case within a share waits for none"
    a_done.set()
    a.join()
    time.sleep(0.2)
    assert log[-1] == "b in", "the room a case gave back goes to the big case waiting"
    d = _holding(lambda: shares[3].room(80), d_done, log, "whole")
    time.sleep(0.2)
    assert "whole in" not in log, "a case bigger than the budget waits while another big case runs"
    b_done.set()
    b.join()
    time.sleep(0.2)
    assert log[-1] == "whole in", "then runs, alone among big cases"
    c_done.set(), d_done.set()
    c.join(), d.join()


def test_the_room_of_a_worker_that_died_holding_it_or_writing_it_is_given_back(tmp_path):
    import subprocess
    import sys

    share = gpu_share.GpuShare(str(tmp_path), 0, memory=200, sharing=10)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "gpu0.budget").write_text(f'{{"{dead.pid}": 50}}')
    with share.room(40) as waited:
        assert waited < 1.0
    (tmp_path / "gpu0.budget").write_text('{"12')  # a worker killed mid-write
    with share.room(40) as waited:
        assert waited < 1.0
    assert (tmp_path / "gpu0.budget").read_text() == "{}"


def test_a_big_case_waits_for_room_before_it_is_judged_and_the_wait_is_counted(tmp_path, monkeypatch):
    """Positive control of the wiring: a case bigger than a worker's share finds the budget taken by a live
    process and waits in ``run_case`` until it is given back; the wait shows as ``gpu_wait``."""
    import os

    share = gpu_share.GpuShare(str(tmp_path), 0, memory=4, sharing=2)  # a share of 1 byte, a budget of 1: all big
    monkeypatch.setattr(workers, "_SHARE", share)
    budget = tmp_path / "gpu0.budget"
    budget.write_text(f'{{"{os.getppid()}": 1}}')  # the budget (1 byte) held by a live process
    refused = threading.Event()
    reserve = share._reserve
    monkeypatch.setattr(share, "_reserve", lambda n: reserve(n) or refused.set())
    threading.Thread(target=lambda: (refused.wait(30), time.sleep(0.3), budget.write_text("{}"))).start()
    result = workers.run_case(cases.Task("block_table.gather", "basic", 1), runtime.DEVICE, trace=False)
    assert result.verdict == "pass", result.details
    assert result.phases["gpu_wait"] >= 0.3
    assert budget.read_text() == "{}", "the room is given back when the case ends"


def test_a_case_needs_its_views_whole_extent_and_canaries_on_the_device():
    from stress.core import guards
    from stress.families.common import spread

    rows = spread(torch.ones(3, 4, dtype=torch.float32), 0, 1000)  # last row 1,000 past the first: 1,004 elements
    pad = guards.GUARD_BYTES // 4
    assert guards.device_bytes({"rows": rows, "n": 3}) == (1004 + 2 * pad) * 4
    assert guards.device_bytes({"rows": rows, "moved": torch.empty(10, device="meta")}) == (1004 + 2 * pad) * 4


def _invalidated_once(task, device, timeout=0, trace=True):
    """A judge whose first run of every task finds its graph capture invalidated; a rerun alone passes."""
    from stress.core.types import Result, Verdict

    if task.alone:
        return Result(task.check, task.family, task.seed, device, "pass", details=[f"alone: {task.alone}"])
    return Result(task.check, task.family, task.seed, device, Verdict.CRASH, fatal=True,
                  details=[f"torch.AcceleratorError: CUDA error: {workers.CAPTURE_INVALIDATED}"])


def test_a_capture_invalidated_beside_other_workers_runs_again_alone_once(monkeypatch):
    task = cases.Task("engine.step", "adaptive_graphs", 7)
    crashed = _invalidated_once(task, "cuda")
    rerun = workers.rerun_alone(task, crashed, "cuda", jobs=8)
    assert rerun is not None and rerun._replace(alone="") == task and "invalidated" in rerun.alone
    assert workers.rerun_alone(rerun, crashed, "cuda", jobs=8) is None, "a rerun's verdict stands"
    assert workers.rerun_alone(task, crashed, "cuda", jobs=1) is None, "no other worker: the code broke it"
    other = dataclasses.replace(crashed, details=["torch.AcceleratorError: CUDA error: an illegal memory access"])
    assert workers.rerun_alone(task, other, "cuda", jobs=8) is None, "only an invalidated capture"

    # through execute (in this process, as if its workers shared a GPU): each rerun is queued after its first run
    # and reported instead of it
    real = workers.rerun_alone
    monkeypatch.setattr(workers, "rerun_alone", lambda t, r, d, jobs: real(t, r, d, jobs=8))
    monkeypatch.setattr(workers, "_gpu_of", lambda outcome, device: 0)
    results = []
    workers.execute([task, task._replace(seed=8)], "cuda", 0, results.append,
                    judge=lambda t, **kw: _invalidated_once(t, "cuda"))
    assert [(r.seed, r.verdict) for r in results] == [(7, "pass"), (8, "pass")]
    assert all("invalidated beside other workers" in r.details[0] for r in results)


def test_a_rerun_alone_holds_the_gpu_alone_and_says_why(tmp_path, monkeypatch):
    share = gpu_share.GpuShare(str(tmp_path), 0)
    monkeypatch.setattr(workers, "_SHARE", share)
    held = []
    real_alone = share.alone
    monkeypatch.setattr(share, "alone", lambda: (held.append("alone"), real_alone())[1])
    task = cases.Task("block_table.gather", "basic", 1, alone="its graph capture was invalidated (test)")
    result = workers.run_case(task, runtime.DEVICE, trace=False)
    assert result.verdict == "pass" and held == ["alone"], result.details
    assert result.details[-1] == f"ran again alone on its GPU, in a fresh worker: {task.alone}"


def test_a_kill_matrix_case_whose_capture_was_invalidated_runs_again_alone_and_only_the_rerun_counts(monkeypatch):
    from stress.mutate import kill_matrix

    real = workers.rerun_alone
    monkeypatch.setattr(workers, "rerun_alone", lambda t, r, d, jobs: real(t, r, "cuda", jobs=8))
    ran = []
    monkeypatch.setattr(kill_matrix.sanitizer, "run_task",
                        lambda task, device, **kw: (ran.append(task.alone), _invalidated_once(task, device))[1])
    hunt = kill_matrix._new_hunt(checks.get("block_table.gather"), "gather-by-batch-row", "cpu", "crash", 1, 0, None)
    rows, seen = [], []
    kill_matrix._run_hunts([hunt], "cpu", 0, 0, rows.append, seen.append)
    assert len(ran) == 2 and not ran[0] and "invalidated" in ran[1]
    assert [r.verdict for r in seen] == ["pass"], "the invalidated capture is not a kill; the rerun alone decides"
    assert rows[0].status != "killed"


def test_a_device_error_surfacing_at_release_is_the_cases_crash_and_retires_its_worker(monkeypatch):
    """A kernel's illegal address reported only at the next CUDA call, trimming the cache after the verdict: the
    case is ``fail:crash`` and fatal (its worker is replaced), and its earlier verdict stays in the details, not a
    raise that would leave the poisoned worker failing every later case."""
    def late_error(device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(workers, "_release_device_memory", late_error)
    result = workers.run_case(cases.Task("block_table.gather", "basic", 1), "cpu", trace=False)
    assert result.verdict == "fail:crash" and result.fatal
    assert "illegal memory access" in result.details[0] and "the verdict before it: pass" in result.details[1]
    assert "release" in result.phases
