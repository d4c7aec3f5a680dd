"""What the mutation operators share: an edit of a target's source, and the views of its syntax tree they read."""

import ast
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (offsets into the target's dedented source) by ``text``."""

    start: int
    end: int
    text: str
    what: str = ""  # what the edit does, in words (semantic operators); generation adds where


class Source:
    """The target's source with (line, column) -> offset conversion and text of nodes."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets; production sources are ASCII, where they agree
        return self.starts[line - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def of(self, node) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def replace(self, node, text: str) -> Edit:
        return Edit(*self.span(node), text)


def is_attr(node, names: tuple[str, ...], attr: str) -> bool:
    """``node`` is ``<one of names>.<attr>`` (``tl.minimum``, ``triton.cdiv``)."""
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id in names)


def in_strings(tree) -> set[int]:
    """ids of nodes inside f-strings and annotations (not code a mutant should touch)."""
    inside = set()
    for node in ast.walk(tree):
        roots = [node] if isinstance(node, ast.JoinedStr) else []
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AnnAssign)) and getattr(node, "returns", None) is not None:
            roots.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            inside.update(id(n) for n in ast.walk(root))
    return inside


def statements(tree) -> Iterator[list]:
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
