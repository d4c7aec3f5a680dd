"""The refusal verdict: a case the launcher must refuse (``Case.refused``), judged without a reference output.

Launchers word every refusal ``"<argument>: <what is wrong and the fix>"`` (``kernels/validate.py`` and the
launchers' own guards), so the rule is exact: the ``ValueError``'s message must begin with the refused
argument's name followed by a colon. A refusal must come before any write, so every tensor input (outputs
included) sits in guard zones and must come back unchanged.

- ``pass``: ``ValueError`` naming the argument, guard zones intact, every input unchanged;
- ``fail:accepted``: nothing was raised (the bad input went through);
- ``fail:oob`` / ``fail:divergence``: it raised, but wrote past a tensor / changed an input before raising;
- ``fail:refusal``: it raised, but another exception type or a message that does not name the argument.
"""

import traceback

from stress.core.guards import (
    TOGETHER_BYTES,
    guarded,
    settle,
    shared_inputs,
    snapshot,
    together,
    together_bytes,
    torch_device,
    written_in_place,
)
from stress.core.types import PASS, Case, Check, Family, Verdict, not_checked

VERDICTS = (Verdict.ACCEPTED, Verdict.REFUSAL)  # the verdicts only refusal cases give


def is_family(family) -> bool:
    """Whether ``family`` builds refusal cases (``stress.families.refusals.refusal_family``): they launch no
    kernel, so there is nothing to trace, hammer or sanitize."""
    return Family.of(family).refuses


def names(message: str, argument: str) -> bool:
    """Whether an error message names ``argument`` the way launchers do: ``"argument: ..."``."""
    return message.startswith(f"{argument}:")


def check_reference(check: Check, case: Case) -> None:
    """A reference that validates (refuses with a ValueError naming one of the case's arguments) must name the
    same argument; one that does not validate (it raises nothing, or fails some other way on the bad input)
    leaves the family's ``refused`` the contract. A disagreement is a defect of the family, not of the kernel:
    it raises (the case is ``fail:crash``). A reference wrapped for judging (``bare``: attention's, which adds
    a float32 baseline) is asked unwrapped: the wrapping validates nothing. It is handed the case's own tensors,
    not copies, and a reference that writes one in place raises too (the judge compares against them)."""
    inputs, versions = shared_inputs(case)
    try:
        getattr(check.reference, "bare", check.reference)(**inputs)
    except ValueError as exc:
        if any(names(str(exc), arg) for arg in case.inputs) and not names(str(exc), case.refused):
            raise RuntimeError(f"refusal case: the family expects a refusal naming {case.refused!r}, but the "
                               f"reference refuses with {exc}") from exc
    except Exception:  # noqa: BLE001 - a reference that does not validate may fail any way on bad input
        pass
    if written := written_in_place(inputs, versions):
        raise RuntimeError(f"refusal case: the reference wrote {', '.join(written)} in place; a reference must not "
                           "write its inputs")


def asks(kernel, argument: str) -> bool:
    """Whether ``kernel`` takes ``argument``: a registered implementation (``stress.core.impl``) is not handed the
    launch knobs of the suite's launcher it does not take, so their refusals cannot be asked of it."""
    takes = getattr(kernel, "takes", None)
    return takes is None or argument in takes


def judge_all(check: Check, case: Case, device: str, kernel) -> tuple[str, list[str]]:
    """``case`` and its ``more_refusals`` in turn (each checked against the reference first): the first that
    fails decides, its details led by the corruption it was. A refusal of an argument the kernel does not take is
    not asked, and says so, as is a limit of the suite's own kernel (``Case.own_limit``) of a registered
    implementation; a case none of whose refusals can be asked is not_checked.

    On a GPU, while the device checks one call's copies, the host checks the next refusals' references
    (``_References.ahead``); no call is made before every call ahead of it is judged."""
    passed, unasked, asked = [], [], []
    for refusal in (case, *case.more_refusals):
        if not asks(kernel, refusal.refused):
            unasked.append(f"not asked: {refusal.note}: the implementation takes no {refusal.refused!r} (a launch "
                           "knob of the suite's launcher)")
        elif refusal.own_limit and getattr(kernel, "takes", None) is not None:
            unasked.append(f"not asked: {refusal.note}: a limit of the suite's own kernel on this GPU (its tiles' "
                           "shared memory), not a clause of the contract")
        else:
            asked.append(refusal)
    references, dev = _References(check, asked), torch_device(device)
    for i, refusal in enumerate(asked):
        references.check(i)
        verdict, details = _Call(refusal, dev, kernel).verdict(idle=references.ahead)
        if verdict != PASS:
            return verdict, [f"refusal case: {refusal.note}", *details]
        passed += details
    if unasked and not passed:
        return not_checked("none of its refusals can be asked of this implementation"), unasked
    return PASS, passed + unasked


