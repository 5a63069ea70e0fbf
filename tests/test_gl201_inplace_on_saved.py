"""GL201 finds every in-place form that overwrites a saved tensor, exactly where PyTorch's backward would fail."""

from __future__ import annotations

import textwrap

import pytest
import torch

from conftest import backward_in_plain_pytorch, findings_of, line_of, lint_file, write

MODEL = '''
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.seq = nn.Sequential(
            nn.Linear(8, 8),
            nn.Tanh(),
            nn.ReLU(inplace=True),  # the ReLU
        )
        self.drop = nn.Dropout(0.5, inplace=True)

    def forward(self, x):
        h = self.inp(x)
{body}
        return y


def make():
    return Net(), (torch.randn(4, 8),)
'''


def model_source(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


# body, the line fragment of the write, the line fragment of the op whose saved tensor it overwrites
FLAGGED = {
    "method mul_": ("y = torch.sigmoid(h)\ny.mul_(2)  # write", "y.mul_(2)", "torch.sigmoid(h)"),
    "clamp_": ("y = torch.exp(h)\ny.clamp_(max=3.0)  # write", "y.clamp_", "torch.exp(h)"),
    "add_": ("y = torch.tanh(h)\ny.add_(1)  # write", "y.add_(1)", "torch.tanh(h)"),
    "augmented +=": ("y = torch.sigmoid(h)\ny += 1  # write", "y += 1", "torch.sigmoid(h)"),
    "augmented *=": ("y = h.exp()\ny *= 0.5  # write", "y *= 0.5", "h.exp()"),
    "index assignment": ("y = torch.softmax(h, -1)\ny[:, 0] = 0  # write", "y[:, 0] = 0", "torch.softmax(h, -1)"),
    "out= into a saved mask": ("keep = torch.ones_like(x)\ny = h * keep\ntorch.mul(keep, 0.5, out=keep)  # write",
                               "out=keep", "y = h * keep"),
    "F.relu inplace": ("y = F.relu(torch.sigmoid(h), inplace=True)  # write", "F.relu(", "F.relu(torch.sigmoid(h)"),
    "nn.ReLU(inplace=True) in nn.Sequential": ("y = self.seq(h)", "nn.ReLU(inplace=True)", "nn.Tanh()"),
    "nn.Dropout(inplace=True) on probabilities": ("y = self.drop(torch.softmax(h, -1))", "nn.Dropout(0.5, inplace=True)",
                                                  "self.drop(torch.softmax"),
    "a view of the saved tensor": ("y = torch.exp(h)\ny.view(-1)[:4].zero_()  # write", ".zero_()", "torch.exp(h)"),
}

NOT_FLAGGED = {
    "in-place after a Linear": "y = self.inp(h)\ny.mul_(2)",
    "out += x on a matmul output": "y = h @ h.t()\ny += 1",
    "in-place ReLU after a Linear": "y = F.relu(self.inp(h), inplace=True)",
    "in-place ReLU after BatchNorm": "y = F.relu(F.batch_norm(h, None, None, training=True), inplace=True)",
    "in-place on a fresh tensor": "y = torch.zeros_like(h)\ny[:, 0] = 1\ny = y + h",
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("case", FLAGGED.values(), ids=FLAGGED.keys())
def test_in_place_write_to_a_saved_tensor_is_flagged_at_the_write(case, device, tmp_path):
    body, write_fragment, producer_fragment = case
    path = write(tmp_path, "net.py", model_source(body))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward_in_plain_pytorch(path)  # the model really has the bug
    report = lint_file(path, device=device)
    assert report.errors == []
    [finding] = findings_of(report, "GL201")
    assert finding.location.line == line_of(path, write_fragment)
    assert "backward will fail" in finding.message
    assert line_of(path, producer_fragment) in {r.location.line for r in finding.related}


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_in_place_write_to_a_tensor_nobody_saved_is_not_flagged(body, tmp_path):
    path = write(tmp_path, "net.py", model_source(body))
    backward_in_plain_pytorch(path)  # and PyTorch agrees
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL201") == []


def test_a_write_through_data_is_flagged_as_a_silently_wrong_gradient(tmp_path):
    path = write(tmp_path, "net.py", model_source("y = torch.sigmoid(h)\ny.data.mul_(2)  # write"))
    backward_in_plain_pytorch(path)  # PyTorch does not notice
    [finding] = findings_of(lint_file(path), "GL201")
    assert finding.location.line == line_of(path, "y.data.mul_(2)")
    assert "silently wrong" in finding.message


def test_the_module_form_names_the_module_and_the_overwritten_op(tmp_path):
    path = write(tmp_path, "net.py", model_source("y = self.seq(h)"))
    [finding] = findings_of(lint_file(path), "GL201")
    assert finding.message.startswith("nn.ReLU(inplace=True) in seq.2 overwrites the output of tanh")
    assert finding.message.endswith("build it with inplace=False.")
    text = path.read_text().splitlines()[finding.location.line - 1]
    assert text[finding.location.column - 1 : finding.location.end_column - 1] == "nn.ReLU(inplace=True)"


def test_rules_still_report_when_backward_fails(tmp_path):
    path = write(tmp_path, "net.py", model_source('''
        class Explodes(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t * 1

            @staticmethod
            def backward(ctx, grad):
                raise RuntimeError("custom backward is broken")

        y = torch.sigmoid(Explodes.apply(h))
        y.mul_(2)  # write
    '''))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL201")
    assert finding.location.line == line_of(path, "y.mul_(2)")
    assert any("backward raised RuntimeError: custom backward is broken" in note for note in report.results[0].notes)


def test_repeated_layers_give_one_finding_with_the_count(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                y = torch.sigmoid(self.fc(x))
                y.mul_(2)
                return y


        def make():
            return nn.Sequential(*[Layer() for _ in range(5)]), (torch.randn(4, 8),)
    ''')
    [finding] = findings_of(lint_file(path), "GL201")
    assert finding.occurrences == 5
    assert "in 0 … 4 overwrites" in finding.message and "(5 occurrences)" in finding.message


def test_the_capture_check_agrees_with_autograd_on_cpu():
    # Saved-tensor hooks switch off autograd's own version check; the capture's check must not depend on it.
    from graphlint.capture import capture_model

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = torch.sigmoid(self.fc(x))
            y.mul_(2)
            return y

    capture = capture_model(Net(), (torch.randn(2, 4),), {})
    assert capture.autograd.backward.error is None  # autograd itself did not notice under the hooks
    sigmoid = next(n for n in capture.autograd.nodes if n.name == "SigmoidBackward0")
    assert sigmoid.saved[0].modified_after_save
