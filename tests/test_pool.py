"""The worker pool: a spinning kernel is killed at its deadline, a worker that dies is charged to its
own task, a signal stops the run at once, and no process outlives the pool."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from stress.core import interrupts, pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def task(kind: str):
    """What a worker does with each test item (this module stays light: workers start fast)."""
    if kind == "spin":
        from spin_kernel import spin

        spin()
    elif kind == "abort":
        os.abort()
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "raise":
        raise ValueError("bad item")
    elif kind == "pid":
        return os.getpid()
    elif kind == "sigint":  # as a Ctrl-C would, while the task runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    elif kind.startswith("sleep"):
        time.sleep(float(kind.removeprefix("sleep")))
    return kind


def _failing_initializer(slot):
    raise RuntimeError("no device for this worker")


def children() -> list[int]:
    """Live processes whose parent is this one (workers, the resource tracker), from /proc."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(pid))
    return found


def in_group(pgid: int) -> list[str]:
    """Processes still alive in a process group (a finished run must leave none)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().replace("\0", " ")
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(f"{pid} {cmdline[:100]}")
    return found


def run_all(items, jobs=2, **kwargs) -> dict:
    """Every outcome by item (items are distinct)."""
    queue, seen = list(items), {}
    with pool.Pool(task, jobs, **kwargs) as workers:
        workers.run(lambda: queue.pop(0) if queue else None, lambda o: seen.setdefault(o.item, o))
    return seen


@pytest.mark.slow
def test_spinning_kernel_is_killed_at_its_deadline_and_the_run_goes_on():
    start = time.monotonic()
    seen = run_all(["spin", "a", "b", "c"], timeout=3)
    assert seen["spin"].failure == "timeout" and "deadline" in seen["spin"].detail and seen["spin"].slot in (0, 1)
    assert 3 <= seen["spin"].seconds < 6
    assert [seen[k].value for k in "abc"] == list("abc")
    assert time.monotonic() - start < 30
    assert children() == []  # workers joined and the resource tracker stopped


@pytest.mark.slow
def test_a_dying_worker_is_charged_to_its_own_task_only():
    seen = run_all(["abort", "a", "sigkill", "b", "raise", "c"], jobs=1)
    assert seen["abort"].failure == "died" and "SIGABRT" in seen["abort"].detail
    assert seen["sigkill"].failure == "died" and "SIGKILL" in seen["sigkill"].detail
    assert seen["raise"].failure == "raised" and "ValueError: bad item" in seen["raise"].detail
    assert [seen[k].value for k in "abc"] == list("abc")
    assert {o.slot for o in seen.values()} == {0}  # every outcome names its slot; a replacement keeps it (its GPU)
    assert children() == []


def test_a_task_for_a_worker_that_died_idle_goes_to_its_replacement():
    queue, seen = ["pid", "a"], []

    def on_outcome(outcome):
        seen.append(outcome)
        if outcome.item == "pid":  # kill the worker while it waits for its next task
            os.kill(outcome.value, signal.SIGKILL)
            while os.path.exists(f"/proc/{outcome.value}") and open(f"/proc/{outcome.value}/stat").read().split(
                    ")")[-1].split()[0] != "Z":
                time.sleep(0.01)

    with pool.Pool(task, 1) as workers:
        workers.run(lambda: queue.pop(0) if queue else None, on_outcome)
    assert [(o.item, o.failure, o.value) for o in seen][1] == ("a", "", "a")


@pytest.mark.slow
def test_retired_workers_are_replaced_by_fresh_processes():
    queue, pids = ["pid"] * 3, []
    with pool.Pool(task, 1, retire=lambda value: True) as workers:
        workers.run(lambda: queue.pop() if queue else None, lambda o: pids.append(o.value))
    assert len(set(pids)) == 3


def test_the_source_may_wait_for_outcomes():
    """None from the source means "nothing yet": the next item may depend on the last outcome."""
    order, given = [], []

    def source():
        if len(given) == len(order) and len(given) < 3:  # one at a time
            given.append(f"step{len(given)}")
            return given[-1]
        return None

    with pool.Pool(task, 2) as workers:
        workers.run(source, lambda o: order.append(o.value))
    assert order == ["step0", "step1", "step2"]


def _dying_initializer(slot):
    os.abort()


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_an_error_not_a_hang():
    with pytest.raises(pool.PoolError, match="no device for this worker"):
        run_all(["a"], jobs=1, initializer=_failing_initializer)
    with pytest.raises(pool.PoolError, match=r"workers keep dying while starting \(killed by SIGABRT\)"):
        run_all(["a"], jobs=1, initializer=_dying_initializer)
    assert children() == []


def test_jobs_zero_runs_in_this_process():
    seen = run_all(["pid", "raise"], jobs=0)
    assert seen["pid"].value == os.getpid() and seen["raise"].failure == "raised"


def test_in_this_process_a_signal_abandons_the_running_task_at_once():
    queue = ["a", "sigint", "b"]
    start = time.monotonic()
    with interrupts.handled(), pool.Pool(task, 0) as here:
        with pytest.raises(interrupts.Interrupted):
            here.run(lambda: queue.pop(0) if queue else None, lambda o: None)
    assert here.abandoned == ["sigint"] and queue == ["b"] and time.monotonic() - start < 2


_INTERRUPTED_RUN = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from stress.core import interrupts
    from stress.core import pool
    from test_pool import task
    queue = ["sleep0.2"] * 50 + ["sleep60"] * 4
    done = []

    def source():
        print("dispatched", queue[-1], flush=True)
        return queue.pop()

    with interrupts.handled():
        try:
            with pool.Pool(task, 2) as workers:
                workers.run(source, done.append)
        except interrupts.Interrupted as exc:
            print(f"abandoned {{len(workers.abandoned)}} after {{len(done)}}", flush=True)
            sys.exit(exc.exit_code)
""")


