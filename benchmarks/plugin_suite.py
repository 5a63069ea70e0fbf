"""A generated test suite for the pytest plugin's overhead: many small model tests, as a model repository's
suite has them, run plain and with `pytest --graphlint`.

    write_suite(folder) -> (the project's folder, tests, distinct models)

Four model classes; each is built and trained for a few steps by eight tests, each at its own line with the same
constructor arguments and input shapes (one model to lint per class, however many tests build it), and one
class is also built by a parametrized test in four other constructor calls (four models more). One class branches
on a value, so it is captured on the CPU, where the inputs' values count: its tests all call it on `torch.ones`.
"""

from __future__ import annotations

from pathlib import Path

MODELS = '''
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        return self.out((attention @ v).transpose(1, 2).reshape(b, n, d))


class ConvNet(nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                 nn.Conv2d(channels, 3, 3, padding=1))

    def forward(self, x):
        return self.net(x)


class Gate(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        if x.mean() > 0:
            return self.fc(x)
        return x
'''

TEST = '''

def test_{name}_{index}():
    torch.manual_seed({index})
    model = {build}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        loss = model({inputs}).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss)
'''

BUILDS = {"mlp": ("Mlp(32)", "torch.randn(16, 32)"), "attention": ("Attention(32)", "torch.randn(4, 16, 32)"),
          "convnet": ("ConvNet(8)", "torch.randn(4, 3, 16, 16)"), "gate": ("Gate(32)", "torch.ones(16, 32)")}

PARAMETRIZED = '''

@pytest.mark.parametrize("hidden", [32, 64, 128, 256])
def test_mlp_sizes(hidden):
    model = Mlp(32, hidden)
    loss = model(torch.randn(16, 32)).square().mean()
    loss.backward()
    assert torch.isfinite(loss)
'''


def write_suite(folder: Path, per_class: int = 8, steps: int = 20) -> tuple[Path, int, int]:
    """The project, its number of tests and its number of distinct models (what `--graphlint` lints)."""
    project = folder / "plugin-suite"
    (project / "src" / "suite").mkdir(parents=True, exist_ok=True)
    (project / "tests").mkdir(exist_ok=True)
    (project / "src" / "suite" / "__init__.py").write_text("")
    (project / "src" / "suite" / "models.py").write_text(MODELS)
    (project / "pyproject.toml").write_text('[project]\nname = "suite"\nversion = "0"\n'
                                            '[tool.pytest.ini_options]\npythonpath = ["src"]\n')
    tests = ["import pytest\nimport torch\n\nfrom suite.models import Attention, ConvNet, Gate, Mlp\n\n"
             f"STEPS = {steps}\n"]
    for name, (build, inputs) in BUILDS.items():
        tests += [TEST.format(name=name, index=index, build=build, inputs=inputs) for index in range(per_class)]
    tests.append(PARAMETRIZED)
    (project / "tests" / "test_models.py").write_text("".join(tests))
    # Mlp(32, 64) is another constructor call than Mlp(32), though 64 is the default: another model.
    return project, per_class * len(BUILDS) + 4, len(BUILDS) + 4
