"""GL201's fix on each in-place form real code writes: rewritten where that provably computes the same (the model
really fails in backward, the fix is proven, the rewritten source is exact and trains in plain PyTorch), refused
with its exact reason where the write must reach another holder of the tensor."""

from __future__ import annotations

import textwrap

import pytest

from conftest import backward_in_plain_pytorch, findings_of, fix_plan, line_of, lint_file, write

MODEL = '''
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.other = nn.Linear(8, 8)
{init}
    def forward(self, x):
        h = self.inp(x)
{body}
        return y


def make():
    return Net(), (torch.randn(4, 8),)
'''


def model_source(body: str, init: str = "") -> str:
    init = textwrap.indent(textwrap.dedent(init).strip(), " " * 8) + "\n" if init else ""
    return MODEL.replace("{init}\n", init + "\n").replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


def _case(body: str, fixed_body: str, init: str = "", fixed_init: str = "") -> tuple[str, str]:
    return model_source(body, init), model_source(fixed_body, fixed_init or init)


# id: (the model, the model as --fix writes it); the write is the line marked `# write`.
FIXED = {
    "augmented assignment on an attribute": _case(
        "self.g = torch.sigmoid(h)\nself.g *= 2  # write\ny = self.g",
        "self.g = torch.sigmoid(h)\nself.g = self.g * 2  # write\ny = self.g"),
    "augmented assignment into a slice": _case(
        "y = torch.sigmoid(h)\ny[..., :4] += self.other(x)[..., :4]  # write",
        "y = torch.sigmoid(h)\ny = y.clone()\ny[..., :4] += self.other(x)[..., :4]  # write"),
    "index assignment": _case(
        "y = torch.softmax(h, -1)\ny[:, 0] = 0  # write",
        "y = torch.softmax(h, -1)\ny = y.clone()\ny[:, 0] = 0  # write"),
    "a write through a view": _case(
        "y = torch.exp(h)\ny.view(-1)[:4].zero_()  # write",
        "y = torch.exp(h)\ny = y.clone()\ny.view(-1)[:4].zero_()  # write"),
    "F.relu with inplace by position": _case(
        "y = F.relu(torch.sigmoid(h), True)  # write",
        "y = F.relu(torch.sigmoid(h))  # write"),
    "an in-place module built with inplace by position": _case(
        "y = self.act(torch.tanh(h))", "y = self.act(torch.tanh(h))",
        "self.act = nn.LeakyReLU(0.1, True)  # write", "self.act = nn.LeakyReLU(0.1)  # write"),
    "an in-place module built with a variable flag": _case(
        "y = self.act(torch.tanh(h))", "y = self.act(torch.tanh(h))",
        "inplace = True\nself.act = nn.ReLU(inplace=inplace)  # write",
        "inplace = True\nself.act = nn.ReLU(inplace=False)  # write"),
    "a chain of in-place methods": _case(
        "y = torch.sigmoid(h)\ny.mul_(2).add_(1)  # write",
        "y = torch.sigmoid(h)\ny = y.mul(2).add(1)  # write"),
    "torch.sigmoid_": _case(
        "y = torch.exp(h)\ntorch.sigmoid_(y)  # write",
        "y = torch.exp(h)\ny = torch.sigmoid(y)  # write"),
    "clamp_ with keywords": _case(
        "y = torch.exp(h)\ny.clamp_(min=0.5, max=3.0)  # write",
        "y = torch.exp(h)\ny = y.clamp(min=0.5, max=3.0)  # write"),
    "masked_fill_": _case(
        "y = torch.sigmoid(h)\ny.masked_fill_(h > 1, 0.0)  # write",
        "y = torch.sigmoid(h)\ny = y.masked_fill(h > 1, 0.0)  # write"),
    "copy_": _case(
        "y = torch.tanh(h)\ny.copy_(y * self.other(x))  # write",
        "y = torch.tanh(h)\ny = torch.empty_like(y).copy_(y * self.other(x))  # write"),
    "zero_": _case(
        "y = torch.exp(h)\nz = y * 2\ny.zero_()  # write\ny = y + z",
        "y = torch.exp(h)\nz = y * 2\ny = torch.zeros_like(y)  # write\ny = y + z"),
    "fill_": _case(
        "y = torch.exp(h)\nz = y * 2\ny.fill_(1.0)  # write\ny = y + z",
        "y = torch.exp(h)\nz = y * 2\ny = torch.empty_like(y).fill_(1.0)  # write\ny = y + z"),
    "fill_diagonal_, which has no out-of-place twin": _case(
        "y = torch.sigmoid(h)\ny.fill_diagonal_(0.0)  # write",
        "y = torch.sigmoid(h)\ny = y.clone()\ny.fill_diagonal_(0.0)  # write"),
    "returned from a helper": _case(
        "def gate(a):\n    s = torch.sigmoid(a)\n    return s.relu_()  # write\n\ny = gate(h)",
        "def gate(a):\n    s = torch.sigmoid(a)\n    return s.relu()  # write\n\ny = gate(h)"),
    "out= into a saved tensor": _case(
        "keep = torch.ones_like(x)\ny = h * keep\ntorch.mul(keep, 0.5, out=keep)  # write",
        "keep = torch.ones_like(x)\ny = h * keep\nkeep = torch.mul(keep, 0.5, out=torch.empty_like(keep))  # write"),
    "out= into a view of a saved tensor": _case(
        "keep = torch.ones_like(x)\ny = h * keep\ntorch.mul(keep[0], 0.5, out=keep[0])  # write",
        "keep = torch.ones_like(x)\ny = h * keep\nkeep = keep.clone()\ntorch.mul(keep[0], 0.5, out=keep[0])  # write"),
    "the result assigned and the tensor read again": _case(
        "s = torch.sigmoid(h)\nr = s.relu_()  # write\ny = r + s",
        "s = torch.sigmoid(h)\nr = s = s.relu()  # write\ny = r + s"),
    "the result in an expression, the tensor not read again": _case(
        "s = torch.sigmoid(h)\ny = s.relu_() * 2  # write",
        "s = torch.sigmoid(h)\ny = s.relu() * 2  # write"),
    "augmented assignment into a slot of a list the function builds": _case(
        "levels = [torch.sigmoid(h), torch.tanh(h)]\nfor i in range(len(levels) - 1, 0, -1):\n"
        "    levels[i - 1] += levels[i]  # write\ny = levels[0]",
        "levels = [torch.sigmoid(h), torch.tanh(h)]\nfor i in range(len(levels) - 1, 0, -1):\n"
        "    levels[i - 1] = levels[i - 1] + levels[i]  # write\ny = levels[0]"),
}

