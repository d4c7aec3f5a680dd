"""The refusal verdict (stress.core.refusal) and the refused families (stress.families.refusals)."""

import numpy as np
import pytest
import torch

from stress import checks
from stress.core import cases, guards, refusal, workers
from stress.core.types import Case, Check
from stress.families import refusals


def _refusing(kernel, reference=lambda out, n: None):
    """A check whose one case (out of 8, n = -1) must be refused naming ``n``."""
    def family(rng, device, launch):
        return Case(inputs={"out": torch.full((8,), 7, dtype=torch.int32), "n": -1}, refused="n", note="n < 0")

    return Check(name="fake", kernel=kernel, reference=reference, families={"f": family}, outputs=("out",))


@pytest.fixture(params=["together", "tensor-by-tensor"])
def placement(request, monkeypatch):
    """Each refusal verdict both ways a call's copies are placed: in one allocation, judged by one comparison
    (``guards.together``), and each tensor in its own (``guards.guarded``, the way of copies past TOGETHER_BYTES)."""
    if request.param == "tensor-by-tensor":
        monkeypatch.setattr(refusal, "TOGETHER_BYTES", -1)
    return request.param


def _judge(kernel):
    check = _refusing(kernel)
    return refusal.judge_one(check, cases.build_case(check, "f", 1, "cpu"), "cpu", kernel)


def _guarded(out, n):
    if n < 0:
        raise ValueError(f"n: expected an int >= 0, got {n}")
    out[:n] = 0


def test_a_refusal_naming_the_argument_before_any_write_passes(placement):
    verdict, details = _judge(_guarded)
    assert verdict == "pass" and details == ["refused: n: expected an int >= 0, got -1"]


def test_bad_input_that_goes_through_is_accepted(placement):
    def unguarded(out, n):
        out[:n] = 0  # n = -1 clears all but the last entry, silently

    verdict, details = _judge(unguarded)
    assert verdict == "fail:accepted" and "ValueError naming 'n' (n < 0)" in details[0]


@pytest.mark.parametrize("raised", [IndexError("n: out of range"), ValueError("out: too short"),
                                    ValueError("expected n >= 0")], ids=["wrong-type", "wrong-name", "name-not-first"])
def test_another_exception_or_another_name_is_a_bad_refusal(raised, placement):
    def kernel(out, n):
        raise raised

    verdict, details = _judge(kernel)
    assert verdict == "fail:refusal" and str(raised) in details[0] and "naming 'n'" in details[0]


def test_a_write_before_the_raise_is_a_divergence(placement):
    def late(out, n):
        out[0] = 0
        _guarded(out, n)

    verdict, details = _judge(late)
    assert verdict == "fail:divergence" and "written before raising ValueError: n:" in details[0]
    assert any("out (read-only input)" in line for line in details[1:])


def test_a_write_past_a_tensor_before_the_raise_is_oob(placement):
    def overrun(out, n):
        torch.as_strided(out, (9,), (1,))[8] = 0
        _guarded(out, n)

    verdict, details = _judge(overrun)
    assert verdict == "fail:oob" and "guard zone" in details[1]


def test_a_write_of_an_equal_value_of_other_bits_before_the_raise_is_a_divergence(placement):
    """-0.0 for 0.0: equal as floats, not as bits; the refusal's inputs must come back bit for bit."""
    def family(rng, device, launch):
        return Case(inputs={"x": torch.zeros(4), "n": -1}, refused="n", note="n < 0")

    def signed(x, n):
        x[1] = -0.0
        raise ValueError("n: must be >= 0")

    check = Check(name="fake", kernel=signed, reference=lambda x, n: None, families={"f": family}, outputs=("x",))
    verdict, details = refusal.judge_one(check, cases.build_case(check, "f", 1, "cpu"), "cpu", signed)
    assert verdict == "fail:divergence"
    assert details[-1].endswith("[1]: expected 0.0 (bits 0x00000000), got -0.0 (bits 0x80000000)")


