"""Cases built ahead by builder processes (stress.core.prebuild): the same cases, the same verdicts, and a build
that fails or a builder that dies leaves the case to its worker."""

import dataclasses
import os

import pytest
import torch
from same_values import same

from stress import checks
from stress.core import cases, prebuild, workers
from stress.core.types import PASS

REFUSING = [c for c in checks.REGISTRY if "refused" in c.families]


@pytest.mark.parametrize("check", REFUSING, ids=lambda c: c.name)
def test_a_case_mapped_from_its_file_is_the_case_built_in_place(check, tmp_path):
    """Saved and mapped back (``case_of``), every refusal of the case keeps its inputs bitwise, in their layout,
    and its note, argument and limit: the worker judges the case it would have built."""
    task = cases.Task(check.name, "refused", cases.case_seed(0, check.name, "refused", 3))
    built = cases.build_case(check, task.family, task.seed, "cpu")
    path = str(tmp_path / "case.pt")
    prebuild._build((task, "cpu", path))
    mapped, expected = prebuild.case_of(check, task._replace(prebuilt=path), "cpu")
    assert expected is None, "a refusal case has no reference outputs"
    assert built.more_refusals, "a refusal case holds one refusal per corruption"
    for a, b in zip([built, *built.more_refusals], [mapped, *mapped.more_refusals], strict=True):
        assert (a.note, a.refused, a.own_limit, a.launch) == (b.note, b.refused, b.own_limit, b.launch)
        assert same(a.inputs, b.inputs) and same(a.unwritten, b.unwritten), a.note


def test_only_the_plans_own_refusal_and_host_heavy_cases_are_built_ahead():
    gather, engine = checks.get("block_table.gather"), checks.get("engine.step")
    assert engine.host_heavy and not gather.host_heavy
    seed = cases.case_seed(0, gather.name, "refused", 0)
    assert prebuild.built_ahead(gather, cases.Task(gather.name, "refused", seed))
    assert not prebuild.built_ahead(gather, cases.Task(gather.name, "basic", seed))
    assert prebuild.built_ahead(engine, cases.Task(engine.name, "combined", seed))
    for check, family in ((gather, "refused"), (engine, "combined")):
        assert not prebuild.built_ahead(check, cases.Task(check.name, family, seed, mutant=check.mutants[0].name))
        assert not prebuild.built_ahead(check, cases.Task(check.name, family, seed, tool="memcheck"))
    assert prebuild.builders_for("cpu", 2) == 0 and prebuild.builders_for("cuda", 0) == 0
    assert prebuild.builders_for("cuda", 8) >= 1


def test_a_reference_computed_ahead_is_the_one_computed_in_place(tmp_path):
    """A host-heavy check's file holds its reference's outputs, the ones the worker would compute."""
    check = checks.get("engine.step")
    task = cases.Task(check.name, "combined", cases.case_seed(0, check.name, "combined", 1))
    built = cases.build_case(check, task.family, task.seed, "cpu")
    path = str(tmp_path / "case.pt")
    prebuild._build((task, "cpu", path))
    mapped, expected = prebuild.case_of(check, task._replace(prebuilt=path), "cpu")
    assert same(built.inputs, mapped.inputs)
    assert expected is not None and same(cases.expected_outputs(check, built), expected)


def test_a_reference_that_fails_or_writes_its_inputs_is_left_to_the_worker():
    """Positive controls of ``_reference``: a reference that raises, or writes an input in place, gives None (the
    worker then computes it on its own copies and judges that as without builders)."""
    check = checks.get("block_table.gather")
    case = cases.build_case(check, "basic", 3, "cpu")
    assert prebuild._reference(check, case) is not None

    def writes(**inputs):
        next(v for v in inputs.values() if isinstance(v, torch.Tensor)).add_(1)
        return check.reference(**inputs)

    def raises(**inputs):
        raise RuntimeError("no reference")

    assert prebuild._reference(dataclasses.replace(check, reference=writes), case) is None
    assert prebuild._reference(dataclasses.replace(check, reference=raises), case) is None


