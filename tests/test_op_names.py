"""Canonical op names: whichever alias the code calls (`torch.multiply`, `torch.special.expit`,
`torch.linalg.matmul`), the capture records one name, the rules match it and locate finds it in the source."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from conftest import findings_of, line_of, lint_file, write
from graphlint.capture import capture_model
from graphlint.capture.forward import op_name
from graphlint.capture.frames import Frame
from graphlint.locate.place import Locator
from graphlint.locate.sites import Site
from graphlint.ops import op
from graphlint.opnames import canonical
from graphlint.project import Project

_ALIAS_DOC = re.compile(r"Alias (?:for|of)\s+:(?:func|meth|attr):`~?([\w.]+)`")
_IN_PLACE_DOC = re.compile(r"In-place version of :meth:`~?(?:torch\.)?Tensor\.(\w+)`")
_OWNERS = {"torch": torch, "torch.Tensor": torch.Tensor, "Tensor": torch.Tensor, "torch.special": torch.special,
           "torch.linalg": torch.linalg, "torch.nn.functional": F}


def _resolve(path: str):
    owner, _, name = path.rpartition(".")
    return getattr(_OWNERS[owner], name)


def _documented(pattern: re.Pattern, owners: dict):
    """(where, the object, the name its docstring points at) for every callable whose docstring matches."""
    for prefix, owner in owners.items():
        for name in dir(owner):
            obj = getattr(owner, name, None)
            doc = getattr(obj, "__doc__", None)
            if name.startswith("_") or not callable(obj) or not isinstance(doc, str):
                continue
            found = pattern.search(doc[:800])
            if found:
                yield f"{prefix}.{name}", obj, found.group(1)


def test_every_alias_torch_documents_is_recorded_under_the_name_of_what_it_aliases():
    owners = {k: v for k, v in _OWNERS.items() if k in ("torch", "Tensor", "torch.special", "torch.linalg")}
    pairs = [(where, obj, _resolve(target if "." in target else f"Tensor.{target}"))
             for where, obj, target in _documented(_ALIAS_DOC, owners)]
    assert len(pairs) > 40  # the scan does find torch's aliases
    differ = {where: (op_name(obj), op_name(target)) for where, obj, target in pairs if op_name(obj) != op_name(target)}
    assert differ == {}


def test_the_in_place_forms_of_aliases_are_recorded_as_the_in_place_canonical_op():
    pairs = [(where, obj, base.removesuffix("_"))  # true_divide_'s docstring names itself
             for where, obj, base in _documented(_IN_PLACE_DOC, {"Tensor": torch.Tensor})]
    pairs = [(where, obj, base) for where, obj, base in pairs if canonical(base) != base]
    assert {where for where, _, _ in pairs} >= {"Tensor.multiply_", "Tensor.true_divide_", "Tensor.swapaxes_"}
    differ = {where: op_name(obj) for where, obj, base in pairs if op_name(obj) != canonical(base) + "_"}
    assert differ == {}


class Spelled(nn.Module):
    def __init__(self, aliased: bool):
        super().__init__()
        self.aliased = aliased
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        if self.aliased:
            h = torch.linalg.matmul(x, self.w)
            h = torch.multiply(h, 2).true_divide(3).subtract(1)
            h = torch.special.expit(h).swapaxes(0, 1).clip(-1, 1)
            h = torch.concat([h, h.negative()]) // 2
            return torch.special.log_softmax(h, -1)
        h = x @ self.w
        h = torch.mul(h, 2).div(3).sub(1)
        h = torch.sigmoid(h).transpose(0, 1).clamp(-1, 1)
        h = torch.cat([h, h.neg()]) // 2
        return torch.log_softmax(h, -1)


def test_code_written_with_aliases_records_the_same_ops_as_the_usual_spelling():
    def ops_of(aliased):
        capture = capture_model(Spelled(aliased), (torch.randn(4, 4),), {})
        return [op(node) for node in capture.ops]

    aliased = ops_of(True)
    assert aliased == ops_of(False)
    assert aliased[:11] == [
        "matmul", "mul", "div", "sub", "sigmoid", "transpose", "clamp", "neg", "cat", "floor_divide", "log_softmax",
    ]


ATTENTION = '''
import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x):
        q, k, v = self.qkv(x).split(32, dim=-1)
        att = torch.multiply(torch.linalg.matmul(q, k.swapaxes(-2, -1)), 1 / math.sqrt(32))
        att = torch.special.softmax(att, -1)  # the softmax
        return torch.linalg.matmul(att, v)


def make():
    return Attention(), (torch.randn(2, 16, 32),)
'''

SILU = '''
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return torch.multiply(h, torch.special.expit(h))  # the formula


def make():
    return Gate(), (torch.randn(2, 8),)
'''


def test_rules_see_attention_spelled_with_aliases(tmp_path):
    path = write(tmp_path, "model.py", ATTENTION)
    [finding] = findings_of(lint_file(path), "GL101")
    assert finding.location.line == line_of(path, "# the softmax")


def test_rules_see_an_activation_spelled_with_aliases(tmp_path):
    path = write(tmp_path, "model.py", SILU)
    [finding] = findings_of(lint_file(path), "GL107")
    assert finding.location.line == line_of(path, "# the formula")
    assert finding.message.startswith("SiLU (x * sigmoid(x)) written out elementwise")


def test_without_instruction_positions_an_alias_is_found_on_its_line_by_its_canonical_name(tmp_path):
    # Python 3.10 records no column positions: the span is searched by the op's name, which is canonical.
    line = "    return torch.sigmoid(h) + torch.multiply(h, 2)"
    path = write(tmp_path, "snippets.py", f"import torch\n\n\ndef f(h):\n{line}\n")
    locator = Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))
    location = locator.location(Site(Frame(str(path), 5, "f"), "call", "mul"))
    assert (location.line, location.end_line) == (5, 5)
    assert line[location.column - 1 : location.end_column - 1] == "torch.multiply(h, 2)"