def test_a_write_past_a_guard_zone_of_copies_placed_together_is_oob_and_names_the_tensor():
    """Copies placed together (``guards.together``) leave slack between a tensor's guard zone and the next buffer,
    and the next tensor's buffer after it: a write that runs past the guard zone lands in one or the other, and is
    caught (tensor by tensor, it would land outside every buffer)."""
    def family(rng, device, launch):
        return Case(inputs={"out": torch.zeros(8, dtype=torch.int32), "other": torch.zeros(8, dtype=torch.int32),
                            "n": -1}, refused="n", note="n < 0")

    def far(offset):
        def kernel(out, other, n):
            torch.as_strided(out, (offset + 1,), (1,))[offset] = 1
            raise ValueError("n: must be >= 0")
        return kernel

    check = Check(name="fake", kernel=far(0), reference=lambda out, other, n: None, families={"f": family},
                  outputs=("out",))
    case = cases.build_case(check, "f", 1, "cpu")
    pad = guards.GUARD_BYTES // 4  # int32 elements of canary on each side of out
    end = (8 + 2 * pad) * 4  # bytes: out's buffer ends here, the next one begins at the ALIGN boundary after it
    following = -(-end // guards.ALIGN) * guards.ALIGN
    into_slack, into_next = end // 4 - pad + 1, following // 4 - pad + 1  # int32 elements from out's first
    assert end < (pad + into_slack) * 4 < following < (pad + into_next) * 4 < following + guards.GUARD_BYTES
    verdict, details = refusal.judge_one(check, case, "cpu", far(into_slack))  # an int32 1 over 4 canary bytes
    assert verdict == "fail:oob" and details[1:] == ["out: 4 byte(s) overwritten past the guard zone after the tensor"]
    verdict, details = refusal.judge_one(check, case, "cpu", far(into_next))
    assert verdict == "fail:oob" and details[1].startswith("other: guard zone overwritten (4 byte(s) before")


LAYOUTS = {
    "contiguous": torch.arange(12, dtype=torch.int32).view(3, 4),
    "row-padded": torch.arange(40, dtype=torch.float16).view(5, 8)[:, :6],
    "every-other": torch.arange(10.0)[::2],
    "broadcast": torch.arange(3.0).view(1, 3).expand(4, 3),
    "empty": torch.zeros(0, 5),
    "bool": torch.tensor([True, False, True]),
    "complex": torch.arange(6.0, dtype=torch.float64).to(torch.complex128),
    "scalar": torch.tensor(7, dtype=torch.int64),
}


def test_copies_placed_together_are_laid_out_as_each_on_its_own():
    """``guards.together`` puts each tensor in its own slice of one allocation, in ``guards.place``'s layout
    (shape, strides, values, canaries), each buffer ALIGN bytes from the last; one comparison of the whole
    allocation sees any byte that changed, in a view, a guard zone or the slack between buffers."""
    dev = torch.device("cpu")
    placed, args = guards.together({**LAYOUTS, "n": 3, "meta": torch.zeros(2, device="meta")}, dev)
    assert args["n"] == 3 and args["meta"].is_meta and "meta" not in placed.placed
    assert placed.memory.numel() == guards.together_bytes(LAYOUTS) and placed.memory.numel() % guards.ALIGN == 0
    for name, t in LAYOUTS.items():
        alone, g = guards.place(name, t, dev), placed.placed[name]
        assert args[name] is g.view and (g.view.shape, g.view.stride(), g.view.dtype) == (t.shape, t.stride(), t.dtype)
        assert torch.equal(g.view, t) and g.pad == alone.pad and g.buffer.numel() == alone.buffer.numel()
        assert (g.buffer.data_ptr() - placed.memory.data_ptr()) % guards.ALIGN == 0
        assert g.view.storage_offset() - g.buffer.storage_offset() == alone.view.storage_offset()
        assert guards.settle({name: g}, {})[0] == []
    before = placed.snapshot()
    assert not placed.changed(before).value()
    for at in (placed.placed["every-other"].view.data_ptr() - placed.memory.data_ptr() + 4,  # the gap after [0]
               placed.placed["bool"].buffer.data_ptr() - placed.memory.data_ptr() - 1,  # slack before a buffer
               placed.placed["broadcast"].view.data_ptr() - placed.memory.data_ptr(),  # a view's own bytes
               0, placed.memory.numel() - 1):  # the first and the last byte
        placed.memory[at] ^= 1
        assert placed.changed(before).value()
        placed.memory[at] ^= 1
    assert not placed.changed(before).value()


def test_copies_past_the_bound_are_placed_tensor_by_tensor(monkeypatch):
    case = Case(inputs={"out": torch.zeros(8, dtype=torch.int32), "n": -1}, refused="n", note="n < 0")
    assert refusal._Call(case, torch.device("cpu"), _guarded).together is not None
    monkeypatch.setattr(refusal, "TOGETHER_BYTES", guards.together_bytes(case.inputs) - 1)
    assert refusal._Call(case, torch.device("cpu"), _guarded).together is None


def _three_refusals(log, kernel_writes_first=False, reference_disagrees_at=None):
    """A check whose case holds three refusals (``tag`` 0, 1, 2) of ``n`` < 0, logging each reference check and
    kernel call: the kernel writes before refusing the first one when asked, the reference refuses naming ``out``
    at ``reference_disagrees_at``."""
    def family(rng, device, launch):
        first, *more = [Case(inputs={"out": torch.zeros(4, dtype=torch.int32), "n": -1, "tag": tag}, refused="n",
                             note=f"refusal {tag}") for tag in range(3)]
        first.more_refusals = more
        return first

    def reference(out, n, tag):
        log.append(f"reference {tag}")
        if tag == reference_disagrees_at:
            raise ValueError("out: the reference's own refusal")

    def kernel(out, n, tag):
        log.append(f"call {tag}")
        if kernel_writes_first and tag == 0:
            out[0] = 1
        _guarded(out, n)

    return Check(name="fake", kernel=kernel, reference=reference, families={"f": family}, outputs=("out",))


@pytest.mark.parametrize("busy", [False, True], ids=["idle-device", "busy-device"])
def test_references_checked_while_the_device_is_busy_keep_the_order_of_verdicts(busy, monkeypatch):
    """On a GPU the next refusals' references are checked while the device compares a call's copies
    (``guards.Flag.ready`` False): each reference once, each before its call, no call before the calls ahead
    of it are judged; a disagreement found early is raised in its turn, after an earlier refusal that fails."""
    if busy:
        monkeypatch.setattr(guards.Flag, "ready", lambda self: False)
    log = []
    check = _three_refusals(log)
    verdict, details = refusal.judge_all(check, cases.build_case(check, "f", 1, "cpu"), "cpu", check.kernel)
    assert verdict == "pass" and len(details) == 3
    assert sorted(log) == ["call 0", "call 1", "call 2", "reference 0", "reference 1", "reference 2"]
    assert all(log.index(f"reference {tag}") < log.index(f"call {tag}") for tag in range(3))
    if busy:
        assert log[:3] == ["reference 0", "call 0", "reference 1"]  # the next reference, during call 0's wait
    else:
        assert log == ["reference 0", "call 0", "reference 1", "call 1", "reference 2", "call 2"]

    log.clear()
    check = _three_refusals(log, kernel_writes_first=True, reference_disagrees_at=1)
    verdict, details = refusal.judge_all(check, cases.build_case(check, "f", 1, "cpu"), "cpu", check.kernel)
    assert verdict == "fail:divergence" and details[0] == "refusal case: refusal 0"
    assert "call 1" not in log and ("reference 1" in log) == busy and "reference 2" not in log

    log.clear()
    check = _three_refusals(log, reference_disagrees_at=1)
    with pytest.raises(RuntimeError, match="expects a refusal naming 'n'.*out: the reference's own refusal"):
        refusal.judge_all(check, cases.build_case(check, "f", 1, "cpu"), "cpu", check.kernel)
    assert log == ["reference 0", "call 0", "reference 1"]


def test_a_refusal_of_a_knob_the_implementation_does_not_take_is_not_asked_and_says_so():
    """A registered implementation is not handed the suite's launch knobs it lacks, so a knob's refusal cannot be
    asked of it: that sub-case is named, not passed; a case of nothing else is not_checked. The production launcher,
    which takes the knob, is asked (and fails here, accepting it)."""
    def family(rng, device, launch):
        bad_knob = Case(inputs={"out": torch.zeros(4, dtype=torch.int32), "n": 2, "chunk": 3}, refused="chunk",
                        note="chunk 3")
        bad_count = Case(inputs={"out": torch.zeros(4, dtype=torch.int32), "n": -1}, refused="n", note="n < 0")
        bad_knob.more_refusals = [bad_count]
        return bad_knob

    def launcher(out, n, chunk=4):  # refuses n < 0, forgets to check chunk
        _guarded(out, n)

    def implementation(out, n):
        _guarded(out, n)
    implementation.takes = frozenset({"out", "n"})

    check = Check(name="fake", kernel=launcher, reference=lambda out, n, chunk=4: None, families={"f": family},
                  outputs=("out",))
    case = cases.build_case(check, "f", 1, "cpu")
    verdict, details = refusal.judge_all(check, case, "cpu", implementation)
    assert verdict == "pass" and any(d.startswith("not asked: chunk 3: the implementation takes no 'chunk'")
                                     for d in details)
    case.more_refusals = []
    assert refusal.judge_all(check, case, "cpu", implementation)[0].startswith("not_checked:")
    assert refusal.judge_all(check, case, "cpu", launcher)[0] == "fail:accepted"


def test_a_limit_of_the_suites_own_kernel_is_not_asked_of_another_implementation():
    """A refusal of input too large for the suite's kernel on the GPU (its tiles' shared memory: attention's
    unfittable groups) is a limit of that kernel, not a clause of the contract: a registered implementation that
    computes it is not failed for accepting it, and the sub-case says so. The suite's launcher is still asked."""
    def family(rng, device, launch):
        too_big = Case(inputs={"out": torch.zeros(4, dtype=torch.int32), "n": 2}, refused="n",
                       note="n too large for the tiles", own_limit=True)
        too_big.more_refusals = [Case(inputs={"out": torch.zeros(4, dtype=torch.int32), "n": -1}, refused="n",
                                      note="n < 0")]
        return too_big

    def implementation(out, n):  # any size: only n < 0 is refused
        _guarded(out, n)
    implementation.takes = frozenset({"out", "n"})

    check = Check(name="fake", kernel=implementation, reference=lambda out, n: None, families={"f": family},
                  outputs=("out",))
    case = cases.build_case(check, "f", 1, "cpu")
    verdict, details = refusal.judge_all(check, case, "cpu", implementation)
    assert verdict == "pass" and any(d.startswith("not asked: n too large for the tiles: a limit of the suite's own")
                                     for d in details)
    launcher = lambda out, n: _guarded(out, n)  # noqa: E731 - the suite's launcher: no ``takes``, asked everything
    assert refusal.judge_all(check, case, "cpu", launcher)[0] == "fail:accepted"


def test_the_message_must_begin_with_the_argument_and_a_colon():
    assert refusal.names("idx_mapping: slot 9 at [2] is outside [-1, 9)", "idx_mapping")
    assert not refusal.names("out: 3 rows, but idx_mapping has 4 batch rows", "idx_mapping")
    assert not refusal.names("idx_mapping_2: bad", "idx_mapping")


def test_a_validating_reference_must_refuse_the_same_argument():
    def reference(out, n):
        raise ValueError(f"out: cannot take n={n}")

    check = _refusing(_guarded, reference)
    case = cases.build_case(check, "f", 1, "cpu")
    with pytest.raises(RuntimeError, match="expects a refusal naming 'n'.*out: cannot take"):
        refusal.check_reference(check, case)
    refusal.check_reference(_refusing(_guarded, lambda out, n: out[n]), case)  # not validating: the family decides


def test_a_reference_that_writes_its_inputs_in_place_is_caught_not_shielded():
    """The reference is handed the case's own tensors (no copies): one that writes them, even before it raises,
    would change what the judge compares against, so the case fails instead."""
    def writing(out, n):
        out.view(-1)[:1].add_(1)  # through a view: the base's version counter moves too
        raise IndexError("not validating")

    check = _refusing(_guarded, writing)
    case = cases.build_case(check, "f", 1, "cpu")
    with pytest.raises(RuntimeError, match="wrote out in place"):
        refusal.check_reference(check, case)


def test_resized_gives_one_corruption_per_size_and_leaves_the_other_inputs_alone():
    inputs = {"out": torch.arange(12, dtype=torch.int32).view(4, 3), "idx_mapping": torch.arange(4)}
    (short,) = refusals.resized("out", 0, (lambda i: i["idx_mapping"].numel() - 1,), "one row short")
    assert short.apply(np.random.default_rng(0), inputs) is not False
    assert inputs["out"].shape == (3, 3) and inputs["idx_mapping"].tolist() == [0, 1, 2, 3]
    narrower, wider = refusals.resized("out", 1, (-1, 2), "width")
    assert (narrower.what, wider.what) == ("width (-1)", "width (+2)")
    grown = {"out": torch.arange(6).view(2, 3)}
    wider.apply(np.random.default_rng(0), grown)
    assert grown["out"].tolist() == [[0, 1, 2, 0, 1], [3, 4, 5, 3, 4]]


def test_past_bound_sets_one_live_index_to_its_exact_bound():
    for seed in range(10):
        inputs = {"idx_mapping": torch.tensor([-1, 2, 0, -1], dtype=torch.int32)}
        refusals.past_bound("idx_mapping", lambda i: 5, "past").apply(np.random.default_rng(seed), inputs)
        changed = (inputs["idx_mapping"] != torch.tensor([-1, 2, 0, -1], dtype=torch.int32)).nonzero().flatten()
        assert changed.tolist() in ([1], [2]) and int(inputs["idx_mapping"][changed]) == 5


REFUSED = [(c.name, f) for c in checks.REGISTRY for f, fn in c.families.items() if refusal.is_family(fn)]


# GPU-sized attention cases cost seconds each to draw: attention's corruptions are measured at the CPU's sizes
SIZED = [(c, f, size) for c, f in REFUSED for size in ("cpu", "cuda")
         if size == "cpu" or not c.startswith("attention.")]


@pytest.mark.parametrize("check_name,family,size", SIZED, ids=[f"{c}-{f}-{s}" for c, f, s in SIZED])
def test_every_corruption_applies_to_one_valid_case_in_six(check_name, family, size):
    """A refusal case is drawn until each corruption finds a valid case it applies to; one that applies to fewer
    than 1 in 6 (over 36 draws at the CPU's or the GPU's sizes, built on the host) would leave some seed's case
    unbuildable at ``TRIES`` (at 1 in 6, 200 tries all miss with a chance near 1e-16)."""
    fn = checks.get(check_name).families[family]
    assert 0.84**refusals.TRIES < 1e-12
    for corruption in fn.corruptions:
        if not refusals.applies(corruption, size):
            continue
        rng = np.random.default_rng(0)
        applied = sum(corruption.apply(rng, dict((corruption.valid or fn.valid)(rng, size, {}).inputs)) is not False
                      for _ in range(36))
        assert applied >= 6, f"{corruption.what}: applies to {applied} of 36 valid cases at {size} sizes"


@pytest.mark.parametrize("check_name,family", REFUSED, ids=[f"{c}-{f}" for c, f in REFUSED])
def test_every_corruption_of_a_refused_family_is_refused(check_name, family, device):
    """Each corruption of the family, on a few valid cases, refused naming its argument before any write."""
    check = checks.get(check_name)
    fn = check.families[family]
    for corruption in fn.corruptions:
        if not refusals.applies(corruption, device.type):
            continue  # the family leaves it out on this device
        for seed in range(3):
            case = refusals.corrupted(fn.valid, corruption, np.random.default_rng(seed), device.type, {})
            refusal.check_reference(check, case)
            verdict, details = refusal.judge_one(check, case, device.type, check.kernel)
            assert verdict == "pass", f"{corruption.what} (seed {seed}): {details}"


def test_a_gpu_refusal_case_of_verification_finds_its_draft_logits():
    """The seed of a GPU-sized refusal case whose draft-logits corruptions found no valid case with draft logits
    in 20 tries: it builds, each refusal on a case holding the tensor it corrupts."""
    case = checks.get("rejection.verify").families["refused"](np.random.default_rng(5479036972379614543), "cuda", {})
    corrupted_logits = [c for c in [case, *case.more_refusals] if c.refused == "draft_logits"]
    assert len(corrupted_logits) >= 7 and all(c.inputs["draft_logits"] is not None for c in corrupted_logits)


def test_a_refusal_case_tries_every_guard_and_reruns_from_its_repro_line(device):
    result = workers.run_case(cases.Task("block_table.gather", "refused", 11), device.type)
    again = workers.run_case(cases.Task("block_table.gather", "refused", 11), device.type)
    assert result.verdict == again.verdict == "pass" and result.details == again.details
    assert len(result.details) == len(checks.get("block_table.gather").families["refused"].corruptions)
    assert result.repro().startswith("./specsan repro block_table.gather refused 11")


def test_refusal_cases_are_neither_sanitized_nor_hammered(device):
    check = checks.get("block_table.shift")
    sanitized = {t.family for t in cases.plan([check], None, 1, 0, tool="memcheck")}
    assert "refused" not in sanitized and "overlap" in sanitized
    assert "refused" in {t.family for t in cases.plan([check], None, 1, 0)}
    from stress import hunt

    result = hunt.hunt(check, device.type, seconds=0.2, seed=0, families=["refused", "overlap"],
                       launch={"chunk": 16})
    assert not result.failed and result.cases >= 1


@pytest.mark.slow
def test_trace_and_repro_of_a_refusal_case():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "SPECSAN_DEVICE": "cpu"}
    traced = subprocess.run([sys.executable, "-m", "stress", "trace", "block_table.gather", "refused", "3"], cwd=root,
                            capture_output=True, text=True, env=env, timeout=300)
    assert traced.returncode == 0 and "a refusal case, nothing to trace" in traced.stdout
    repro = subprocess.run([sys.executable, "-m", "stress", "repro", "block_table.gather", "refused", "3", "--device",
                            "cpu", "--mutant", "width-guard-removed"], cwd=root, capture_output=True, text=True,
                           env=env, timeout=300)
    assert repro.returncode == 1 and "verdict: fail:accepted" in repro.stdout, repro.stdout + repro.stderr
    assert "refusal case: out one column narrower or wider than persistent" in repro.stdout
    assert "expected a ValueError naming 'out'" in repro.stdout


