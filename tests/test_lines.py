"""graphlint.lines: the line type rules and flow key what ran at one line by."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import graphlint.flow as flow
from conftest import line_of
from graphlint.capture import capture_model
from graphlint.capture.frames import Frame
from graphlint.lines import SourceLine


def test_a_frame_stands_at_its_file_and_line_whatever_its_columns_and_function():
    call = Frame("/p/model.py", 12, "forward", 8, 12, 30)
    other_call = Frame("/p/model.py", 12, "<lambda>", 31, 12, 40)
    assert SourceLine.of(call) == SourceLine.of(other_call) == SourceLine("/p/model.py", 12)
    assert SourceLine.of(call) != SourceLine.of(Frame("/p/model.py", 13, "forward"))
    assert len({SourceLine.of(call), SourceLine.of(other_call)}) == 1


class Cut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            h = self.a(x) * 2
        return self.b(h) + self.c(x).relu().detach()


def test_gradient_cuts_are_lines_of_the_user_file():
    """The detach's line and the no_grad block's statement, each once, as SourceLines (GL103 and GL104 read them)."""
    lines = flow.cut_lines(capture_model(Cut(), (torch.randn(2, 4),), {}))
    assert all(type(line) is SourceLine for line in lines)
    here = Path(__file__)
    assert sorted(lines) == [SourceLine(str(here), line_of(here, "h = self.a(x) * 2")),
                             SourceLine(str(here), line_of(here, "self.c(x).relu().detach()"))]
