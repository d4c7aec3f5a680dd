"""Refusal families: valid cases of a check, each with one corruption its launcher must refuse (``Case.refused``).

Each ``Corruption`` is applied to a fresh valid case, so the rest of the input is valid and the guard under
test is the one that must fire; ``stress.core.refusal`` judges each. A case holds one such refusal per corruption
of its family (``Case.more_refusals``): refusals launch no kernel and cost little, and so every case tries
every guard (one drawn corruption per case would leave most guards untried in a three-case hunt). The one
exception is attention's shape that no tile fits: the launcher learns that from Triton's failed compiles
(one per tile rung), so on a GPU its refusal costs compile time in every worker that has not compiled it. Bounds
are hit exactly where the guard compares (one past the last slot, one row short), where a flipped ``>=``
shows.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kernels import validate
from stress.core.types import Case, Family

# Valid cases drawn until one the corruption applies to (e.g. one with a live batch row, or with the optional
# tensor it corrupts: verification's draft logits come with about 1 valid case in 4 at GPU sizes, so 20 tries
# left about one refusal case in 60 unbuildable). A case built within fewer tries is the same at any bound.
TRIES = 200


@dataclass(frozen=True)
class Corruption:
    """``apply(rng, inputs)`` corrupts ``inputs`` (a dict it may change) in place, or returns False when this
    valid case has nothing to corrupt; the launcher must then refuse naming ``refused``."""

    refused: str
    what: str
    apply: Callable[[np.random.Generator, dict], bool | None]
    valid: Callable | None = None  # the valid family it corrupts, where not the refusal family's own
    # False: an index value the launcher checks through kernels.validate.indices/offsets, which on a GPU read
    # it back only with SPECSAN_CHECK_INDICES=1; without it a GPU case leaves the corruption out
    on_gpu: bool = True
    # False: a limit of the GPU itself (its shared memory) for the suite's kernel, which the interpreter does not
    # have and another implementation need not share (``Case.own_limit``)
    on_cpu: bool = True


def applies(corruption: Corruption, device: str) -> bool:
    """Whether a refusal family holds ``corruption`` on ``device`` (see ``Corruption.on_gpu`` / ``on_cpu``)."""
    if device == "cuda":
        return corruption.on_gpu or validate.CHECK_INDICES_ON_GPU
    return corruption.on_cpu


def refusal_family(valid: Callable, corruptions: tuple[Corruption, ...], launcher: str) -> Callable:
    """A family whose every case holds each of ``corruptions``, each applied to its own case of ``valid``."""
    def build(rng, device, launch):
        first, *more = [corrupted(valid, c, rng, device, launch) for c in corruptions if applies(c, device)]
        first.more_refusals = more
        return first

    build.__name__ = "refused"
    build.__doc__ = f"{launcher}'s refusals, each on its own valid case: " + "; ".join(c.what for c in corruptions)
    return Family(build, corruptions=corruptions, valid=valid)


def corrupted(valid: Callable, corruption: Corruption, rng, device: str, launch: dict) -> Case:
    """The first of ``valid``'s cases that ``corruption`` applies to, corrupted."""
    valid = corruption.valid or valid
    for _ in range(TRIES):
        case = valid(rng, device, launch)
        inputs = dict(case.inputs)
        if corruption.apply(rng, inputs) is not False:
            note = f"{corruption.what}, must be refused" + (f" ({case.note})" if case.note else "")
            return Case(inputs, note=note, refused=corruption.refused, own_limit=not corruption.on_cpu)
    raise RuntimeError(f"{corruption.what}: none of {TRIES} cases of {valid.__name__} can be corrupted so")


# ---------------------------------------------------------------- corruptions


