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

    if (why := impl.why_not_registrable(check)) is not None:
        return [f"  --impl: not registrable: {why}"]
    lines = [f"  --impl {check.name}=module:function  where function{inspect.signature(check.kernel)}",
             f"    writes {', '.join(check.outputs)} in place (or returns it: Implementation.layout places a returned"
             " value); launch knobs it does not accept are not passed"]
    lines += [f"    @{name}: {choice.doc}" for name, choice in check.choices.items()]
    return lines


def cmd_list(args) -> int:
    from stress import checks

    if args.impl:
        for c in checks.REGISTRY:
            print(c.name)
            print("\n".join(impl_lines(c)))
        return 0
    if args.json:
        print(json.dumps([{"check": c.name, "contract": c.contract, "docs": c.docs, "families": list(c.families),
                           "devices": list(c.devices),
                           "mutants": [{"name": m.name, "description": m.description, "oracles": m.oracles}
                                       for m in c.mutants]} for c in checks.REGISTRY], indent=2))
        return 0
    for c in checks.REGISTRY:
        print(f"{c.name}  [{', '.join(c.devices)}]")
        print(f"  contract: {c.contract}  (more: {c.docs})")
        print(f"  families: {', '.join(c.families)}")
        for m in c.mutants:
            oracles = ", ".join(f"{d}: {o}" for d, o in m.oracles.items())
            print(f"  mutant {m.name}: {m.description}  (killed by {oracles})")
    return 0
