"""Submodule calls a fix stops making: `self.attend(scores)` where `self.attend = nn.Softmax(dim=-1)`, replaced
by a fused call, or `self.attn_drop(attn)` folded into `dropout_p=`, or `dropout(p_attn)` in a helper that the
model calls with `dropout=self.dropout`. The outputs stay the same, but every hook registered on that submodule
(an attention recorder's forward hook) would silently stop firing, so such a fix is never safe, whichever rule
made it (graphlint.locate.spans applies this to every fixer's answer)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

from graphlint.fix.rewrite import code_of
from graphlint.fix.source import functions_in, self_assignments


def self_calls(node: cst.CSTNode, in_else: bool = True) -> list[cst.Call]:
    """The calls `self.NAME(...)` in `node` (outside its `else:` blocks unless `in_else`)."""
    return [call for call in _calls(node, in_else) if isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, cst.Name) and call.func.value.value == "self"]


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
                         class_around: Callable[[cst.CSTNode], cst.ClassDef | None],
                         around: Callable[[cst.CSTNode], tuple[cst.FunctionDef | None, cst.Module]] | None = None,
                         ) -> list[tuple[str, str]]:
    """(what was called, what it is) of each submodule the replaced code `olds` called and the new code `news`
    never calls: `self.NAME(...)`, and with `around` (the function a node is written in, and its file's module)
    a parameter `NAME(...)` to which a call of its function in that file passes a submodule. `class_around`
    gives the class a call is written in. A call the new code still makes fewer times (`self.gate(x) *
    torch.sigmoid(self.gate(x))` → `F.silu(self.gate(x))`) keeps the module's hooks."""
    # A call the new code keeps only in an `else:` (GL101's fallback for flags the capture did not take) is not
    # made on the path the fix takes: there its hooks stop firing.
    kept = {code_of(call.func) for node in news for call in _calls(node, in_else=False)}
    dropped: dict[str, str] = {}
    for node in olds:
        for call in self_calls(node):
            name = call.func.attr.value
            if code_of(call.func) in kept:
                continue
            kind = module_kind(class_around(call), name)
            if kind is not None:
                dropped.setdefault(f"self.{name}", f"a {kind} module")
        if around is None:
            continue
        for call in _calls(node):
            if isinstance(call.func, cst.Name) and call.func.value not in kept:
                for passed, kind in _modules_passed(call.func.value, *around(call), class_around):
                    dropped.setdefault(call.func.value, f"{passed}, a {kind} module")
    return list(dropped.items())


def _calls(node: cst.CSTNode, in_else: bool = True) -> list[cst.Call]:
    """Every call in `node` (outside its `else:` blocks unless `in_else`)."""
    found: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Else(self, node: cst.Else) -> bool:
            return in_else

        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(_Calls())
    return found


def _modules_passed(name: str, function: cst.FunctionDef | None, module: cst.Module,
                    class_around: Callable[[cst.CSTNode], cst.ClassDef | None]) -> list[tuple[str, str]]:
    """(`self.X`, module class) for each submodule a call of `function` in `module` passes as its parameter
    `name`: `attention(q, k, v, dropout=self.dropout)`, or by position; a method is called as `self.f(...)`."""
    if function is None:
        return []
    params = [*function.params.posonly_params, *function.params.params]
    names = [param.name.value for param in params]
    every = names + [param.name.value for param in function.params.kwonly_params]
    if name not in every:
        return []
    method = bool(names) and names[0] == "self"
    position = names.index(name) - (1 if method else 0) if name in names else None
    found: list[tuple[str, str]] = []
    for call in _calls(module):
        callee = code_of(call.func)
        if callee != (f"self.{function.name.value}" if method else function.name.value):
            continue
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        passed = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)
        if passed is None and position is not None and 0 <= position < len(positional):
            passed = positional[position].value
        for branch in _branches(passed) if passed is not None else ():
            if isinstance(branch, cst.Attribute) and code_of(branch.value) == "self":
                kind = module_kind(class_around(call), branch.attr.value)
                if kind is not None:
                    found.append((code_of(branch), kind))
    return found


def hooks_reason(dropped: list[tuple[str, str]]) -> str:
    """Why such a fix is unsafe, in one clause."""
    named = ", ".join(f"{name} ({what})" for name, what in dropped)
    return f"the fix no longer calls {named}; hooks registered on {'them' if len(dropped) > 1 else 'it'} would stop firing"