def resized(name: str, dim: int, sizes: tuple, what: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per entry of ``sizes``: ``name`` resized along ``dim``, by an int (-1: one entry fewer)
    or to what a callable gives from the inputs (one row short of the batch); grown entries repeat the first
    ones."""
    def resize(choice):
        def apply(rng, inputs):
            t = inputs.get(name)
            if t is None:  # an optional tensor this case leaves out
                return False
            size = t.shape[dim]
            new = choice(inputs) if callable(choice) else size + choice
            if new < 0 or new == size or (new > size and size == 0):
                return False
            if new < size:
                inputs[name] = t.narrow(dim, 0, new).clone()
            else:
                inputs[name] = torch.cat([t] * -(-new // size), dim).narrow(dim, 0, new).clone()
            return True

        return apply

    return tuple(Corruption(refused or name, what if callable(choice) else f"{what} ({choice:+d})", resize(choice))
                 for choice in sizes)


def _each(names: tuple[str, ...], what: str, change, refused: str | None) -> tuple[Corruption, ...]:
    """One corruption per name: that tensor replaced by ``change(tensor)``, or the case skipped where the tensor
    is absent or ``change`` gives None. ``what`` is formatted with the name; ``refused`` as in ``moved``."""
    def apply_to(name):
        def apply(rng, inputs):
            t = inputs.get(name)
            changed = change(t) if isinstance(t, torch.Tensor) else None
            if changed is None:
                return False
            inputs[name] = changed
            return True

        return apply

    return tuple(Corruption(refused or name, what.format(name=name), apply_to(name)) for name in names)


def moved(*names: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per name: that tensor on the meta device, which no kernel runs on and which holds no data,
    so the launcher must refuse it by name (``refused``, where the case's input reaches the launcher under
    another) before it reads it: its device check names the tensor off the kernel's device, not the first one
    that differs from the rest. A name the case leaves out is skipped."""
    return _each(names, "{name} on another device", lambda t: t.to("meta"), refused)


def every_other(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as a view whose innermost stride is 2 (every other element of a buffer twice as wide), which the
    kernels' unit-stride loads would misread; None for a tensor of fewer than two elements or whose innermost
    dimension holds one: it is read at index 0 alone, whatever its stride, and a launcher must accept it."""
    return torch.stack([t, t], -1)[..., 0] if t.numel() >= 2 and t.shape[-1] >= 2 else None


def strided(*names: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per name: that tensor as a view of innermost stride 2 (``every_other``), which the
    launcher must refuse by name (``refused``, as in ``moved``). A tensor ``every_other`` leaves alone is
    skipped."""
    return _each(names, "{name} of innermost stride 2", every_other, refused)


def emptied(dims: dict[str, int], what: str, refused: str, on_gpu: bool = True) -> Corruption:
    """Every tensor of ``dims`` given size 0 along its dimension (a vocabulary of 0 in logits and cache alike);
    a tensor absent from the case is skipped, and a case with no entry along the first is left alone.
    ``on_gpu``: as ``Corruption``'s."""
    def apply(rng, inputs):
        first = next(iter(dims))
        if inputs[first].numel() == 0:
            return False
        for name, dim in dims.items():
            if inputs.get(name) is not None:
                inputs[name] = inputs[name].narrow(dim, 0, 0).clone()
        return True

    return Corruption(refused, what, apply, on_gpu=on_gpu)


def past_bound(name: str, bound: Callable[[dict], int], what: str,
               live: Callable[[dict], torch.Tensor] | None = None, refused: str | None = None,
               on_gpu: bool = False) -> Corruption:
    """One index of ``name`` set to ``bound(inputs)``, its exclusive upper bound (exactly there, where a flipped
    ``>=`` shows): one that ``live(inputs)`` marks, by default one >= 0 (a padded row's -1 is never followed).
    ``on_gpu``: the launcher reads the index back itself, so a GPU launch refuses it too."""
    def apply(rng, inputs):
        t = inputs[name].clone(memory_format=torch.contiguous_format)
        marked = live(inputs) if live else t >= 0
        where = marked.flatten().nonzero().flatten()
        if where.numel() == 0:
            return False
        t.view(-1)[int(where[int(rng.integers(where.numel()))])] = bound(inputs)
        inputs[name] = t
        return True

    return Corruption(refused or name, what, apply, on_gpu=on_gpu)


def replaced(name: str, values: tuple, what: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per entry of ``values``: ``name`` replaced by it (a zero count, a float for an int, a bool)."""
    def replace(value):
        def apply(rng, inputs):
            inputs[name] = value

        return apply

    return tuple(Corruption(refused or name, f"{what}: {value!r}", replace(value)) for value in values)


def retyped(name: str, *dtypes: torch.dtype, refused: str | None = None) -> Corruption:
    """``name`` in the first of ``dtypes`` it does not have already (a case that leaves it out is skipped)."""
    def apply(rng, inputs):
        t = inputs.get(name)
        if t is None:
            return False
        inputs[name] = t.to(next(d for d in dtypes if d != t.dtype))

    return Corruption(refused or name, f"{name} in another dtype", apply)


def one_dim_more(name: str) -> Corruption:
    """``name`` with a leading dimension of 1: the wrong number of dimensions."""
    def apply(rng, inputs):
        inputs[name] = inputs[name].unsqueeze(0)

    return Corruption(name, f"{name} with an extra dimension", apply)


def as_list(name: str) -> Corruption:
    """``name`` as a Python list instead of a tensor."""
    def apply(rng, inputs):
        inputs[name] = inputs[name].tolist()

    return Corruption(name, f"{name} as a list", apply)


# ---------------------------------------------------------------- per launcher


def rows_short_of(batch: Callable[[dict], int]) -> Callable[[dict], int]:
    """A size one short of the batch, for ``resized``."""
    return lambda inputs: batch(inputs) - 1


def short(name: str, need: Callable[[dict], int], what: str) -> Corruption:
    """``name`` one row short of what the live batch needs."""
    return resized(name, 0, (rows_short_of(need),), f"{name} one row short of {what}")


def batch_rows(inputs: dict) -> int:
    """A batch of one row per ``idx_mapping`` entry."""
    return inputs["idx_mapping"].numel()


def qsl_rows(inputs: dict) -> int:
    return inputs["query_start_loc"].numel() - 1


NOT_POSITIVE = (0, -1, 16.0, True)  # a count the launcher must refuse: zero, negative, float, bool
