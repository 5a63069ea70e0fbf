"""GL102 finds dtype conversions repeated by loops and layers, and leaves one-off and sensitive casts alone."""

from __future__ import annotations

import textwrap

import pytest

from conftest import findings_of, line_of, lint_file, write

LOOP = '''
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(16, 16)

    def forward(self, x, mask):
        h = x.new_zeros(x.shape[1], 16)
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
{body}
        return h.float()


def make():
    return Decoder().half(), (torch.randn(6, 4, 16, dtype=torch.float16), torch.ones(6, 4, 1, dtype=torch.bool))
'''


def loop_model(body: str) -> str:
    return LOOP.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 12))


LOOP_INVARIANT = {
    "the whole mask, then indexed": "h = h * mask.to(h.dtype)[t]  # cast",
    "indexed, then converted": "h = h * mask[t].half()  # cast",
    "a parameter converted at every step": "h = h + self.cell.bias_hh.float().half()[:16]  # cast",
}

NOT_FLAGGED = {
    "no-op casts of a tensor already in the dtype": "h = h.half().to(torch.float16) + x[t].half()",
    "a different tensor converted at each step": "h = (h.float() * 2).half()",
}


@pytest.mark.parametrize("body", LOOP_INVARIANT.values(), ids=LOOP_INVARIANT.keys())
def test_a_loop_invariant_cast_is_flagged_with_its_count(body, tmp_path):
    path = write(tmp_path, "model.py", loop_model(body))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert finding.location.line == line_of(path, "# cast")
    assert finding.occurrences == 6
    assert "6 times in one forward (in the model); convert it once, before the loop" in finding.message


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_casts_that_are_no_ops_or_of_new_values_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", loop_model(body)))
    assert report.errors == []
    assert findings_of(report, "GL102") == []


LAYERS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.conv = nn.Conv1d(16, 16, 1)

    def forward(self, x):
{body}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make():
    return Model(), (torch.randn(2, 16, 8, dtype=torch.{dtype}),)
'''


def layers_model(body: str, dtype: str = "float16") -> str:
    source = LAYERS.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))
    return source.replace("{dtype}", dtype)


ROUND_TRIPS = {
    "Linear": ("return x + self.fc(x.transpose(1, 2).float()).half().transpose(1, 2)  # trip", "float16", "linear"),
    "convolution with an activation between": (
        "return torch.relu(self.conv(x.to(torch.float32))).to(torch.float16)  # trip", "float16", "conv1d"),
    "bfloat16 matmul": ("w = self.fc.weight\nreturn (w @ x.float()).bfloat16()  # trip", "bfloat16", "matmul"),
}


@pytest.mark.parametrize("case", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_a_round_trip_around_matrix_work_in_every_layer_is_flagged(case, tmp_path):
    body, dtype, work = case
    path = write(tmp_path, "model.py", layers_model(body, dtype))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert finding.location.line == line_of(path, "# trip")
    assert finding.message.startswith(f"The {dtype} → float32 → {work} → {dtype} round trip runs 4 times in one "
                                      "forward (in blocks.0 … blocks.3); run the layer under torch.autocast")
    assert {r.message for r in finding.related} >= {f"{work} in float32", f"cast back to {dtype}"}


SENSITIVE = {
    "float32 softmax": "return torch.softmax(x.float(), dim=-1).half()",
    "float32 layer norm after a Linear": ("h = self.fc(x.transpose(1, 2).float())\n"
                                          "return torch.nn.functional.layer_norm(h, (16,)).half().transpose(1, 2)"),
    "float32 variance": "v = x.float().pow(2).mean(-1, keepdim=True)\nreturn (x * torch.rsqrt(v + 1e-6).half())",
    "float32 log-sum-exp of matrix work": ("return x + torch.logsumexp(self.fc(x.transpose(1, 2).float()), -1, "
                                           "keepdim=True).half().transpose(1, 2)"),
}


@pytest.mark.parametrize("body", SENSITIVE.values(), ids=SENSITIVE.keys())
def test_up_casts_around_numerically_sensitive_work_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", layers_model(body)))
    assert report.errors == []
    assert findings_of(report, "GL102") == []


def test_a_single_cast_outside_any_loop_is_not_flagged(tmp_path):
    path = write(tmp_path, "model.py", layers_model("return x + self.fc(x.transpose(1, 2)).transpose(1, 2)", "float32")
                 .replace("        return x\n\n\ndef make", "        return x.float()\n\n\ndef make"))
    report = lint_file(path)
    assert report.errors == [] and findings_of(report, "GL102") == []


def test_a_cast_repeated_inside_an_installed_library_is_not_flagged(tmp_path):
    """A library block that converts the same input again in every layer (a diffusion model's timestep
    embedding) is not the user's to move; the same code in the project is."""
    library = '''
import torch


def embed(mask, h):
    return h * mask.to(h.dtype)  # cast
'''
    write(tmp_path / "site-packages", "masklib.py", library)
    call = "h = masklib.embed(mask[t], h)"
    path = write(tmp_path, "model.py", loop_model(call).replace(
        "import torch\n", "import sys\nsys.path.insert(0, __file__.rsplit('/', 1)[0] + '/site-packages')\n"
                          "import masklib\nimport torch\n", 1))
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL102") == []
    write(tmp_path / "project", "masklib.py", library)  # the same code as the project's own: flagged
    own = write(tmp_path / "project", "model.py", path.read_text().replace("/site-packages", "/project"))
    [finding] = findings_of(lint_file(own), "GL102")
    assert finding.location.path == str(tmp_path / "project" / "masklib.py") and finding.occurrences == 6
