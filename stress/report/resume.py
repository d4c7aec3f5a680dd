"""Resuming a stopped run: the cases an earlier report finished are carried into the new one, not run again.

A case's verdict follows from its seed, the run's settings and the code that judged it. So an earlier report's
cases are carried only when that run had the same device, seed, deadline, tracer, planted bug and judged
implementations, and the same source: a hash of the kernels', references' and suite's files and of every
``--impl`` module. Crashes and timeouts are run again, since a stalled neighbour or a killed worker can cause
them as well as the code. Matching is by case (check, family, seed), so a resumed run may ask for more
iterations than the earlier one: its first iterations' seeds are the same.

The kill matrix's rows that the earlier run decided by hunting (killed or survived) are carried too when its
matrix had the same bounds, one row per planted bug (no ``--by-shape``) and no path column; otherwise the
matrix runs again. The race hunts always run again: they take seconds. A run in one process (``--jobs 0``) kept
its process after a fatal case, so nothing it finished after one is carried, nor its kill matrix, whose fatal
cases its report does not list.
"""

import gzip
import hashlib
import importlib
import inspect
import json
import os
from dataclasses import dataclass, fields

from stress.core import sources
from stress.core.types import Kill, Result, Verdict

SOURCES = ("kernels", "reference", "stress", "eager")  # what judges a case, beside any --impl module
SAME = ("device", "seed", "timeout", "trace", "mutant", "impl", "source")  # header fields a carried case needs equal
RERUN = (Verdict.CRASH, Verdict.TIMEOUT)
KILL_SAME = ("max_iters", "by_shape", "path_iters")  # and SAME: the kill matrix's bounds
HUNTED = ("killed", "survived")  # the kill-matrix rows a hunt decided
_RESULT_FIELDS = {f.name for f in fields(Result)}
_KILL_FIELDS = {f.name for f in fields(Kill)}


class ResumeError(ValueError):
    """The earlier report cannot be resumed; the message says why, then (after '; ') what to do instead."""


def source_fingerprint(impl_specs: list[str] | None = None) -> str:
    """A hash of every file that judges a case: the kernels, the references, the suite, and the module of each
    ``--impl`` spec (``CHECK=module:function``), so a changed kernel never inherits its old verdicts."""
    digest = hashlib.sha256(sources.fingerprint(SOURCES).encode())
    for spec in impl_specs or ():
        module_name = spec.partition("=")[2].partition(":")[0]
        try:
            source = inspect.getsource(importlib.import_module(module_name))
        except (ImportError, OSError, TypeError):
            source = ""  # not importable here: the run itself refuses it
        digest.update(spec.encode() + b"\0" + source.encode() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Earlier:
    """An earlier report's header and its finished cases that may be carried, by (check, family, seed)."""

    path: str
    header: dict
    results: dict[tuple[str, str, int], Result]
    rerun: int  # crashes and timeouts it finished, left to run again
    kills: dict[tuple[str, str], Kill]  # kill-matrix rows it decided by hunting, by check and planted bug


def _results_file(path: str) -> str:
    if os.path.isdir(path):
        for name in ("results.jsonl", "results.jsonl.gz"):
            if os.path.exists(candidate := os.path.join(path, name)):
                return candidate
        raise ResumeError(f"{path} holds no results.jsonl; give the --report folder (or its results.jsonl) of the "
                          "run to resume")
    if not os.path.exists(path):
        raise ResumeError(f"{path} does not exist; give the --report folder (or its results.jsonl) of the run to "
                          "resume")
    return path


def read(path: str) -> Earlier:
    """The earlier run at ``path`` (a report folder, its results.jsonl, or a .jsonl.gz copy)."""
    file = _results_file(path)
    opener = gzip.open if file.endswith(".gz") else open
    header, results, rerun, kills, damaged = None, {}, 0, {}, False
    one_process = False  # --jobs 0: its process was kept after a fatal case
    try:
        with opener(file, "rt") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut off when the run was killed
                if "run" in record and header is None:
                    header = record["run"]
                    one_process = header.get("jobs") == 0
                elif "check" in record and "verdict" in record and not record.get("tool") and not damaged:
                    result = Result(**{k: v for k, v in record.items() if k in _RESULT_FIELDS})
                    damaged = result.fatal and one_process
                    if result.verdict in RERUN:
                        rerun += 1
                        continue
                    results[(result.check, result.family, result.seed)] = result
                elif "kill" in record and record["kill"].get("status") in HUNTED and not one_process:
                    kill = Kill(**{k: v for k, v in record["kill"].items() if k in _KILL_FIELDS})
                    kills[(kill.check, kill.mutant)] = kill
    except OSError as exc:
        raise ResumeError(f"cannot read {file} ({exc.strerror}); give a readable results.jsonl") from None
    if header is None:
        raise ResumeError(f"{file} has no run header; give the results.jsonl of a `run`")
    return Earlier(file, header, results, rerun, kills)


def check_same(earlier: Earlier, header: dict) -> None:
    """Refuse an earlier run whose settings or source differ from this run's (``header``), naming the first."""
    for key in SAME:
        was, now = earlier.header.get(key), header.get(key)
        if was != now:
            what = "the source changed since" if key == "source" else f"{key} was {was!r}, now {now!r}"
            raise ResumeError(f"{earlier.path}: {what}, so its verdicts may not be this run's; "
                              "run without --resume" + ("" if key == "source" else f", or with the same {key}"))


def carry(tasks: list, earlier: Earlier) -> tuple[list, list[Result]]:
    """``tasks`` split into those still to run and the earlier results that stand for the rest."""
    to_run, carried = [], []
    for task in tasks:
        result = earlier.results.get((task.check, task.family, task.seed))
        if result is not None and result.mutant == task.mutant:
            carried.append(result)
        else:
            to_run.append(task)
    return to_run, carried


def carry_kills(earlier: Earlier, header: dict, matrix, on_row) -> int:
    """Put the earlier run's hunted rows in place of ``matrix``'s (``stress.mutate.kill_matrix.Matrix``) planned
    hunts of the same planted bugs, each given to ``on_row``, when both matrices had the same bounds, one row per
    bug and no path column; returns how many were carried."""
    if header.get("by_shape") or header.get("path_iters") or any(
            earlier.header.get(key) != header.get(key) for key in KILL_SAME):
        return 0
    carried = 0
    for hunt in list(matrix.hunts):
        row = earlier.kills.get((hunt.kill.check, hunt.kill.mutant))
        if row is None:
            continue
        at = next(i for i, planned in enumerate(matrix.rows) if planned is hunt.kill)
        matrix.rows[at] = row
        matrix.hunts.remove(hunt)
        on_row(row)
        carried += 1
    return carried
