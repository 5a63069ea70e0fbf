"""GL104 host-tensor-in-forward: a tensor built on the host and copied to the device on every forward."""

from __future__ import annotations

import linecache
import re

import torch
from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphlint.capture import facts
from graphlint.capture.frames import Frame
from graphlint.files import is_installed_file
from graphlint.flow import cut_lines
from graphlint.lines import SourceLine
from graphlint.ops import MAX_PASS_THROUGH_STEPS, is_own_code, op
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule
from graphlint.walk import DOWN, find

# torch functions that create a tensor and take `device=`; without it they fill host memory.
FACTORIES = frozenset({
    "arange", "range", "linspace", "logspace", "zeros", "ones", "empty", "full", "eye", "rand", "randn",
    "randint", "randperm", "tensor", "as_tensor", "asarray", "scalar_tensor",
})
_FROM_PYTHON_DATA = frozenset({"tensor", "as_tensor", "asarray"})


class HostTensorInForward(Rule):
    id = "GL104"
    name = "host-tensor-in-forward"
    severity = Severity.WARNING
    tags = ("performance", "sync", "memory")
    precision = "high"
    summary = "A tensor built on the host and copied to the device on every forward."
    what = """
        In the project's own forward or loss, a tensor judged by its origin: not an input, a parameter or a
        buffer, but made on the host inside the forward, then copied to the device. Reported at the line that
        made it, with the copy as a related location:

        - a torch factory call without `device=` (`torch.arange`, `zeros`, `ones`, `empty`, `full`, `eye`,
          `rand`, `randn`, `randint`, `tensor`, ...) whose result, directly or after more host-side ops, is moved
          with `.to(device or tensor)`, `.cuda()` or `.type_as(tensor)`;
        - a tensor made by a call that PyTorch does not record: `torch.from_numpy(...)` (however it is imported),
          legacy constructors (`torch.FloatTensor(n)`, `torch.LongTensor([...])`, `torch.Tensor(...)`),
          `torch.frombuffer`: moved, or used with the model's tensors (on a GPU, that use needs it on the device);
        - `torch.tensor(<Python data>, device=...)` (or `as_tensor`, `asarray`, `x.new_tensor(<Python data>)`):
          the data lives in Python, so it is copied on every forward.

        Paths taken only on a GPU. graphlint captures on the meta device or the CPU, so `if x.is_cuda:`,
        `v.cuda() if w.is_cuda else v` and `if x.device.type == "cuda":` take their CPU branch, and the copy
        does not run. graphlint still sees the tensor's origin and where it meets the model's tensors, and reads
        the source between them: a factory result reassigned from a move of itself there (`v = v.cuda()`,
        `v = v.to(x.device)`) that the capture did not run is reported. A tensor from a call PyTorch does not
        record is reported wherever it meets the model's tensors (not a single number, which torch takes beside
        device tensors). What graphlint does not see: a move on an untaken path in another function, and
        custom CUDA code.

        Not flagged: `torch.arange(n, device=x.device)`, `x.new_zeros(...)`, `torch.zeros_like(x)`, registered
        buffers, tensors built in `__init__` or at module level (even when moved in the forward), views of the
        inputs (iterating a batch), casts that only change the dtype, factory calls with a `generator=` (a host
        generator is a deliberate choice), a factory result that never goes to the device, and calls inside
        installed libraries. The capture runs on the meta device, so the rule judges the calls as written, not
        where memory landed.
    """
    why = """
        The tensor is filled by the CPU, then copied to the device through pageable memory, which makes the
        copy synchronous: Python waits for it on every forward. Creating it on the device (`device=x.device`) is
        one kernel launch, and a constant made once in `__init__` as a buffer costs nothing per forward.
    """
    example = """
        positions = torch.arange(x.shape[1]).to(x.device)
        noise = torch.randn(x.shape).cuda()
        scale = torch.tensor([0.5, 2.0], device=x.device)
        negatives = torch.FloatTensor(n).uniform_(0, vocab).long()
        negatives = negatives.cuda() if self.embed.weight.is_cuda else negatives
    """
    instead = """
        positions = torch.arange(x.shape[1], device=x.device)
        noise = torch.randn_like(x)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]), persistent=False)   # in __init__
        negatives = torch.randint(0, vocab, (n,), device=self.embed.weight.device)
    """
    bad_examples = (
        Example(
            title="positions, a mask and constants built on the host in every forward",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.embed = nn.Embedding(32, 8)
                        self.fc = nn.Linear(8, 8)

                    def forward(self, ids):
                        positions = torch.arange(ids.shape[1]).to(ids.device)  # expect: GL104
                        mask = torch.ones(ids.shape[1], ids.shape[1])  # expect: GL104
                        mask = mask.tril().type_as(self.fc.weight)
                        h = self.fc(self.embed(ids) + self.embed(positions))
                        weights = torch.tensor([0.5, 2.0], device=ids.device)  # expect: GL104
                        return (mask @ h).sum(-1) * weights[0] + weights[1]


                def make():
                    return Model(), (torch.randint(0, 32, (2, 6)),)
            ''',
        ),
        Example(
            title="negatives sampled on the host with numpy and a legacy constructor, moved on a GPU-only path",
            source='''
                import numpy as np
                import torch
                from torch import nn


                class SkipGram(nn.Module):
                    def __init__(self, vocab=50, dim=8):
                        super().__init__()
                        self.vocab = vocab
                        self.embed = nn.Embedding(vocab, dim)
                        self.frequencies = np.full(vocab, 1 / vocab)

                    def forward(self, words):
                        n = words.numel() * 4
                        negatives = torch.FloatTensor(n).uniform_(0, self.vocab - 1).long()  # expect: GL104
                        negatives = negatives.cuda() if self.embed.weight.is_cuda else negatives
                        noise = torch.from_numpy(np.random.choice(self.vocab, n, p=self.frequencies))  # expect: GL104
                        noise = noise.to(words.device)
                        return -(self.embed(words).sum() - self.embed(negatives).sum() - self.embed(noise).sum())


                def make():
                    return SkipGram(), (torch.randint(0, 50, (2, 6)),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="tensors made on the input's device, from the input, or once as a buffer",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.embed = nn.Embedding(32, 8)
                        self.fc = nn.Linear(8, 8)
                        self.register_buffer("weights", torch.tensor([0.5, 2.0]), persistent=False)

                    def forward(self, ids):
                        positions = torch.arange(ids.shape[1], device=ids.device)
                        h = self.fc(self.embed(ids) + self.embed(positions))
                        mask = torch.ones(ids.shape[1], ids.shape[1], device=h.device, dtype=h.dtype).tril()
                        noise = torch.zeros_like(h) + h.new_ones(h.shape) * 0.1
                        scale = torch.full((), 2.0, device=h.device).to(h.dtype)
                        return (mask @ (h + noise)).sum(-1) * self.weights[0] * scale


                def make():
                    return Model(), (torch.randint(0, 32, (2, 6)),)
            ''',
        ),
    )

    def check(self, capture):
        yield from _unrecorded_host_tensors(capture)
        for node in capture.ops:
            if op(node) == "new_tensor" and len(node.args) > 1 and not _has_node(node.args[1]) and is_own_code(node):
                yield Problem(
                    node=node,
                    message=".new_tensor() of Python data in {where} copies that data to the device on every "
                            "forward{occurrences}; register it once as a buffer in __init__, or use new_full for "
                            "a single value.",
                )
            if op(node) not in FACTORIES or not is_own_code(node):
                continue
            if _host_factory(node):
                if node.kwargs.get("generator") is not None:
                    continue
                move = _first_move(node)
                if move is not None:
                    yield Problem(
                        node=node,
                        message=f"torch.{op(node)}() in {{where}} builds a tensor on the host that is copied to "
                                "the device on every forward{occurrences}; pass device=... to the call (for "
                                "example device=x.device).",
                        related=((move, f"copied to the device by .{op(move)}()"),),
                    )
                    continue
                meeting = _first_meeting(node)
                untaken = _untaken_move(facts(node).stack[-1], meeting) if meeting is not None else None
                if untaken is not None:
                    yield Problem(
                        node=node,
                        message=f"torch.{op(node)}() in {{where}} builds a tensor on the host that a path taken "
                                "only on a GPU copies to the device on every forward{occurrences} (this capture did "
                                "not take it); pass device=... to the call (for example device=x.device).",
                        related=((meeting, f"used with the model's tensors by {op(meeting)}()"),),
                    )
            elif op(node) in _FROM_PYTHON_DATA and node.args and not _has_node(node.args[0]):
                yield Problem(
                    node=node,
                    message=f"torch.{op(node)}() of Python data in {{where}} copies that data to the device on every "
                            "forward{occurrences}; register it once as a buffer in __init__, or use torch.full for "
                            "a single value.",
                )


def _unrecorded_host_tensors(capture):
    """Tensors the forward made on the host by calls the capture cannot see (`torch.from_numpy`, legacy
    constructors), anchored at their first use: moved to the device, or meeting the model's tensors, which
    on a GPU needs a copy on a path this capture did not take (`v.cuda() if w.is_cuda else v`)."""
    order = {node: index for index, node in enumerate(capture.ops)}
    trips = cut_lines(capture)  # a value back from a trip out of torch that cuts gradients is GL202's line
    for node in capture.forward.nodes:
        if node.op != "get_attr" or not facts(node).host_made:
            continue
        uses = sorted((user for user in node.users if user in order), key=order.__getitem__)
        made = facts(node).made_at or (facts(uses[0]).stack if uses else ())
        if not made or is_installed_file(made[-1].file) or SourceLine.of(made[-1]) in trips:
            continue  # made inside a library, which its users cannot change, or reported as the cut
        if capture.device != "meta" and not _spells_a_host_maker(made[-1]):
            continue  # on a host capture only the source tells data from a tensor torch.func or a custom op returned
        first = uses[0]
        # The line that made it, as a whole statement: the capture saw only its first use.
        at = {"stack": (*made[:-1], Frame(made[-1].file, made[-1].line, made[-1].function)),
              "module_path": next((m.path for m in reversed(facts(first).module_stack) if not m.library), "")}
        move = _first_move(node)
        if move is not None:
            yield Problem(
                **at,
                message="A tensor made on the host in {where} (by a call such as torch.from_numpy or "
                        "torch.FloatTensor) is copied to the device on every forward{occurrences}; make it on the "
                        "device (torch.empty(..., device=x.device), torch.as_tensor(data, device=x.device)) or "
                        "once, as a buffer in __init__.",
                related=((move, f"copied to the device by .{op(move)}()"),),
            )
            continue
        meeting = _first_meeting(node)
        if meeting is not None:
            yield Problem(
                **at,
                message="A tensor made on the host in {where} (by a call such as torch.from_numpy or "
                        "torch.FloatTensor) meets the model's tensors, so on a GPU it is copied to the device on "
                        "every forward{occurrences} (on a path this capture did not take, such as `if x.is_cuda:`); "
                        "make it on the device (torch.empty(..., device=x.device), torch.as_tensor(data, "
                        "device=x.device)) or once, as a buffer in __init__.",
                related=((meeting, f"used with the model's tensors by {op(meeting)}()"),),
            )


_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")


def _untaken_move(made: Frame, meeting: fx.Node) -> int | None:
    """The line of a move of the variable that `made`'s line assigns (`v = v.cuda()`, `v = v.to(x.device) if
    x.is_cuda else v`) that the capture did not run, read from the source between that line and the line of
    the same function that used it with the model's tensors: a path taken only on a GPU. None when there is none."""
    name = _ASSIGNED.match(linecache.getline(made.file, made.line))
    if name is None:
        return None
    end = next((f.line for f in reversed(facts(meeting).stack)
                if (f.file, f.function) == (made.file, made.function)), None)
    if end is None or end < made.line:
        return None
    variable = re.escape(name.group(1))
    moved = re.compile(rf"\b{variable}\s*=.*\b{variable}\s*\.\s*(?:cuda|to)\s*\(")
    for line in range(made.line + 1, end + 1):
        if moved.search(linecache.getline(made.file, line)):
            return line
    return None


def _first_meeting(start: fx.Node) -> fx.Node | None:
    """The first op where a host value computed only from `start` (not a single number, which torch accepts
    beside device tensors) is combined with a tensor that is not: on a GPU, the host value must be there."""
    host: set[fx.Node] = set()  # `start` and what is computed only from it: the nodes the search passed

    def meets(node: fx.Node) -> bool:
        inputs = node.all_input_nodes
        return not _from_host(node, host) and any(n in host and not _is_scalar(n) for n in inputs) and \
            any(_is_tensor(n) for n in inputs if n not in host)

    found = find([start], DOWN, meets, through=lambda n: n is start or _from_host(n, host),
                 limit=MAX_PASS_THROUGH_STEPS, again=True, passed=host)
    return next((step.node for step in found), None)


def _from_host(node: fx.Node, host: set[fx.Node]) -> bool:
    """Whether every input of the node is a host value (or a host factory's tensor): the result is one too."""
    return all(n in host or _host_factory(n) for n in node.all_input_nodes)


# Calls that make a tensor from host data or host memory, as source spells them.
_HOST_MAKER = re.compile(r"\b(?:from_numpy|frombuffer|from_dlpack|asarray|as_tensor|tensor|new_tensor|[A-Z]\w*Tensor)\s*\(")
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _spells_a_host_maker(made: Frame) -> bool:
    """Whether the statement that made a tensor, or a function of the same file that it calls, spells a call that
    makes a tensor on the host. On a meta capture the device says so; on the host every tensor is there, and
    tensors that torch.func transforms, autograd.grad or custom C++ ops return are unrecorded too."""
    line = linecache.getline(made.file, made.line)
    if _HOST_MAKER.search(line):
        return True
    source = "".join(linecache.getlines(made.file))
    for name in set(_CALLED.findall(line)):
        body = re.search(rf"^([ \t]*)def {re.escape(name)}\b.*?(?=^\1(?:def|class)\b|^\S|\Z)", source, re.M | re.S)
        if body is not None and _HOST_MAKER.search(body.group(0)):
            return True
    return False


def _is_scalar(node: fx.Node) -> bool:
    meta = facts(node).tensor_meta
    return isinstance(meta, TensorMetadata) and len(meta.shape) == 0


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(facts(node).tensor_meta, TensorMetadata)


def _first_move(factory: fx.Node) -> fx.Node | None:
    """The first op that moves the factory's result, or something computed only from it, to a device."""
    host: set[fx.Node] = set()  # the factory and what is computed only from it: the nodes the search passed

    def moves(node: fx.Node) -> bool:
        return _moves(node) and bool(node.args) and node.args[0] in host

    # Past a value mixed with a device tensor the search stops: the copy, if any, is torch's.
    found = find([factory], DOWN, moves, through=lambda n: n is factory or _from_host(n, host),
                 limit=MAX_PASS_THROUGH_STEPS, again=True, passed=host)
    return next((step.node for step in found), None)


def _host_factory(node: fx.Node) -> bool:
    return op(node) in FACTORIES and node.kwargs.get("device") is None


def _moves(node: fx.Node) -> bool:
    """A call that sends its input to a device: `.cuda()`, `.type_as(t)`, `.to(device)` or `.to(t)`."""
    name = op(node)
    if name in ("cuda", "type_as"):
        return True
    if name != "to":
        return False
    targets = [*node.args[1:], node.kwargs.get("device"), node.kwargs.get("other")]
    return any(_is_device(t) for t in targets)


def _is_device(value) -> bool:
    if isinstance(value, fx.Node):  # .to(other): other's device and dtype
        return True
    if isinstance(value, str):
        return value.split(":")[0] != "cpu"  # a literal "cpu" stays on the host
    return isinstance(value, torch.device)


def _has_node(value) -> bool:
    if isinstance(value, fx.Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_node(v) for v in value)
    return False

