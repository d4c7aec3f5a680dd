"""The package's structure, drawn from its imports: no circle, and no import from a lower layer to a higher one.

Every import counts, also those inside functions: a deferred import hides a circle from Python, not from a reader.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("kernels", "reference", "stress")

# Lowest first. A module imports modules of its own layer or below; the first prefix that matches places it.
LAYERS = (
    ("kernels", "reference"),
    ("stress.core.types", "stress.core.compare", "stress.core.guards", "stress.core.pool", "stress.core.gpus",
     "stress.core.gpu_share", "stress.core.interrupts", "stress.core.load", "stress.core.patches",
     "stress.core.trace_conflicts", "stress.core.tracer", "stress.core.telemetry", "stress.core.refusal",
     "stress.core.impl"),
    ("stress.oracles", "stress.families"),  # how one check's cases are built and judged
    ("stress.checks",),  # the registry entries
    ("stress.core",),  # registry-driven: case building, the oracle, workers
    ("stress.hunt", "stress.mutate", "stress.sanitize", "stress.trace", "stress.tp", "stress.bench", "stress.report",
     "stress.gate"),
    ("stress.__main__", "stress.cli"),  # the command line
)


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, at any depth of its code."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    if name in PACKAGES:  # a package's own __init__ imports nothing of its subpackages' layers
        return 0
    for level, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return level
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__}")


GRAPH = {name: imports_of(name, path, set(modules())) for name, path in modules().items()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` from a module to one of a higher layer."""
    return sorted(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
                  for a, targets in graph.items() for b in targets
                  if layer_of(b) > layer_of(a) and not b.startswith(a + "."))


def test_no_import_goes_up_a_layer():
    assert not upward(GRAPH), "\n".join(upward(GRAPH))


def test_an_import_of_a_driver_from_the_core_is_upward():
    planted = {"stress.core.oracle": {"stress.sanitize.runner", "stress.core.types"}, "stress.hunt": {"stress.core"}}
    assert upward(planted) == ["stress.core.oracle (layer 4) imports stress.sanitize.runner (layer 5)"]


def test_reference_imports_nothing_from_kernels():
    assert not [f"{a} imports {b}" for a, t in GRAPH.items() if a.startswith("reference") for b in t
                if b.startswith("kernels")]


def cycle_through(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as the modules along it), or None. A package importing its own
    submodules (``stress.checks`` assembling its entries) is not a circle."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle():
    circle = cycle_through(GRAPH)
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_a_planted_circle():
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle_through(planted) == ["a", "b", "c", "a"]
    assert cycle_through({"p": {"p.x"}, "p.x": {"q"}, "q": set()}) is None


@pytest.mark.parametrize("layered", ["stress.core.types", "stress.checks.block_table", "stress.__main__"])
def test_every_module_has_a_layer(layered):
    assert all(layer_of(name) >= 0 for name in GRAPH)
    assert layered in GRAPH


def test_the_report_imports_no_other_driver():
    """Rows render themselves (a hunt's record, the kill matrix's closing line): the report needs no driver."""
    drivers = layer_of("stress.hunt")
    found = [f"{a} imports {b}" for a, targets in GRAPH.items() if a.startswith("stress.report") for b in targets
             if layer_of(b) == drivers and not b.startswith("stress.report")]
    assert not found, found
