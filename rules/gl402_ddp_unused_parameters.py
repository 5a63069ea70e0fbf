"""GL402 ddp-unused-parameters: a target meant for DistributedDataParallel whose step leaves trainable parameters
without a gradient, which DDP refuses at the start of the second step."""

from __future__ import annotations

from graphlint.flow import trainable_without_gradient
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule
from graphlint.rules.gl203_unused_parameter import _branch_note

# The first sentence of the error torch.distributed's reducer raises (torch 2.13, checked by a real gloo run).
DDP_ERROR = "Expected to have finished reduction in the prior iteration before starting a new one"


class DdpUnusedParameters(Rule):
    id = "GL402"
    name = "ddp-unused-parameters"
    severity = Severity.ERROR
    tags = ("correctness", "training", "distributed", "ddp")
    precision = "high"
    default_enabled = False  # on for targets meant for DDP: `--ddp N`, or distributed = "ddp" in [tool.graphlint]
    summary = ("Under DistributedDataParallel, trainable parameters that get no gradient make the second step "
               "fail.")
    what = """
        For a target meant to be trained with `DistributedDataParallel` (`graphlint check --ddp N`, `graphlint
        memory --ddp N`, or `distributed = "ddp"` in `[tool.graphlint]`): trainable parameters that get no
        gradient on the captured step, whatever the reason (a layer built but never called, a head whose
        result the loss drops, a `.detach()` on the way): the parameters GL203 and GL202 find, the ones the
        real backward did not reach. Without `find_unused_parameters=True`, DDP waits for their gradients to
        finish its buckets' reduction, and the next forward raises.

        The finding points at the line that built the parameters and names them, with their indices in DDP's
        parameter list (the trainable parameters in `named_parameters()` order), the indices DDP's own error
        prints. The rule runs only when the target is meant for DDP; it is off otherwise.
    """
    why = """
        The job starts, runs its first step on every rank, and fails at the second with "Expected to have
        finished reduction in the prior iteration before starting a new one. This error indicates that your
        module has parameters that were not used in producing loss." That is after the queue, the launch and
        the data loading, on every rank at once.
    """
    example = """
        self.proj = nn.Linear(256, 256)
        self.aux_head = nn.Linear(256, 10)   # never called in forward
        ...
        model = DistributedDataParallel(Net())
    """
    instead = """
        self.proj = nn.Linear(256, 256)
        # remove aux_head or freeze it: self.aux_head.requires_grad_(False); or, at a cost on every step,
        model = DistributedDataParallel(Net(), find_unused_parameters=True)
    """
    bad_examples = (
        Example(
            title="a head built but never called, under DDP",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(8, 8)
                        self.aux_head = nn.Linear(8, 3)  # expect: GL402

                    def forward(self, x):
                        return self.proj(x)


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="a branch whose result the loss drops",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.body = nn.Linear(8, 8)
                        self.probe = nn.Linear(8, 1)  # expect: GL402

                    def forward(self, x):
                        h = self.body(x)
                        self.last_probe = self.probe(h.detach())
                        return h


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="every trainable parameter gets a gradient; the spare layer is frozen",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(8, 8)
                        self.spare = nn.Linear(8, 8).requires_grad_(False)

                    def forward(self, x):
                        return self.proj(x)


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
    )

    def check(self, capture):
        missing = set(trainable_without_gradient(capture))
        if not missing:
            return
        # DDP's parameter list: the trainable parameters in named_parameters() order, the indices its error prints.
        index = {name: i for i, name in enumerate(n for n, info in capture.parameters.items() if info.requires_grad)}
        by_site: dict[object, list[str]] = {}
        for name in capture.parameters:
            if name in missing:
                built = capture.parameters[name].built_at
                site = (built[-1].file, built[-1].line) if built else capture.parameters[name].module_path
                by_site.setdefault(site, []).append(name)
        branch = _branch_note(capture)
        for group in by_site.values():
            indices = ", ".join(str(index[name]) for name in group)
            yield Problem(
                message=f"Under DistributedDataParallel, {{parameters}} in {{where}} (DDP's parameter "
                        f"{'indices' if len(group) > 1 else 'index'} {indices}) get no gradient on this step"
                        f"{branch}, so the second step fails with \"{DDP_ERROR}\"; remove {{them}} or freeze "
                        "{them} with requires_grad_(False), or pass find_unused_parameters=True to "
                        "DistributedDataParallel, which then walks the autograd graph after every forward to "
                        "find them (a cost on every step).",
                stack=capture.parameters[group[0]].built_at,
                module_path=capture.parameters[group[0]].module_path,
                parameters=tuple(group),
            )
