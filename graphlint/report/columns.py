"""Columns in the units other tools count: graphlint's locations count Unicode code points, SARIF and the
Language Server Protocol count UTF-16 code units by default (LSP clients may ask for UTF-8 bytes or code points).
"""

from __future__ import annotations

from graphlint.files import read_source, split_lines

UNITS = ("utf-16", "utf-8", "utf-32")  # the Language Server Protocol's names for the three ways to count


class SourceColumns:
    """1-based code-point columns of a file's lines to 1-based columns in `unit`; each file is read once."""

    def __init__(self, unit: str = "utf-16") -> None:
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}; got {unit!r}")
        self.unit = unit
        self._lines: dict[str, list[str]] = {}

    def convert(self, path: str, line: int, column: int) -> int:
        lines = self._read(path)
        if not 1 <= line <= len(lines):
            return column
        prefix = lines[line - 1][: column - 1]
        # A column past the end of the line (the line break itself) counts one unit per missing character.
        return self.width(prefix) + 1 + max(0, column - 1 - len(prefix))

    def line_length(self, path: str, line: int) -> int:
        """The code points of a line, without its line break (0 for a line the file does not have)."""
        lines = self._read(path)
        return len(lines[line - 1]) if 1 <= line <= len(lines) else 0

    def _read(self, path: str) -> list[str]:
        lines = self._lines.get(path)
        if lines is None:
            text = read_source(path)
            lines = self._lines[path] = split_lines(text) if text is not None else []
        return lines

    def width(self, text: str) -> int:
        """How many units `text` counts."""
        if self.unit == "utf-16":
            return len(text.encode("utf-16-le", "surrogatepass")) // 2
        if self.unit == "utf-8":
            return len(text.encode("utf-8", "surrogatepass"))
        return len(text)
