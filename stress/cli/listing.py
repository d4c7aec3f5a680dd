"""The command line of list: the checks, their families and planted bugs; what an implementation must provide."""

import json


def add_parsers(sub) -> None:
    lst = sub.add_parser("list", help="show checks, families and mutants")
    lst.add_argument("--json", action="store_true", help="print JSON on stdout and nothing else")
    lst.add_argument("--impl", action="store_true", help="what an implementation registered against each check "
                     "must accept and write, and the choices of its contract profile")



def impl_lines(check) -> list[str]:
    """What ``--impl CHECK=...`` must provide for ``check``: the launcher's signature and outputs, its choices."""
    import inspect

    from stress.core import impl
    from stress.core.types import RETURN

    if (why := impl.why_not_registrable(check)) is not None:
        return [f"  --impl: not registrable: {why}"]
    launcher = impl.launcher_of(check)
    written = [name for name in check.outputs if name != RETURN]
    does = (["returns its result"] if RETURN in check.outputs else []) + (
        [f"writes {', '.join(written)} in place"] if written else [])
    if launcher is not check.kernel:  # the check judges it through an adapter of the suite's, named in its outputs
        does = ["writes its outputs in place"]
    lines = [f"  --impl {check.name}=module:function  where function{inspect.signature(launcher)}",
             f"    as {launcher.__module__}.{launcher.__qualname__} does, it {' and '.join(does)} (a returned value"
             " can be placed by Implementation.layout); launch knobs it does not accept are not passed"]
    lines += [f"    @{name}: {choice.doc}" for name, choice in check.choices.items()]
    return lines


def impl_record(check) -> dict:
    """``impl_lines`` as data: whether an implementation can be registered, its signature, the choices."""
    import inspect

    from stress.core import impl

    if (why := impl.why_not_registrable(check)) is not None:
        return {"registrable": False, "why_not": why}
    return {"registrable": True, "signature": str(inspect.signature(impl.launcher_of(check))),
            "choices": {name: choice.doc for name, choice in check.choices.items()}}


def cmd_list(args) -> int:
    from stress import checks

    if args.json:  # JSON only; with --impl each check also says what an implementation must provide
        print(json.dumps([{"check": c.name, "contract": c.contract, "docs": c.docs, "families": list(c.families),
                           "devices": list(c.devices),
                           "mutants": [{"name": m.name, "description": m.description, "oracles": m.oracles}
                                       for m in c.mutants],
                           **({"impl": impl_record(c)} if args.impl else {})} for c in checks.REGISTRY], indent=2))
        return 0
    if args.impl:
        for c in checks.REGISTRY:
            print(c.name)
            print("\n".join(impl_lines(c)))
        return 0
    for c in checks.REGISTRY:
        print(f"{c.name}  [{', '.join(c.devices)}]")
        print(f"  contract: {c.contract}  (more: {c.docs})")
        print(f"  families: {', '.join(c.families)}")
        for m in c.mutants:
            oracles = ", ".join(f"{d}: {o}" for d, o in m.oracles.items())
            print(f"  mutant {m.name}: {m.description}  (killed by {oracles})")
    return 0
