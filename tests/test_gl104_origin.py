"""GL104 judges a tensor by its origin: made on the host inside the forward by any means (calls the capture
cannot see, such as `torch.from_numpy` and legacy constructors like `torch.FloatTensor(n)`, included), then
copied to the device, also on paths taken only on a GPU (`v.cuda() if w.is_cuda else v`, `if x.is_cuda:`).

Checked in plain PyTorch with the meta device standing in for a GPU: `is_cuda` answers True for it and `.cuda()`
moves there, and a counting mode sees every copy of a CPU tensor to the device during the forward.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import findings_of, line_of, lint_file, write
from graphlint.rules.gl104_host_tensor_in_forward import HostTensorInForward

MODEL = '''
import numpy as np
import torch
import torch as T
from torch import nn
from torch import from_numpy

TABLE = torch.arange(8.0)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.fc = nn.Linear(8, 8)
        self.noise = np.full(50, 1 / 50)
        self.plain = torch.arange(4)

    def forward(self, ids):
        h = self.emb(ids)
{body}
        return self.fc(h).sum()


def make():
    return Model(), (torch.randint(0, 50, (2, 4)),)
'''


def model_with(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


# "# made" marks the line to report, "# moved" or "# used" the related location.
FLAGGED = {
    "from_numpy moved with .to(device)": "picks = torch.from_numpy(np.random.choice(50, 8, p=self.noise))  # made\n"
                                         "picks = picks.to(ids.device)  # moved\nh = h + self.emb(picks).sum()",
    "from_numpy imported by name, moved with .to(tensor)": "m = from_numpy(np.ones((2, 4, 8), dtype=np.float32)).to(h)"
                                                           "  # made\nh = h * m",
    "a legacy constructor sampled, moved on a GPU-only path":
        "neg = torch.FloatTensor(16).uniform_(0, 49).long()  # made\n"
        "neg = neg.cuda() if self.emb.weight.is_cuda else neg\nh = h + self.emb(neg).sum()  # used",
    "a legacy constructor of a list, moved under if x.is_cuda":
        "w = T.LongTensor([1, 2, 3])  # made\nif ids.is_cuda:\n    w = w.cuda()\nh = h + self.emb(w).sum()  # used",
    "a numpy array of the model's, used as an index": "idx = torch.from_numpy(np.arange(8) % 2)  # made\n"
                                                     "h = h + self.fc.weight[idx].sum()  # used",
    "a factory without device, moved on a GPU-only path":
        "mask = torch.ones(4, 4).tril()  # made\nif ids.device.type == 'cuda':\n    mask = mask.to(ids.device)\n"
        "h = (mask @ h)  # used",
    "a factory without device, moved in a conditional expression":
        "noise = torch.randn(8)  # made\nnoise = noise.cuda() if h.is_cuda else noise\nh = h + noise  # used",
    "asarray of a Python list, moved": "w = torch.asarray([0.5, 2.0] * 4)  # made\nh = h * w.to(ids.device)  # moved",
}

NOT_FLAGGED = {
    "a module-level constant moved": "h = h + TABLE.to(ids.device)",
    "a plain attribute made in __init__, moved": "h = h + self.emb(self.plain.to(ids.device)).sum()",
    "rows of the input, moved": "for row in ids:\n    h = h + self.emb(row.to(ids.device)).sum()",
    "a single number from numpy": "h = h * torch.from_numpy(np.array(2.0, dtype=np.float32))",
    "a host tensor kept on the host": "n = torch.from_numpy(np.ones(3)).sum().item()\nh = h * n",
    "a factory without device and no move anywhere": "h = h + torch.ones(8)",
    "a dtype-only cast on a GPU-only path": "w = torch.ones(8)\nif h.is_cuda:\n    w = w.half()\nh = h + w",
}


@pytest.mark.parametrize("body", FLAGGED.values(), ids=FLAGGED.keys())
def test_a_tensor_made_on_the_host_in_the_forward_is_flagged_where_it_was_made(body, tmp_path):
    path = write(tmp_path, "model.py", model_with(body))
    assert _host_to_device_copies(path) >= 1  # plain PyTorch: the copy happens on the device
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL104")
    assert finding.location.line == line_of(path, "# made")
    assert "copied to the device on every forward" in finding.message or "copies to the device on every" in finding.message
    [related] = finding.related
    marker = "# moved" if "# moved" in body else "# used" if "# used" in body else "# made"
    assert related.location.line == line_of(path, marker)


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_tensors_not_made_on_the_host_in_the_forward_are_not_flagged(body, tmp_path):
    path = write(tmp_path, "model.py", model_with(body))
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL104") == []


def test_python_data_given_to_new_tensor_in_every_forward_is_flagged(tmp_path):
    path = write(tmp_path, "model.py", model_with("h = h * h.new_tensor([0.5, 2.0] * 4)  # made\n"
                                                  "h = h * h.new_tensor(h.detach())"))
    [finding] = findings_of(lint_file(path), "GL104")
    assert finding.location.line == line_of(path, "# made")
    assert finding.message.startswith(".new_tensor() of Python data in the model copies that data to the device")


def test_the_span_is_the_call_that_made_it(tmp_path):
    path = write(tmp_path, "model.py", model_with(FLAGGED["a legacy constructor sampled, moved on a GPU-only path"]))
    [finding] = findings_of(lint_file(path), "GL104")
    line = path.read_text().splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1 : finding.location.end_column - 1] == \
        "torch.FloatTensor(16).uniform_(0, 49).long()"
    assert finding.message.startswith("A tensor made on the host in the model (by a call such as torch.from_numpy")


@pytest.mark.parametrize("example", [e for e in HostTensorInForward.bad_examples if "from_numpy" in e.code],
                         ids=lambda e: e.title.replace(" ", "-"))
def test_the_examples_copy_once_per_flagged_line(example, tmp_path):
    path = write(tmp_path, "example.py", example.code)
    assert _host_to_device_copies(path) == len(example.expected_lines("GL104"))


class _Copies(TorchFunctionMode):
    """Counts copies of CPU tensors to the meta device (standing in for a GPU): moves, and calls that take a
    CPU tensor (not a single number) beside device tensors, which a GPU copies first (indexing with it)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if getattr(func, "__name__", "") in ("to", "cuda"):
            if isinstance(out, torch.Tensor) and tensors[0].device.type == "cpu" and out.device.type == "meta":
                self.count += 1
        elif any(t.device.type == "meta" for t in tensors):
            self.count += sum(t.device.type == "cpu" and t.dim() > 0 for t in tensors)
        return out


