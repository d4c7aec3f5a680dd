"""Comparison of kernel outputs with reference outputs, and first-divergence reports."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

SHOW = 8  # divergent elements listed per output


@dataclass
class Divergence:
    """Where one output differs: ``total`` wrong elements, the first few listed."""

    output: str
    total: int
    first: list[tuple[tuple[int, ...], object, object]]  # (index, expected, got)
    problem: str = ""  # set when shapes or dtypes differ, or an output is missing
    verdict: str = "divergence"  # the oracle that found it: the case fails as fail:<verdict>

    def lines(self, source: torch.Tensor | None = None) -> list[str]:
        if self.problem:
            return [f"{self.output}: {self.problem}"]
        out = [f"{self.output}: {self.total} element(s) differ"]
        for index, want, got in self.first:
            where = _found_in(source, got, index) if source is not None else ""
            out.append(f"  {self.output}{list(index)}: expected {want}, got {got}{where}")
        return out


def _found_in(source: torch.Tensor, value, index) -> str:
    """Say which entry of the original input a wrong value was copied from (block tables)."""
    if source.dim() == 0 or source.is_floating_point():
        return ""
    hits = (source == value).nonzero().tolist()
    if not hits:
        return "  (value not in the original input)"
    same_row = [h for h in hits if len(index) > 1 and h[:-1] == list(index[:-1])] or hits
    hit = same_row[0]
    offset = hit[-1] - index[-1]
    return f"  (= original{hit}, {offset:+d} from this entry)"


def _as_tensor(v) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # float width -> same-size int


def _shown(value: torch.Tensor, other: torch.Tensor):
    """A float that equals ``other`` by value but not by bits (-0.0 vs 0.0, NaN payloads) shows its bits."""
    v = value.item()
    if value.is_floating_point() and (value == other or (value.isnan() & other.isnan())):
        width = value.element_size() * 2
        return f"{v} (bits 0x{int(value.view(_BITS[value.element_size()])) & ((1 << 4 * width) - 1):0{width}x})"
    return v


def _differ(want: torch.Tensor, have: torch.Tensor) -> torch.Tensor:
    """Elements that differ, on the tensors' device; floats by their bits (-0.0 vs 0.0, NaN payloads)."""
    if want.is_floating_point():
        bits = _BITS[want.element_size()]
        return want.contiguous().view(bits) != have.contiguous().view(bits)
    return want != have


def exact(output: str, expected, got) -> Divergence | None:
    """Bitwise equality: ints, ids, bools and floats alike (-0.0 differs from 0.0, NaN payloads must match)."""
    if got is None:
        return Divergence(output, 1, [], problem="missing from the kernel's outputs")
    want, have = _as_tensor(expected).cpu(), _as_tensor(got).detach().cpu()
    if want.shape != have.shape:
        return Divergence(output, 1, [], problem=f"shape {tuple(have.shape)}, expected {tuple(want.shape)}")
    if want.dtype != have.dtype:
        return Divergence(output, 1, [], problem=f"dtype {have.dtype}, expected {want.dtype}")
    differ = _differ(want, have)
    total = int(differ.sum())
    if total == 0:
        return None
    idx = differ.nonzero()[:SHOW].tolist()
    first = [(tuple(i), _shown(want[tuple(i)], have[tuple(i)]), _shown(have[tuple(i)], want[tuple(i)])) for i in idx]
    return Divergence(output, total, first)


def unchanged(name: str, before: torch.Tensor, after: torch.Tensor) -> Divergence | None:
    """A read-only input must come back bit for bit as it went in."""
    found = exact(name, before, after)
    if found is not None:
        found.output = f"{name} (read-only input)"
    return found


@dataclass
class Tolerated:
    """Not a divergence: what a comparator deliberately left unjudged, for the case's details."""

    output: str
    note: str

    def lines(self, source: torch.Tensor | None = None) -> list[str]:
        return [f"{self.output}: {self.note}"]


class Unjudged(Tolerated):
    """Too much of an output could not be judged: the case is ``not_checked``, never a pass."""


NEAR_TIE_SHARE = 0.05  # more near-tie rows than 1 + this share leaves too little of the case judged


def exact_unless_near_tie(output: str, expected, got) -> Divergence | Tolerated | None:
    """Exact, except the rows an expected ``reference.sampling.Decided`` marks ``near_tie``.

    There the float64 reference cannot tell which token the float32 kernel must pick, so the
    row is counted and reported instead of judged. The flags come from the inputs alone (no
    kernel can raise them), so a flood of them says the case cannot be judged, not that the
    kernel is wrong: the case is then ``not_checked``, while its other rows must still match.
    Plain expected tensors compare exactly.
    """
    near_tie = getattr(expected, "near_tie", None)
    if near_tie is None:
        return exact(output, expected, got)
    want = expected.value
    if got is not None and near_tie.any() and tuple(_as_tensor(got).shape) == tuple(want.shape):
        rows = near_tie.view(-1, *([1] * (want.dim() - 1))).expand_as(want)
        want = torch.where(rows, _as_tensor(got).detach().cpu(), want)
    found = exact(output, want, got)
    count = int(near_tie.sum())
    if found is not None or count == 0:
        return found
    if count > 1 + NEAR_TIE_SHARE * near_tie.numel():
        return Unjudged(output, f"{count} of {near_tie.numel()} rows are near ties that float32 cannot decide: "
                                "too few rows judged")
    return Tolerated(output, f"{count} of {near_tie.numel()} row(s) within float32 rounding of a tie, not judged")


