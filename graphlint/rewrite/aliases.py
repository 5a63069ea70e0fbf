"""Who else holds a tensor that an in-place write reaches: other names bound to it or to a view of it, the tensor
it is itself a view of, the caller (an argument), the module (a registered buffer or parameter). GL201's fix
(graphlint/rewrite/out_of_place.py) may only make a write out-of-place, or give it a copy of its own, where nothing
reads the old tensor after the write."""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.contract import FixSite, Refused, code_of, names_read
from graphlint.rewrite.source import all_parameters, binds, path_to

# Methods whose result shares the receiver's memory: a write into the result reaches the receiver.
VIEWS = frozenset({"view", "view_as", "transpose", "t", "permute", "unsqueeze", "squeeze", "narrow", "select",
                   "diagonal", "unflatten", "movedim", "moveaxis", "swapaxes", "swapdims", "expand", "expand_as",
                   "as_strided", "unfold", "detach", "chunk", "split", "unbind", "tensor_split"})
_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag"})


def viewed(expression: cst.BaseExpression) -> cst.BaseExpression | None:
    """The name or attribute whose memory `expression` is, read through views (`y.view(-1)[:4]` → `y`); None
    when it is anything else (a call's new tensor)."""
    while True:
        if isinstance(expression, cst.Name) or is_attribute_path(expression):
            return expression
        if isinstance(expression, cst.Subscript):
            expression = expression.value
        elif isinstance(expression, cst.Attribute) and expression.attr.value in _VIEW_ATTRIBUTES:
            expression = expression.value
        elif isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute) and \
                expression.func.attr.value in VIEWS:
            expression = expression.func.value
        else:
            return None


def is_attribute_path(expression: cst.BaseExpression) -> bool:
    """`self.h`, `self.block.h`: an attribute of a name, not a view attribute (`.T`) nor `.data`."""
    if not isinstance(expression, cst.Attribute) or expression.attr.value in _VIEW_ATTRIBUTES | {"data", "grad"}:
        return False
    return isinstance(expression.value, cst.Name) or is_attribute_path(expression.value)


def statement_of(site: FixSite) -> cst.BaseSmallStatement | None:
    """The small statement the located node is part of."""
    if site.statement is not None:
        return site.statement
    for line in lines_of(site.function or site.module):
        for small in line.body:
            if path_to(small, site.node) is not None:
                return small
    return None


def unshared(site: FixSite, statement: cst.BaseSmallStatement, target: cst.BaseExpression) -> None:
    """Raise Refused when something other than `target` reads the tensor it names after `statement` writes it:
    a made out-of-place write, or one into a copy, would no longer reach that reader."""
    if isinstance(target, cst.Attribute):
        if isinstance(target.value, cst.Attribute):  # `self.fc.weight`
            raise Refused(f"{code_of(target)} belongs to {code_of(target.value)}, another object: rebinding it would "
                          f"replace what that object holds (a submodule's parameter or buffer, for one)")
        registered = _registered(site.classdef, target)
        if registered == "parameter":
            raise Refused(f"{code_of(target)} is a registered parameter of the module: nn.Module does not let it be "
                          f"rebound to a computed tensor, and the optimizer updates the one it holds")
        if registered:
            raise Refused(f"{code_of(target)} is a registered {registered} of the module, kept from step to step: "
                          f"rebinding it to a new tensor is not the same update (other holders of it would not see "
                          f"the write, and it could carry autograd history into the next step)")
        return
    name = target.value
    if site.function is None:
        return
    if name in {p.name.value for p in all_parameters(site.function)}:
        raise Refused(f"{name} is an argument of {site.function.name.value}(): the caller's tensor would no longer be "
                      f"written")
    order = _ordered(site.function)
    index = next((i for i, (small, _) in enumerate(order) if small is statement), None)
    if index is None:
        return
    last_own: cst.BaseExpression | None = None
    for small, _ in order[:index]:
        kept = _kept(small, name)
        if kept:
            raise Refused(f"{kept} keeps {name} where a later read may see the write (in this call or the next): "
                          f"made out-of-place or into a copy, the write would no longer reach it")
        for bound, value in _bindings(small):
            source = viewed(value) if value is not None else None
            if bound == name:
                last_own = value
            elif isinstance(source, cst.Name) and source.value == name and read_after(order, index, bound):
                raise Refused(f"{bound} = {code_of(value)} shares its memory with {name} and is read after the "
                              f"write: made out-of-place or into a copy, the write would no longer reach {bound}")
    source = viewed(last_own) if last_own is not None else None
    if isinstance(source, cst.Name) and source.value != name and read_after(order, index, source.value):
        raise Refused(f"{name} is a view of {source.value} ({name} = {code_of(last_own)}), and {source.value} is read "
                      f"after the write: made out-of-place or into a copy, the write would no longer reach it")


