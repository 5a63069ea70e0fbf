"""GL201's fix: an in-place write to a tensor autograd saved, made out-of-place where that computes the same.

Two rewrites, both exact when nothing else reads the old tensor after the write (graphlint/rewrite/aliases.py):
out-of-place (`y.mul_(2)` → `y = y.mul(2)`, `y *= 2` → `y = y * 2`, `inplace=True` dropped), and, where a
write has no out-of-place twin (index assignment, a write through a view, `zero_`, `copy_`), a copy of its own
made just before it (`y = y.clone()`), so that the tensor autograd saved keeps its value.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import torch

from graphlint.rewrite.aliases import is_attribute_path, is_read_after, lines_of, statement_of, unshared, viewed
from graphlint.rewrite.contract import FixSite, Refused, Rewrite, atom, code_of, is_namespace
from graphlint.rewrite.source import all_nodes, import_bindings, path_to, root_name

_AUGMENTED = {cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
              cst.DivideAssign: cst.Divide, cst.PowerAssign: cst.Power, cst.MatrixMultiplyAssign: cst.MatrixMultiply,
              cst.FloorDivideAssign: cst.FloorDivide, cst.ModuloAssign: cst.Modulo, cst.BitAndAssign: cst.BitAnd,
              cst.BitOrAssign: cst.BitOr, cst.BitXorAssign: cst.BitXor, cst.LeftShiftAssign: cst.LeftShift,
              cst.RightShiftAssign: cst.RightShift}
# Methods that overwrite the whole tensor, whatever it held.
_OVERWRITES = frozenset({"copy_", "zero_", "fill_"})
# Where `inplace` is passed by position: torch.nn.functional's functions, and torch.nn's modules (capitalised).
_INPLACE_POSITION = {"relu": 1, "relu6": 1, "selu": 1, "silu": 1, "mish": 1, "hardswish": 1, "hardsigmoid": 1,
                     "elu": 2, "celu": 2, "leaky_relu": 2, "hardtanh": 3, "threshold": 3, "rrelu": 4, "dropout": 3,
                     "dropout1d": 3, "dropout2d": 3, "dropout3d": 3, "alpha_dropout": 3, "feature_alpha_dropout": 3,
                     "ReLU": 0, "ReLU6": 0, "SELU": 0, "SiLU": 0, "Mish": 0, "Hardswish": 0, "Hardsigmoid": 0,
                     "ELU": 1, "CELU": 1, "LeakyReLU": 1, "Hardtanh": 2, "Threshold": 2, "RReLU": 2, "Dropout": 1,
                     "Dropout1d": 1, "Dropout2d": 1, "Dropout3d": 1, "AlphaDropout": 1, "FeatureAlphaDropout": 1}


def out_of_place(site: FixSite) -> Rewrite | str:
    """GL201's fix: the same computation without the write (rules/gl201_inplace_on_saved/__init__.py, `fixes`), or why
    this write has none."""
    try:
        return _rewrite(site)
    except Refused as reason:
        return str(reason)


def _rewrite(site: FixSite) -> Rewrite:
    node = site.node
    statement = statement_of(site)
    if isinstance(node, cst.AugAssign) or isinstance(statement, cst.AugAssign) and node is statement.target:
        return _augmented(site, statement)
    if isinstance(statement, cst.Assign) and not isinstance(node, cst.Call) and \
            any(isinstance(t.target, cst.Subscript) for t in statement.targets):
        target = next(t.target for t in statement.targets if isinstance(t.target, cst.Subscript))
        return _own_copy(site, statement, target, code_of(statement))
    if not isinstance(node, cst.Call):
        raise Refused("the write is not a call, an augmented assignment or an index assignment")
    flag = _inplace_argument(node)
    if flag is not None:
        return _flag(node, flag)
    if statement is None:
        raise Refused("the write is not inside a statement of a function")
    out = next((a for a in node.args if a.keyword is not None and a.keyword.value == "out"), None)
    if out is not None:
        return _out(site, statement, node, out)
    if isinstance(node.func, cst.Attribute) and is_namespace(node.func.value, site.imports):
        return _function(site, statement, node)
    return _method(site, statement, node)


def _augmented(site: FixSite, statement: cst.AugAssign) -> Rewrite:
    """`x op= y` → `x = x op y`; into a subscript (`x[..., :d] += y`), on a copy of its own."""
    operator = _AUGMENTED.get(type(statement.operator))
    if isinstance(statement.target, cst.Subscript) and operator is not None and _list_slot(site, statement.target):
        # `laterals[i - 1] += y` on a Python list: rebinding the slot writes no tensor.
        new = cst.Assign(targets=[cst.AssignTarget(statement.target)],
                         value=cst.BinaryOperation(statement.target, operator(), atom(statement.value)))
        return Rewrite(statement, new, f"{code_of(statement)} → {code_of(new)} (a slot of a list, not a tensor)")
    if isinstance(statement.target, cst.Subscript):
        return _own_copy(site, statement, statement.target, code_of(statement))
    if operator is None:
        raise Refused(f"{code_of(statement.operator).strip()} has no binary operator to write it with")
    if not isinstance(statement.target, cst.Name) and not is_attribute_path(statement.target):
        raise Refused("only x op= y on a name, an attribute or a subscript can be rewritten")
    unshared(site, statement, statement.target)
    new = cst.Assign(targets=[cst.AssignTarget(statement.target)],
                     value=cst.BinaryOperation(statement.target, operator(), atom(statement.value)))
    return Rewrite(statement, new, f"{code_of(statement)} → {code_of(new)}")


def _inplace_argument(call: cst.Call) -> cst.Arg | None:
    """The argument that passes inplace=: by keyword, or at its position for the functions and modules that take it."""
    keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == "inplace"), None)
    if keyword is not None:
        return keyword
    name = call.func.attr.value if isinstance(call.func, cst.Attribute) else getattr(call.func, "value", "")
    position = _INPLACE_POSITION.get(name)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[position] if position is not None and len(positional) > position else None


def _flag(call: cst.Call, flag: cst.Arg) -> Rewrite:
    """`F.relu(x, inplace=True)` → `F.relu(x)`, `nn.LeakyReLU(0.1, True)` → `nn.LeakyReLU(0.1)`; a flag that is
    not the literal True (`inplace=inplace`) becomes False: it was true when the write ran."""
    literal_true = isinstance(flag.value, cst.Name) and flag.value.value == "True"
    if literal_true and (flag.keyword is not None or flag is call.args[-1]):
        args = [a for a in call.args if a is not flag]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    else:
        args = [a.with_changes(value=cst.Name("False")) if a is flag else a for a in call.args]
    new = call.with_changes(args=args)
    return Rewrite(call, new, f"{code_of(call)} → {code_of(new)}")


def _chain(call: cst.Call, statement: cst.BaseSmallStatement) -> tuple[cst.Call, cst.BaseExpression, list[cst.Call]]:
    """(the outermost in-place method call of the chain `call` is in, the tensor the chain writes, the chain's
    in-place calls): `y.mul_(2).add_(1)` → (the add_ call, `y`, [mul_, add_])."""
    top = call
    while True:
        path = path_to(statement, top) or []
        parent = path[-2] if len(path) > 1 else None
        grand = path[-3] if len(path) > 2 else None
        if isinstance(parent, cst.Attribute) and parent.value is top and isinstance(grand, cst.Call) and \
                grand.func is parent and _in_place_name(parent.attr.value):
            top = grand
        else:
            break
    calls, receiver = [], top
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and \
            _in_place_name(receiver.func.attr.value):
        calls.append(receiver)
        receiver = receiver.func.value
    return top, receiver, calls[::-1]


def _method(site: FixSite, statement: cst.BaseSmallStatement, call: cst.Call) -> Rewrite:
    """`y.mul_(2)` → `y = y.mul(2)`, `y.mul_(2).add_(1)` → `y = y.mul(2).add(1)`, `r = y.relu_()` →
    `r = y = y.relu()`; `y.view(-1).zero_()` or a method with no out-of-place twin: a copy first."""
    top, receiver, calls = _chain(call, statement)
    imported = import_bindings(site.module) if site.module is not None else {}
    if root_name(receiver) in imported or code_of(receiver) == "self":  # `nn.init.zeros_(w)`, a module's method
        raise Refused(f"{code_of(top.func)} is not an in-place method of a tensor")
    _not_through_data(receiver)
    target = viewed(receiver)
    if target is None:
        raise Refused(f"the write goes into what {code_of(receiver)} returns, which may be a tensor held elsewhere")
    if target is receiver and len(calls) == 1 and calls[0].func.attr.value in _OVERWRITES:
        return _fresh(site, statement, top, target)
    twins = [c.func.attr.value[:-1] for c in calls]
    if target is not receiver or not all(hasattr(torch.Tensor, twin) for twin in twins):
        return _own_copy(site, statement, receiver, code_of(top))
    return _assigned(site, statement, top, _renamed(top, calls), target)


def _fresh(site: FixSite, statement: cst.BaseSmallStatement, call: cst.Call, target: cst.BaseExpression) -> Rewrite:
    """`y.copy_(src)` → `y = torch.empty_like(y).copy_(src)`, `y.zero_()` → `y = torch.zeros_like(y)`: the whole
    tensor is overwritten, so a new one of its kind takes the values, and the one autograd saved keeps its own."""
    method = call.func.attr.value
    like, imports = site.imports.torch_call("zeros_like" if method == "zero_" else "empty_like")
    fresh = cst.parse_expression(f"{like}({code_of(target)})")
    new = fresh if method == "zero_" else call.with_changes(func=call.func.with_changes(value=fresh))
    rewrite = _assigned(site, statement, call, new, target)
    return Rewrite(rewrite.old, rewrite.new, rewrite.message, imports=imports)


def _out(site: FixSite, statement: cst.BaseSmallStatement, call: cst.Call, out: cst.Arg) -> Rewrite:
    """`torch.mul(keep, 0.5, out=keep)` → `keep = torch.mul(keep, 0.5, out=torch.empty_like(keep))`: the result
    goes into a new tensor of the same kind (dtype, device, shape, as out= casts and resizes), not the saved one;
    out= into a view: a copy first."""
    if viewed(out.value) is not out.value:  # into a view (out=keep[0]): the view's tensor gets a copy of its own
        return _own_copy(site, statement, out.value, code_of(call))
    like, imports = site.imports.torch_call("empty_like")
    fresh = cst.parse_expression(f"{like}({code_of(out.value)})")
    new = call.with_changes(args=[a.with_changes(value=fresh) if a is out else a for a in call.args])
    rewrite = _assigned(site, statement, call, new, out.value)
    return Rewrite(rewrite.old, rewrite.new, rewrite.message, imports=imports)


def _function(site: FixSite, statement: cst.BaseSmallStatement, call: cst.Call) -> Rewrite:
    """`torch.sigmoid_(t)` → `t = torch.sigmoid(t)`; a function with no out-of-place twin: a copy first."""
    name = call.func.attr.value
    first = next((a.value for a in call.args if a.keyword is None and not a.star), None)
    if not name.endswith("_") or first is None:
        raise Refused(f"{code_of(call.func)} is not an in-place function of a tensor")
    _not_through_data(first)
    target = viewed(first)
    if target is None:
        raise Refused(f"the write goes into what {code_of(first)} returns, which may be a tensor held elsewhere")
    namespace = code_of(call.func.value)
    module = torch.nn.functional if namespace in site.imports.functional or namespace.endswith("functional") else torch
    if target is not first or not hasattr(module, name[:-1]):
        return _own_copy(site, statement, first, code_of(call))
    new = call.with_changes(func=call.func.with_changes(attr=cst.Name(name[:-1])))
    return _assigned(site, statement, call, new, target)


def _assigned(site: FixSite, statement: cst.BaseSmallStatement, old: cst.Call, new: cst.Call,
              target: cst.BaseExpression) -> Rewrite:
    """The out-of-place call `new` in place of `old`, its result given to the written tensor's name where the
    code reads that name again."""
    unshared(site, statement, target)
    if isinstance(statement, cst.Expr) and statement.value is old:
        replaced = cst.Assign(targets=[cst.AssignTarget(target)], value=new)
    elif isinstance(statement, cst.Assign) and statement.value is old:
        replaced = statement.with_changes(targets=[*statement.targets, cst.AssignTarget(target)], value=new)
    elif isinstance(target, cst.Name) and not is_read_after(site, statement, target.value):
        return Rewrite(old, new, f"{code_of(old)} → {code_of(new)}")
    elif isinstance(target, cst.Name):
        raise Refused(f"{code_of(target)} is read after the write, and an out-of-place call inside "
                      f"{code_of(statement).strip()} would not update it")
    else:
        raise Refused(f"{code_of(target)} is kept by its object, and an out-of-place call inside "
                      f"{code_of(statement).strip()} would not update it")
    return Rewrite(statement, replaced, f"{code_of(statement).strip()} → {code_of(replaced)}")


def _own_copy(site: FixSite, statement: cst.BaseSmallStatement, written: cst.BaseExpression, what: str) -> Rewrite:
    """`y = y.clone()` just before the write: it goes into a copy, and the tensor autograd saved keeps its value."""
    _not_through_data(written)
    target = viewed(written)
    if target is None:
        raise Refused(f"the write goes into what {code_of(written)} returns, which may be a tensor held elsewhere")
    unshared(site, statement, target)
    line = _line_of(site, statement)
    if line is None:
        raise Refused("the write shares its line with other statements")
    copy = f"{code_of(target)} = {code_of(target)}.clone()"
    return Rewrite(statement, statement, f"{what}: {copy} before it, so the write goes into a copy",
                   inserted=((line, copy),))


def _list_slot(site: FixSite, target: cst.Subscript) -> bool:
    """Whether `target` is `name[index]` where the function binds `name` only to a list it builds (a literal, a
    comprehension or `list(...)`) and the index reads only names and numbers, so evaluating it twice is the same."""
    if not isinstance(target.value, cst.Name) or len(target.slice) != 1 or \
            not isinstance(target.slice[0].slice, cst.Index) or site.function is None:
        return False
    index = target.slice[0].slice.value
    if any(not isinstance(n, (cst.Name, cst.Integer, cst.BinaryOperation, cst.UnaryOperation, cst.Add,
                              cst.Subtract, cst.Minus, cst.Multiply, cst.FloorDivide))
           for n in _nodes(index)):
        return False
    name, bound = target.value.value, []
    for line in lines_of(site.function):
        for small in line.body:
            if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                if any(isinstance(t, cst.Name) and t.value == name for t in targets):
                    bound.append(small)
    return bool(bound) and all(isinstance(b, cst.Assign) and _builds_a_list(b.value) for b in bound)


def _builds_a_list(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, (cst.List, cst.ListComp)) or (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "list")


def _nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node under `node`, itself included, in source order, but parentheses and whitespace."""
    skipped = (cst.LeftParen, cst.RightParen, cst.ParenthesizedWhitespace, cst.SimpleWhitespace)
    return [n for n in all_nodes(node) if not isinstance(n, skipped)]


def _line_of(site: FixSite, statement: cst.BaseSmallStatement) -> cst.SimpleStatementLine | None:
    for line in lines_of(site.function or site.module):
        if len(line.body) == 1 and line.body[0] is statement:
            return line
    return None


def _not_through_data(written: cst.BaseExpression) -> None:
    """Refused when the write goes through `.data` (`y.data.mul_(2)`, `y.data[:, 0] = 0`)."""
    node = written
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        if isinstance(node, cst.Attribute) and node.attr.value == "data":
            raise Refused("a write through .data bypasses autograd on purpose; an out-of-place rewrite changes the "
                          "gradients")
        node = node.func if isinstance(node, cst.Call) else node.value


def _in_place_name(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name not in ("requires_grad_", "share_memory_",
                                                                            "retain_grad_")


def _renamed(root: cst.Call, calls: list[cst.Call]) -> cst.Call:
    """`root` with the in-place methods of `calls` (found by identity) named out-of-place."""
    return m.replace(root, m.MatchIfTrue(lambda n: any(n is call for call in calls)),
                     lambda updated, _: updated.with_changes(func=updated.func.with_changes(
                         attr=cst.Name(updated.func.attr.value[:-1]))))
