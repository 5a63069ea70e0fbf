"""GL106 finds every library-equal spelling of LayerNorm and RMSNorm statistics (`var_mean`, `std_mean` with no
correction, `unbiased=False`, a mean of squares written as `pow(2)`, `x * x`, `square()` or `** 2`; `rsqrt`,
`1 / sqrt`, `** -0.5`) and never an unbiased or otherwise different norm. Each formula is compared with the
library call in plain PyTorch: flagged exactly when it equals it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import findings_of, line_of, lint_file, write

LAYER = '''
import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, inputs):
        x = self.fc(inputs)
{statements}
        return y  # the norm


def make():
    return Norm(), (torch.randn(4, 8, 16),)
'''

LAYER_NORM = lambda x: F.layer_norm(x, (16,), eps=1e-5)  # noqa: E731
RMS_NORM = lambda x: F.rms_norm(x, (16,), eps=1e-6)  # noqa: E731

# statements computing y from x -> the library norm they equal, or None
FORMULAS = {
    "var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)\ny = (x - mean) * torch.rsqrt(var + 1e-5)":
        LAYER_NORM,
    "var, mean = torch.var_mean(x, -1, keepdim=True, unbiased=False)\ny = (x - mean) / torch.sqrt(var + 1e-5)":
        LAYER_NORM,
    "stats = torch.var_mean(x, -1, keepdim=True, correction=0)\ny = (x - stats[1]) * (stats[0] + 1e-5) ** -0.5": LAYER_NORM,
    "std, mean = torch.std_mean(x, -1, keepdim=True, correction=0)\ny = (x - mean) / torch.sqrt(std ** 2 + 1e-5)":
        LAYER_NORM,
    "std = x.std(-1, keepdim=True, unbiased=False)\ny = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(std.square() + 1e-5)":
        LAYER_NORM,
    "var = x.var(-1, False, True)\ny = (x - x.mean(-1, keepdim=True)) * (1 / torch.sqrt(var + 1e-5))": LAYER_NORM,
    "c = x - x.mean(-1, keepdim=True)\ny = c * torch.sqrt(c.pow(2).mean(-1, keepdim=True) + 1e-5).reciprocal()":
        LAYER_NORM,
    "y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)": RMS_NORM,
    "y = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6)": RMS_NORM,
    "y = x / torch.sqrt(torch.square(x).mean(-1, keepdim=True) + 1e-6)": RMS_NORM,
    "y = x * (x ** 2).mean(-1, keepdim=True).add(1e-6).rsqrt()": RMS_NORM,
    "y = x * (1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6))": RMS_NORM,
    "y = x * ((x * x).mean(-1, keepdim=True) + 1e-6) ** -0.5": RMS_NORM,
    # not flagged: unbiased statistics, a different norm, another axis
    "var, mean = torch.var_mean(x, -1, keepdim=True)\ny = (x - mean) * torch.rsqrt(var + 1e-5)": None,
    "std, mean = torch.std_mean(x, -1, keepdim=True)\ny = (x - mean) / torch.sqrt(std ** 2 + 1e-5)": None,
    "std, mean = torch.std_mean(x, -1, keepdim=True, correction=0)\ny = (x - mean) / (std + 1e-5)": None,
    "var, mean = torch.var_mean(x, 0, keepdim=True, correction=0)\ny = (x - mean) * torch.rsqrt(var + 1e-5)": None,
    "var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)\ny = x * torch.rsqrt(var + 1e-5)": None,
    "y = x * torch.rsqrt(x.abs().mean(-1, keepdim=True) + 1e-6)": None,
    "y = x * (x.pow(2).sum(-1, keepdim=True) + 1e-6) ** -0.5": None,
    "y = x * ((x * x).mean(-1, keepdim=True) + 1e-6) ** 0.5": None,
    "y = x * (2 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6))": None,
}


@pytest.mark.parametrize("statements", FORMULAS)
def test_gl106_flags_exactly_the_spellings_that_equal_a_library_norm(statements, tmp_path):
    # float64, and a small variance that shows where epsilon goes
    x = torch.randn(4, 8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.01 + 0.5
    namespace = {"x": x, "torch": torch}
    exec(statements, namespace)
    library = FORMULAS[statements]
    for candidate in (LAYER_NORM, RMS_NORM):
        equal = torch.allclose(namespace["y"], candidate(x), rtol=1e-4, atol=1e-5)
        assert equal == (candidate is library)  # plain PyTorch: it equals the library norm it is flagged as
    body = "\n".join(" " * 8 + line for line in statements.splitlines())
    path = write(tmp_path, "model.py", LAYER.replace("{statements}", body))
    report = lint_file(path)
    assert report.errors == []
    findings = findings_of(report, "GL106")
    if library is None:
        assert findings == []
        return
    [finding] = findings
    assert finding.location.line == line_of(path, "y = ")
    assert finding.message.startswith("LayerNorm" if library is LAYER_NORM else "RMSNorm")
