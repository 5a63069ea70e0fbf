"""GL201 inplace-on-saved: an in-place write to a tensor that autograd saved for the backward pass."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from graphlint.capture import facts
from graphlint.capture.autograd import AutogradNode, SavedTensor
from graphlint.ops import op
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Problem, Rule

if TYPE_CHECKING:  # annotations only: the rule's module imports no torch of its own
    from torch import fx

# Positional index of `inplace` in functionals that take it (modules pass it by keyword).
_INPLACE_POSITION = {"relu": 1, "relu6": 1, "selu": 1, "silu": 1, "mish": 1, "hardswish": 1, "hardsigmoid": 1,
                     "elu": 2, "celu": 2, "leaky_relu": 2, "hardtanh": 3, "threshold": 3, "dropout": 3,
                     "dropout1d": 3, "dropout2d": 3, "dropout3d": 3, "alpha_dropout": 3, "feature_alpha_dropout": 3}
_OPERATORS = {"add_": "+", "sub_": "-", "mul_": "*", "div_": "/", "pow_": "**"}


class InplaceOnSaved(Rule):
    id = "GL201"
    name = "inplace-on-saved"
    severity = Severity.ERROR
    tags = ("correctness", "autograd", "inplace")
    precision = "very-high"
    summary = "An in-place write to a tensor that autograd saved for the backward pass."
    what = """
        An in-place operation that overwrites a tensor some earlier op saved for its backward: the output of
        `torch.sigmoid`, `exp`, `tanh` or `softmax`, or an input that a multiplication kept. Every in-place
        form counts: `t.mul_()`, `clamp_()`, `add_()` and friends, `+=` and `*=`, index assignment
        (`t[:, 0] = 0`), `out=` arguments, in-place modules and functionals (`nn.ReLU(inplace=True)`,
        `F.relu(x, inplace=True)`, `nn.Dropout(inplace=True)`), also through a view of the saved tensor, and
        writes through `.data`, which autograd cannot see at all.

        It is read from the capture itself (what each autograd node saved, and the tensors' version counters),
        on the meta device as on CPU. The finding points at the write; for an in-place module, at the line
        that built it (the `nn.ReLU(inplace=True)` argument of an `nn.Sequential`). The op whose saved tensor
        was overwritten is named in the message and is a related location.

        Not flagged: in-place ops on tensors nobody saved, such as `out += x` on a matmul's output, or an
        in-place ReLU after a Linear or BatchNorm (they save their inputs, not their outputs).
    """
    why = """
        The backward pass of the op that saved the tensor needs the value it saw. After the write, training
        stops at the first `loss.backward()` with "one of the variables needed for gradient computation has
        been modified by an inplace operation", often far from the line at fault. A write through `.data` is
        worse: autograd does not notice, and the gradients are silently wrong.
    """
    example = """
        gate = torch.sigmoid(self.proj(x))
        gate *= 2                        # overwrites sigmoid's saved output
        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU(inplace=True))
    """
    instead = """
        gate = torch.sigmoid(self.proj(x))
        gate = gate * 2
        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU())
    """
    fixes = """
        `--fix` makes the write out-of-place, where that computes the same thing: `x *= 2` (also on an attribute,
        `self.h *= g`) becomes `x = x * 2`, `x.mul_(2)` becomes `x = x.mul(2)`, a chain `x.mul_(y).add_(z)`
        becomes `x = x.mul(y).add(z)`, `torch.sigmoid_(x)` becomes `x = torch.sigmoid(x)`, `out = x.relu_()`
        becomes `out = x = x.relu()`, and a call inside an expression loses its write where nothing reads the
        tensor again. `x.copy_(src)` becomes `x = torch.empty_like(x).copy_(src)`, `x.zero_()`
        `x = torch.zeros_like(x)`, and `torch.mul(x, 2, out=x)` `x = torch.mul(x, 2, out=torch.empty_like(x))`
        (out= casts and resizes as before, into a new tensor). `nn.ReLU(inplace=True)` becomes `nn.ReLU()`,
        `F.relu(x, True)` `F.relu(x)`, and a flag that is not the literal True (`inplace=inplace`)
        `inplace=False`. A write with no out-of-place
        form (index assignment `x[:, 0] = 0`, `x[..., :d] += y`, a write through a view `x.view(-1)[:4].zero_()`,
        `out=x[0]`) gets a copy of its own just before it (`x = x.clone()`), so the tensor autograd saved keeps its
        value. Left alone, with the reason: writes through `.data` (autograd does not see them, so the gradients
        would change), into what a call returns (`x.contiguous().mul_(2)`), and writes that another holder of the
        tensor must see: another name for it or the tensor it is a view of read after the write, a function's
        argument (the caller's tensor), a registered buffer or parameter, an attribute of a submodule.
    """
    bad_examples = (
        Example(
            title="augmented assignment, index assignment and an in-place module",
            source='''
                import torch
                from torch import nn


                class Gate(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(16, 16)
                        self.mlp = nn.Sequential(
                            nn.Linear(16, 16),
                            nn.Sigmoid(),
                            nn.ReLU(inplace=True),  # expect: GL201
                        )

                    def forward(self, x):
                        gate = torch.sigmoid(self.proj(x))
                        gate *= 2  # expect: GL201
                        probs = torch.softmax(self.proj(x), dim=-1)
                        probs[:, 0] = 0  # expect: GL201
                        return self.mlp(gate * probs)


                def make():
                    return Gate(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn


                class Gate(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(16, 16)
                        self.mlp = nn.Sequential(
                            nn.Linear(16, 16),
                            nn.Sigmoid(),
                            nn.ReLU(),  # expect: GL201
                        )

                    def forward(self, x):
                        gate = torch.sigmoid(self.proj(x))
                        gate = gate * 2  # expect: GL201
                        probs = torch.softmax(self.proj(x), dim=-1)
                        probs = probs.clone()
                        probs[:, 0] = 0  # expect: GL201
                        return self.mlp(gate * probs)


                def make():
                    return Gate(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="in-place functionals and methods",
            source='''
                import torch
                import torch.nn.functional as F
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.inp = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 16)

                    def forward(self, x):
                        h = torch.sigmoid(self.inp(x))
                        h = F.relu(h, inplace=True)  # expect: GL201
                        y = torch.tanh(self.out(h))
                        y.mul_(0.5 + 0.25)  # expect: GL201
                        z = torch.exp(y)
                        z -= 1.0  # expect: GL201
                        return z


                def make():
                    return Net(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import torch
                import torch.nn.functional as F
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.inp = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 16)

                    def forward(self, x):
                        h = torch.sigmoid(self.inp(x))
                        h = F.relu(h)  # expect: GL201
                        y = torch.tanh(self.out(h))
                        y = y.mul(0.5 + 0.25)  # expect: GL201
                        z = torch.exp(y)
                        z = z - 1.0  # expect: GL201
                        return z


                def make():
                    return Net(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="a view, .data and out= on saved tensors",
            source='''
                import torch
                import torch.nn.functional as F
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.inp = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 16)

                    def forward(self, x):
                        h = torch.exp(self.inp(x))
                        h.view(-1).clamp_(max=10.0)  # expect: GL201
                        y = torch.tanh(self.out(h))
                        y.data.mul_(0.5)  # expect: GL201
                        keep = torch.ones_like(x)
                        z = F.relu(y * keep)
                        torch.mul(keep, 0.5, out=keep)  # expect: GL201
                        return z


                def make():
                    return Net(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import torch
                import torch.nn.functional as F
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.inp = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 16)

                    def forward(self, x):
                        h = torch.exp(self.inp(x))
                        h = h.clone()
                        h.view(-1).clamp_(max=10.0)  # expect: GL201
                        y = torch.tanh(self.out(h))
                        y.data.mul_(0.5)  # expect: GL201
                        keep = torch.ones_like(x)
                        z = F.relu(y * keep)
                        keep = torch.mul(keep, 0.5, out=torch.empty_like(keep))  # expect: GL201
                        return z


                def make():
                    return Net(), (torch.randn(4, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="in-place ops on tensors nobody saved",
            source='''
                import torch
                import torch.nn.functional as F
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc1 = nn.Linear(16, 32)
                        self.fc2 = nn.Linear(32, 16)
                        self.block = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True))

                    def forward(self, x):
                        h = F.relu(self.fc1(x), inplace=True)
                        out = self.fc2(h)
                        out += x
                        scores = x @ x.t()
                        scores.mul_(0.5)
                        return self.block(out) + scores.sum()


                def make():
                    return Net(), (torch.randn(4, 16),)
            ''',
        ),
    )

    def check(self, capture):
        writers: dict[int, list[fx.Node]] = defaultdict(list)
        for node in capture.ops:
            for storage in {m.storage for m in facts(node).mutated if m.storage is not None}:
                writers[storage].append(node)
        overwritten: dict[fx.Node, list[tuple[AutogradNode, SavedTensor]]] = defaultdict(list)
        for autograd_node, saved in capture.autograd.saved:
            for writer in writers.get(saved.storage, ()):
                if facts(writer).ran_after_saving(saved.index):  # written after it was saved
                    overwritten[writer].append((autograd_node, saved))
        for writer, victims in overwritten.items():
            yield _problem(writer, victims)


def _problem(writer: fx.Node, victims: list[tuple[AutogradNode, SavedTensor]]) -> Problem:
    autograd_node, saved = victims[0]
    producer = _producer_name(autograd_node)
    what = f"the output of {producer}" if saved.attribute == "_saved_result" else f"a tensor that {producer} kept"
    silent = not any(s.modified_after_save for _, s in victims)
    if silent:
        consequence = "autograd cannot see a write through .data, so the gradient will be silently wrong"
    else:
        consequence = "backward will fail with “modified by an inplace operation”"
    related = tuple(
        (a.forward_node, f"{_producer_name(a)} saved {_what_was_saved(s)} for backward")
        for a, s in victims if a.forward_node is not None
    )
    return Problem(
        node=writer,
        message=f"{_describe_write(writer)} in {{where}} overwrites {what}, saved for the backward pass"
                f"{{occurrences}}; {consequence}; {_advice(writer, silent)}.",
        related=related,
        at_build_site=True,
        fix=out_of_place,
    )


@LazyFixer
def out_of_place():
    """GL201's fix: the write made out-of-place, or into a copy of its own."""
    from .fix import out_of_place

    return out_of_place


def _producer_name(autograd_node: AutogradNode) -> str:
    if autograd_node.forward_node is not None:
        return op(autograd_node.forward_node)
    return autograd_node.name.removesuffix("Backward0").removesuffix("Backward1").lower()


def _inplace_flag(writer: fx.Node) -> bool:
    position = _INPLACE_POSITION.get(op(writer))
    if writer.kwargs.get("inplace") is True:
        return True
    return position is not None and len(writer.args) > position and writer.args[position] is True


def _in_module(writer: fx.Node):
    """The torch.nn module the write ran in, when the user wrote a module rather than the call."""
    return facts(writer).library_module


def _describe_write(writer: fx.Node) -> str:
    name = op(writer)
    module = _in_module(writer)
    if module is not None and _inplace_flag(writer):
        return f"nn.{module.class_name}(inplace=True)"
    if _inplace_flag(writer):
        return f"{name}(..., inplace=True)"
    if name == "setitem":
        return "The index assignment"
    if any(m.position == "out" for m in facts(writer).mutated):
        return f"{name}(..., out=...)"
    return f"The in-place {name}"


def _advice(writer: fx.Node, silent: bool) -> str:
    name = op(writer)
    if silent:
        return "compute a new tensor instead of writing through .data"
    if _inplace_flag(writer):
        return "build it with inplace=False" if _in_module(writer) is not None else "drop inplace=True"
    if name == "setitem":
        return "clone the tensor before writing into it, or build the result with torch.where"
    if any(m.position == "out" for m in facts(writer).mutated):
        return "drop out= and use the returned tensor"
    if name in _OPERATORS:
        symbol = _OPERATORS[name]
        return f"write y = y {symbol} … rather than y {symbol}= … or y.{name}(…)"
    return f"use the out-of-place {name.rstrip('_')}() instead"


def _what_was_saved(saved) -> str:
    return "its output" if saved.attribute == "_saved_result" else "this input"
