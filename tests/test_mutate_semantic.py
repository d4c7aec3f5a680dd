"""Semantic mutation operators (stress/mutate/semantic.py): each makes the slips it names on small targets, written
out in full; mutants are valid, deterministic patches; the two operator classes are selected and scored apart."""

import inspect
import json
import os
import subprocess
import sys

import pytest

from kernels import runtime
from stress import __main__ as cli
from stress.cli.mutants import chosen_operators
from stress.core.patches import source_of
from stress.mutate import campaign as mutate
from stress.mutate import operators as mutate_ops
from stress.mutate import semantic as mutate_semantic

KERNEL = "tests.mutate_semantic_targets:reverse_rows_kernel"
HOST = "tests.mutate_semantic_targets:window_sum"
CLASS = "tests.mutate_semantic_targets:Window"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _edits(target: str, operator: str) -> list[tuple[str, str]]:
    """(old, new) of each mutant the operator makes, stripped of the indentation."""
    return [(g.patch.old.strip(), g.patch.new.strip()) for g in mutate_ops.generate(target, [operator])]


def _new(target: str, operator: str) -> set[str]:
    return {new for _, new in _edits(target, operator)}


def test_same_name_takes_a_name_of_the_same_kind_bound_before_it():
    kernel = _new(KERNEL, "same-name")
    # unannotated parameters: a stride for another stride or the width; a pointer only for a pointer
    assert "values = tl.load(src_ptr + row * dst_stride + cols, mask=live, other=0)" in kernel
    assert "values = tl.load(dst_ptr + row * src_stride + cols, mask=live, other=0)" in kernel
    assert "live = cols < src_stride" in kernel
    assert not any("BLOCK" in new or "src_ptr + row * src_stride + dst_ptr" in new for new in kernel)
    host = _new(HOST, "same-name")
    assert "first = values[stop]" in host and "return divmod(total + first - first, count + 1)" in host
    # `first` and `last` are bound on later lines: no earlier use of another name becomes them
    assert not any(new.startswith(("total += values[first]", "for i in range(first)")) for new in host)
    # attributes of one object, assigned from the same kind of value (`self.seen` is a dict)
    assert _new(CLASS, "same-name") >= {"return self.start - self.start", "return self.stop - self.stop"}
    assert not any("self.seen" in new for new in _new(CLASS, "same-name"))


def test_same_name_leaves_what_index_swap_makes_to_it():
    target = "kernels.block_table:_shift_rows_kernel"
    token = {g.patch for g in mutate_ops.generate(target, ["index-swap"])}
    assert token and not token & {g.patch for g in mutate_ops.generate(target, ["same-name"])}


def test_arg_swap_swaps_two_arguments_of_one_kind():
    assert _edits(HOST, "arg-swap") == [("return divmod(total + first - last, count + 1)",
                                          "return divmod(count + 1, total + first - last)")]
    assert "validate.on_kernel_device(persistent=persistent, idx_mapping=out, out=idx_mapping)" in _new(
        "kernels.block_table:gather_block_tables", "arg-swap")
    # min/max commute and where's branches are where-swap's: neither is swapped
    assert not any("tl.maximum(0, slot)" in new for new in _new("kernels.block_table:_gather_rows_kernel", "arg-swap"))


def test_stmt_delete_forgets_exactly_the_statements_with_an_effect():
    def deleted(target):
        return {old for old, new in _edits(target, "stmt-delete") if new.split("#")[0].strip() == "pass"}

    assert deleted(HOST) == {'if stop < start:\n        raise ValueError("stop: before start; pass stop >= start")',
                             "total += values[i]", "total = total - sum(values[:start])"}
    assert deleted(KERNEL) == {"tl.store(dst_ptr + row * dst_stride + (width - 1 - cols), values, mask=live)"
                               "  # the row reversed"}
    assert deleted(CLASS) == {"self.start = start", "self.stop = stop", "self.seen: dict[int, int] = {}"}
    assert not any("debug_barrier" in old for old, _ in _edits("kernels.block_table:_shift_rows_kernel",
                                                               "stmt-delete"))  # barrier's


