"""Submodule calls a fix stops making: `self.attend(scores)` where `self.attend = nn.Softmax(dim=-1)`, replaced
by a fused call, or `self.attn_drop(attn)` folded into `dropout_p=`. The outputs stay the same, but every hook
registered on that submodule (an attention recorder's forward hook) would silently stop firing, so such a fix
is never safe, whichever rule made it (graphlint.locate.spans applies this to every fixer's answer)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

from graphlint.fix.rewrite import code_of
from graphlint.fix.source import functions_in, self_assignments


def self_calls(node: cst.CSTNode, in_else: bool = True) -> list[cst.Call]:
    """The calls `self.NAME(...)` in `node` (outside its `else:` blocks unless `in_else`)."""
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Else(self, node: cst.Else) -> bool:
            return in_else

        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) and \
                    call.func.value.value == "self":
                found.append(call)

    node.visit(_Calls())
    return found


def module_kind(classdef: cst.ClassDef | None, name: str) -> str | None:
    """The class `self.<name>` is built from in `classdef` when it is a module (`nn.Softmax(dim=-1)` gives
    "Softmax"), None for a method, a function stored on self (`self.act = F.gelu`) or what the class never sets."""
    if classdef is None or any(f.name.value == name for f in functions_in(classdef)):
        return None
    for value in self_assignments(classdef, name):
        for branch in _branches(value):
            if isinstance(branch, cst.Call):
                callee = code_of(branch.func).split(".")[-1]
                if callee[:1].isupper():  # a class is constructed: nn.Dropout(p), Attend(...)
                    return callee
    return None


def _branches(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(value, cst.IfExp):  # `nn.Dropout(p) if p > 0 else nn.Identity()`
        return [*_branches(value.body), *_branches(value.orelse)]
    return [value]


def dropped_module_calls(olds: Iterable[cst.CSTNode], news: Iterable[cst.CSTNode],
                         class_around: Callable[[cst.CSTNode], cst.ClassDef | None]) -> list[tuple[str, str]]:
    """(name, module class) of each `self.NAME` submodule the replaced code `olds` called and the new code `news`
    never calls; `class_around` gives the class an old call is written in. A call the new code still makes fewer
    times (`self.gate(x) * torch.sigmoid(self.gate(x))` → `F.silu(self.gate(x))`) keeps the module's hooks."""
    # A call the new code keeps only in an `else:` (GL101's fallback for flags the capture did not take) is not
    # made on the path the fix takes: there its hooks stop firing.
    kept = {code_of(call.func) for node in news for call in self_calls(node, in_else=False)}
    dropped: dict[str, str] = {}
    for node in olds:
        for call in self_calls(node):
            name = call.func.attr.value
            if code_of(call.func) in kept:
                continue
            kind = module_kind(class_around(call), name)
            if kind is not None:
                dropped.setdefault(name, kind)
    return list(dropped.items())


def hooks_reason(dropped: list[tuple[str, str]]) -> str:
    """Why such a fix is unsafe, in one clause."""
    named = ", ".join(f"self.{name} (a {kind} module)" for name, kind in dropped)
    return f"the fix no longer calls {named}; hooks registered on {'them' if len(dropped) > 1 else 'it'} would stop firing"