def _host_to_device_copies(path) -> int:
    """Runs the model with the meta device as the GPU: `is_cuda` is True on it, `.cuda()` moves there, and the
    string "cuda" in the source names it."""
    source = path.read_text().replace("'cuda'", "'meta'").replace('"cuda"', '"meta"')
    namespace = {"__name__": f"plain_{path.stem}"}
    exec(compile(source, str(path), "exec"), namespace)
    model, args = namespace["make"]()
    model.to("meta")
    patched = {"is_cuda": property(lambda t: t.device.type == "meta"), "cuda": lambda t, *a, **k: t.to("meta")}
    saved = {name: torch.Tensor.__dict__.get(name) for name in patched}
    for name, value in patched.items():
        setattr(torch.Tensor, name, value)
    args = tuple(a.to("meta") for a in args)
    try:
        with _Copies() as copies:
            model(*args)
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)
    return copies.count


_TEMPORARIES_THEN_MORE = """
import numpy as np
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)

    def forward(self, words):
        total = 0
        for _ in range(16):
            sampled = torch.FloatTensor(4).uniform_(0, 49).long()  # made in a loop
            total = total + self.embed(sampled).sum()
""" + "".join(f"""        total = total + self.embed(torch.from_numpy(np.arange({n}))).sum()  # made {n}
""" for n in range(1, 7)) + """        return total + self.embed(words).sum()


def make():
    return Model(), (torch.randint(0, 50, (2, 6)),)
"""


def test_a_host_tensor_is_flagged_though_it_reuses_the_id_of_one_that_died(tmp_path):
    """Python gives a new tensor the id of one freed before it: each host-made tensor is its own, however many
    temporaries died earlier in the forward (the capture once took a later one for an earlier, and lost it)."""
    path = write(tmp_path, "model.py", _TEMPORARIES_THEN_MORE)
    expected = [line_of(path, "# made in a loop")] + [line_of(path, f"# made {n}") for n in range(1, 7)]
    for _ in range(3):  # the ids Python reuses vary from run to run
        assert sorted(f.location.line for f in findings_of(lint_file(path), "GL104")) == expected