def test_neighbour_expr_takes_a_value_or_an_offset_from_a_nearby_line():
    assert _new(HOST, "neighbour-expr") == {"first = values[stop - 1]", "last = values[start]"}
    assert "tl.store(dst_ptr + row * src_stride + cols, values, mask=live)  # the row reversed" in _new(
        KERNEL, "neighbour-expr")


def test_boundary_shift_moves_an_index_or_a_bound_by_one():
    host = _new(HOST, "boundary-shift")
    assert {"for i in range(stop - 1):", "for i in range(1, stop):", "total += values[i + 1]",
            "first = values[start - 1]", "total = total - sum(values[:start + 1])"} <= host
    assert not any(new.startswith("last = ") for new in host)  # `stop - 1` is const's to shift
    gather = _new("kernels.block_table:_gather_rows_kernel", "boundary-shift")
    assert "slot = tl.load(idx_mapping_ptr + batch_row + 1).to(tl.int64)" in gather  # a scalar load


def test_guard_part_leaves_one_operand_out_of_a_guard_that_raises():
    attention = _edits("kernels.attention:paged_attention", "guard-part")
    assert {new for old, new in attention if old == "if num_kv_heads == 0 or num_q_heads % num_kv_heads:"} == {
        "if num_kv_heads == 0:", "if num_q_heads % num_kv_heads:"}
    # an `and` guard one part short refuses more: its dropped part is what let valid input through; an operand
    # that is itself a test of the other kind keeps its parentheses
    assert ("if num_batch_rows and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):",
            "if (int(slots.min()) < 0 or int(slots.max()) >= num_slots):") in _edits(
        "kernels.draft_inputs:prepare_draft_inputs", "guard-part")
    assert not _edits(HOST, "guard-part")  # a guard of one test is stmt-delete's to forget


def test_every_semantic_mutant_is_a_valid_patch_that_resolves_and_says_what_it_does():
    for target in (KERNEL, HOST, CLASS, "kernels.block_table:_slot_mapping_kernel", "kernels.spec.slots:RequestSlots",
                   "kernels.spec.depth:AcceptanceLengthController"):  # two equal lines, one before a blank line
        generated = mutate_ops.generate(target, list(mutate_semantic.OPERATORS))
        assert {g.operator for g in generated} <= set(mutate_semantic.OPERATORS)
        assert not {g.patch for g in generated} & {g.patch for g in mutate_ops.generate(target)}  # token slips
        fn, text = source_of(mutate_ops._target(target))
        where = f"{os.path.relpath(inspect.getsourcefile(fn), ROOT)}:{target.split(':')[1]}"
        for g in generated:
            assert text.count(g.patch.old) == 1, g.id
            compile(text.replace(g.patch.old, g.patch.new), g.id, "exec")
            assert g.description.endswith(f" in line {g.line} of {where}"), g.description
        for g in {g.operator: g for g in generated}.values():  # resolving regenerates the target: one per operator
            assert mutate_ops.resolve(g.id).patches[0] == g.patch
    (g,) = [g for g in mutate_ops.generate(HOST, ["same-name"]) if g.patch.new.strip() == "first = values[stop]"]
    assert g.description == "replaces `start` by `stop` in line 25 of tests/mutate_semantic_targets.py:window_sum"
    assert mutate_ops.resolve(g.id).description == g.description


def test_token_operators_stay_the_default():
    assert mutate_ops.generate(HOST) == mutate_ops.generate(HOST, list(mutate_ops.OPERATORS))
    assert {mutate_ops.operator_class(g.operator) for g in mutate_ops.generate(HOST)} == {"token"}


