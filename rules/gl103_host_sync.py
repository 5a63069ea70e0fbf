"""GL103 host-sync: the forward makes the device hand a value to Python, which waits for all queued work."""

from __future__ import annotations

import torch
from torch import fx

from graphlint.capture import facts
from graphlint.flow import cut_lines
from graphlint.lines import SourceLine
from graphlint.ops import is_own_code, op, tensor_meta
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule
from graphlint.walk import UP, reach

_BLOCKS = "which waits for the device on every forward and breaks a torch.compile graph"
# What each host-bound call is and does, in the user's words, and what to write instead.
_MESSAGES = {
    "item": (".item()", "copies a value to Python", "keep it a tensor"),
    "tolist": (".tolist()", "copies the tensor to Python", "keep it a tensor"),
    "numpy": (".numpy()", "copies the tensor to the host", "keep it a tensor"),
    "cpu": (".cpu()", "copies the tensor to the host", "keep it on the device"),
    "to": ('.to("cpu")', "copies the tensor to the host", "keep it on the device"),
    "bool": ("A Python branch on a tensor", "reads its value on the host", "choose with torch.where or masked_fill"),
    "int": ("int() of a tensor", "reads its value on the host", "use a static shape or keep it a tensor"),
    "float": ("float() of a tensor", "reads its value on the host", "keep it a tensor"),
    "index": ("A tensor used as a Python index", "reads its value on the host", "use a static shape"),
    "repr": ("Printing a tensor", "copies it to the host", "print outside the forward"),
    "format": ("Formatting a tensor", "copies it to the host", "format it outside the forward"),
}
# Calls that return a Python value; some share their name with a cast that returns a tensor.
_TO_PYTHON = frozenset({"item", "tolist", "numpy", "bool", "int", "float", "index"})
# Ops whose output size depends on the values: the device must report that size to Python.
_VALUE_SHAPED_OPS = {
    "nonzero": "nonzero()",
    "argwhere": "argwhere()",
    "masked_select": "masked_select()",
    "unique": "unique()",
    "unique_consecutive": "unique_consecutive()",
    "where": "torch.where(condition) with one argument",
    "getitem": "Indexing with a boolean mask",
}
_STATIC_FIX = "use torch.where or masked_fill to keep a static shape"
# Torch factories: with no device argument they make their tensor on the host, whatever device the model is on.
_FACTORIES = frozenset({
    "arange", "range", "linspace", "logspace", "zeros", "ones", "empty", "full", "eye", "tensor", "as_tensor",
    "rand", "randn", "randint", "randperm", "tril_indices", "triu_indices",
})
# Syncs inside torch helpers whose cause and remedy are known: (helper, op) -> (what it does, what to do).
_HELPER_CAUSES = {
    ("pad_packed_sequence", "cpu"): (
        "copies the batch's unsorted_indices to the host (.cpu()) because the batch was packed with "
        "enforce_sorted=False",
        "sort each batch by length, longest first (in the data loader), and pack it with enforce_sorted=True",
    ),
    ("Distribution.__init__", "bool"): (
        "checks its arguments' values on the host (validate_args)",
        "pass validate_args=False to the distribution in training code "
        "(or torch.distributions.Distribution.set_default_validate_args(False))",
    ),
    ("Distribution._validate_sample", "bool"): (
        "checks the sample's values on the host (validate_args)",
        "pass validate_args=False to the distribution in training code "
        "(or torch.distributions.Distribution.set_default_validate_args(False))",
    ),
    ("pack_padded_sequence", "to"): (
        "copies lengths to the host, where it needs them",
        "keep the lengths on the CPU (a list or a CPU tensor) rather than on the device",
    ),
    ("pack_padded_sequence", "as_tensor"): (
        "copies lengths to the host, where it needs them",
        "keep the lengths on the CPU (a list or a CPU tensor) rather than on the device",
    ),
}


