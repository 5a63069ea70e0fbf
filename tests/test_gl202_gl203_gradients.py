"""GL202 finds trainable parameters cut off from the loss at the cut; GL203 the ones the forward never uses."""

from __future__ import annotations

import textwrap

import pytest

from conftest import backward_in_plain_pytorch, findings_of, line_of, lint_file, write

MODEL = '''
import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
{body}
        return self.head(x + features)


def make():
    return Net(), (torch.randn(4, 8),)
'''

ENCODER = ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"]


def model_source(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


CUTS = {
    ".detach()": ("features = self.encoder(x).detach()  # cut", ".detach()"),
    ".data": ("features = self.encoder(x).data  # cut", ".data"),
    "torch.no_grad()": ("with torch.no_grad():\n    features = self.encoder(x)  # cut", "This statement inside torch.no_grad()"),
    "torch.inference_mode()": ("with torch.inference_mode():\n    features = self.encoder(x)  # cut\nfeatures = features.clone()",
                               "This statement inside torch.inference_mode()"),
    ".item() and back": ("features = torch.tensor(self.encoder(x).sum().item())  # cut", ".item()"),
    ".tolist() and back": ("features = torch.tensor(self.encoder(x).tolist())  # cut", ".tolist()"),
    ".numpy() and back": ("features = torch.from_numpy(self.encoder(x).detach().cpu().numpy() * 1)  # cut",
                          ".numpy()"),
}


@pytest.mark.parametrize("case", CUTS.values(), ids=CUTS.keys())
def test_a_cut_is_flagged_at_the_cut_naming_the_parameters(case, tmp_path):
    body, what = case
    path = write(tmp_path, "net.py", model_source(body))
    model = backward_in_plain_pytorch(path)
    assert all(p.grad is None for name, p in model.named_parameters() if name in ENCODER)  # really cut
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(path, "# cut")
    assert finding.occurrences == 1
    assert finding.message.startswith(what)
    assert ("encoder.0.weight, encoder.0.bias, encoder.2.weight, ... (4 tensors in encoder) off from the loss"
            in finding.message)
    assert findings_of(report, "GL203") == []


def test_the_no_grad_cut_points_at_the_statement_inside_the_block(tmp_path):
    path = write(tmp_path, "net.py", model_source("with torch.no_grad():\n    features = self.encoder(x)  # cut"))
    [finding] = findings_of(lint_file(path), "GL202")
    text = path.read_text().splitlines()[finding.location.line - 1]
    assert text[finding.location.column - 1 : finding.location.end_column - 1] == "self.encoder(x)"
    assert "in the model" in finding.message
    [switched_off] = finding.related  # the `with` line that turned autograd off is shown beside the statement
    assert switched_off.location.line == finding.location.line - 1
    assert path.read_text().splitlines()[switched_off.location.line - 1].strip() == "with torch.no_grad():"
    assert switched_off.message == "autograd switched off here (no_grad)"


NOT_CUT = {
    "a frozen encoder under no_grad": "self.encoder.requires_grad_(False)\nwith torch.no_grad():\n    features = self.encoder(x)",
    "a detach that cuts nothing trainable": "features = self.encoder(x)\nfeatures = features + features.detach().mean()",
    "a detached copy that is only logged": "features = self.encoder(x)\nlogged = features.detach().cpu()",
}


@pytest.mark.parametrize("body", NOT_CUT.values(), ids=NOT_CUT.keys())
def test_intended_or_harmless_detaches_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "net.py", model_source(body)))
    assert report.errors == []
    assert findings_of(report, "GL202") == [] and findings_of(report, "GL203") == []


