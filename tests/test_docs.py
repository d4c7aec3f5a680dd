"""The documentation a user reads: every citation in code and docs names a file (and a section) that exists in
the repository, and the docs name every registered check, family and planted bug."""

import os
import re
import subprocess

import pytest

from stress import checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Documents the project does not carry: the upstream digest and its sections, design notes, research files.
FOREIGN = re.compile(r"\bspec (fix|fixes|section|\d+\.\d)|specdecode|\bresearch/|DESIGN\.md|anchors\.md", re.IGNORECASE)
# A repository path cited in code or prose, with an optional section: docs/fixes.md#fix-5, stress/checks.py.
PATH = re.compile(r"(?<![\w/.$-])((?:docs|records|tests|stress|kernels|reference|tools)/[\w/.-]*\w\."
                  r"(?:md|py|toml|gz|sh))(#[\w-]+)?")
LINK = re.compile(r"\]\(([^()\s]*)\)")  # a markdown link's target


def _tracked(*patterns: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if os.path.exists(os.path.join(ROOT, p))]


def slug(heading: str) -> str:
    """The anchor a markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    found, fenced = set(), False
    for line in open(os.path.join(ROOT, path), encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def _problem(target: str, section: str | None) -> str | None:
    if not os.path.isfile(os.path.join(ROOT, target)):
        return f"{target} does not exist"
    if section and target.endswith(".md") and section not in anchors(target):
        return f"{target} has no section #{section}"
    return None


def added_by_the_worked_example() -> set[str]:
    """The files docs/adding-a-kernel.md adds (its "### <path>" headings): cited there before they exist."""
    with open(os.path.join(ROOT, "docs", "adding-a-kernel.md"), encoding="utf-8") as f:
        return set(re.findall(r"^### ((?:kernels|reference|stress|tests|docs)/\S+)$", f.read(), re.MULTILINE))


def citations() -> list[tuple[str, int, str, str | None]]:
    """(file, line, cited path from the root, section) for every repository path cited in code, tests and docs,
    and every relative markdown link."""
    found = []
    for path in _tracked("*.py", "*.md", "*.toml", "Makefile", "*.sh"):
        if path == "tests/test_docs.py":  # its own examples of broken citations
            continue
        example = added_by_the_worked_example() if path == "docs/adding-a-kernel.md" else set()
        for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
            for m in PATH.finditer(line):
                if m.group(1) not in example:
                    found.append((path, n, m.group(1), (m.group(2) or "#")[1:] or None))
            if path.endswith(".md"):
                for m in LINK.finditer(line):
                    target = m.group(1)
                    if target.startswith(("http://", "https://", "mailto:")):
                        continue
                    file, _, section = target.partition("#")
                    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                    found.append((path, n, resolved, section or None))
    return found


def test_every_cited_file_and_section_exists():
    assert len(citations()) > 100  # the scan sees the citations it exists for
    broken = [f"{path}:{n}: {target}{'#' + s if s else ''}: {why}" for path, n, target, s in citations()
              if (why := _problem(target, s))]
    assert not broken, "\n".join(broken)


def test_no_citation_of_a_document_the_repository_does_not_carry():
    found = [f"{path}:{n}: {line.strip()[:120]}" for path in _tracked("*.py", "*.md", "*.toml", "Makefile", "*.sh")
             if path != "tests/test_docs.py"
             for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1) if FOREIGN.search(line)]
    assert not found, "\n".join(found)


def test_the_citation_check_sees_a_missing_file_and_a_missing_section():
    assert _problem("docs/fixes.md", "fix-5") is None
    assert _problem("docs/fixes.md", "fix-9") == "docs/fixes.md has no section #fix-9"
    assert _problem("docs/no-such-page.md", None) == "docs/no-such-page.md does not exist"
    assert slug("Mutation score: `mutate`") == "mutation-score-mutate"
    assert slug("block_table.shift") == "block_tableshift"
    line = "see docs/fixes.md#fix-5 and stress/checks.py, not reports/stress/summary.md"
    assert [(m.group(1), m.group(2)) for m in PATH.finditer(line)] == [("docs/fixes.md", "#fix-5"),
                                                                     ("stress/checks.py", None)]
    assert FOREIGN.search("(spec fix 5)") and FOREIGN.search("spec 2.7 padding") and not FOREIGN.search("fix 5")


def check_section(check) -> str:
    """The text of ``check``'s section (from its ``## name`` heading to the next) on its contract page."""
    page = check.docs.partition("#")[0]
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    body = text[text.index(f"## {check.name}\n"):]
    return body[:body.find("\n## ", 1)] if "\n## " in body[1:] else body