class HostSync(Rule):
    id = "GL103"
    name = "host-sync"
    severity = Severity.WARNING
    tags = ("performance", "sync", "compile")
    precision = "high"
    summary = "The forward makes the device hand a value to Python, stalling it on every forward."
    what = """
        Calls in the project's own forward or loss that need a tensor's values in Python:

        - `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")`;
        - a tensor as a Python condition or number: `if t:`, `while t:`, `if (x > 0).any():`, `bool(t)`,
          `int(t)`, `float(t)`, a tensor used as a Python index;
        - ops whose output size depends on the values: `nonzero`, `argwhere`, `masked_select`, `unique`,
          one-argument `torch.where(mask)`, boolean-mask indexing `x[mask]`;
        - printing or formatting a tensor (`print(t)`, `f"{t}"`).

        One finding per line, with the number of times it ran. Not flagged: shape arithmetic (`x.shape[0]`,
        `x.size(-1)`, `len(x)`), Python numbers, calls inside installed libraries, and reads of host tensors:
        a tensor made only from torch factories given no device (`torch.arange(n).tolist()`) lives on the host
        wherever the model runs, so reading it waits for nothing.

        A sync inside torch's own Python code that the forward called (`torch.nn.utils.rnn.pad_packed_sequence`,
        `pack_padded_sequence`, a `torch.distributions` object checking its arguments) is reported at the call in
        the project's code, naming the helper and why it syncs there, with torch's line as a related location
        and the remedy when it is known ("`pad_packed_sequence` copies `unsorted_indices` to the host because
        the batch was packed with `enforce_sorted=False`": sort the batches and pack with `enforce_sorted=True`;
        `validate_args=False` for a distribution in training code).

        One policy for host trips that also cut gradients: a line where GL202 reports a gradient cut gets no
        GL103, whatever host trips it holds. An `.item()` that cuts parameters off from the loss, and every trip
        on a line such as `h.detach().cpu().numpy()` that does, are GL202's (an error, whose message says that
        the trip also waits for the device); keeping the computation in tensors fixes both. A host trip that
        cuts nothing trainable, on a line of its own, is GL103.
    """
    why = """
        The device runs work queued by Python asynchronously; reading a value back makes Python wait until
        everything queued before it has finished, so the device idles while Python queues the next work.
        Under `torch.compile` each such call is a graph break. Graphlint checks this on the meta device, which
        has no values: these are exactly the calls that fail there and make the capture fall back to CPU.
    """
    example = """
        def forward(self, x):
            if (x < 0).any():                # a branch on a tensor value
                x = x.clamp(min=0)
            scale = x.abs().max().item()     # a copy to Python
            return x[x > 0.5] / scale        # a size that depends on the values
    """
    instead = """
        def forward(self, x):
            x = x.clamp(min=0)                       # the same result, no branch
            scale = x.abs().amax()                   # stays a tensor
            return torch.where(x > 0.5, x, 0) / scale  # a static shape
    """
    bad_examples = (
        Example(
            title="a branch on a tensor, .item(), a boolean mask and a print in the forward",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(8, 8)

                    def forward(self, x):
                        h = self.fc(x)
                        if (h < 0).any():  # expect: GL103
                            h = h.clamp(min=0)
                        scale = h.abs().max().item()  # expect: GL103
                        print(h)  # expect: GL103
                        return h[h > 0.5].sum() / scale  # expect: GL103


                def make():
                    return Model(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="a loop that reads a tensor back on every step",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.cell = nn.GRUCell(8, 8)

                    def forward(self, x):
                        h = x.new_zeros(x.shape[1], 8)
                        total = 0.0
                        for t in range(x.shape[0]):
                            h = self.cell(x[t], h)
                            total += float(h.mean())  # expect: GL103
                        return h.sum() + total


                def make():
                    return Model(), (torch.randn(5, 4, 8),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="shape arithmetic, torch.where and masked_fill instead of reading values",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(8, 8)

                    def forward(self, x):
                        batch, width = x.shape[0], x.size(-1)
                        h = self.fc(x).reshape(batch, width) * (1.0 / len(x))
                        h = torch.where(h < 0, torch.zeros_like(h), h)
                        h = h.masked_fill(h > 3, 3.0)
                        return h / h.abs().amax().clamp(min=1e-6)


                def make():
                    return Model(), (torch.randn(4, 8),)
            ''',
        ),
    )

    def check(self, capture):
        cut = cut_lines(capture)  # GL202 reports these lines, host trips included
        for node in capture.ops:
            if not is_own_code(node) or SourceLine.of(facts(node).stack[-1]) in cut:
                continue
            message = _message(node)
            if message is None or _made_on_host(node):
                continue
            helper = facts(node).torch_helper
            if helper is None:
                yield Problem(node=node, message=message)
                continue
            called, line = helper  # the helper the user called, and torch's line that synchronises
            yield Problem(node=node, message=_helper_message(node, called.function, line.function),
                          related=((line, f"{_what(node)} inside torch's {called.function}()"),))


def _message(node: fx.Node) -> str | None:
    name = op(node)
    if name in _VALUE_SHAPED_OPS and _value_shaped(node):
        return (f"{_VALUE_SHAPED_OPS[name]} in {{where}} gives a result whose size depends on the values, "
                f"{_BLOCKS}{{occurrences}}; {_STATIC_FIX}.")
    if name in _TO_PYTHON and tensor_meta(node) is not None:
        return None  # the casts `.float()`, `.int()`, `.bool()`, not the conversions float(t), int(t), bool(t)
    if name in _MESSAGES and (name != "to" or _to_host(node)):
        what, does, fix = _MESSAGES[name]
        return f"{what} in {{where}} {does}, {_BLOCKS}{{occurrences}}; {fix}."
    return None


def _made_on_host(node: fx.Node) -> bool:
    """Whether the tensor the call reads lives on the host wherever the model runs: everything it comes from was
    made by a torch factory given no device (`torch.arange(n)`), and nothing from an input, a parameter, a buffer
    or a move to a device. Reading it waits for no device."""
    start = node.args[0] if node.args else None
    if not isinstance(start, fx.Node):
        return False
    made = False
    for current in (step.node for step in reach([start], UP)):
        if current.op in ("placeholder", "get_attr"):
            return False
        name = op(current)
        if name in ("cuda", "to") and _to_device(current):
            return False
        if current.op == "call_function" and name in _FACTORIES:
            device = current.kwargs.get("device")
            if device is not None and not _is_cpu_text(device):
                return False  # a device read from a tensor or named: on the device in a real run
            made = True
    return made


def _to_device(node: fx.Node) -> bool:
    """`.cuda()`, or a `.to()` given a device other than the text "cpu" (a dtype alone keeps the tensor where it is)."""
    if op(node) == "cuda":
        return True
    values = [*node.args[1:], node.kwargs.get("device")]
    return any(isinstance(v, torch.device) or (isinstance(v, str) and not _is_cpu_text(v)) for v in values)


def _is_cpu_text(device) -> bool:
    return isinstance(device, str) and device.split(":")[0] == "cpu"


def _what(node: fx.Node) -> str:
    """The synchronising call as written in torch's code: `.cpu()`, `nonzero()`."""
    name = op(node)
    if name in _VALUE_SHAPED_OPS:
        return _VALUE_SHAPED_OPS[name][0].lower() + _VALUE_SHAPED_OPS[name][1:]
    what = _MESSAGES[name][0] if name in _MESSAGES else f".{name}()"
    return what[0].lower() + what[1:] if what[:2] in ("A ", "Pr", "Fo") else what


def _helper_message(node: fx.Node, helper: str, inner: str) -> str:
    """The finding for a sync inside a torch helper the user called: the helper, why it syncs there, and the
    remedy when it is known."""
    cause, remedy = _HELPER_CAUSES.get((helper, op(node))) or _HELPER_CAUSES.get((inner, op(node))) or (None, None)
    if cause is None:
        does = "reads values on the host" if op(node) in _VALUE_SHAPED_OPS else _MESSAGES.get(op(node), ("", "syncs"))[1]
        cause = f"calls {_what(node)} inside, which {does}"
        remedy = "call it outside the forward, or give it inputs that need no copy (torch's line is related)"
    return f"torch's {helper}() in {{where}} {cause}, {_BLOCKS}{{occurrences}}; {remedy}."


def _value_shaped(node: fx.Node) -> bool:
    """Whether a call of a value-shaped op family really is the value-shaped form."""
    name = op(node)
    if name == "where":
        return len(node.args) + len(node.kwargs) == 1
    if name == "getitem":
        index = node.args[1] if len(node.args) > 1 else None
        indices = index if isinstance(index, (tuple, list)) else (index,)
        return any(_is_bool_tensor(i) for i in indices)
    return True


def _is_bool_tensor(value) -> bool:
    meta = tensor_meta(value)
    return meta is not None and meta.dtype == torch.bool


def _to_host(node: fx.Node) -> bool:
    """`.to("cpu")` as the user wrote it: a device named in the source, not one read from a tensor."""
    device = node.args[1] if len(node.args) > 1 else node.kwargs.get("device")
    return isinstance(device, str) and device.split(":")[0] == "cpu"

