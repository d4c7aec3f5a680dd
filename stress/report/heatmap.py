"""Heat maps of a run as PNG files: kills by mutant x launch shape, failures by check x family.

Drawn with the standard library only (a 5x7 bitmap font and zlib), so every machine that runs
the harness, including one without network or plotting libraries, writes the same picture.
"""

import struct
import zlib

from stress.core.types import PASS

# The classic 5x7 font, ASCII 32..126: five column bytes per glyph, bit 0 the top row.
_FONT = bytes.fromhex(
    "0000000000" "00005f0000" "0007000700" "147f147f14" "242a7f2a12" "2313086462" "3649552250" "0005030000"
    "001c224100" "0041221c00" "082a1c2a08" "08083e0808" "0050300000" "0808080808" "0060600000" "2010080402"
    "3e5149453e" "00427f4000" "4261514946" "2141454b31" "1814127f10" "2745454539" "3c4a494930" "0171090503"
    "3649494936" "064949291e" "0036360000" "0056360000" "0008142241" "1414141414" "4122140800" "0201510906"
    "324979413e" "7e1111117e" "7f49494936" "3e41414122" "7f4141221c" "7f49494941" "7f09090101" "3e41415132"
    "7f0808087f" "00417f4100" "2040413f01" "7f08142241" "7f40404040" "7f0204027f" "7f0408107f" "3e4141413e"
    "7f09090906" "3e4151215e" "7f09192946" "4649494931" "01017f0101" "3f4040403f" "1f2040201f" "7f2018207f"
    "6314081463" "0304780403" "6151494543" "00007f4141" "0204081020" "41417f0000" "0402010204" "4040404040"
    "0001020400" "2054545478" "7f48444438" "3844444420" "384444487f" "3854545418" "087e090102" "081454543c"
    "7f08040478" "00447d4000" "2040443d00" "007f102844" "00417f4000" "7c04180478" "7c08040478" "3844444438"
    "7c14141408" "081414187c" "7c08040408" "4854545420" "043f444020" "3c4040207c" "1c2040201c" "3c4030403c"
    "4428102844" "0c5050503c" "4464544c44" "0008364100" "00007f0000" "0041360800" "08082a1c08")
GLYPH_W, GLYPH_H, SCALE = 6, 8, 2  # a glyph cell with one column and one row of spacing; drawn twice the size
CHAR_W, CHAR_H = GLYPH_W * SCALE, GLYPH_H * SCALE
PAD = 6

WHITE, BLACK, GREY, LIGHT = (255, 255, 255), (0, 0, 0), (150, 150, 150), (235, 235, 235)
GREEN, YELLOW, RED, PURPLE = (46, 160, 67), (230, 190, 40), (215, 48, 39), (150, 90, 180)