def _plan():
    chosen = [checks.get("block_table.gather"), checks.get("sampling.gumbel"), checks.get("engine.step")]
    return cases.plan(chosen, ["refused", "padded", "combined"], 2, 0)


def _verdicts(results):
    return {(r.check, r.family, r.seed): (r.verdict, r.note, r.launch) for r in results}


def test_a_run_with_builders_reaches_the_verdicts_of_one_without(monkeypatch):
    """The same plan with two builders and with none: the same cases (notes, launch shapes) and verdicts; each
    refusal case says its builder's seconds, and the builders' folder is gone after the run."""
    tasks = _plan()
    built = [t for t in tasks if prebuild.built_ahead(checks.get(t.check), t)]
    assert {t.family for t in built} == {"refused", "combined"} and len(built) < len(tasks)
    without: list = []
    workers.execute(tasks, "cpu", 1, without.append, timeout=300)
    folders = []
    made = prebuild.Ahead.__init__

    def noting(self, *args):
        made(self, *args)
        folders.append(self.folder)

    monkeypatch.setattr(prebuild.Ahead, "__init__", noting)
    ahead: list = []
    seconds = workers.execute(tasks, "cpu", 1, ahead.append, timeout=300, builders=2)
    assert _verdicts(ahead) == _verdicts(without)
    assert all(r.verdict == PASS for r in ahead)
    assert {(r.check, r.seed) for r in ahead if r.phases.get("built_ahead")} == {(t.check, t.seed) for t in built}
    assert seconds["built_ahead"] > 0
    assert folders and not os.path.exists(folders[0])


def _handed_out(ahead: prebuild.Ahead) -> list:
    out = []
    try:
        while (task := ahead.next()) is not None:
            out.append(task)
            ahead.finished(task)
    finally:
        ahead.close()
    return out


def test_a_build_that_fails_leaves_its_case_to_its_worker():
    """A builder that cannot write its file (the folder is gone) fails the build: the task is still handed out,
    once, with no file, and its worker builds it as without builders."""
    tasks = _plan()
    ahead = prebuild.Ahead(tasks, "cpu", 1)
    os.rmdir(ahead.folder)
    handed = _handed_out(ahead)
    assert sorted(handed) == sorted(tasks)
    assert not any(t.prebuilt for t in handed)


def test_dead_builders_leave_every_case_to_the_workers():
    tasks = _plan()
    ahead = prebuild.Ahead(tasks, "cpu", 2)
    for builder in ahead.builders:
        builder.process.kill()
    handed = _handed_out(ahead)
    assert sorted(handed) == sorted(tasks)
    assert not any(t.prebuilt for t in handed) and not ahead.builders


def test_every_task_is_handed_out_once_built_where_picked():
    tasks = _plan()
    handed = _handed_out(prebuild.Ahead(tasks, "cpu", 2))
    assert sorted(t._replace(prebuilt="") for t in handed) == sorted(tasks)
    assert all(bool(t.prebuilt) == prebuild.built_ahead(checks.get(t.check), t) for t in handed)


def test_a_built_case_is_handed_out_while_an_earlier_one_still_builds(monkeypatch):
    """No head-of-line wait: once nothing else is left, the first task whose case is built goes out, not the
    earliest one waiting, whose build is not done; that one goes out once it is."""
    tasks = cases.plan([checks.get("block_table.gather"), checks.get("sampling.gumbel")], ["refused"], 1, 0)
    ahead = prebuild.Ahead(tasks, "cpu", 1)
    first, second = ahead.builds[0], ahead.builds[1]

    def poll(timeout):  # the builders' news: the second build finishes first
        if timeout is None:
            assert second.state != "ready", "waited for the earliest build while a later one was done"
            second.state = "ready"

    try:
        monkeypatch.setattr(ahead, "_poll", poll)
        first.state = second.state = "building"
        assert ahead.next() == tasks[1]._replace(prebuilt=second.path)
        first.state = "ready"
        assert ahead.next() == tasks[0]._replace(prebuilt=first.path)
        assert ahead.next() is None
    finally:
        ahead.close()
