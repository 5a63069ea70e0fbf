"""GL104 finds tensors that the forward builds on the host and then copies to the device.

With the model and inputs on the meta device standing in for a GPU, plain PyTorch shows the problem: a factory
call without `device=` fills host memory (its result is on the CPU) before the move.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import findings_of, line_of, lint_file, write
from graphlint.rules.gl104_host_tensor_in_forward import FACTORIES, HostTensorInForward

MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
{body}
        return h.sum()


def make():
    return Model(), (torch.randn(4, 8),)
'''


def model_with(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


# "# built" marks the factory calls, "# moved" the move when it is on another line; then how many factory calls.
FLAGGED = {
    "arange moved with .to(device)": ("h = h + torch.arange(8).to(h.device)  # built", 1),
    "randn moved with .to(tensor)": ("h = h + torch.randn(4, 8).to(h)  # built", 1),
    "a mask moved with .type_as after host work":
        ("mask = torch.ones(8, 8)  # built\nh = h @ mask.tril().type_as(h)  # moved", 1),
    "eye moved with .to(device=...)": ("h = h @ torch.eye(8, dtype=h.dtype).to(device=h.device)  # built", 1),
    "two factories combined on the host, then moved":
        ("z = torch.zeros(4, 1) + torch.arange(8)  # built\nh = h + z.to(h.device)  # moved", 2),
}

NOT_FLAGGED = {
    "factories given the device": "h = h + torch.arange(8, device=h.device) + torch.full((), 2.0, device=h.device)",
    "tensors made from the input": "h = h + h.new_zeros(4, 8) + torch.zeros_like(h) + torch.ones_like(h)",
    "a dtype-only cast": "h = h + torch.ones(8).to(torch.float32)",
    "a host tensor kept on the host": 'h = h + torch.ones(8).to("cpu")',
    "a deliberate host generator": "g = torch.Generator().manual_seed(0)\nh = h + torch.randn(4, 8, generator=g).to(h.device)",
}


@pytest.mark.parametrize(("body", "calls"), FLAGGED.values(), ids=FLAGGED.keys())
def test_a_host_tensor_moved_in_the_forward_is_flagged_at_its_factory(body, calls, tmp_path):
    path = write(tmp_path, "model.py", model_with(body))
    report = lint_file(path)
    assert report.errors == []
    findings = findings_of(report, "GL104")
    assert len(findings) == calls  # one per factory call
    for finding in findings:
        assert finding.location.line == line_of(path, "# built")
        assert "on the host that is copied to the device on every forward; pass device=..." in finding.message
        [move] = finding.related
        assert move.message.startswith("copied to the device by .")
        if "# moved" in body:
            assert move.location.line == line_of(path, "# moved")


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_tensors_made_on_the_device_or_kept_on_the_host_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", model_with(body)))
    assert report.errors == []
    assert findings_of(report, "GL104") == []


def test_python_data_given_to_torch_tensor_in_every_forward_is_flagged(tmp_path):
    path = write(tmp_path, "model.py", model_with('''
        for _ in range(2):
            h = h * torch.tensor([0.5, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], device=h.device)  # built
        h = h * torch.tensor(h.shape[0], device=h.device)  # built once
        h = h * torch.tensor(h.detach(), device=h.device)
    '''))
    report = lint_file(path)
    assert report.errors == []
    found = {f.location.line: f for f in findings_of(report, "GL104")}
    assert sorted(found) == [line_of(path, "# built"), line_of(path, "# built once")]
    assert found[line_of(path, "# built")].occurrences == 2
    assert "register it once as a buffer in __init__" in found[line_of(path, "# built")].message


class _HostCopies(TorchFunctionMode):
    """Plain PyTorch: for each torch factory call, whether its data started on the host, either filled on the
    CPU (its result is there) or given as Python data."""

    def __init__(self):
        super().__init__()
        self.from_host = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in FACTORIES and isinstance(out, torch.Tensor):
            python_data = name in ("tensor", "as_tensor") and not isinstance(args[0], torch.Tensor)
            self.from_host.append(out.device.type == "cpu" or python_data)
        return out


def _from_host(path):
    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, args = module.make()
    model.to("meta")  # standing in for the GPU: no default device, as in a training script
    with _HostCopies() as mode:
        model(*(a.to("meta") for a in args))
    return mode.from_host


# Examples made with calls no TorchFunctionMode sees (torch.from_numpy, legacy constructors) are checked by
# counting the copies themselves, in test_gl104_origin.py.
RECORDED_EXAMPLES = [e for e in HostTensorInForward.bad_examples + HostTensorInForward.good_examples
                     if "from_numpy" not in e.code and "Tensor(" not in e.code]


@pytest.mark.parametrize("example", RECORDED_EXAMPLES, ids=lambda e: e.title.replace(" ", "-"))
def test_the_examples_build_on_the_host_exactly_when_flagged(example, tmp_path):
    from_host = _from_host(write(tmp_path, "example.py", example.code))
    assert from_host  # the forward does build tensors
    expected = len(example.expected_lines("GL104")) if example in HostTensorInForward.bad_examples else 0
    assert from_host.count(True) == expected