class Canvas:
    """An RGB picture in memory; ``save`` writes it as a PNG."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def rect(self, x: int, y: int, w: int, h: int, color) -> None:
        x0, x1 = max(0, x), min(self.width, x + w)
        if x1 <= x0:
            return
        run = bytes(color) * (x1 - x0)
        for row in range(max(0, y), min(self.height, y + h)):
            start = (row * self.width + x0) * 3
            self.pixels[start:start + len(run)] = run

    def text(self, x: int, y: int, s: str, color=BLACK, vertical: bool = False) -> None:
        """Left to right from (x, y); ``vertical`` reads bottom to top with (x, y) the bottom-left corner."""
        for n, ch in enumerate(s):
            code = ord(ch) - 32 if 32 <= ord(ch) < 127 else ord("?") - 32
            for col in range(5):
                bits = _FONT[code * 5 + col]
                for row in range(7):
                    if bits >> row & 1:
                        if vertical:
                            px, py = x + row * SCALE, y - (n * GLYPH_W + col + 1) * SCALE
                        else:
                            px, py = x + (n * GLYPH_W + col) * SCALE, y + row * SCALE
                        self.rect(px, py, SCALE, SCALE, color)

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        i = (y * self.width + x) * 3
        return tuple(self.pixels[i:i + 3])

    def png(self) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        stride = self.width * 3
        raw = b"".join(b"\0" + self.pixels[r * stride:(r + 1) * stride] for r in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(
            b"IEND", b"")

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.png())


def _width(s: str) -> int:
    return len(s) * CHAR_W


class Grid:
    """One titled table of coloured cells: ``cells[(row, column)] = (colour, text)``; gaps stay blank."""

    def __init__(self, title: str, rows: list[str], columns: list[str], cells: dict):
        self.title, self.rows, self.columns, self.cells = title, rows, columns, cells
        texts = [t for _, t in cells.values()] + ["0000"]
        self.cell_w = max(_width(t) for t in texts) + 2 * PAD
        self.cell_h = CHAR_H + 2 * PAD
        self.label_w = max((_width(r) for r in rows), default=0) + 2 * PAD
        self.head_h = max((_width(c) for c in columns), default=0) + 2 * PAD
        self.width = self.label_w + self.cell_w * len(columns) + PAD
        self.height = CHAR_H + 2 * PAD + self.head_h + self.cell_h * len(rows) + PAD

    def origin(self, row: int, column: int, top: int) -> tuple[int, int]:
        """Top-left corner of a cell when the grid is drawn at height ``top``."""
        return (self.label_w + column * self.cell_w,
                top + CHAR_H + 2 * PAD + self.head_h + row * self.cell_h)

    def draw(self, canvas: Canvas, top: int) -> None:
        canvas.text(PAD, top + PAD, self.title)
        base = top + CHAR_H + 2 * PAD + self.head_h - PAD
        for c, name in enumerate(self.columns):
            canvas.text(self.label_w + c * self.cell_w + (self.cell_w - CHAR_H) // 2, base, name, vertical=True)
        for r, name in enumerate(self.rows):
            x, y = self.origin(r, 0, top)
            canvas.text(PAD, y + PAD, name)
            for c in range(len(self.columns)):
                x, y = self.origin(r, c, top)
                if (r, c) in self.cells:
                    color, text = self.cells[(r, c)]
                    canvas.rect(x + 1, y + 1, self.cell_w - 2, self.cell_h - 2, color)
                    canvas.text(x + (self.cell_w - _width(text)) // 2, y + PAD, text, WHITE)
                else:
                    canvas.rect(x + 1, y + 1, self.cell_w - 2, self.cell_h - 2, LIGHT)


def render(grids: list[Grid], legend: list[tuple[tuple, str]]) -> Canvas:
    """Stack the grids, then a legend line of colour swatches."""
    label_w = max(g.label_w for g in grids)  # one column of row labels for every grid
    for g in grids:
        g.width += label_w - g.label_w
        g.label_w = label_w
    legend_w = sum(CHAR_H + PAD + _width(text) + 3 * PAD for _, text in legend) + PAD
    width = max([g.width for g in grids] + [legend_w])
    height = sum(g.height for g in grids) + CHAR_H + 3 * PAD
    canvas = Canvas(width, height)
    top = 0
    for g in grids:
        g.draw(canvas, top)
        top += g.height
    x = PAD
    for color, text in legend:
        canvas.rect(x, top + PAD, CHAR_H, CHAR_H, color)
        canvas.text(x + CHAR_H + PAD, top + PAD, text)
        x += CHAR_H + PAD + _width(text) + 3 * PAD
    return canvas


def _shape(launch: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(launch.items())) or "default"


def kill_cell(row) -> tuple[tuple, str]:
    """Green: killed within a few cases; yellow: it took many; red: survived; grey: not hunted here."""
    if row.status == "killed":
        return (GREEN if row.iterations <= 10 else YELLOW), str(row.iterations)
    if row.status == "survived":
        return RED, "x"
    return GREY, {"not_checked": "nc", "stale": "old", "unfinished": "..."}.get(row.status, "?")


def kills(rows: list) -> Canvas:
    """One grid per check: its mutants down, the launch shapes they were hunted (or killed) in across.

    With ``--by-shape`` each cell is one hunt; otherwise a mutant's cell sits in the shape that
    killed it (or under "any" when it was not killed)."""
    grids = []
    for check in dict.fromkeys(k.check for k in rows):
        mine = [k for k in rows if k.check == check]
        mutants = list(dict.fromkeys(k.mutant for k in mine))
        shapes = list(dict.fromkeys(_shape(k.launch) if k.launch else "any" for k in mine))
        cells = {(mutants.index(k.mutant), shapes.index(_shape(k.launch) if k.launch else "any")): kill_cell(k)
                 for k in mine}
        grids.append(Grid(check, mutants, shapes, cells))
    legend = [(GREEN, "killed (cases)"), (YELLOW, "killed after > 10"), (RED, "survived"),
              (GREY, "not checked / stale / unfinished")]
    return render(grids, legend)


def failure_cell(results: list) -> tuple[tuple, str]:
    failed = sum(r.failed for r in results)
    passed = sum(r.verdict == PASS for r in results)
    if failed:
        return RED, f"{failed}/{len(results)}"
    return (GREEN, str(passed)) if passed else (GREY, "nc")


MAX_FAMILY_COLUMNS = 16  # a registry-wide run has hundreds of families; a column each made it 8,000+ px wide
OTHER_FAMILIES = "other families"


def failure_grid(results: list) -> Grid:
    """Checks down, families across (blank where a check has no such family): failed / cases per cell.

    When the run has more than MAX_FAMILY_COLUMNS families, only those that failed get a column (the most
    failures first, at most MAX_FAMILY_COLUMNS) and each check's other families share one cell."""
    by_pair: dict[tuple[str, str], list] = {}
    for r in results:
        by_pair.setdefault((r.check, r.family), []).append(r)
    checks = list(dict.fromkeys(c for c, _ in by_pair))
    families = list(dict.fromkeys(f for _, f in by_pair))
    if len(families) > MAX_FAMILY_COLUMNS:
        failed: dict[str, int] = {}
        for (_, family), rs in by_pair.items():
            if count := sum(r.failed for r in rs):
                failed[family] = failed.get(family, 0) + count
        families = sorted(failed, key=lambda f: -failed[f])[:MAX_FAMILY_COLUMNS] + [OTHER_FAMILIES]
    grouped: dict[tuple[int, int], list] = {}
    for (c, f), rs in by_pair.items():
        column = families.index(f if f in families else OTHER_FAMILIES)
        grouped.setdefault((checks.index(c), column), []).extend(rs)
    cells = {at: failure_cell(rs) for at, rs in grouped.items()}
    return Grid("failures by check and family", checks, families, cells)


def failures(results: list) -> Canvas:
    """``failure_grid`` as a picture, with its legend."""
    legend = [(GREEN, "all passed (cases)"), (RED, "failed / cases"), (GREY, "not checked")]
    return render([failure_grid(results)], legend)
