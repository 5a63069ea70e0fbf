"""GL103 finds the forward's calls that hand a tensor's values to Python, and leaves shape arithmetic alone.

No GPU is needed to know that a call synchronises: a call that needs a tensor's values in Python cannot run on
the meta device, which has none. `test_every_flagged_call_needs_real_values` checks that with plain PyTorch.
"""

from __future__ import annotations

import json
import linecache
import os
import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import backward_in_plain_pytorch, findings_of, line_of, lint_file, run_graphlint, write

MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        for _ in range(3):
{body}
        return h.sum()


def make():
    return Model(), (torch.randn(4, 8),)
'''


def model_with(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 12))


# Each body runs three times per forward; "# sync" marks the line to report. The lambda is the same call in
# plain PyTorch, on a tensor like `h`.
FLAGGED = {
    ".item()": ("h = h * h.max().item()  # sync", lambda h: h.max().item()),
    ".tolist()": ("h = h * len(h[0].tolist())  # sync", lambda h: h[0].tolist()),
    ".cpu()": ("h = h + h.cpu().mean()  # sync", lambda h: h.cpu()),
    ".numpy()": ("h = h + float(h.detach().numpy().mean())  # sync", lambda h: h.detach().numpy()),
    "a branch": ("if (h > 0).any():  # sync\n    h = h * 0.5", lambda h: bool((h > 0).any())),
    "a while loop": ("while h.abs().max() > 10:  # sync\n    h = h / 2", lambda h: bool(h.abs().max() > 10)),
    "int()": ("h = h[: int(h.argmax()) + 1]  # sync", lambda h: int(h.argmax())),
    "nonzero": ("h = h + h.nonzero().sum()  # sync", lambda h: h.nonzero()),
    "a boolean mask": ("h = h + h[h > 0].sum()  # sync", lambda h: h[h > 0]),
    "masked_select": ("h = h + h.masked_select(h > 0).sum()  # sync", lambda h: h.masked_select(h > 0)),
    "unique": ("h = h + h.unique().sum()  # sync", lambda h: h.unique()),
    "one-argument where": ("h = h + torch.where(h > 0)[0].sum()  # sync", lambda h: torch.where(h > 0)),
}

NOT_FLAGGED = {
    "shape arithmetic": "h = h.reshape(h.shape[0], h.size(-1)) * (1.0 / len(h))",
    "Python numbers": "h = h * (2.0 ** -0.5) + sum([1, 2])",
    "choosing with torch.where and masked_fill": "h = torch.where(h > 0, h, 0.0).masked_fill(h > 3, 3.0)",
    "casts named like Python conversions": "h = h.float().int().float() + h.bool().float() + h.double().float()",
    "indexing with slices and integer tensors": "h = h[:, :4].repeat(1, 2) + h.gather(1, h.argmax(1, keepdim=True))",
}


@pytest.mark.parametrize("body", [b for b, _ in FLAGGED.values()], ids=FLAGGED.keys())
def test_a_call_that_needs_values_is_flagged_once_with_its_count(body, tmp_path):
    path = write(tmp_path, "model.py", model_with(body))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL103")
    assert finding.location.line == line_of(path, "# sync")
    assert finding.occurrences == 3
    assert "waits for the device on every forward and breaks a torch.compile graph (3 occurrences)" in finding.message


@pytest.mark.parametrize("call", [c for _, c in FLAGGED.values()], ids=FLAGGED.keys())
def test_every_flagged_call_needs_real_values(call):
    """On the meta device a tensor has no values: a call that fails there is one that reads them on the host."""
    call(torch.randn(4, 8))  # fine with values
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        call(torch.randn(4, 8, device="meta"))


def test_printing_a_tensor_reads_its_values_and_is_flagged(tmp_path):
    assert "0.2500" in repr(torch.full((2,), 0.25))  # the printed text holds the values, read on the host
    path = write(tmp_path, "model.py", model_with('print(f"{h}")  # sync\nprint(h)'))
    report = lint_file(path)
    assert report.errors == []
    assert [(f.location.line, f.occurrences) for f in findings_of(report, "GL103")] == [
        (line_of(path, "# sync"), 3), (line_of(path, "# sync") + 1, 3)]


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_shape_arithmetic_and_device_side_choices_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", model_with(body)))
    assert report.errors == []
    assert findings_of(report, "GL103") == []


def test_an_item_that_cuts_parameters_from_the_loss_is_only_a_gradient_cut(tmp_path):
    path = write(tmp_path, "model.py", '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.temperature = nn.Linear(8, 1)

    def forward(self, x):
        t = self.temperature(x).mean().item()  # the cut
        scale = self.fc(x).abs().max().item()  # a sync only
        return self.fc(x) / (t * scale)


def make():
    return Model(), (torch.randn(4, 8),)
''')
    report = lint_file(path)
    assert report.errors == []
    assert [f.location.line for f in findings_of(report, "GL202")] == [line_of(path, "# the cut")]
    assert [f.location.line for f in findings_of(report, "GL103")] == [line_of(path, "# a sync only")]


