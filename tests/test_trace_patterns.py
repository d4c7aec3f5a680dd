"""The tracer on patterns of real engines' kernels (``tests/trace_kernels.py``): pointer tables,
constructs the interpreter cannot run, atomic tickets, a tiled sampler over a 128k vocabulary;
and tracing a kernel of one's own from the command line."""

import numpy as np
import pytest
import torch
from triton.language.extra import libdevice

from kernels import runtime
from stress.__main__ import main
from stress.bench import trace as trace_bench
from stress.core import oracle
from stress.core.tracer import trace, tracing
from stress.core.types import Case, Check
from tests import trace_kernels as tk

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="the tracer runs under the CPU interpreter")

KERNELS = tk.__file__


def _line_of(text: str) -> int:
    """The line of tests/trace_kernels.py that holds ``text`` (once)."""
    lines = [i for i, line in enumerate(open(KERNELS), start=1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def _groups(lengths=(5, 3, 8)):
    """Per-group float32 sources and zeroed destinations, and int64 tables of their addresses."""
    src = [torch.arange(n, dtype=torch.float32) + 100 * g for g, n in enumerate(lengths)]
    dst = [torch.zeros(n) for n in lengths]
    return (src, dst, torch.tensor([t.data_ptr() for t in src]), torch.tensor([t.data_ptr() for t in dst]),
            torch.tensor(lengths, dtype=torch.int32))


# ---------------------------------------------------------------- pointers loaded from memory


def test_pointer_table_kernel_traces_clean_and_computes_what_the_plain_interpreter_does():
    src, plain_dst, src_table, plain_table, lengths = _groups()
    tk.scale_groups[(3,)](src_table, plain_table, lengths, 2.0, BLOCK=8, OVERREAD=False)
    assert all(torch.equal(d, s * 2) for d, s in zip(plain_dst, src, strict=True))
    _, dst, _, dst_table, _ = _groups()
    # reordered reruns write through the loaded pointers too: they must be undone before the verdict
    report = trace(tk.scale_groups, (3,), src_table, dst_table, lengths, 2.0, BLOCK=8, OVERREAD=False,
                   permute="always")
    assert report.ok, report.lines()
    assert all(torch.equal(d, p) for d, p in zip(dst, plain_dst, strict=True))


def test_reading_past_a_table_entry_is_out_of_bounds_of_that_entrys_storage():
    src, dst, src_table, dst_table, lengths = _groups()
    report = trace(tk.scale_groups, (3,), src_table, dst_table, lengths, 2.0, BLOCK=8, OVERREAD=True)
    assert report.verdict == "fail:oob", report.lines()
    (finding,) = report.oob
    assert finding.kind == "load" and finding.count == (8 - 5) + (8 - 3)  # the third group fills its tile
    made_at = f"trace_kernels.py:{_line_of('src = tl.load(src_table_ptr + g)')}"
    assert finding.first.where.startswith("storage behind the pointer made at") and made_at in finding.first.where
    assert finding.first.where.endswith("outside its 20 B storage"), finding.first.where
    assert all(torch.equal(d, s * 2) for d, s in zip(dst, src, strict=True)), "in-bounds lanes still computed"


def test_a_pointer_into_memory_no_tensor_owns_is_not_checked_and_runs_as_plain():
    foreign = np.arange(4, dtype=np.float32) + 7  # memory the tracer cannot attribute to a storage
    table = torch.tensor([foreign.ctypes.data], dtype=torch.int64)
    out = torch.zeros(1, 4)
    report = trace(tk.gather_groups, (1,), table, torch.tensor([4], dtype=torch.int32), out, 4, BLOCK=4)
    assert report.verdict.startswith("not_checked:") and "inside no live tensor's storage" in report.not_checked
    assert f"trace_kernels.py:{_line_of('src = tl.load(table_ptr + g)')}" in report.not_checked
    assert out.tolist() == [[7.0, 8.0, 9.0, 10.0]], "lanes it cannot judge still read what the kernel asked for"


# ---------------------------------------------------------------- constructs the interpreter cannot run


REFUSED = [(tk.asm_copy, {"BLOCK": 4}, "inline asm `mov.u32 $0, $1;`", "tl.inline_asm_elementwise("),
           (tk.libdevice_erfinv, {"BLOCK": 4}, "libdevice.erfinv", "libdevice.erfinv("),
           (tk.stamp_time, {}, "globaltimer", "tl.extra.cuda.globaltimer()")]


@pytest.mark.parametrize("kernel,constexprs,construct,source", REFUSED, ids=[r[0].fn.__name__ for r in REFUSED])
def test_a_construct_the_interpreter_cannot_run_is_not_checked_naming_it_and_its_line(kernel, constexprs,
                                                                                       construct, source):
    args = [torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)][:kernel.fn.__code__.co_argcount
                                                                                   - len(constexprs)]
    report = trace(kernel, (1,), *args, **constexprs)
    assert report.verdict.startswith("not_checked:the Triton interpreter cannot run"), report.verdict
    assert construct in report.not_checked and f"trace_kernels.py:{_line_of(source)}" in report.not_checked
    assert source in report.not_checked, "the source text of the line is quoted"


def test_a_refusal_ends_the_tracing_block_quietly_and_restores_libdevice():
    erfinv_code = libdevice.erfinv.__code__
    reached = False
    with tracing() as recording:
        tk.libdevice_erfinv[(1,)](torch.zeros(4), torch.zeros(4), BLOCK=4)
        reached = True
    assert not reached and recording.verdict.startswith("not_checked:")
    assert libdevice.erfinv.__code__ is erfinv_code and libdevice.erfinv(1.0) is None


def test_runner_tracing_step_reports_a_refusal_as_not_checked_not_a_crash():
    def launch(x, out):
        tk.asm_copy[(1,)](x, out, BLOCK=4)

    check = Check("control.asm", launch, lambda x, out: x.clone(), families={}, outputs=("out",))
    case = Case({"x": torch.arange(4, dtype=torch.int32), "out": torch.zeros(4, dtype=torch.int32)})
    verdict, details = oracle.traced(check, case, seed=0)
    assert verdict.startswith("not_checked:") and "inline asm" in verdict and "asm_copy" in details[0]


# ---------------------------------------------------------------- atomic tickets


def _compaction_inputs():
    x = torch.tensor([3, -1, 4, 1, -5, 9, 2, -6, 5, 3, -5, 8, -9, 7, 9, -3], dtype=torch.int32)
    return x, torch.zeros(1, dtype=torch.int32), torch.zeros(16, dtype=torch.int32)


def test_ticket_compaction_is_order_dependent_and_passes_when_declared():
    x, count, out = _compaction_inputs()
    report = trace(tk.compact_positive, (4,), x, count, out, BLOCK=4, ATOMIC=True)
    assert report.verdict == "fail:order-dependent" and not report.races, report.lines()
    assert {f.kind for f in report.order_dependent} == {"reversed", "shuffled"}
    assert sorted(out[:int(count)].tolist()) == sorted(x[x > 0].tolist()), "the default order's layout is kept"
    x, count, out = _compaction_inputs()
    declared = trace(tk.compact_positive, (4,), x, count, out, BLOCK=4, ATOMIC=True,
                     expected_order_dependence="positions are claimed in arrival order")
    assert declared.ok and declared.order_dependent
    assert "order dependence expected: positions are claimed in arrival order" in declared.lines()[0]


def test_a_ticket_taken_with_plain_load_and_store_is_a_race():
    report = trace(tk.compact_positive, (4,), *_compaction_inputs(), BLOCK=4, ATOMIC=False)
    assert report.verdict == "fail:race" and not report.order_dependent, report.lines()
    cross = {(f.first.op, f.second.op) for f in report.races if f.kind != "order"}
    assert ("load", "store") in cross and ("store", "load") in cross


def test_a_check_declares_expected_order_dependence():
    def launch(x, count, out):
        tk.compact_positive[(4,)](x, count, out, BLOCK=4, ATOMIC=True)

    x, count, out = _compaction_inputs()
    case = Case({"x": x, "count": count, "out": out})
    undeclared = Check("control.tickets", launch, lambda **_: None, families={}, outputs=("out",))
    assert oracle.traced(undeclared, case, seed=0)[0] == "fail:order-dependent"
    declared = Check("control.tickets", launch, lambda **_: None, families={}, outputs=("out",),
                     expected_order_dependence="compaction order follows ticket order")
    assert oracle.traced(declared, case, seed=0) == ("pass", [])


# ---------------------------------------------------------------- a tiled sampler at 128k


def test_tiled_sampler_at_128k_vocab_traces_clean_as_one_run_per_tile():
    rows, vocab, tile = 2, 131072, 32768
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    greedy = torch.zeros(rows, dtype=torch.int32)
    report = trace(tk.gumbel_argmax, (rows,), logits, vocab, greedy, vocab, 7, GUMBEL=False, BLOCK_V=tile)
    assert report.ok, report.lines()
    assert torch.equal(greedy, logits.argmax(dim=1).to(torch.int32))
    assert (report.runs, report.lanes) == (rows * (vocab // tile + 1), rows * (vocab + 1)), "tiles are runs"
    sampled, plain = torch.zeros(rows, dtype=torch.int32), torch.zeros(rows, dtype=torch.int32)
    assert trace(tk.gumbel_argmax, (rows,), logits, vocab, sampled, vocab, 7, GUMBEL=True, BLOCK_V=tile).ok
    tk.gumbel_argmax[(rows,)](logits, vocab, plain, vocab, 7, GUMBEL=True, BLOCK_V=tile)
    assert torch.equal(sampled, plain) and not torch.equal(sampled, greedy)


def test_the_overhead_bench_measures_the_sampler():
    lines, ratios = trace_bench.sampler_rows(shapes=((1, 2048, 1024, True),), rounds=1)
    assert len(ratios) == 1 and ratios[0] > 0 and "2048" in lines[-1]


# ---------------------------------------------------------------- your own kernel, from the command line


EXAMPLE = ["trace", "--kernel", "tests.trace_kernels:gather_groups", "--grid", "3", "--args",
           "tests/trace_example_args.py"]


def test_readme_example_traces_your_own_kernel(capsys):
    assert main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "gather_groups grid (3, 1, 1): pass" in out and out.rstrip().endswith("verdict: pass")


def test_your_own_launcher_and_its_findings(tmp_path, capsys):
    script = tmp_path / "args.py"
    script.write_text("import torch\n"
                      "from tests.test_trace_patterns import _groups\n"
                      "src, dst, src_table, dst_table, lengths = _groups()\n"
                      "args = (src_table, dst_table, lengths)\n")
    launcher = tmp_path / "engine.py"
    launcher.write_text("from tests import trace_kernels as tk\n"
                        "def scale(src_table, dst_table, lengths):\n"
                        "    tk.scale_groups[(3,)](src_table, dst_table, lengths, 2.0, BLOCK=8, OVERREAD=True)\n")
    assert main(["trace", "--kernel", f"{launcher}:scale", "--args", str(script)]) == 1
    out = capsys.readouterr().out
    assert "scale_groups grid (3, 1, 1): fail:oob" in out and "storage behind the pointer made at" in out


@pytest.mark.parametrize("extra,message", [
    (["--grid", "0"], "--grid: '0'"),
    (["--grid", "3", "--args", "missing.py"], "no such file"),
    (["--args", "tests/trace_example_args.py"], "--grid: needed"),
])
def test_own_kernel_usage_errors_name_the_fix(extra, message, capsys):
    argv = ["trace", "--kernel", "tests.trace_kernels:gather_groups"] + (
        extra if "--args" in extra else extra + ["--args", "tests/trace_example_args.py"])
    assert main(argv) == 2
    assert message in capsys.readouterr().err
