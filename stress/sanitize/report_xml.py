"""compute-sanitizer's ``--xml --save`` output, read into findings.

The file is ``<ComputeSanitizerOutput>`` holding one ``<record>`` per reported error: ``kind``
(``Precise``, ``Api``, ...), ``level``, ``what`` (``text`` such as "Invalid __global__ read of
size 4 bytes", and where known the ``size``, ``space``, ``address``), ``where`` (``func``, the
kernel; ``path`` and ``line``; ``pc``), ``who`` (``threadIdx`` and ``blockIdx``) and a host stack.
NVIDIA publishes no schema, so fields are looked up anywhere below their record and a missing
one is left empty rather than failing the parse; a clean run is an empty root element.
"""

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass
class Finding:
    kind: str  # the record's kind: "Precise" (a device access), "Api" (a failed CUDA call), ...
    text: str  # what the sanitizer says, e.g. "Invalid __global__ read of size 4 bytes"
    kernel: str = ""
    source: str = ""  # path:line of the access, when the kernel carries line info
    address: int | None = None
    size: int | None = None
    thread: tuple[int, ...] = ()
    block: tuple[int, ...] = ()

    @property
    def device_access(self) -> bool:
        """A finding about a kernel's own access (not a CUDA API call failing afterwards)."""
        return self.kind.lower() not in ("api", "api error") and not self.text.lower().startswith("program hit")


class SanitizerXmlError(ValueError):
    """The file is not compute-sanitizer XML (truncated, empty, another format)."""


def _find_text(element, *names: str) -> str:
    for name in names:
        found = element.find(f".//{name}")
        if found is not None and found.text and found.text.strip():
            return found.text.strip()
    return ""


def _int(text: str) -> int | None:
    text = text.replace(",", "").strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _axes(element) -> tuple[int, ...]:
    if element is None:
        return ()
    return tuple(v for axis in ("x", "y", "z") if (v := _int(_find_text(element, axis) or "")) is not None)


def _finding(record) -> Finding:
    what = record.find("what")
    where = record.find("where")
    who = record.find("who")
    scope = what if what is not None else record
    text = _find_text(scope, "text") or " ".join(t.strip() for t in record.itertext() if t.strip())[:200]
    if (subtype := _find_text(scope, "type")) and subtype not in text:
        text += f" ({subtype})"  # synccheck: "Barrier error (Invalid arguments)"
    path = _find_text(where, "path", "file") if where is not None else ""
    line = _find_text(where, "line") if where is not None else ""
    address = _int(_find_text(scope, "address"))
    if address is None and (m := re.search(r"\baddress (0x[0-9a-fA-F]+)", text, re.IGNORECASE)):
        address = int(m.group(1), 16)
    size = _int(_find_text(scope, "size", "accessSize"))
    if size is None and (m := re.search(r"of size (\d+) bytes?", text)):
        size = int(m.group(1))
    return Finding(kind=_find_text(record, "kind") or "", text=text,
                   kernel=_find_text(where, "func") if where is not None else "",
                   source=f"{path}:{line}" if path and line and line != "0" else path,
                   address=address, size=size,
                   thread=_axes(who.find(".//threadIdx") if who is not None else None),
                   block=_axes(who.find(".//blockIdx") if who is not None else None))


def parse(text: str) -> list[Finding]:
    """Every record of one XML file, in order. Raises ``SanitizerXmlError`` on anything else."""
    if not text.strip():
        raise SanitizerXmlError("the sanitizer's XML file is empty")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SanitizerXmlError(f"the sanitizer's XML does not parse ({exc})") from None
    if root.tag != "ComputeSanitizerOutput":
        raise SanitizerXmlError(f"root element <{root.tag}>, expected <ComputeSanitizerOutput>")
    return [_finding(record) for record in root.iter("record")]