SHARED_LINE = '''
import numpy as np
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gate = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
{body}
        return (h * g).sum()


def make():
    return Model(), (torch.randn(4, 8),)
'''

# One host-trip policy: a line where GL202 reports a cut gets no GL103, whatever trips it holds; "# cut" marks it.
SHARED = {
    "detach, cpu and numpy": "g = torch.from_numpy(self.gate(x).detach().cpu().numpy())  # cut",
    "cpu then numpy": "g = torch.from_numpy(np.tanh(self.gate(x).cpu().detach().numpy()))  # cut",
    "an .item() that cuts": "g = torch.full_like(h, self.gate(x).mean().item())  # cut",
    "tolist and back": "g = torch.tensor(self.gate(x).tolist())  # cut",
    "an .item() in a no_grad block": "with torch.no_grad():\n    s = self.gate(x).abs().max().item()  # cut\ng = h * s",
}


@pytest.mark.parametrize("body", SHARED.values(), ids=SHARED.keys())
def test_a_line_that_cuts_gradients_and_syncs_is_reported_once_as_the_cut(body, tmp_path):
    path = write(tmp_path, "model.py", SHARED_LINE.replace("{body}", textwrap.indent(body, " " * 8)))
    model = backward_in_plain_pytorch(path)
    assert model.gate.weight.grad is None and model.fc.weight.grad is not None  # plain PyTorch: really cut
    report = lint_file(path)
    assert report.errors == []
    [cut] = findings_of(report, "GL202")
    assert cut.location.line == line_of(path, "# cut")
    assert "gate.weight, gate.bias" in cut.message
    assert findings_of(report, "GL103") == findings_of(report, "GL104") == []  # the way back is the same trip


def test_a_host_trip_that_cuts_nothing_keeps_its_own_finding_beside_a_cut(tmp_path):
    body = ("g = torch.from_numpy(self.gate(x).detach().cpu().numpy())  # cut\n"
            "logged = h.detach().cpu().numpy()  # a sync only")
    path = write(tmp_path, "model.py", SHARED_LINE.replace("{body}", textwrap.indent(body, " " * 8)))
    report = lint_file(path)
    assert [f.location.line for f in findings_of(report, "GL202")] == [line_of(path, "# cut")]
    assert {f.location.line for f in findings_of(report, "GL103")} == {line_of(path, "# a sync only")}


def test_a_host_trip_that_cuts_says_it_also_waits_for_the_device(tmp_path):
    path = write(tmp_path, "model.py", SHARED_LINE.replace("{body}", textwrap.indent(SHARED["an .item() that cuts"], " " * 8)))
    [cut] = findings_of(lint_file(path), "GL202")
    assert cut.message.startswith(".item() in the model takes the value out of torch, which cuts gate.weight, gate.bias")
    assert "waits for the device on every forward; keep the computation in tensors" in cut.message


PACKED = '''
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted={sorted})
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True)  # the helper
        return out.sum()


def make():
    return Tagger(), (torch.randn(3, 5, 8), torch.tensor({lengths}))
'''