CHUNK = 1 << 26  # elements compared at a time by exact_chunked


def _unravel(flat: int, shape) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def exact_chunked(output: str, expected, got) -> Divergence | None:
    """``exact``, a slice of CHUNK elements at a time: a multi-GB output (a KV cache past 2^31
    elements) never needs a second whole copy, or whole-size masks, on the host. Where both sides
    sit on one GPU a slice is compared there and copied to the host only when it differs."""
    if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)) or expected.numel() <= CHUNK \
            or expected.shape != got.shape or expected.dtype != got.dtype:
        return exact(output, expected, got)
    want, have = expected.reshape(-1), got.detach().reshape(-1)
    on_device = want.device == have.device and want.device.type != "cpu"
    total, first = 0, []
    for start in range(0, want.numel(), CHUNK):
        if on_device and not bool(_differ(want[start:start + CHUNK], have[start:start + CHUNK]).any()):
            continue
        found = exact(output, want[start:start + CHUNK], have[start:start + CHUNK])
        if found is not None:
            total += found.total
            first += [(_unravel(start + i[0], expected.shape), w, g) for i, w, g in found.first][:SHOW - len(first)]
    return Divergence(output, total, first) if total else None


@dataclass
class Float64Expected:
    """A float64 reference with what oracle 1 needs to judge a low-precision output against it.

    ``computed`` marks the elements the kernel computes; every other element must come back bit
    for bit (``value`` holds it exactly: a float16/bfloat16/float32 value converts to float64
    exactly). ``baseline`` is a float32 torch computation of the same result, rounded to the
    output dtype; ``floor`` an absolute rounding floor for what float32 cannot show (products of
    probabilities rounded to the output precision, as FlashAttention-style kernels do).
    """

    value: torch.Tensor
    baseline: torch.Tensor
    computed: torch.Tensor
    floor: float
    # A further floor, asked only of an output the bound above rejects: the float32 rounding of inputs whose
    # size the baseline's own error does not show (attention's scores in the thousands: see
    # stress.families.attention.score_rounding). A callable, so a passing case never pays for it.
    rounding: Callable[[], float] | None = None


@dataclass
class FloatDivergence(Divergence):
    """A float output off by more than oracle 1 allows; the first line says how much was allowed."""

    allowed: str = ""

    def lines(self, source: torch.Tensor | None = None) -> list[str]:
        out = super().lines(source)
        out[0] += f" beyond the allowed error ({self.allowed})"
        return out


def _largest(values: torch.Tensor, where: torch.Tensor) -> float:
    """The largest of ``values`` (none negative) where ``where`` holds, 0.0 where it holds nowhere: a masked max,
    which copies no selection of a multi-million-element output out."""
    return float(values.masked_fill(~where, 0.0).max()) if values.numel() else 0.0


def within_float32_baseline(output: str, expected, got) -> Divergence | Tolerated | None:
    """Oracle 1 for floats: ``max |got - float64| <= 2 * max |float32 baseline - float64| + floor`` over the
    computed elements whose reference is finite, the others bit for bit (a NaN or infinite reference element
    must come back NaN or the same infinity, and sets no part of the bound); a passing output logs the
    measured ratio. NaN where the reference is finite (a read of poisoned memory) always diverges. Plain
    expected values compare exactly."""
    if not isinstance(expected, Float64Expected):
        return exact(output, expected, got)
    if got is None:
        return Divergence(output, 1, [], problem="missing from the kernel's outputs")
    want, have = expected.value, _as_tensor(got).detach().cpu()
    if tuple(have.shape) != tuple(want.shape):
        return Divergence(output, 1, [], problem=f"shape {tuple(have.shape)}, expected {tuple(want.shape)}")
    if have.dtype != expected.baseline.dtype:
        return Divergence(output, 1, [], problem=f"dtype {have.dtype}, expected {expected.baseline.dtype}")
    have = have.to(torch.float64)
    same = (have == want) | (torch.isnan(have) & torch.isnan(want))
    error = (have - want).abs().nan_to_num(nan=float("inf"))
    computed = expected.computed & torch.isfinite(want)
    baseline_gap = (expected.baseline.to(torch.float64) - want).abs()
    # a baseline that is not finite where the reference is bounds nothing: the bound comes from the others
    baseline_error = _largest(baseline_gap, computed & torch.isfinite(baseline_gap))
    allowed = 2 * baseline_error + expected.floor
    wrong = torch.where(computed, ~same & (error > allowed), ~same)
    rounding = ""
    if wrong.any() and expected.rounding is not None:
        extra = expected.rounding()
        allowed, rounding = allowed + extra, f" + input rounding {extra:.3g}"
        wrong = torch.where(computed, ~same & (error > allowed), ~same)
    worst = _largest(error, computed)
    if wrong.any():
        idx = wrong.nonzero()[:SHOW].tolist()
        first = [(tuple(i), want[tuple(i)].item(), have[tuple(i)].item()) for i in idx]
        return FloatDivergence(output, int(wrong.sum()), first, allowed=f"{allowed:.3g} = 2 x float32 baseline "
                               f"{baseline_error:.3g} + floor {expected.floor:.3g}{rounding}; elements not computed: "
                               "bit for bit")
    ratio = f"{worst / baseline_error:.2f}x" if baseline_error else "n/a (baseline exact)"
    return Tolerated(output, f"max error {worst:.3g} vs float64 = {ratio} the float32 baseline's {baseline_error:.3g} "
                             f"(allowed 2x + floor {expected.floor:.3g}{rounding})")
