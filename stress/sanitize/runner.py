"""The GPU memory-safety oracle: registry cases under NVIDIA compute-sanitizer.

On the GPU a read past a tensor whose value is never stored, or a read of memory nothing wrote
that happens to hold the right bytes, leaves the outputs right; only a sanitizer sees it. Each
case runs in a process of its own (``stress.sanitize.case``) under ``compute-sanitizer --tool T
--xml --save``, with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (inside a cached segment an
out-of-bounds access lands in memory the allocator owns and memcheck stays silent), and the XML
becomes the verdict: ``fail:oob`` (memcheck), ``fail:uninit`` (initcheck), ``fail:sync``
(synccheck), naming the kernel, the access and the address as an offset from the nearest input
tensor.

A run starts with its tool's positive control (``stress.sanitize.controls``); if the tool does
not report it, every case of the run is ``not_checked:sanitizer blind``. No binary, no GPU, or
a sanitizer that cannot attach to this device: ``not_checked`` with the reason.
"""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from stress.core.types import NOT_CHECKED, PASS, SANITIZER, Check, Result, Verdict, not_checked
from stress.sanitize import report_xml as sanitizer_xml

TOOLS = ("memcheck", "initcheck", "synccheck")
VERDICT = {"memcheck": Verdict.OOB, "initcheck": Verdict.UNINIT, "synccheck": Verdict.SYNC}
CONTROL = {"memcheck": "overread", "initcheck": "uninit", "synccheck": "bad-warp-sync"}
CONTROL_TIMEOUT = 300.0  # seconds for a control (a first Triton compile included)
PRINT_LIMIT = 100  # findings the sanitizer writes per process
ERROR_EXIT = 9  # --error-exitcode: the sanitizer's exit status when it reported anything
PADDING = 1024  # bytes memcheck keeps unowned after each allocation, so a stray access cannot land in a neighbour
SHOWN = 4  # findings spelled out per case (the count says how many there were)
_ENV = "COMPUTE_SANITIZER"


