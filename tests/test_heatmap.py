"""The failures heat map stays readable for a registry-wide run: bounded width, the failing families shown."""

from stress import checks
from stress.core.types import Result
from stress.report import heatmap

PAIRS = [(c.name, f) for c in checks.REGISTRY for f in c.families]


def _results(failing: dict[tuple[str, str], int]) -> list[Result]:
    """Three cases per (check, family) of the registry; ``failing[pair]`` of them failed."""
    return [Result(c, f, i, "cpu", "fail:divergence" if i < failing.get((c, f), 0) else "pass")
            for c, f in PAIRS for i in range(3)]


def test_a_registry_wide_map_shows_the_failing_families_and_bounds_its_width():
    assert len({f for _, f in PAIRS}) > heatmap.MAX_FAMILY_COLUMNS  # the registry is wider than the bound
    (c1, f1), (c2, f2) = PAIRS[0], PAIRS[-1]
    grid = heatmap.failure_grid(_results({(c1, f1): 1, (c2, f2): 2}))
    assert grid.columns == [f2, f1, heatmap.OTHER_FAMILIES]  # the most failures first
    assert grid.rows == list(dict.fromkeys(c for c, _ in PAIRS))
    assert grid.cells[(grid.rows.index(c2), 0)] == (heatmap.RED, "2/3")
    assert grid.cells[(grid.rows.index(c1), 2)][0] == heatmap.GREEN  # its other families all passed
    clean = heatmap.failures(_results({}))
    assert clean.width < 1000, clean.width  # every check in one column of all its families
    many = {pair: 1 for pair in PAIRS}  # everything failed: still at most MAX_FAMILY_COLUMNS + 1 columns
    assert len(heatmap.failure_grid(_results(many)).columns) == heatmap.MAX_FAMILY_COLUMNS + 1


def test_a_small_run_keeps_a_column_per_family():
    check = checks.get("block_table.shift")
    results = [Result(check.name, f, 0, "cpu", "pass") for f in check.families]
    assert heatmap.failure_grid(results).columns == list(check.families)
