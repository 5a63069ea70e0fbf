"""GL202 gradient-cut: trainable parameters cut off from the loss inside the forward."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from graphlint.capture import facts
from graphlint.flow import cut_kind, gradient_cuts, in_reentrant_checkpoint
from graphlint.ops import op
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule

if TYPE_CHECKING:  # annotations only: the rule's module imports no torch of its own
    from torch import fx


class GradientCut(Rule):
    id = "GL202"
    name = "gradient-cut"
    severity = Severity.ERROR
    tags = ("correctness", "autograd", "training")
    precision = "high"
    summary = "Trainable parameters that get no gradient because the forward cut their path to the loss."
    what = """
        Parameters with `requires_grad=True` that receive no gradient from the loss because their path to it
        is cut inside the forward: by `.detach()`, by `.data`, by a `torch.no_grad()` or
        `torch.inference_mode()` block, or by a trip out of torch (`.item()`, `.tolist()`, `.numpy()`, then
        back with `torch.tensor` or `torch.from_numpy`), or by a reentrant `torch.utils.checkpoint` none of
        whose inputs requires grad (its backward never runs: the frozen-embedding mistake under LoRA).

        A function decorated with `@torch.no_grad()`, `@torch.inference_mode()` or
        `@torch.set_grad_enabled(False)` (a module's `forward`, or a helper it calls) runs its whole call with
        autograd off: every trainable parameter it uses on the way to the loss is cut. When the whole forward is
        decorated (Meta's reference Llama decorates `Transformer.forward` with `@torch.inference_mode()`), the
        output needs no grad and no backward pass can run; the parameters are reported all the same. The
        "no backward pass was captured" note alone is left for models with nothing to train.

        The finding points at the cut: the `.detach()` call, the `.data` access, the statement inside the
        `no_grad` block, the decorator, the `.item()`, the checkpoint call. The message names the parameters
        that lose their gradient, grouped by module path. It is read from a real backward: a parameter is cut
        when the backward does not reach it although the forward used it on the way to the loss.

        A trip out of torch that cuts parameters is also a host sync; it is reported once, here, and GL103
        leaves every line that has a GL202 finding alone (the `.cpu()` of `h.detach().cpu().numpy()` as much as
        its `.numpy()`). Keeping the computation in tensors on the device fixes both.

        Not flagged: parameters with `requires_grad=False` (a frozen teacher under `no_grad`, a momentum or
        target network detached on purpose), detaches that cut nothing trainable, and parameters that the
        forward never used (those are GL203 unused-parameter).
    """
    why = """
        A cut parameter never trains: the optimizer sees no gradient, and weight decay slowly shrinks it
        towards zero. Nothing fails: the loss still goes down thanks to the other parameters, so the bug
        (often half an encoder) is found weeks later, if ever.
    """
    example = """
        features = self.encoder(x).detach()   # the encoder never trains
        with torch.no_grad():
            context = self.context_net(x)      # trainable, but no gradient reaches it
    """
    instead = """
        features = self.encoder(x)
        context = self.context_net(x)

        # or, when freezing is intended, say so where the module is built:
        self.context_net.requires_grad_(False)
    """
    bad_examples = (
        Example(
            title="detach, no_grad and .data",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
                        self.context = nn.Linear(8, 16)
                        self.scale = nn.Linear(8, 16)
                        self.head = nn.Linear(16, 2)

                    def forward(self, x):
                        features = self.encoder(x).detach()  # expect: GL202
                        with torch.no_grad():
                            context = self.context(x)  # expect: GL202
                        scale = self.scale(x).data  # expect: GL202
                        return self.head(features + context * scale)


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="a trip out of torch and back",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.temperature = nn.Linear(8, 1)
                        self.head = nn.Linear(8, 2)

                    def forward(self, x):
                        t = self.temperature(x).mean().item()  # expect: GL202
                        return self.head(x) / torch.tensor(t)


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="an encoder whose forward is decorated with @torch.no_grad()",
            source='''
                import torch
                from torch import nn


                class Encoder(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(8, 16)

                    @torch.no_grad()  # expect: GL202
                    def forward(self, x):
                        return self.proj(x).relu()


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.encoder = Encoder()
                        self.head = nn.Linear(16, 2)

                    def forward(self, x):
                        return self.head(self.encoder(x))


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="a whole forward under @torch.inference_mode(): nothing can train, and no backward can run",
            source='''
                import torch
                from torch import nn


                class Transformer(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.embed = nn.Embedding(32, 8)
                        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
                        self.output = nn.Linear(8, 32, bias=False)

                    @torch.inference_mode()  # expect: GL202
                    def forward(self, tokens, start_pos: int):
                        h = self.embed(tokens)
                        for layer in self.layers:
                            h = h + layer(h).relu()
                        return self.output(h).float()


                def make():
                    return Transformer(), (torch.randint(0, 32, (2, 5)), 0)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="a frozen teacher under no_grad and a detached target network",
            source='''
                import copy
                import torch
                from torch import nn


                class Distill(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.student = nn.Linear(8, 4)
                        self.teacher = nn.Linear(8, 4).requires_grad_(False)
                        self.target = copy.deepcopy(self.student).requires_grad_(False)

                    def forward(self, x):
                        with torch.no_grad():
                            soft = self.teacher(x).softmax(-1)
                        target = self.target(x).detach()
                        out = self.student(x)
                        stats = out.detach().mean()  # cuts nothing trainable: out also reaches the loss
                        return ((out.log_softmax(-1) * soft).sum() + (out - target).pow(2).mean()) * (1 + 0 * stats)


                def make():
                    return Distill(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="decorated functions that cut nothing trainable: a frozen extractor, a mask helper",
            source='''
                import torch
                from torch import nn


                class Extractor(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(8, 8)
                        self.requires_grad_(False)

                    @torch.no_grad()
                    def forward(self, x):
                        return self.proj(x)


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.extractor = Extractor()
                        self.head = nn.Linear(8, 2)

                    @torch.no_grad()
                    def keep(self, x):
                        return (x.abs() > 0.1).to(x.dtype)

                    def forward(self, x):
                        features = self.extractor(x)
                        return self.head(features * self.keep(x))


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
    )

    def check(self, capture):
        cut_off: dict[tuple, list[str]] = defaultdict(list)
        first_node: dict[tuple, fx.Node] = {}
        for name, cuts in gradient_cuts(capture).items():
            for cut in cuts:
                key = _occasion(cut)
                first_node.setdefault(key, cut)
                cut_off[key].extend(n for n in [name] if n not in cut_off[key])
        for key, names in cut_off.items():
            yield _problem(first_node[key], tuple(names))


# Trips out of torch whose op name alone would not say what the user wrote.
_HOST_TRIPS = {
    "bool": "A Python branch on a tensor",
    "int": "int() of a tensor",
    "float": "float() of a tensor",
    "index": "A tensor used as a Python index",
}
_WHAT = {
    "detach": (".detach()", "remove the .detach()"),
    "data": (".data", "use the tensor itself rather than .data"),
    "no_grad": ("This statement inside torch.no_grad()", "move it out of the no_grad block"),
    "inference_mode": ("This statement inside torch.inference_mode()", "move it out of the inference_mode block"),
}


def _problem(cut: fx.Node, names: tuple[str, ...]) -> Problem:
    kind = cut_kind(cut)
    if kind is None and in_reentrant_checkpoint(cut):
        message = ("This reentrant torch.utils.checkpoint call in {where} cuts {parameters} off from the loss"
                   "{occurrences}, so they never train: none of its inputs requires grad, so its backward never "
                   "runs; pass use_reentrant=False or make an input require grad (transformers: "
                   "model.enable_input_require_grads()), or freeze them with requires_grad_(False) if that is "
                   "intended.")
        call = facts(cut).grad_region.entered_at
        if not call:  # no visible frame entered the checkpoint: the block's first op stands for it
            return Problem(message=message, node=cut, parameters=names)
        return Problem(message=message, stack=call, module_path=_user_module_path(cut), parameters=names)
    decorator = _decorator(cut)
    if decorator is not None:
        context = "torch.inference_mode()" if kind == "inference_mode" else "torch.no_grad()"
        message = (f"The {context} decorator on {decorator.function}() in {{where}} turns autograd off for its "
                   f"whole call, which cuts {{parameters}} off from the loss{{occurrences}}, so they never train; "
                   f"remove the decorator (and call the model under `with {context}:` where only inference is "
                   "meant), or freeze them with requires_grad_(False) if that is intended.")
        return Problem(message=message, stack=(decorator,), module_path=_user_module_path(cut), parameters=names)
    if kind == "host":
        what = _HOST_TRIPS.get(op(cut), f".{op(cut)}()")
        message = (f"{what} in {{where}} takes the value out of torch, which cuts {{parameters}} off from the "
                   "loss{occurrences}, so they never train, and waits for the device on every forward; keep the "
                   "computation in tensors, or freeze them with requires_grad_(False) if that is intended.")
        return Problem(message=message, node=cut, parameters=names)
    what, fix = _WHAT[kind]
    message = (f"{what} in {{where}} cuts {{parameters}} off from the loss{{occurrences}}, so they never train; "
               f"{fix}, or freeze them with requires_grad_(False) if that is intended.")
    statement = _statement_in_block(cut)
    entered = facts(cut).grad_region.entered_at if kind in ("no_grad", "inference_mode") else ()
    # The statement is what to move; the `with` line that switched autograd off is shown beside it.
    related = ((entered[-1], f"autograd switched off here ({kind})"),) if entered else ()
    if statement:
        return Problem(message=message, stack=statement, module_path=_user_module_path(cut), parameters=names,
                       related=related)
    return Problem(message=message, node=cut, parameters=names, related=related)


def _user_module_path(node: fx.Node) -> str:
    """The innermost running module whose forward is the user's code, not torch.nn's."""
    own = [m for m in facts(node).module_stack if not m.library]
    return own[-1].path if own else ""


def _decorator(cut: fx.Node):
    """For a cut made by a grad-mode decorator on a function (the whole call runs with autograd off): the
    decorator's line, as a frame of that function."""
    region = facts(cut).grad_region
    if region is None or cut_kind(cut) not in ("no_grad", "inference_mode"):
        return None
    return region.decorator


def _statement_in_block(cut: fx.Node) -> tuple | None:
    """For a cut made by a `no_grad` or `inference_mode` block: the user stack of the statement in the block."""
    region = facts(cut).grad_region
    if region is None or cut_kind(cut) not in ("no_grad", "inference_mode"):
        return None
    return region.statement_of(facts(cut).stack)


def _occasion(cut: fx.Node) -> tuple:
    """One cut as the user sees it: a detach is one op, but all the ops of one statement inside one entry of
    a `no_grad` block are one cut, and all the ops of one reentrant checkpoint call."""
    if cut_kind(cut) is None and in_reentrant_checkpoint(cut):
        return (facts(cut).grad_region,)  # one checkpoint call
    if _decorator(cut) is not None:
        return (facts(cut).grad_region,)  # one call of the decorated function
    statement = _statement_in_block(cut)
    return (facts(cut).grad_region, statement) if statement is not None else (cut,)
