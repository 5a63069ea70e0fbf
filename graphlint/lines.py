"""A line of source, as rules and the data-flow answers group and compare what ran there: the same line in every
pass of a loop and in every layer. No imports: the capture, the rules, flow and locate all read it."""

from __future__ import annotations

from typing import NamedTuple, Protocol


class _Positioned(Protocol):
    file: str
    line: int


class SourceLine(NamedTuple):
    """A file and a line in it (1-based)."""

    file: str
    line: int

    @classmethod
    def of(cls, frame: _Positioned) -> SourceLine:
        """The line a frame (`graphlint.capture.frames.Frame`) stands at, whatever its columns and function."""
        return cls(frame.file, frame.line)