def binary() -> str | None:
    """``$COMPUTE_SANITIZER``, else ``compute-sanitizer`` on PATH, else the CUDA toolkit's."""
    for candidate in (os.environ.get(_ENV), shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def unavailable(device: str) -> str | None:
    """Why nothing can be sanitized here (None: try; the control decides whether the tool works)."""
    if device != "cuda":
        return "compute-sanitizer checks GPU kernels and no CUDA device is in use here"
    if binary() is None:
        return (f"no compute-sanitizer binary (looked at ${_ENV}, PATH and /usr/local/cuda/bin); install the CUDA "
                f"toolkit or set {_ENV}")
    return None


def default_jobs() -> int:
    """One sanitized case per core: each is a process that imports torch, compiles and is instrumented,
    so the CPU, not the GPU, is what they share."""
    from stress.core import gpus

    return gpus.cores()


def why_not(check: Check) -> str | None:
    """The check's reason not to run under a sanitizer, or None."""
    return check.skipped(device="cuda") or check.skipped(tool=SANITIZER)


def command(tool: str, xml_path: str, child_args: list[str]) -> list[str]:
    """The sanitizer's command line around ``python -m stress.sanitize.case CHILD_ARGS``.

    Its exit status is ``ERROR_EXIT`` only for findings: the child's own exit status is not checked
    (a kernel aborted by memcheck makes the child fail afterwards), a host-logic child that never
    touches CUDA is not an error, and it waits for a slow child to start (the case's deadline
    bounds it instead). Only device backtraces: the host stack is the Python interpreter's."""
    return [binary() or "compute-sanitizer", "--tool", tool, "--xml", "--save", xml_path,
            "--print-limit", str(PRINT_LIMIT), "--error-exitcode", str(ERROR_EXIT),
            "--check-exit-code", "no", "--require-cuda-init", "no",
            "--launch-timeout", "0", "--show-backtrace", "device", "--target-processes", "application-only",
            *(["--padding", str(PADDING)] if tool == "memcheck" else []),
            sys.executable, "-m", "stress.sanitize.case", *child_args]


def _environment(gpu: int) -> dict:
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", SPECSAN_DEVICE="cuda", SPECSAN_NO_LOAD="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # expandable segments give false reports under memcheck
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    env["CUDA_VISIBLE_DEVICES"] = visible[gpu] if gpu < len(visible) else str(gpu)  # the worker's GPU
    return env


def _current_gpu() -> int:
    import torch

    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _dying_with_parent():
    """A ``preexec_fn`` that makes the sanitizer SIGKILLed when the worker that started it dies.

    prctl is looked up here, before the fork: the forked child only calls it (no dlopen there,
    whose lock another thread of this process may have held at the fork)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_child(tool: str, child_args: list[str], timeout: float = 0) -> tuple[int, str, str, dict]:
    """Run the child under the tool: (exit status, XML text, the tool's text output, the child's record).

    The sanitizer gets a session of its own (a Ctrl-C is the parent's to handle) and dies with the
    worker that started it (a worker killed at its deadline takes the case with it); past
    ``timeout`` seconds (0: none) the whole session is killed and ``TimeoutError`` raised."""
    with tempfile.TemporaryDirectory(prefix="specsan-sanitize-") as tmp:
        xml_path, record_path = os.path.join(tmp, "out.xml"), os.path.join(tmp, "record.json")
        argv = command(tool, xml_path, ["--record", record_path, *child_args])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_environment(_current_gpu()), start_new_session=True,
                                preexec_fn=_dying_with_parent())
        try:
            output, _ = proc.communicate(timeout=timeout or None)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise TimeoutError(f"case ran past {timeout:g} s under compute-sanitizer") from None
        except BaseException:  # a deadline (alarm) or a signal: the whole group goes with this case
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        xml_text = open(xml_path).read() if os.path.exists(xml_path) else ""
        record = json.load(open(record_path)) if os.path.exists(record_path) else {}
        return proc.returncode, xml_text, output, record


def _nearest(address: int, tensors: dict) -> str:
    """``name + offset`` of the input tensor nearest to ``address``, and where that lies relative to it."""
    best = None
    for name, (start, nbytes) in tensors.items():
        end = start + nbytes
        distance = 0 if start <= address < end else (start - address if address < start else address - end + 1)
        if best is None or distance < best[0]:
            best = (distance, name, start, nbytes)
    if best is None:
        return f"address {address:#x} (no input tensor recorded)"
    _, name, start, nbytes = best
    offset = address - start
    if offset < 0:
        where = f"{-offset} byte(s) before its start"
    elif offset >= nbytes:
        where = "just past its end" if offset == nbytes else f"{offset - nbytes} byte(s) past its end"
    else:
        where = "inside it"
    where += f"; it has {nbytes} bytes"
    return f"{name} {'+' if offset >= 0 else '-'} {abs(offset)}: {where}"


def describe(finding: sanitizer_xml.Finding, tensors: dict) -> str:
    """One line: kernel, access, address relative to the nearest tensor, source line, thread."""
    parts = [finding.kernel or "(kernel not named)", finding.text]
    if finding.address is not None:
        parts.append(f"at {_nearest(finding.address, tensors)}")
    if finding.source:
        parts.append(f"line {finding.source}")
    if finding.block or finding.thread:
        parts.append(f"block {finding.block} thread {finding.thread}")
    return "; ".join(parts)


def judge_tool_output(tool: str, status: int, xml_text: str, output: str, record: dict) -> tuple[str, list[str]]:
    """The verdict of one sanitized run and its detail lines."""
    try:
        findings = sanitizer_xml.parse(xml_text) if xml_text else None
    except sanitizer_xml.SanitizerXmlError as exc:
        findings, problem = None, str(exc)
    else:
        problem = "no XML was written"
    tool_lines = [line.strip("= ").strip() for line in output.splitlines() if line.startswith("========= ")]
    if findings is None:
        if status == ERROR_EXIT:
            return VERDICT[tool], [f"{tool} reported errors (exit {ERROR_EXIT}) but {problem}", *tool_lines[:SHOWN]]
        reason = next((line for line in tool_lines if "rror" in line), None) or (output.strip().splitlines() or
                                                                                   [f"exit {status}"])[-1]
        return not_checked(f"compute-sanitizer did not run the case: {reason[:200]}"), tool_lines[:SHOWN]
    tensors = record.get("tensors", {})
    access = [f for f in findings if f.device_access]
    if access:
        count = f"{len(access)}{' or more' if len(findings) >= PRINT_LIMIT else ''}"
        after = len(findings) - len(access)
        summary = f"{count} {tool} finding(s)" + (f" (and {after} failed CUDA call(s) after them)" if after else "")
        return VERDICT[tool], [describe(f, tensors) for f in access[:SHOWN]] + [summary]
    if record.get("error"):
        return Verdict.CRASH, [record["error"], *[f.text for f in findings[:SHOWN]], *record.get("traceback", [])[-6:]]
    if status == ERROR_EXIT and not findings:
        return VERDICT[tool], [f"{tool} reported errors (exit {ERROR_EXIT}) that its XML did not list",
                               *tool_lines[:SHOWN]]
    if status not in (0, ERROR_EXIT):
        return Verdict.CRASH, [f"the sanitized process exited with status {status}", *tool_lines[:SHOWN]]
    if not record.get("launches"):
        return not_checked("launches no Triton kernel (host logic): nothing for compute-sanitizer to see"), []
    api = f"; {len(findings)} failed CUDA call(s) reported: {findings[0].text}" if findings else ""
    return PASS, [f"{record['launches']} kernel launch(es) clean under {tool}{api}"]


def run_task(task, device: str, timeout: float = 0, trace: bool = True) -> Result:
    """``workers.run_case`` for drivers whose tasks may name a tool: those run under it, the rest as usual."""
    from stress.core import workers

    return run_sanitized(task, task.tool, timeout) if task.tool else workers.run_case(task, device, timeout, trace)


def run_sanitized(task, tool: str, timeout: float = 0) -> Result:
    """One case (a ``cases.Task``) under ``tool``. Never raises but for a signal: a crash is a verdict."""
    from stress import checks

    result = Result(task.check, task.family, task.seed, "cuda", PASS, launch=dict(task.launch or ()),
                    mutant=task.mutant, timeout=timeout, tool=tool)
    start = time.perf_counter()
    check = checks.get(task.check)
    if reason := why_not(check):
        result.verdict = not_checked(reason)
        return result
    args = ["case", task.check, task.family, str(task.seed)]
    if task.mutant:
        args += ["--mutant", task.mutant]
    if task.launch:
        args += ["--launch", ",".join(f"{k}={v}" for k, v in task.launch)]
    try:
        status, xml_text, output, record = _run_child(tool, args, timeout)
    except TimeoutError as exc:
        result.verdict, result.details = Verdict.TIMEOUT, [str(exc)]
        result.seconds = round(time.perf_counter() - start, 4)
        return result
    result.launch = record.get("launch", result.launch)
    result.note = record.get("note", "")
    result.verdict, result.details = judge_tool_output(tool, status, xml_text, output, record)
    result.seconds = round(time.perf_counter() - start, 4)
    return result


def slowdown(results: list[Result], baseline: str) -> str:
    """What a sanitized case costs against the same (check, family) replayed in process by ``run``:
    median seconds per passing case, here and in the ``run`` report in ``baseline``, and their ratio."""
    path = os.path.join(baseline, "results.jsonl")
    plain: dict[tuple[str, str], list[float]] = {}
    try:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if "check" in record and not record.get("tool") and record["verdict"] == PASS:
                    plain.setdefault((record["check"], record["family"]), []).append(record["seconds"])
    except (OSError, ValueError) as exc:
        return f"no baseline: cannot read {path} ({exc})"
    pairs = [(r.seconds, statistics.median(plain[r.check, r.family])) for r in results
             if r.verdict == PASS and (r.check, r.family) in plain]
    if not pairs:
        return f"no baseline: no passing (check, family) in common with {path}"
    ours, theirs = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    return (f"{ours:.2f} s per sanitized case against {theirs:.3f} s replayed in process by run (medians over "
            f"{len(pairs)} case(s) of the same check and family, {path}): {ours / max(theirs, 1e-6):.0f}x")


class Gate(NamedTuple):
    """Whether a run may trust ``tool`` here: ``state`` is caught (its control was reported),
    unavailable (no GPU, no binary, a sanitizer that cannot attach) or blind (it ran and missed it)."""

    state: str
    text: str


def gate(tool: str, device: str) -> Gate:
    """The tool's positive control, run now, in this run."""
    if reason := unavailable(device):
        return Gate("unavailable", reason)
    try:
        status, xml_text, output, record = _run_child(tool, ["control", CONTROL[tool]], CONTROL_TIMEOUT)
    except TimeoutError as exc:
        return Gate("unavailable", f"the {CONTROL[tool]} control: {exc}")
    verdict, details = judge_tool_output(tool, status, xml_text, output, record)
    what = f"{CONTROL[tool]} control under {tool}: {verdict}" + (f" ({details[0]})" if details else "")
    if verdict == VERDICT[tool]:
        return Gate("caught", what)
    if verdict.startswith(NOT_CHECKED):
        return Gate("unavailable", verdict.removeprefix(NOT_CHECKED))
    return Gate("blind", f"sanitizer blind: the planted {CONTROL[tool]} was not reported ({what})")