def test_a_gpu_case_leaves_out_index_refusals_unless_indices_are_checked_there(monkeypatch):
    """On a GPU, validate.indices reads index values back only with SPECSAN_CHECK_INDICES=1."""
    from kernels import validate

    family = checks.get("block_table.gather").families["refused"]

    def notes(device):
        case = family(np.random.default_rng(5), device, {})
        return [c.note for c in (case, *case.more_refusals)]

    monkeypatch.setattr(validate, "CHECK_INDICES_ON_GPU", False)
    assert not any("a slot past persistent's rows" in n for n in notes("cuda"))
    assert any("a slot past persistent's rows" in n for n in notes("cpu"))
    monkeypatch.setattr(validate, "CHECK_INDICES_ON_GPU", True)
    assert len(notes("cuda")) == len(family.corruptions)


def test_the_case_deadline_inside_a_refusal_is_not_taken_for_the_refusal():
    """A refusal judges whatever its reference and its call raise; the case's deadline, an alarm that may fire
    in either, must still end the case as fail:timeout (``oracle.CaseTimeout`` is no ``Exception``)."""
    from stress.core.oracle import CaseTimeout

    def deadline(out, n):
        raise CaseTimeout()

    check = _refusing(deadline, deadline)
    case = cases.build_case(check, "f", 1, "cpu")
    with pytest.raises(CaseTimeout):
        refusal.check_reference(check, case)
    with pytest.raises(CaseTimeout):
        refusal.judge_one(check, case, "cpu", deadline)