@pytest.mark.parametrize("check", checks.REGISTRY, ids=lambda c: c.name)
def test_every_check_has_a_contract_line_and_a_section_naming_its_families_and_planted_bugs(check):
    assert check.contract and "\n" not in check.contract
    page, _, section = check.docs.partition("#")
    assert _problem(page, section) is None, check.docs
    body = check_section(check)
    assert check.contract in " ".join(body.split()), f"{page} does not state {check.name}'s contract line"
    missing = [f"family {f}" for f in check.families if f"`{f}`" not in body]
    missing += [f"planted bug {m.name}" for m in check.mutants if f"`{m.name}`" not in body]
    assert not missing, f"{check.docs} does not name: {', '.join(missing)}"


def test_the_fixes_page_names_every_planted_bug_it_says_guards_a_fix():
    text = open(os.path.join(ROOT, "docs", "fixes.md"), encoding="utf-8").read()
    planted = {m.name for c in checks.REGISTRY for m in c.mutants}
    named = set(re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", text))
    assert named <= planted, f"docs/fixes.md names bugs no check plants: {sorted(named - planted)}"
    for n in range(1, 9):
        assert f"fix-{n}" in anchors("docs/fixes.md")
    cited = {m.name for c in checks.REGISTRY for m in c.mutants if "docs/fixes.md" in m.description}
    assert cited <= named, f"planted bugs citing docs/fixes.md that it does not name: {sorted(cited - named)}"


PROMISES = "**Promises and the families that test them.**"
KERNEL_PAGES = {f"docs/contracts/{name}.md" for name in
                ("attention", "block_table", "draft_inputs", "kv_cache", "rejection", "sampling", "spec", "graphs",
                 "engine")}
ORACLES = {"divergence", "oob", "race", "uninit", "refusal", "accepted", "crash", "accounting", "drafts", "kv",
           "graphs"}  # verdicts, docs/verdicts.md
UNTESTED = "—"
EVERY_FAMILY = "every family"


def promise_problems(body: str, families) -> list[str]:
    """What is wrong with the promise table of a check's section ``body``: missing, a row naming a family the
    check does not register or an oracle the suite does not have, or a row that names no family without
    marking the promise untested."""
    if PROMISES not in body:
        return ["no promise table"]
    rows = []
    for line in body[body.index(PROMISES):].splitlines()[1:]:
        if line.startswith("| ") and not line.startswith(("| promise |", "|---")):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
        elif rows and not line.startswith("|"):
            break
    problems = [] if rows else ["an empty promise table"]
    for promise, named, oracles in rows:
        names = re.findall(r"`([^`]+)`", named)
        problems += [f"{promise}: family {n} is not registered" for n in names if n not in families]
        names += list(families) if named == EVERY_FAMILY else []
        problems += [f"{promise}: oracle {o} is unknown" for o in re.findall(r"`([^`]+)`", oracles) if o not in ORACLES]
        if not names and not named.startswith(UNTESTED):
            problems.append(f"{promise}: names no family and is not marked untested")
    return problems


@pytest.mark.parametrize("check", [c for c in checks.REGISTRY if c.docs.partition("#")[0] in KERNEL_PAGES],
                         ids=lambda c: c.name)
def test_every_kernel_check_maps_its_promises_to_families_it_registers(check):
    problems = promise_problems(check_section(check), check.families)
    assert not problems, f"{check.docs}: " + "; ".join(problems)


def test_the_promise_check_sees_a_missing_table_an_unknown_family_and_an_unmarked_row():
    table = (f"{PROMISES} why\n\n| promise | families | oracle |\n|---|---|---|\n"
             "| a | `known` | `divergence` |\n| b | `ghost` | `divergence` |\n| c | prose only | — |\n"
             "| d | — (a unit test) | `telepathy` |\n| e | every family | `divergence` |\n\n**Families.**\n\n"
             "| `ghost` | not a promise row |\n")
    assert promise_problems(table, {"known"}) == ["b: family ghost is not registered",
                                                  "c: names no family and is not marked untested",
                                                  "d: oracle telepathy is unknown"]
    assert promise_problems("## x\n", {"known"}) == ["no promise table"]
