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
    # Two fixes may need the same edit (one import added for both): it is made once.
    spans = sorted({(_offset(starts, e.line, e.column), _offset(starts, e.end_line, e.end_column), e.text)
                    for e in edits}, reverse=True)
    end_of_previous = len(text) + 1
    for start, end, new in spans:
        if end > end_of_previous:
            raise EditConflict(f"two fixes overlap at offset {start}")
        text = text[:start] + new + text[end:]
        end_of_previous = start
    return text


def deleted_lines(lines: list[str], statements: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The 1-based line ranges to delete for whole statements spanning `statements` (first, last line): each
    run of deleted lines also takes one blank line next to it when it would otherwise leave two blank lines
    together, a blank line at the start or end of a block, or one between a comment and the code it is about."""
    gone = {line for first, last in statements for line in range(first, last + 1)}

    def blank(number: int) -> bool:
        return 1 <= number <= len(lines) and not lines[number - 1].strip()

    def indent(number: int) -> int:
        text = lines[number - 1]
        return len(text) - len(text.lstrip())

    runs: list[list[int]] = []
    for line in sorted(gone):
        if runs and runs[-1][1] == line - 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    for first, last in runs:
        before = first - 1
        while before in gone:
            before -= 1
        after = last + 1
        while after in gone:
            after += 1
        # A block's first line, or a comment that introduced the deleted lines and now introduces what follows.
        opens_block = before >= 1 and (lines[before - 1].rstrip().endswith(":") or lines[before - 1].lstrip().startswith("#"))
        following = next((n for n in range(after, len(lines) + 1) if n not in gone and not blank(n)), None)
        closes_block = following is None or indent(following) < indent(first)
        if blank(after) and (blank(before) or opens_block or before < 1):
            gone.add(after)
        elif blank(before) and closes_block:
            gone.add(before)
    ranges: list[tuple[int, int]] = []
    for line in sorted(gone):
        if ranges and ranges[-1][1] == line - 1:
            ranges[-1] = (ranges[-1][0], line)
        else:
            ranges.append((line, line))
    return ranges


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
