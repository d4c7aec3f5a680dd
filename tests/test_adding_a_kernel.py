"""docs/adding-a-kernel.md stays true: its five files, written into a copy of the repository exactly as printed,
give a check that lists, passes every family, kills both planted bugs, passes its tests and its docs checks."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "adding-a-kernel.md")
# a "### <path>" heading followed by one fenced block: the file the example adds
FILE = re.compile(r"^### ((?:kernels|reference|stress|tests|docs)/\S+)\n\n```\w*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
COPIED = ("kernels", "reference", "eager", "stress", "tests", "docs", "records", "tools", "conftest.py",
          "pyproject.toml", "specsan", "README.md", "Makefile")


def example_files() -> dict[str, str]:
    with open(GUIDE, encoding="utf-8") as f:
        return dict(FILE.findall(f.read()))


def test_the_example_adds_a_kernel_in_five_files_of_the_five_kinds():
    files = example_files()
    assert len(files) == 5
    assert [p.split("/")[0] for p in files] == ["kernels", "reference", "stress", "tests", "docs"]
    assert not any(os.path.exists(os.path.join(ROOT, p)) for p in files), "the example's files are not the project's"


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": cwd}
    env.pop("SPECSAN_MUTANT", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_worked_example_runs_as_printed(tmp_path):
    copy = str(tmp_path / "repo")
    os.mkdir(copy)
    for name in COPIED:
        source = os.path.join(ROOT, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(copy, name), ignore=shutil.ignore_patterns("__pycache__"))
        elif os.path.exists(source):
            shutil.copy(source, copy)
    for path, text in example_files().items():
        with open(os.path.join(copy, path), "w", encoding="utf-8") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)  # tests/test_docs.py lists files through git
    subprocess.run(["git", "add", "-A"], cwd=copy, check=True)

    listed = _run(["-m", "stress", "list"], copy)
    assert listed.returncode == 0 and "seq_lens.advance" in listed.stdout, listed.stderr[-2000:]
    run = _run(["-m", "stress", "run", "--check", "seq_lens.advance", "--iters", "3", "--jobs", "0",
                "--report", str(tmp_path / "run")], copy)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout + run.stderr
    mutants = _run(["-m", "stress", "mutants", "--check", "seq_lens.advance", "--report", str(tmp_path / "m")], copy)
    assert mutants.returncode == 0, mutants.stdout[-2000:] + mutants.stderr[-2000:]
    assert "2 of 2 checkable mutants killed" in mutants.stdout + mutants.stderr
    its_tests = [path for path in example_files() if path.startswith("tests/")]
    tests = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *its_tests,
                  os.path.join("tests", "test_docs.py"), os.path.join("tests", "test_layers.py"),
                  os.path.join("tests", "test_eager.py"), "-k", "not keeps_the_contract and not violation_is_failed"],
                 copy)
    assert tests.returncode == 0, tests.stdout[-3000:]
