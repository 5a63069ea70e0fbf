"""Source locations: the right line for each op, and the exact libcst span on it."""

from __future__ import annotations

import pytest

from conftest import line_of, write
from graphlint.capture.frames import Frame
from graphlint.locate.place import Locator
from graphlint.locate.sites import Site, node_sites
from graphlint.project import Project
from test_capture import SMALL, capture_file

SNIPPETS = '''
import torch


def f(q, k, t, x):
    scores = (q @ k.transpose(-2, -1)) * 0.5
    probs = scores.float().softmax(-1).to(torch.float16)
    out = torch.matmul(
        probs,
        k,
    )
    t += 1
    t[:, 0] = 0
    raw = x.data
    return out
'''


def text_of(path, span) -> str:
    line, column, end_line, end_column = span
    lines = path.read_text(encoding="utf-8").splitlines()
    if line == end_line:
        return lines[line - 1][column - 1 : end_column - 1]
    return "\n".join([lines[line - 1][column - 1 :], *lines[line : end_line - 1], lines[end_line - 1][: end_column - 1]])


@pytest.fixture
def small(tmp_path):
    path = write(tmp_path, "net.py", SMALL)
    return path, capture_file(path), Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))


def span_of(locator, site):
    location = locator.location(site)
    return (location.line, location.column, location.end_line, location.end_column)


def test_an_op_in_user_code_is_the_exact_operator_expression(small):
    path, capture, locator = small
    matmul = next(n for n in capture.ops if n.meta["op"] == "matmul")
    primary, library = node_sites(matmul, locator.project, capture.factory)
    assert library is None
    assert text_of(path, span_of(locator, primary)) == "h @ h.transpose(-2, -1)"


def test_an_in_place_method_is_the_method_call_from_its_dot(small):
    path, capture, locator = small
    write_node = next(n for n in capture.ops if n.meta["op"] == "mul_")
    primary, _ = node_sites(write_node, locator.project, capture.factory)
    assert text_of(path, span_of(locator, primary)) == ".mul_(2)"


def test_an_op_inside_a_module_called_by_the_user_is_the_call(small):
    path, capture, locator = small
    linear = next(n for n in capture.ops if n.meta["module_path"] == "proj")
    primary, _ = node_sites(linear, locator.project, capture.factory)
    assert text_of(path, span_of(locator, primary)) == "self.proj(x)"


def test_an_op_inside_nn_sequential_is_the_argument_that_built_the_module(small):
    path, capture, locator = small
    relu = next(n for n in capture.ops if n.meta["op"] == "relu")
    primary, _ = node_sites(relu, locator.project, capture.factory)
    assert primary.style == "build"
    assert text_of(path, span_of(locator, primary)) == "nn.ReLU(inplace=True)"


def test_a_rule_can_ask_for_the_build_site_of_a_module_it_called(small):
    path, capture, locator = small
    linear = next(n for n in capture.ops if n.meta["module_path"] == "proj")
    primary, _ = node_sites(linear, locator.project, capture.factory, at_build_site=True)
    assert text_of(path, span_of(locator, primary)) == "nn.Linear(8, 8)"
    assert primary.frame.line == line_of(path, "self.proj = nn.Linear(8, 8)")


@pytest.mark.parametrize(
    ("fragment", "style", "op", "expected"),
    [
        ("scores = (q @ k", "method", "matmul", "q @ k.transpose(-2, -1)"),
        ("scores = (q @ k", "method", "mul", "(q @ k.transpose(-2, -1)) * 0.5"),
        ("probs = scores", "method", "softmax", ".softmax(-1)"),
        ("probs = scores", "method", "to", ".to(torch.float16)"),
        ("out = torch.matmul(", "call", "matmul", "torch.matmul(\n        probs,\n        k,\n    )"),
        ("t += 1", "method", "add_", "t += 1"),
        ("t[:, 0] = 0", "call", "setitem", "t[:, 0] = 0"),
        ("raw = x.data", "call", "data", "x.data"),
    ],
)
def test_without_instruction_positions_the_op_is_found_on_its_line_by_name(tmp_path, fragment, style, op, expected):
    # Python 3.10 records no column positions: libcst finds the expression from the op's name.
    path = write(tmp_path, "snippets.py", SNIPPETS)
    locator = Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))
    site = Site(Frame(str(path), line_of(path, fragment), "f"), style, op)
    assert text_of(path, span_of(locator, site)) == expected


def test_the_factory_definition_is_the_function_name(tmp_path):
    path = write(tmp_path, "factory.py", "import functools\n\n\n@functools.lru_cache\ndef make():\n    return 1\n")
    locator = Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))
    site = Site(Frame(str(path), 4, "make"), "def")
    assert text_of(path, span_of(locator, site)) == "make"


def test_spans_stay_inside_a_file_that_changed_after_it_ran(tmp_path):
    path = write(tmp_path, "changed.py", "x = 1\ny = (\n")  # no longer valid Python, and shorter
    locator = Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))
    location = locator.location(Site(Frame(str(path), 40, "forward", 4, 40, 12), "call", "matmul"))
    assert 1 <= location.line <= 3 and location.column >= 1 and location.end_column >= location.column


def test_installed_packages_are_not_first_party_even_inside_the_project(tmp_path):
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    assert project.is_first_party(str(tmp_path / "model.py"))
    assert not project.is_first_party(str(tmp_path / ".venv/lib/python3.11/site-packages/transformers/x.py"))
    assert not project.is_first_party("/elsewhere/model.py")


LIBRARY_ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
'''


def test_library_locations_come_from_frame_positions_without_parsing_the_library(tmp_path, monkeypatch):
    import sys

    from conftest import lint_file
    from graphlint.locate.spans import SourceSpans

    site = tmp_path / "env" / "site-packages"
    library = write(site, "attnlib/__init__.py", LIBRARY_ATTENTION)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "attnlib", raising=False)
    parsed = []
    original = SourceSpans._parse
    monkeypatch.setattr(SourceSpans, "_parse", lambda self, path: parsed.append(path) or original(self, path))
    user = write(tmp_path / "project", "model.py", '''
        import torch
        from attnlib import Attention


        def make():
            return Attention(), (torch.randn(2, 8, 16),)
    ''')
    [finding] = lint_file(user).findings
    assert finding.rule_id == "GL101" and finding.location.path == str(user)
    softmax_line = line_of(library, "torch.softmax(")
    spans = {r.message: r.location for r in finding.related if r.location.path == str(library)}
    text = library.read_text().splitlines()[softmax_line - 1]
    assert all(where.line == softmax_line and not where.first_party for where in spans.values())

    def shown(where):
        return text[where.column - 1:where.end_column - 1]

    assert shown(spans["softmax in attnlib"]) == "torch.softmax(q @ k.transpose(-2, -1), dim=-1)"
    assert shown(spans["attention scores: matmul"]) == "q @ k.transpose(-2, -1)"
    assert str(library) not in parsed  # libcst never parsed the library file