@pytest.mark.slow
def test_the_same_source_gives_the_same_mutants_in_the_same_order_in_any_process():
    targets = [KERNEL, HOST, CLASS, "kernels.block_table:_slot_mapping_kernel"]
    here = [g.id for t in targets for g in mutate_ops.generate(t, list(mutate_semantic.OPERATORS))]
    assert here == [g.id for t in targets for g in mutate_ops.generate(t, list(mutate_semantic.OPERATORS))]
    script = ("import sys\nfrom stress.mutate import operators as mutate_ops, semantic as mutate_semantic\n"
              f"for t in {targets!r}:\n"
              "    for g in mutate_ops.generate(t, list(mutate_semantic.OPERATORS)):\n        print(g.id)\n")
    for hash_seed in ("1", "2"):  # a set's order would show here
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, check=True)
        assert done.stdout.split() == here


def _row(operator: str, status: str, check: str = "block_table.gather") -> mutate.Row:
    return mutate.Row(f"gen:m:t:{operator}:{status}", "kernels.block_table:t", operator, "kernels/block_table.py", 1,
                      "a", "b", check, [check], status=status, operator_class=mutate_ops.operator_class(operator))


def test_each_operator_class_is_scored_apart():
    rows = [_row("cmp-flip", "killed"), _row("const", "killed"), _row("same-name", "killed"),
            _row("stmt-delete", "survived"), _row("arg-swap", "equivalent")]
    by_class = mutate.scores_by_class(rows)
    token, semantic = by_class["token"]["by_check"]["block_table.gather"], by_class["semantic"]["by_check"][
        "block_table.gather"]
    assert (token["generated"], token["killed"], token["survived"], token["score"]) == (2, 2, 0, 100.0)
    assert (semantic["generated"], semantic["killed"], semantic["survived"], semantic["equivalent"],
            semantic["score"]) == (3, 1, 1, 1, 50.0)
    assert by_class["semantic"]["by_module"]["kernels.block_table"]["score"] == 50.0
    assert list(mutate.scores_by_class(rows[:2])) == ["token"]


def test_an_operator_outside_the_chosen_class_is_a_usage_error_naming_the_fix(capsys):
    assert cli.main(["mutate", "--operator", "same-name"]) == 2
    assert "--operator: 'same-name' is not a token operator; add --operators semantic" in capsys.readouterr().err
    assert cli.main(["mutate", "--operators", "semantic", "--operator", "cmp-flip"]) == 2
    assert "add --operators token" in capsys.readouterr().err


def test_a_survivors_rerun_line_generates_its_class_without_naming_it():
    (g,) = [g for g in mutate_ops.generate(HOST, ["same-name"]) if g.patch.new.strip() == "first = values[stop]"]
    rerun = mutate.Row(g.id, g.target, g.operator, "", g.line, "", "", "c", ["c"]).command("cpu", 2).split()[1:]
    assert "same-name" in chosen_operators(cli.parser().parse_args(rerun))
    assert chosen_operators(cli.parser().parse_args(["mutate"])) == list(mutate_ops.OPERATORS)


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_a_semantic_sample_of_one_check_kills_and_is_scored_as_semantic(tmp_path, capsys):
    rc = cli.main(["mutate", "--check", "block_table.gather", "--operators", "semantic", "--sample", "6", "--iters",
                   "1", "--jobs", "1", "--device", "cpu", "--report", str(tmp_path), "--json"])
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert rc == 0 and list(summary["by_class"]) == ["semantic"]
    semantic = summary["by_class"]["semantic"]["by_check"]["block_table.gather"]
    assert semantic["generated"] == 6 and semantic["killed"] >= 1 and semantic["pending"] == 0
    assert "check (semantic mutants)" in out.err and "check (token mutants)" not in out.err
    rows = [json.loads(line)["mutant"] for line in open(tmp_path / mutate.Stream.NAME) if '"mutant"' in line]
    assert len(rows) == 6 and {r["operator_class"] for r in rows} == {"semantic"}
    assert all(r["operator"] in mutate_semantic.OPERATORS and r["description"] for r in rows)
    assert all(r["equivalence"] in ("ttir", "bytecode", "ast") for r in rows)
    for row in (r for r in rows if r["status"] == "survived"):  # each survivor with its rerun line
        assert f"./specsan mutate --mutant {row['id']} --device cpu --iters 1" in out.err
        assert row["description"] in out.err