def test_a_cut_in_every_layer_is_one_finding_naming_all_the_parameters(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
                self.head = nn.Linear(8, 2)

            def forward(self, x):
                for layer in self.layers:
                    x = x + layer(x).detach()
                return self.head(x)


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    [finding] = findings_of(lint_file(path), "GL202")
    assert finding.occurrences == 3
    assert "layers.0.weight, layers.0.bias, layers.1.weight, ... (6 tensors in layers)" in finding.message


def test_unused_parameters_are_gl203_at_the_line_that_built_them(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)
                self.aux_head = nn.Linear(8, 3)
                self.temperature = nn.Parameter(torch.ones(1))
                self.side = nn.Linear(8, 8)

            def forward(self, x):
                unused_result = self.side(x)
                return self.proj(x)


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    report = lint_file(path)
    by_line = {f.location.line: f for f in findings_of(report, "GL203")}
    assert set(by_line) == {line_of(path, "self.aux_head ="), line_of(path, "self.temperature ="),
                            line_of(path, "self.side =")}
    assert by_line[line_of(path, "self.aux_head =")].message.startswith(
        "The forward never uses aux_head.weight, aux_head.bias in aux_head, so no gradient reaches them")
    assert by_line[line_of(path, "self.side =")].message.startswith(
        "Nothing computed from side.weight, side.bias in side reaches the loss")
    assert by_line[line_of(path, "self.temperature =")].message == (  # one parameter: "it"
        "The forward never uses temperature in the model, so no gradient reaches it for the inputs captured; remove "
        "it, or freeze it with requires_grad_(False).")
    assert findings_of(report, "GL202") == []
    assert all(f.severity.value == "note" for f in by_line.values())


def test_an_untaken_data_dependent_branch_is_mentioned(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.small = nn.Linear(8, 8)
                self.large = nn.Linear(8, 8)

            def forward(self, x):
                if x.norm() > 100:
                    return self.large(x)
                return self.small(x)


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    report = lint_file(path)
    [finding] = findings_of(report, "GL203")
    assert f"branched on a tensor value at {path}:{line_of(path, 'if x.norm()')}, and a branch" in finding.message
    assert "large.weight, large.bias" in finding.message


VQ = '''
import torch
from torch import nn

import graphlint


class VectorQuantised(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.codebook = nn.Linear(8, 8)
        self.decoder = nn.Linear(8, 8)

    def forward(self, x):
        z = self.encoder(x)
        reconstruction = self.decoder(z.detach())  # the cut
        commitment = (z.detach() - self.codebook(z)).pow(2).mean()  # dropped by the loss
        return reconstruction, commitment


def make():
    return graphlint.Target(VectorQuantised(), (torch.randn(4, 8),), loss=lambda out: out[0].sum())


def plain():
    model, (x,) = VectorQuantised(), (torch.randn(4, 8),)
    model(x)[0].sum().backward()
    return model
'''


def test_a_detach_in_a_term_the_loss_drops_is_not_a_cut(tmp_path):
    import importlib.util

    path = write(tmp_path, "vq.py", VQ)
    spec = importlib.util.spec_from_file_location("vq_plain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.plain()
    assert model.encoder.weight.grad is None and model.decoder.weight.grad is not None  # plain PyTorch
    [cut] = findings_of(lint_file(path), "GL202")
    assert cut.location.line == line_of(path, "# the cut")
    assert cut.occurrences == 1  # the commitment term's detach reaches no loss: it cuts nothing
    assert "encoder.weight" in cut.message


@pytest.mark.parametrize("cast", [".float()", ".int().float()", ".bool().float()"])
def test_a_dtype_cast_is_not_a_trip_out_of_torch(tmp_path, cast):
    # `.float()`, `.int()` and `.bool()` share their names with float(t), int(t) and bool(t) but stay in torch
    path = write(tmp_path, "net.py", model_source(f"""
        hidden = self.encoder(x){cast}
        features = hidden.detach()  # cut
    """))
    model = backward_in_plain_pytorch(path)
    assert all(p.grad is None for name, p in model.named_parameters() if name in ENCODER)  # really cut
    [finding] = findings_of(lint_file(path), "GL202")
    assert finding.location.line == line_of(path, "# cut") and finding.message.startswith(".detach()")


def test_a_bool_cast_is_not_a_branch_on_a_tensor_value(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)
                self.spare = nn.Linear(8, 8)

            def forward(self, x):
                mask = (x > 0).bool()
                return self.proj(x) * mask


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    [finding] = findings_of(lint_file(path), "GL203")
    assert "spare.weight, spare.bias" in finding.message and "branched" not in finding.message
