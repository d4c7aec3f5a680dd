"""Every shell command of README.md runs as printed, on the CPU, from the repository root.

Commands in ```sh / ```bash fences are run one line at a time (a trailing backslash continues a line). A line
the README marks `# long` takes minutes; it must be one of LONG, and runs in the short form given there."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(sh|bash)\s*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A long command -> the short form the test runs: the same target and arguments, checked without the minutes.
LONG = {
    "make test": "make -n test",
    "make stress ITER=100": "make stress ITER=1 CHECK=block_table.unaligned_prefix DEVICE=cpu REPORT={tmp}/stress",
}


def commands(text: str) -> list[str]:
    found = []
    for block in FENCE.finditer(text):
        pending = ""
        for line in block.group(2).splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(line.strip())
    return found


def as_run(command: str, tmp: str) -> str:
    """The command as the test runs it: as printed, or a long one's short form."""
    code, _, comment = command.partition("#")
    if comment.strip().startswith("long"):
        assert code.strip() in LONG, f"{command!r} is marked long, but the test has no short form of it"
        return LONG[code.strip()].format(tmp=tmp)
    return command


README_COMMANDS = commands(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())


def test_the_readme_shows_the_two_commands_and_a_run_a_family_and_a_repro():
    printed = [c.partition("#")[0].strip() for c in README_COMMANDS]
    assert {"make test", "make stress ITER=100"} <= set(printed)
    for start in ("./specsan list", "./specsan run --check", "./specsan repro "):
        assert any(c.startswith(start) for c in printed), start
    assert any("--family" in c for c in printed)
    assert not any("python -m stress" in c for c in README_COMMANDS)  # fails on a fresh clone: torch is in .venv


def test_commands_are_read_from_both_fence_kinds_with_continuations():
    text = "```sh\nmake a   # long\n./x \\\n  --y\n```\nnot a command\n```bash\n# a comment\nb\n```\n```text\nc\n```\n"
    assert commands(text) == ["make a   # long", "./x    --y", "b"]
    with pytest.raises(AssertionError, match="no short form"):
        as_run("make other   # long: minutes", "/tmp")
    assert as_run("make test   # long: the suite", "/t") == "make -n test"
    assert as_run("./specsan list   # checks", "/t") == "./specsan list   # checks"


@pytest.mark.slow
@pytest.mark.parametrize("command", README_COMMANDS)
def test_readme_command_runs_as_printed(command, tmp_path):
    env = {**os.environ, "SPECSAN_DEVICE": "cpu"}
    done = subprocess.run(["bash", "-c", as_run(command, str(tmp_path))], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_every_module_a_make_target_runs_does_something_when_run():
    """``python -m M`` of a module without a ``__main__`` guard imports it and exits 0 having done nothing: a
    make target naming one would pass while running nothing."""
    import importlib.util

    makefile = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    modules = set(re.findall(r"\$\(PY\) -m ([\w.]+)", makefile)) - {"pytest", "ruff"}
    assert "stress" in modules
    for name in modules:
        spec = importlib.util.find_spec(name)
        main = importlib.util.find_spec(f"{name}.__main__") if spec.submodule_search_locations else spec
        source = open(main.origin, encoding="utf-8").read()
        assert main is not spec or 'if __name__ == "__main__"' in source, f"python -m {name} runs nothing"