def read_after(order: list, index: int, name: str) -> bool:
    """Whether `name` is read after the statement at `index`, or anywhere in a loop around it."""
    statement, loops = order[index]
    for loop in loops:
        if any(n.value == name for n in names_read(loop) if not _binds_here(loop, n)):
            return True
    for small, _ in order[index + 1:]:
        if name in _reads(small):
            return True
        if any(bound == name for bound, _ in _bindings(small)):
            return False
    return False


def is_read_after(site: FixSite, statement: cst.BaseSmallStatement, name: str) -> bool:
    order = _ordered(site.function) if site.function is not None else []
    index = next((i for i, (small, _) in enumerate(order) if small is statement), None)
    return index is None or read_after(order, index, name)


def lines_of(root: cst.CSTNode | None) -> list[cst.SimpleStatementLine]:
    found: list[cst.SimpleStatementLine] = []

    class _Lines(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> bool:
            found.append(line)
            return False

    if root is not None:
        root.visit(_Lines())
    return found


def _ordered(function: cst.FunctionDef) -> list[tuple[cst.BaseSmallStatement, tuple[cst.CSTNode, ...]]]:
    """The function's small statements in source order, each with the loops around it."""
    found: list = []

    class _Walk(cst.CSTVisitor):
        def __init__(self) -> None:
            self.loops: list[cst.CSTNode] = []

        def visit_For(self, node: cst.For) -> None:
            self.loops.append(node)

        def leave_For(self, node: cst.For) -> None:
            self.loops.pop()

        def visit_While(self, node: cst.While) -> None:
            self.loops.append(node)

        def leave_While(self, node: cst.While) -> None:
            self.loops.pop()

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function  # a nested function's statements are not this one's

        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> bool:
            found.extend((small, tuple(self.loops)) for small in line.body)
            return False

    function.visit(_Walk())
    return found


def _bindings(small: cst.BaseSmallStatement) -> list[tuple[str, cst.BaseExpression | None]]:
    """(name, the value it is bound to, or None when not known) for each plain name the statement binds."""
    if isinstance(small, cst.Assign):
        found = []
        for target in small.targets:
            if isinstance(target.target, cst.Name):
                found.append((target.target.value, small.value))
            else:
                found.extend((n.value, None) for n in names_read(target.target) if binds(target.target, n))
        return found
    if isinstance(small, (cst.AnnAssign, cst.AugAssign)) and isinstance(small.target, cst.Name):
        return [(small.target.value, getattr(small, "value", None) if isinstance(small, cst.AnnAssign) else None)]
    return []


def _kept(small: cst.BaseSmallStatement, name: str) -> str:
    """The code of a statement that stores `name` (or a view of it) in an object: `self.cache = y`,
    `outputs.append(y)`; "" for any other statement."""
    stored = []
    if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Attribute) for t in small.targets):
        stored = [small.value]
    elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
            isinstance(small.value.func, cst.Attribute) and small.value.func.attr.value in ("append", "extend", "insert"):
        stored = [a.value for a in small.value.args]
    for value in stored:
        source = viewed(value)
        if isinstance(source, cst.Name) and source.value == name:
            return code_of(small).strip()
    return ""


def _binds_here(root: cst.CSTNode, name: cst.Name) -> bool:
    return False if not isinstance(root, cst.For) else path_to(root.target, name) is not None


def _reads(small: cst.BaseSmallStatement) -> set[str]:
    bound = {id(n) for t in getattr(small, "targets", ()) for n in names_read(t.target) if binds(t.target, n)}
    return {n.value for n in names_read(small) if id(n) not in bound}


def _registered(classdef: cst.ClassDef | None, target: cst.Attribute) -> str:
    """"buffer" or "parameter" when the class registers `self.<name>` as one, else ""."""
    if classdef is None or not (isinstance(target.value, cst.Name) and target.value.value == "self"):
        return ""
    name = target.attr.value
    found = []

    class _Registrations(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else ""
            first = call.args[0].value if call.args else None
            if method in ("register_buffer", "register_parameter") and isinstance(first, cst.SimpleString) and \
                    first.evaluated_value == name:
                found.append(method.removeprefix("register_"))

        def visit_Assign(self, node: cst.Assign) -> None:
            called = node.value.func if isinstance(node.value, cst.Call) else None
            if any(code_of(t.target) == f"self.{name}" for t in node.targets) and called is not None and \
                    code_of(called).split(".")[-1] == "Parameter":
                found.append("parameter")

    classdef.visit(_Registrations())
    return found[0] if found else ""
