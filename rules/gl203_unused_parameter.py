"""GL203 unused-parameter: trainable parameters the forward never uses, or whose results never reach the loss."""

from __future__ import annotations

from collections import defaultdict

from graphlint.capture import facts
from graphlint.files import display_path
from graphlint.flow import gradient_cuts, leaves_torch, trainable_without_gradient
from graphlint.ops import op
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule


class UnusedParameter(Rule):
    id = "GL203"
    name = "unused-parameter"
    severity = Severity.NOTE
    tags = ("correctness", "training", "memory", "sequence-length")
    precision = "high"
    summary = "Trainable parameters that the forward never uses, so they get no gradient."
    what = """
        Parameters with `requires_grad=True` that get no gradient because the forward never used them (a
        layer built but not called, a head for another task), or used them only for results that never reach
        the loss. Parameters cut off by `.detach()`, `.data` or `no_grad` are GL202 gradient-cut instead.

        The finding points at the line that built the parameters (the `nn.Linear(...)` call, or the
        `self.w = nn.Parameter(...)` assignment) and names them, grouped by module. When the captured forward
        branched on a tensor value, the message says so: a branch this capture did not take may use them.
        So it does when the forward drew from Python's or NumPy's random numbers (`random.randrange(5)` steps):
        every capture draws the same (graphlint seeds torch, `random` and NumPy alike), so the finding is
        repeatable, but another draw may use them.
        When the source uses them only inside an `if` on an attribute of the model (`if self.use_global:`, a
        flag switched on after warm-up epochs, or `if not self.training:`), the message names that condition:
        they get gradients wherever it holds. graphlint also runs the step again with the inputs' sequence
        (dimension 1) four times longer; parameters that get gradients there (a layer used only from a model's
        second chunk on) are reported with both lengths ("this holds at the recorded sequence 32 only: at sequence 128
        gradients do reach them")
        and the advice to keep them if training sees longer sequences; otherwise the message says that the
        finding holds at both lengths, or, when the longer step cannot run, "for the inputs captured".
    """
    why = """
        Unused parameters cost memory for weights, gradients and optimizer state, and they make
        DistributedDataParallel fail ("Expected to have finished reduction in the prior iteration") unless
        `find_unused_parameters=True`, which slows every step. Often they are a sign of a layer that was
        meant to be called.
    """
    example = """
        self.proj = nn.Linear(256, 256)
        self.aux_head = nn.Linear(256, 10)   # never called in forward
    """
    instead = """
        self.proj = nn.Linear(256, 256)
        # remove aux_head, call it, or freeze it: self.aux_head.requires_grad_(False)
    """
    bad_examples = (
        Example(
            title="a layer built but never called, and a parameter never read",
            source='''
                import torch
                from torch import nn


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.proj = nn.Linear(8, 8)
                        self.aux_head = nn.Linear(8, 3)  # expect: GL203
                        self.temperature = nn.Parameter(torch.ones(1))  # expect: GL203

                    def forward(self, x):
                        return self.proj(x)


                def make():
                    return Net(), (torch.randn(4, 8),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="every trainable parameter is used; a frozen spare layer",
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
        used = gradient_cuts(capture)
        unused = [name for name in trainable_without_gradient(capture) if name not in used]
        unreaching = [name for name, cuts in used.items() if not cuts]
        branch = _branch_note(capture)
        for names, opening in ((unused, "The forward never uses {parameters} in {where}"),
                            (unreaching, "Nothing computed from {parameters} in {where} reaches the loss")):
            by_module: dict[str, list[str]] = defaultdict(list)
            for name in names:
                by_module[capture.parameters[name].module_path].append(name)
            for module, group in by_module.items():
                flag = _untaken_flag(capture, module, group)
                advice = "remove {them}, or freeze {them} with requires_grad_(False)."
                if flag is not None:  # the source uses them where a Python flag of the model says so
                    advice = (f"the source uses {{them}} only under {flag}, a branch this capture did not take: "
                              "where that condition holds (a flag switched on later in training) the forward uses "
                              f"{{them}}; if it never does, {advice}")
                longer = capture.longer_sequence
                scope = branch
                if not branch:  # how far the finding is known to hold
                    scope = (" for the inputs captured" if longer is None else
                             f" (at sequence {longer[0]}, and also at {longer[1]})")
                if longer is not None and set(group) <= longer[2]:  # a longer input's step reaches them
                    scope = branch
                    recorded, grown, _ = longer
                    advice = (f"this holds at the recorded sequence {recorded} only: at sequence {grown} gradients do "
                              "reach {them} (the forward uses more of the model on longer inputs), so keep {them} if "
                              f"training sees sequences longer than {recorded}; if it never does, {advice}")
                yield Problem(
                    message=f"{opening}, so no gradient reaches {{them}}{scope}; {advice}",
                    stack=capture.parameters[group[0]].built_at,
                    module_path=module,
                    parameters=tuple(group),
                )


def _untaken_flag(capture, module: str, group: list[str]) -> str | None:
    """`` `if <condition>` (file:line) `` when the source uses these parameters (or a module that holds them,
    at any depth) only inside an `if` whose condition reads an attribute of `self` in the class that holds it (a
    flag such as `self.use_global`, or a buffer), outside `__init__`: a branch the capture did not take. None
    otherwise, or when the source cannot be read."""
    levels = []  # (the holder's path, the attribute it holds them by, the frames that built that attribute)
    if len(group) == 1:  # an `nn.Parameter` of the module itself
        levels.append((module, group[0].rpartition(".")[2], capture.parameters[group[0]].built_at))
    parts = module.split(".") if module else []
    for depth in range(len(parts), 0, -1):
        path = ".".join(parts[:depth])
        info = capture.modules.get(path)
        levels.append((".".join(parts[:depth - 1]), parts[depth - 1], info.built_at if info is not None else ()))
    for holder, attribute, built in levels:
        info = capture.modules.get(holder)
        if info is not None and built:  # the attribute is assigned in the holder's class, in that file
            found = _flag_in_source(built[-1].file, info.class_name, attribute)
            if found is not None:
                return found
    return None


def _flag_in_source(file: str, class_name: str, attribute: str) -> str | None:
    import ast
    import linecache

    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == class_name]
    if len(classes) != 1:
        return None
    conditions: list[ast.expr] = []
    for method in classes[0].body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.name == "__init__":
            continue
        for _use, guard in _uses(method, attribute, None):
            if guard is None:
                return None  # used unconditionally: the branch is not why they got no gradient
            conditions.append(guard)
    if not conditions:
        return None
    first = conditions[0]
    return f"`if {ast.unparse(first)}` ({display_path(file)}:{first.lineno})"


def _reads_self(condition) -> bool:
    import ast

    return any(isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
               for node in ast.walk(condition))


def _uses(node, attribute: str, guard):
    """(use, guarding condition) for each `self.<attribute>` under `node`; the guard is the innermost `if` (or
    conditional expression) whose condition reads an attribute of `self`, None when there is none."""
    import ast

    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
            and node.attr == attribute and isinstance(node.ctx, ast.Load):
        yield node, guard
        return
    if isinstance(node, (ast.If, ast.IfExp)):
        yield from _uses(node.test, attribute, guard)
        inner = node.test if _reads_self(node.test) else guard
        for child in (node.body if isinstance(node.body, list) else [node.body]):
            yield from _uses(child, attribute, inner)
        for child in (node.orelse if isinstance(node.orelse, list) else [node.orelse]):
            yield from _uses(child, attribute, inner)
        return
    for child in ast.iter_child_nodes(node):
        yield from _uses(child, attribute, guard)


def _branch_note(capture) -> str:
    branch = next((n for n in capture.ops if op(n) == "bool" and leaves_torch(n) and facts(n).stack), None)
    if branch is None and capture.python_draws:
        drawn = " and ".join(f"`{name}`" for name in capture.python_draws)
        return (f" in this capture (the forward draws from {drawn}, and another draw may use {{them}}: "
                "check that some draw does)")
    if branch is None:
        return ""
    frame = facts(branch).stack[-1]
    return (f" (the forward branched on a tensor value at {display_path(frame.file)}:{frame.line}, "
            "and a branch this capture did not take may use {them})")
