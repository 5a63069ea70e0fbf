"""Text edits on source files: applying several to one file, checking the result still compiles, and the
unified diff that `--diff` prints."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from graphlint.results import Edit

_LINE_END = re.compile(r"\r\n|\r|\n")  # the line ends Python counts


class EditConflict(Exception):
    """Two edits of one file overlap."""


def _offset(starts: list[int], line: int, column: int) -> int:
    return starts[line - 1] + column - 1


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """`text` with every edit applied; edits refer to the original text and must not overlap."""
    starts = [0] + [m.end() for m in _LINE_END.finditer(text)]
    spans = sorted(((_offset(starts, e.line, e.column), _offset(starts, e.end_line, e.end_column), e.text)
                    for e in edits), reverse=True)
    end_of_previous = len(text) + 1
    for start, end, new in spans:
        if end > end_of_previous:
            raise EditConflict(f"two fixes overlap at offset {start}")
        text = text[:start] + new + text[end:]
        end_of_previous = start
    return text


def compiles(text: str, path: str) -> str | None:
    """None when `text` is valid Python, else the syntax error in one line."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        return f"{error.msg} at line {error.lineno}"
    return None


def unified_diff(before: str, after: str, name: str) -> str:
    """`--- a/name` / `+++ b/name` hunks, as git and ruff print them."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        f"a/{name}", f"b/{name}"))
