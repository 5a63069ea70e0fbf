"""Spans without parsing: the instruction position a frame recorded (Python 3.11+), else the whole line.

Locations inside installed libraries use these: a library file can be thousands of lines (diffusers'
attention processors: 5,679) that libcst would parse only to place a related location.
"""

from __future__ import annotations

from graphlint.files import read_source, split_lines

Span = tuple[int, int, int, int]  # 1-based line, column, end line, end column (exclusive); code points


class LineSpans:
    """Spans from frame positions and plain lines; each file is read once per run."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str] | None] = {}

    def span(self, frame) -> Span:
        lines = self.lines(frame.file)
        if not lines:
            line = max(frame.line, 1)
            return (line, 1, line, 1)
        if frame.col is not None and frame.end_line is not None and frame.end_col is not None \
                and 1 <= frame.line <= frame.end_line <= len(lines):
            return (frame.line, chars(lines[frame.line - 1], frame.col) + 1,
                    frame.end_line, chars(lines[frame.end_line - 1], frame.end_col) + 1)
        return line_extent(lines, frame.line)

    def lines(self, path: str) -> list[str] | None:
        if path not in self._lines:
            text = read_source(path)
            self._lines[path] = split_lines(text) if text is not None else None
        return self._lines[path]


def chars(line: str, byte_offset: int) -> int:
    """CPython's column (a UTF-8 byte offset) as a code-point offset."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", "ignore"))


def line_extent(lines: list[str], line: int) -> Span:
    """The line without its indentation and trailing space, clamped into the file."""
    line = min(max(line, 1), max(len(lines), 1))
    text = lines[line - 1] if lines else ""
    stripped = text.strip()
    if not stripped:
        return (line, 1, line, len(text) + 1)
    first = len(text) - len(text.lstrip()) + 1
    return (line, first, line, first + len(stripped))