class _References:
    """``check_reference`` of each of a case's refusals, once, in order: the next ones may run early, while the
    device is busy (``ahead``); a disagreement found early is raised in its turn (``check``), so a refusal before
    it that fails still decides the case."""

    def __init__(self, check: Check, refusals: list[Case]):
        self.check_, self.refusals = check, refusals
        self.done: list[RuntimeError | None] = []

    def ahead(self) -> bool:
        """Check the next refusal's reference, if any is left and none found so far disagrees; whether it did."""
        if len(self.done) == len(self.refusals) or any(self.done):
            return False
        try:
            check_reference(self.check_, self.refusals[len(self.done)])
        except RuntimeError as exc:
            self.done.append(exc)
        else:
            self.done.append(None)
        return True

    def check(self, i: int) -> None:
        """Refusal ``i``'s reference checked (now, unless it was ahead): raises its disagreement."""
        if i == len(self.done):
            check_reference(self.check_, self.refusals[i])
            self.done.append(None)
        elif self.done[i] is not None:
            raise self.done[i]


def judge_one(check: Check, case: Case, device: str, kernel) -> tuple[str, list[str]]:
    """Call ``kernel`` once on guarded copies of the case's inputs and judge the refusal."""
    return _Call(case, torch_device(device), kernel).verdict()


class _Call:
    """``kernel`` called once on guarded copies of ``case``'s inputs, judged by ``verdict``. Copies up to
    TOGETHER_BYTES share one allocation (``stress.core.guards.together``): one comparison with a copy of it, on
    the device, tells whether the call wrote anything, and on a GPU its flag comes back while the host does other
    work. Larger ones are placed and compared tensor by tensor (``guarded``, ``snapshot``): no copy of more than
    their elements (a case of no tensors has nothing to place)."""

    def __init__(self, case: Case, dev, kernel):
        self.case, self.flag = case, None
        if 0 < together_bytes(case.inputs) <= TOGETHER_BYTES:
            self.together, args = together(case.inputs, dev)
            self.placed = self.together.placed
        else:
            self.together, (self.placed, args) = None, guarded(case.inputs, dev)
        self.before = (self.together.snapshot() if self.together is not None
                       else snapshot({name: g.view for name, g in self.placed.items()}))
        self.raised = None
        try:
            kernel(**args, **case.launch)
        except Exception as exc:  # noqa: BLE001 - which exception it is, is the verdict
            self.raised = exc
        if self.together is not None:
            self.flag = self.together.changed(self.before)

    def _settled(self, idle) -> tuple[list[str], dict]:
        """Guard-zone damage in words and the inputs that changed (host values), after one wait for the device,
        which ``idle()`` fills with host work while it is busy (until it returns False)."""
        if self.together is None:
            damage, _, after = settle(self.placed, {}, {name: (g.view, self.before[name])
                                                         for name, g in self.placed.items()})
            return damage, after
        while not self.flag.ready() and idle():
            pass
        if not self.flag.value():
            return [], {}
        damage, _, after = settle(self.placed, {}, self.together.kept(self.before))
        return damage + self.together.stray(self.before), after

    def verdict(self, idle=lambda: False) -> tuple[str, list[str]]:
        from stress.core import compare

        case, raised = self.case, self.raised
        damage, after = self._settled(idle)
        want = f"a ValueError naming {case.refused!r} ({case.note or 'bad input'})"
        if raised is None:
            return Verdict.ACCEPTED, [f"expected {want}; the call returned without raising"]
        said = traceback.format_exception_only(raised)[-1].strip()
        if damage:
            return Verdict.OOB, [f"written past a tensor before raising {said}", *damage]
        changed = [line for name, values in after.items()
                   if (found := compare.unchanged(name, case.inputs[name], values)) for line in found.lines()]
        if changed:
            return Verdict.DIVERGENCE, [f"written before raising {said}", *changed]
        if not isinstance(raised, ValueError) or not names(str(raised), case.refused):
            return Verdict.REFUSAL, [f"expected {want}; raised {said}"]
        return PASS, [f"refused: {raised}"]