_ELSEWHERE = "made out-of-place or into a copy, the write would no longer reach"
# id: (the model, the reason its write is left alone)
REFUSED = {
    "a write through .data": (model_source("y = torch.sigmoid(h)\ny.data.mul_(2)  # write"),
                              "a write through .data bypasses autograd on purpose; an out-of-place rewrite changes "
                              "the gradients"),
    "another name for the tensor, read after": (
        model_source("y = torch.sigmoid(h)\nalias = y\ny.mul_(2)  # write\ny = alias + y"),
        f"alias = y shares its memory with y and is read after the write: {_ELSEWHERE} alias"),
    "a view of a tensor read after": (
        model_source("s = torch.sigmoid(h)\nv = s[:, :4]\nv += 1  # write\ny = s * 2"),
        f"v is a view of s (v = s[:, :4]), and s is read after the write: {_ELSEWHERE} it"),
    "kept in the module": (
        model_source("y = torch.sigmoid(h)\nself.last = y\ny.mul_(2)  # write"),
        f"self.last = y keeps y where a later read may see the write (in this call or the next): {_ELSEWHERE} it"),
    "an index assignment through .data": (
        model_source("y = torch.sigmoid(h)\ny.data[:, 0] = 0  # write"),
        "a write through .data bypasses autograd on purpose; an out-of-place rewrite changes the gradients"),
    "an attribute written inside an expression": (
        model_source("self.g = torch.sigmoid(h)\ny = self.g.relu_() * 2  # write"),
        "self.g is kept by its object, and an out-of-place call inside y = self.g.relu_() * 2 would not update it"),
    "kept in a list": (
        model_source("outs = []\ny = torch.sigmoid(h)\nouts.append(y)\ny.mul_(2)  # write\ny = outs[0] + y"),
        f"outs.append(y) keeps y where a later read may see the write (in this call or the next): {_ELSEWHERE} it"),
    "a torch.nn.init function": (
        model_source("y = torch.sigmoid(h)\nnn.init.zeros_(y)  # write\ny = y + h"),
        "nn.init.zeros_ is not an in-place method of a tensor"),
    "a function of a module imported by name": (
        model_source("y = torch.sigmoid(h)\ninit.zeros_(y)  # write\ny = y + h").replace(
            "from torch import nn\n", "from torch import nn\nfrom torch.nn import init\n"),
        "init.zeros_ is not an in-place method of a tensor"),
    "a submodule's parameter written under no_grad": (
        model_source("y = self.other(h)\nwith torch.no_grad():\n    self.other.weight[:, 0] = 0  # write"),
        "self.other.weight belongs to self.other, another object: rebinding it would replace what that object holds "
        "(a submodule's parameter or buffer, for one)"),
    "a parameter of the module written under no_grad": (
        model_source("y = h * self.gain\nwith torch.no_grad():\n    self.gain.mul_(0.5)  # write",
                     "self.gain = nn.Parameter(torch.ones(8))"),
        "self.gain is a registered parameter of the module: nn.Module does not let it be rebound to a computed "
        "tensor, and the optimizer updates the one it holds"),
    "a registered buffer": (
        model_source("y = h * self.scale\nself.scale.mul_(0.5)  # write", 'self.register_buffer("scale", torch.ones(8))'),
        "self.scale is a registered buffer of the module, kept from step to step: rebinding it to a new tensor is "
        "not the same update (other holders of it would not see the write, and it could carry autograd history into "
        "the next step)"),
    "a helper's argument": (
        model_source("def scale(t):\n    t.mul_(2)  # write\n\ny = torch.sigmoid(h)\nscale(y)"),
        "t is an argument of scale(): the caller's tensor would no longer be written"),
    "the result in an expression, the tensor read again": (
        model_source("s = torch.sigmoid(h)\nz = s.relu_() * 2  # write\ny = z + s"),
        "s is read after the write, and an out-of-place call inside z = s.relu_() * 2 would not update it"),
    "into what a method returns": (
        model_source("y = torch.sigmoid(h)\ny.contiguous().mul_(2)  # write"),
        "the write goes into what y.contiguous() returns, which may be a tensor held elsewhere"),
}

