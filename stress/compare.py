"""Comparison of kernel outputs with reference outputs, and first-divergence reports."""

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


def exact(output: str, expected, got) -> Divergence | None:
    """Bitwise equality: ints, ids, bools and floats alike (-0.0 differs from 0.0, NaN payloads must match)."""
    if got is None:
        return Divergence(output, 1, [], problem="missing from the kernel's outputs")
    want, have = _as_tensor(expected).cpu(), _as_tensor(got).detach().cpu()
    if want.shape != have.shape:
        return Divergence(output, 1, [], problem=f"shape {tuple(have.shape)}, expected {tuple(want.shape)}")
    if want.dtype != have.dtype:
        return Divergence(output, 1, [], problem=f"dtype {have.dtype}, expected {want.dtype}")
    if want.is_floating_point():
        bits = _BITS[want.element_size()]
        differ = want.contiguous().view(bits) != have.contiguous().view(bits)
    else:
        differ = want != have
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
