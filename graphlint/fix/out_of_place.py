"""GL201's fix: an in-place write to a tensor autograd saved, made out-of-place where that computes the same."""

from __future__ import annotations

import libcst as cst

from graphlint.fix.rewrite import FixSite, Rewrite, atom, code_of

_AUGMENTED = {cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
              cst.DivideAssign: cst.Divide, cst.PowerAssign: cst.Power, cst.MatrixMultiplyAssign: cst.MatrixMultiply}


def out_of_place(site: FixSite) -> Rewrite | str:
    """GL201's fix: the same computation without the write (rules/gl201_inplace_on_saved.py, `fixes`), or why
    this write has none."""
    node = site.node
    if isinstance(node, cst.AugAssign):
        operator = _AUGMENTED.get(type(node.operator))
        if operator is None or not isinstance(node.target, (cst.Name, cst.Attribute)):
            return "only x op= y on a name or attribute can be rewritten as x = x op y"
        value = atom(node.value)
        new = cst.Assign(targets=[cst.AssignTarget(node.target)],
                         value=cst.BinaryOperation(node.target, operator(), value))
        return Rewrite(node, new, f"{code_of(node)} → {code_of(new)}")
    if not isinstance(node, cst.Call):
        return "an index assignment has no out-of-place form that updates the same tensor; clone it first"
    flag = next((a for a in node.args if a.keyword is not None and a.keyword.value == "inplace"), None)
    if flag is not None:
        if not (isinstance(flag.value, cst.Name) and flag.value.value == "True"):
            return "inplace= is not the literal True"
        args = [a for a in node.args if a is not flag]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new = node.with_changes(args=args)
        return Rewrite(node, new, f"{code_of(node)} → {code_of(new)}")
    if any(a.keyword is not None and a.keyword.value == "out" for a in node.args):
        return "out= writes into an existing tensor; use the returned tensor instead"
    method = node.func
    if not isinstance(method, cst.Attribute) or not method.attr.value.endswith("_"):
        return "the write is not a method call, an augmented assignment or inplace=True"
    receiver = method.value
    if isinstance(receiver, cst.Attribute) and receiver.attr.value == "data":
        return "a write through .data bypasses autograd on purpose; an out-of-place rewrite changes the gradients"
    if not isinstance(receiver, (cst.Name, cst.Attribute)):
        return "the write goes through a view; an out-of-place result would not reach the tensor it views"
    if site.statement is None:
        return "the in-place call's result is used in an expression, where the tensor it writes may be read again"
    new = cst.Assign(targets=[cst.AssignTarget(receiver)],
                     value=node.with_changes(func=method.with_changes(attr=cst.Name(method.attr.value[:-1]))))
    return Rewrite(site.statement, new, f"{code_of(node)} → {code_of(new)}")
