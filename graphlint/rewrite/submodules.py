"""Submodule calls a fix stops making: `self.attend(scores)` where `self.attend = nn.Softmax(dim=-1)`, replaced
by a fused call, or `self.attn_drop(attn)` folded into `dropout_p=`, or `dropout(p_attn)` in a helper that the
model calls with `dropout=self.dropout`. The outputs stay the same; what else could tell the difference is
judged on the model as built (graphlint.locate.spans applies this to every fixer's answer, whichever rule made
it): a hook registered on the module would stop firing, a subclass's or a project module's forward would no
longer run, and parameters or buffers would no longer be used, each of which makes the fix unsafe. A stateless
torch.nn module of exactly its class (a dropout, `Softmax`, `Identity`) with no hook is safe to stop calling,
as long as the fix still reads its configuration (a dropout's `p`), so that changing it still changes the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.contract import code_of
from graphlint.rewrite.source import collect, functions_in, self_assignments

if TYPE_CHECKING:
    from graphlint.capture.modules import ModuleInfo

# torch.nn modules whose call computes a function of its input and its configuration only: no state, no
# parameters, nothing recorded. The configuration a fix must keep reading, where it has one that can change.
STATELESS = {
    **{f"torch.nn.modules.dropout.{name}": "p" for name in (
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")},
    "torch.nn.modules.activation.Softmax": None,
    "torch.nn.modules.linear.Identity": None,
}


@dataclass(frozen=True)
class Dropped:
    """A submodule call the fix no longer makes: the name called (`self.attn_drop`, or `dropout` in a helper),
    what it is (`a Dropout module`, `self.dropout, a Dropout module`), and the module's attribute and the class
    that sets it, to find it in the model as built."""

    called: str
    what: str
    attribute: str
    owner: str | None


def self_calls(node: cst.CSTNode, in_else: bool = True) -> list[cst.Call]:
    """The calls `self.NAME(...)` in `node` (outside its `else:` blocks unless `in_else`)."""
    return _calls(node, in_else, m.Call(func=m.Attribute(value=m.Name("self"))))


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
                         ) -> list[Dropped]:
    """(what was called, what it is) of each submodule the replaced code `olds` called and the new code `news`
    never calls: `self.NAME(...)`, and with `around` (the function a node is written in, and its file's module)
    a parameter `NAME(...)` to which a call of its function in that file passes a submodule. `class_around`
    gives the class a call is written in. A call the new code still makes fewer times (`self.gate(x) *
    torch.sigmoid(self.gate(x))` → `F.silu(self.gate(x))`) keeps the module's hooks."""
    # A call the new code keeps only in an `else:` (GL101's fallback for flags the capture did not take) is not
    # made on the path the fix takes: there its hooks stop firing.
    kept = {code_of(call.func) for node in news for call in _calls(node, in_else=False)}
    dropped: dict[str, Dropped] = {}
    for node in olds:
        for call in self_calls(node):
            name = call.func.attr.value
            if code_of(call.func) in kept:
                continue
            owner = class_around(call)
            kind = module_kind(owner, name)
            if kind is not None:
                dropped.setdefault(f"self.{name}", Dropped(f"self.{name}", f"a {kind} module", name,
                                                           owner.name.value if owner is not None else None))
        if around is None:
            continue
        for call in _calls(node):
            if isinstance(call.func, cst.Name) and call.func.value not in kept:
                for passed, kind, owner in _modules_passed(call.func.value, *around(call), class_around):
                    dropped.setdefault(call.func.value, Dropped(call.func.value, f"{passed}, a {kind} module",
                                                                passed.removeprefix("self."), owner))
    return list(dropped.values())


def _calls(node: cst.CSTNode, in_else: bool = True, call: m.Call | None = None) -> list[cst.Call]:
    """Every call in `node` that `call` matches (outside its `else:` blocks unless `in_else`)."""
    return collect(node, m.Call() if call is None else call, prune=None if in_else else m.Else())


def _modules_passed(name: str, function: cst.FunctionDef | None, module: cst.Module,
                    class_around: Callable[[cst.CSTNode], cst.ClassDef | None]) -> list[tuple[str, str, str | None]]:
    """(`self.X`, module class, the class that passes it) for each submodule a call of `function` in `module`
    passes as its parameter `name`: `attention(q, k, v, dropout=self.dropout)`, or by position; a method is
    called as `self.f(...)`."""
    if function is None:
        return []
    params = [*function.params.posonly_params, *function.params.params]
    names = [param.name.value for param in params]
    every = names + [param.name.value for param in function.params.kwonly_params]
    if name not in every:
        return []
    method = bool(names) and names[0] == "self"
    position = names.index(name) - (1 if method else 0) if name in names else None
    found: list[tuple[str, str, str | None]] = []
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
                owner = class_around(call)
                kind = module_kind(owner, branch.attr.value)
                if kind is not None:
                    found.append((code_of(branch), kind, owner.name.value if owner is not None else None))
    return found


def judged(dropped: list[Dropped], news: Iterable[cst.CSTNode], modules: Mapping[str, ModuleInfo] | None,
           ) -> tuple[bool, str]:
    """Whether a fix that stops making the calls `dropped` stays safe, judged on `modules` (the capture's, by
    path; None when unknown), and the clause its message gets: what is no longer called, and why that is
    invisible or what would change."""
    new_code = " ".join(code_of(node) for node in news)
    reasons, quiet = [], []
    for one in dropped:
        why = _observable(one, new_code, modules)
        (reasons if why else quiet).append((one, why))
    if not reasons:
        named = ", ".join(f"{one.called} ({one.what})" for one, _ in quiet)
        return True, (f"the fix no longer calls {named}, which has no hook in the model as built and computes "
                      f"nothing the fused call does not" if len(quiet) == 1 else
                      f"the fix no longer calls {named}, which have no hooks in the model as built and compute "
                      f"nothing the fused call does not")
    return False, "; ".join(f"the fix no longer calls {one.called} ({one.what}): {why}" for one, why in reasons)


def _observable(one: Dropped, new_code: str, modules: Mapping[str, ModuleInfo] | None) -> str:
    """What code outside the model could see change when `one` is no longer called; "" when nothing."""
    instances = _instances(one, modules or {})
    if not instances:
        return "graphlint did not find it in the model as built, so hooks registered on it might stop firing"
    for info in instances:
        if info.hooks:
            kinds = ", ".join(dict.fromkeys(info.hooks))
            return f"{info.path or 'the model'} has hooks registered ({kinds}), which would stop firing"
    for info in instances:
        if info.type_name not in STATELESS:
            if info.library:
                return (f"{info.path} is a {info.class_name}, not a stateless torch.nn module; hooks registered on "
                        f"it would stop firing")
            return (f"{info.path} is a {info.class_name}, not exactly one of torch.nn's stateless modules: its own "
                    f"forward would no longer run")
        if info.tensors:
            return f"{info.path} holds parameters or buffers, which would no longer be used"
    for setting in dict.fromkeys(STATELESS[info.type_name] for info in instances):
        if setting and not re.search(rf"(?<![\w.]){re.escape(one.called)}\.{setting}\b", new_code):
            return f"the fix does not read its `{setting}`, so changing it would no longer change the model"
    return ""


def _instances(one: Dropped, modules: Mapping[str, ModuleInfo]) -> list[ModuleInfo]:
    """The modules of the model set as `self.<attribute>` by a module of the class `owner`."""
    found = []
    for path, info in modules.items():
        parent, _, attribute = path.rpartition(".")
        if attribute != one.attribute or not path:
            continue
        owner = modules.get(parent)
        if owner is not None and owner.class_name == one.owner:
            found.append(info)
    return found