NOT_FLAGGED = {
    "a chain on a Linear's output": "y = self.other(h)\ny.mul_(2).add_(1)",
    "an in-place result of a fresh tensor": "y = self.other(h).relu_() * 2",
    "a slice of a matmul's output": "y = h @ h.t()\ny[..., :2] += 1",
}


@pytest.fixture(scope="module")
def parent():
    from graphlint.run.parent import WarmParent

    return WarmParent()  # one for the module's proofs


@pytest.mark.proof
@pytest.mark.parametrize("case", FIXED.values(), ids=FIXED.keys())
def test_the_write_is_rewritten_proven_and_trains(case, tmp_path, parent):
    source, expected = case
    path = write(tmp_path, "net.py", source)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward_in_plain_pytorch(path)  # the model really has the bug
    report = lint_file(path)
    findings = findings_of(report, "GL201")
    assert findings and {f.location.line for f in findings} == {line_of(path, "# write")}
    assert all(f.fix is not None for f in findings), [f.no_fix for f in findings]
    plan = fix_plan(report, tmp_path, parent=lambda: parent)
    assert plan.refused == [] and set(plan.applied) == set(findings)
    assert plan.texts[str(path)] == textwrap.dedent(expected).lstrip()
    fixed = write(tmp_path / "fixed", "net.py", expected)
    backward_in_plain_pytorch(fixed)  # trains now
    assert findings_of(lint_file(fixed), "GL201") == []


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_a_write_that_must_reach_another_holder_is_left_alone_with_its_reason(case, tmp_path):
    source, reason = case
    path = write(tmp_path, "net.py", source)
    if ".data" not in source:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            backward_in_plain_pytorch(path)
    [finding] = findings_of(lint_file(path), "GL201")
    assert finding.location.line == line_of(path, "# write")
    assert finding.fix is None
    assert finding.no_fix == reason


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_the_same_forms_on_a_tensor_nobody_saved_are_not_flagged(body, tmp_path):
    path = write(tmp_path, "net.py", model_source(body))
    backward_in_plain_pytorch(path)
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL201") == []