@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGINT to the parent", "SIGTERM to the group"])
def test_a_signal_stops_the_pool_at_once_and_leaves_no_process(how):
    """The 60 s tasks are running when the signal comes: they are abandoned, nothing else starts."""
    script = _INTERRUPTED_RUN.format(root=ROOT, tests=os.path.join(ROOT, "tests"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    for _ in range(2):  # both workers are running a 60 s task
        assert proc.stdout.readline() == "dispatched sleep60\n"
    time.sleep(0.2)
    signum = signal.SIGTERM if "SIGTERM" in how else signal.SIGINT
    start = time.monotonic()
    (os.killpg if "group" in how else os.kill)(proc.pid, signum)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 5
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert out == "abandoned 2 after 0\n"  # nothing was dispatched after the signal
    assert in_group(proc.pid) == []


def test_deferred_blocks_raise_on_exit_and_only_once():
    with interrupts.handled():
        with pytest.raises(interrupts.Interrupted) as raised:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # delivered here, raised only when the block ends
                finished = True
        assert finished and raised.value.exit_code == 130
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal while shutting down is noted, not raised
            time.sleep(0.05)
        assert interrupts.received() == signal.SIGINT


def test_the_pool_counts_its_workers_seconds_outside_their_tasks():
    """Starting, idle and in transit, each counted: a worker's start-up is seconds, and a task's round trip is
    longer than its time in the worker."""
    done = []
    with pool.Pool(task, 2) as workers:
        items = iter(["sleep0.05"] * 4)
        workers.run(lambda: next(items, None), done.append)
    assert len(done) == 4 and all(o.value for o in done)
    assert workers.seconds["starting"] > 0 and workers.seconds["transit"] > 0 and workers.seconds["idle"] >= 0
    assert workers.seconds["transit"] < sum(o.seconds for o in done), "transit is the round trip less the task"