class _HostReads(TorchFunctionMode):
    """Plain PyTorch: the calls that hand a value to the host, wherever they are made (torch's helpers too)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("cpu", "item", "tolist", "__bool__"):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _host_reads(path) -> list[str]:
    namespace = {"__name__": "plain_model"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    model, args = namespace["make"]()
    with _HostReads() as mode:
        model(*args)
    return mode.calls


def test_a_sync_inside_a_torch_helper_names_the_helper_its_cause_and_the_remedy(tmp_path):
    path = write(tmp_path, "model.py", PACKED.format(sorted=False, lengths=[5, 3, 4]))
    assert _host_reads(path) == ["cpu"]  # plain PyTorch: pad_packed_sequence copies to the host
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL103")
    assert finding.location.line == line_of(path, "# the helper")
    assert finding.message.startswith("torch's pad_packed_sequence() in the model copies the batch's unsorted_indices "
                                      "to the host (.cpu()) because the batch was packed with enforce_sorted=False")
    assert finding.message.endswith("pack it with enforce_sorted=True.")
    [torch_line] = finding.related
    assert torch_line.location.path.endswith(os.path.join("torch", "nn", "utils", "rnn.py"))
    assert "unsorted_indices.cpu()" in linecache.getline(torch_line.location.path, torch_line.location.line)
    assert torch_line.message == ".cpu() inside torch's pad_packed_sequence()"


def test_a_sorted_packed_batch_does_not_sync(tmp_path):
    path = write(tmp_path, "model.py", PACKED.format(sorted=True, lengths=[5, 4, 3]))
    assert _host_reads(path) == []
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL103") == []


DISTRIBUTION = '''
import torch
from torch import nn
from torch.distributions import Normal


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.mu = nn.Linear(8, 2)
        self.log_std = nn.Parameter(torch.zeros(2))

    def forward(self, obs, actions):
        dist = Normal(self.mu(obs), self.log_std.exp(){options})  # the distribution
        return -dist.log_prob(actions).sum()  # the sample


def make():
    return Policy(), (torch.randn(4, 8), torch.randn(4, 2))
'''


def test_a_generic_torch_helper_is_named_with_its_line_related(tmp_path):
    path = write(tmp_path, "model.py", DISTRIBUTION.format(options=""))
    assert "__bool__" in _host_reads(path)  # plain PyTorch: the argument checks branch on values
    report = lint_file(path)
    found = {f.location.line: f for f in findings_of(report, "GL103")}
    assert sorted(found) == [line_of(path, "# the distribution"), line_of(path, "# the sample")]
    made = found[line_of(path, "# the distribution")]
    assert made.message.startswith("torch's Normal.__init__() in the model checks its arguments' values on the host")
    assert "pass validate_args=False" in made.message
    assert all(r.location.path.endswith("distribution.py") for f in found.values() for r in f.related)


def test_a_distribution_without_argument_checks_does_not_sync(tmp_path):
    path = write(tmp_path, "model.py", DISTRIBUTION.format(options=", validate_args=False"))
    assert _host_reads(path) == []
    assert findings_of(lint_file(path), "GL103") == []


def test_a_call_inside_an_installed_library_is_not_flagged(tmp_path):
    write(tmp_path / "site-packages", "steplib.py", '''
def scaled(h):
    return h / h.abs().max().item()
''')
    path = write(tmp_path, "model.py", model_with("h = steplib.scaled(h)").replace(
        "import torch\n", "import sys\nsys.path.insert(0, __file__.rsplit('/', 1)[0] + '/site-packages')\n"
                          "import steplib\nimport torch\n", 1))
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL103") == []


def test_the_cpu_rebuild_after_the_meta_attempt_reports_the_sync_once(tmp_path):
    path = write(tmp_path, "model.py", model_with("h = h * h.max().item()  # sync"))
    result = run_graphlint("check", f"{path}:make", "--format", "json", "--no-cache", cwd=tmp_path)
    report = json.loads(result.stdout)
    [note] = [n["message"] for n in report["notes"]]
    assert note.startswith("captured on CPU because the forward needs real values (.item() at model.py:")
    [finding] = [f for f in report["findings"] if f["rule"] == "GL103"]
    assert finding["location"]["line"] == line_of(path, "# sync")
    assert finding["occurrences"] == 3
    assert finding["message"].startswith(".item() in the model copies a value to Python")


HOST_MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        n = x.shape[1]
        offsets = torch.arange(n).tolist()  # host
        k = int((torch.arange(n) * 2).max())  # host
        picked = torch.ones(n, dtype=torch.bool, device="cpu").nonzero()  # host
        h = self.fc(x)[:, : k + 1]
        steps = torch.arange(n, device=x.device)
        limit = int(steps.max())  # device
        shift = torch.arange(n).to(x.device)
        last = shift[-1].item()  # device
        return h.sum() + sum(offsets) + limit + last + len(picked)


def make():
    return Model(), (torch.randn(4, 8),)
'''


def test_reads_of_tensors_made_on_the_host_are_not_flagged(tmp_path):
    """`torch.arange(n)` with no device lives on the host wherever the model runs: reading it waits for no device.
    A factory given the input's device, or a host tensor moved there, is on the device and still flagged."""
    path = write(tmp_path, "model.py", HOST_MODEL)
    report = lint_file(path)
    assert report.errors == []
    lines = sorted(f.location.line for f in findings_of(report, "GL103"))
    source = path.read_text().splitlines()
    assert lines == [i for i, text in enumerate(source, 1) if text.endswith("# device")]


def test_host_reads_need_no_device_in_plain_pytorch():
    """The same lines in plain PyTorch on a model on the meta device: the host reads run (the factory made a CPU
    tensor), while the device-side ones cannot read values there."""
    n = 8
    assert torch.arange(n).device.type == "cpu"
    assert torch.arange(n).tolist() == list(range(n))
    assert int((torch.arange(n) * 2).max()) == 14
    x = torch.randn(4, n, device="meta")
    with pytest.raises(RuntimeError, match="meta"):
        int(torch.arange(n, device=x.device).max())
    with pytest.raises(RuntimeError, match="meta"):
        torch.arange(n).to(x.device)[-1].item()
