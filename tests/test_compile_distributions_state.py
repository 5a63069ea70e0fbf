"""The torch.compile analysis runs in the process state a program's own torch.compile runs in: dynamo's first
compilation switches torch.distributions' argument checks off process-wide, so a gate using `Normal.cdf` has no
graph break there in plain torch.compile, and GL301 reports none; the eager capture still runs them (GL103)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import findings_of, lint_file, write

pytestmark = pytest.mark.compile

GATE = '''
import torch
import torch.nn as nn
from torch.distributions.normal import Normal


class NoisyGate(nn.Module):
    """A mixture-of-experts gate: the probability that each expert stays in the top k under noise."""

    def __init__(self, dim=16, experts=4, k=2):
        super().__init__()
        self.k = k
        self.w_gate = nn.Linear(dim, experts)
        self.w_noise = nn.Linear(dim, experts)
        self.register_buffer("mean", torch.tensor([0.0]))
        self.register_buffer("std", torch.tensor([1.0]))

    def forward(self, x):
        clean = self.w_gate(x)
        noise_std = nn.functional.softplus(self.w_noise(x)) + 1e-2
        noisy = clean + torch.randn_like(clean) * noise_std
        threshold = noisy.topk(self.k, dim=-1).values[:, -1:]
        normal = Normal(self.mean, self.std{extra})
        gates = normal.cdf((clean - threshold) / noise_std)
        {line}
        return gates


def make():
    return NoisyGate(), (torch.randn(8, 16),)
'''

# Plain torch.compile in a fresh process, as a user's program runs it: graph breaks by dynamo's own count, with
# gradients on (as training runs), on the factory's inputs (every break reason: torch 2.13's graph_break_count leaves out
# a break after which no op follows).
PLAIN = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from {module} import make
model, args = make()
with torch.enable_grad():
    explained = torch._dynamo.explain(model)(*args)
print(json.dumps([len(explained.break_reasons), torch.distributions.Distribution._validate_args]))
"""


def _plain_breaks(path) -> tuple[int, bool]:
    done = subprocess.run([sys.executable, "-c", PLAIN.format(module=path.stem), str(path.parent)],
                          capture_output=True, text=True, timeout=300, check=True)
    count, validating = json.loads(done.stdout.strip().splitlines()[-1])
    return count, validating


@pytest.mark.parametrize("name,extra,line,breaks", [
    ("gate", "", "", 0),  # the argument checks: no break in plain torch.compile
    ("gate_validated", ", validate_args=True", "", None),  # checks asked for by the model itself
    ("gate_breaking", "", "torch._dynamo.graph_break()", 1),  # a break plain torch.compile has: still reported
])
def test_gl301_breaks_are_plain_torch_compiles_on_a_distributions_gate(tmp_path, name, extra, line, breaks):
    path = write(tmp_path, f"{name}.py", GATE.replace("{extra}", extra).replace("{line}", line or "pass"))
    plain, validating_after = _plain_breaks(path)
    assert validating_after is False  # what plain torch.compile leaves the program's process with
    if breaks is not None:
        assert plain == breaks
    before = torch.distributions.Distribution._validate_args
    report = lint_file(path, select=("GL301", "GL103"))
    assert torch.distributions.Distribution._validate_args == before  # the test process's own state, as it was
    found = findings_of(report, "GL301")
    if breaks is None:  # checks the model asks for break plain torch.compile's graph too (counted its own way)
        assert plain > 0 and found, [f.message for f in found]
    else:
        assert sum(f.occurrences for f in found) == plain, [f.message for f in found]
    # The eager forward runs the checks (no torch.compile in a plain program): GL103 says where.
    assert findings_of(report, "GL103") or extra
