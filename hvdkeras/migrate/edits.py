"""Text edits located by the syntax tree: where a node's source lies in the
text, and applying non-overlapping replacements. Pure.

What may import this module: the rest of `hvdkeras.migrate`.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import List, Sequence


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace text[start:end] with `text`; `line` and `what` go into the report."""

    start: int
    end: int
    text: str
    line: int
    what: str


class Locator:
    """Turns the (line, UTF-8 byte column) positions `ast` gives into string offsets."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, byte_column: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(text.encode("utf-8")[:byte_column].decode("utf-8",
                                                                                  "replace"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)

    def line_end(self, line: int) -> int:
        """The offset just after line `line` (its newline included)."""
        return self.starts[min(line, len(self.lines))]


def apply(source: str, edits: Sequence[Edit]) -> tuple[str, List[Edit], List[Edit]]:
    """(new text, edits applied, edits skipped because they overlap an earlier one)."""
    applied: List[Edit] = []
    skipped: List[Edit] = []
    taken_until = -1
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        if edit.start < taken_until:
            skipped.append(edit)
            continue
        applied.append(edit)
        taken_until = max(taken_until, edit.end)
    text = source
    for edit in reversed(applied):  # already in order; from the end, offsets stay valid
        text = text[:edit.start] + edit.text + text[edit.end:]
    return text, applied, skipped
