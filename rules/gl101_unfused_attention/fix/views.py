"""A mask added to the scores viewed in another shape and viewed back, as BART, CLIP and Swin write it:
`s = s.view(bsz, heads, tgt, src) + mask` then `s = s.view(bsz * heads, tgt, src)`. The sum is the scores plus
the mask broadcast to the first shape and viewed as the second: `attn_mask=mask.expand(A).reshape(B)`.
Only the reading of the two statements is here; the walk takes the mask in scores.py."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from graphlint.rewrite.contract import Refused, atom, call_parts, code_of, names_read
from graphlint.rewrite.source import assigned_names, redefinition, statements_of

_VIEWS = ("view", "reshape")


@dataclass(frozen=True)
class ViewedMask:
    scores: cst.BaseExpression  # the scores as the addition reads them, before the first view
    mask: cst.BaseExpression  # `mask.expand(A).reshape(B)`
    added: cst.BaseExpression  # the mask as written
    fill: cst.BaseExpression | None = None  # a `masked_fill`'s value: then `mask` says which positions it fills


def viewed_back(statement: cst.CSTNode, name: str) -> bool:
    """`name = name.view(...)` (or `reshape`) alone on its line."""
    name_, receiver, _, _ = call_parts(redefinition(statement, name))
    return name_ in _VIEWS and isinstance(receiver, cst.Name) and receiver.value == name


def added_to_a_view(statement: cst.CSTNode, name: str) -> bool:
    """`name = name.view(...) + m` (either side) alone on its line."""
    return _parts(redefinition(statement, name), name) is not None


def filled_in_a_view(body, name: str) -> bool:
    """The guard's last three statements are `name = name.view(A)`, `name = name.masked_fill(c, f)`,
    `name = name.view(B)` (fairseq's key padding)."""
    return len(body) >= 3 and viewed_back(body[-3], name) and viewed_back(body[-1], name) and \
        _fill_parts(redefinition(body[-2], name), name) is not None


def viewed_fill(first: cst.CSTNode, fill: cst.CSTNode, back: cst.CSTNode, name: str) -> ViewedMask | None:
    """Of `name = name.view(A)`, `name = name.masked_fill(c, f)`, `name = name.view(B)` (fairseq, Graphormer): the
    scores, and the condition that fills the same positions of them in their own shape, `c.expand(A).reshape(B)`."""
    if not filled_in_a_view((first, fill, back), name):
        return None
    view = redefinition(first, name)
    condition, value = _fill_parts(redefinition(fill, name), name)
    _writable(view)
    expanded = f"{code_of(atom(condition))}.expand({_args(view)}).reshape({_args(redefinition(back, name))})"
    return ViewedMask(view.func.value, cst.parse_expression(expanded), condition, value)


def _fill_parts(value, name: str) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    called, receiver, positional, keywords = call_parts(value)
    if called != "masked_fill" or not isinstance(receiver, cst.Name) or receiver.value != name or keywords or \
            len(positional) != 2:
        return None
    return positional[0], positional[1]


def _writable(view: cst.Call) -> None:
    if any(a.star for a in view.args) or any(code_of(a).replace(" ", "") in ("-1", "(-1)") for a in _sizes(view)):
        raise Refused(f"the mask is applied to the scores viewed as `{code_of(view.func.value)}"
                      f".{view.func.attr.value}({_args(view)})`, a shape graphlint cannot give the mask "
                      "(-1 or a starred size)")


def viewed_mask(add: cst.CSTNode, back: cst.CSTNode, name: str) -> ViewedMask | None:
    """Of `name = name.view(A) + m` followed by `name = name.view(B)`: the scores, and the mask that adds the
    same to them in their own shape; None for any other pair. Raises Refused where the first shape cannot be
    written for the mask (a -1 or a starred size, which `expand` reads otherwise than `view`)."""
    if not viewed_back(back, name):
        return None
    parts = _parts(redefinition(add, name), name)
    if parts is None:
        return None
    first, mask = parts
    second = redefinition(back, name)
    shape_a = _sizes(first)
    if any(a.star for a in first.args) or any(code_of(a).replace(" ", "") in ("-1", "(-1)") for a in shape_a):
        raise Refused(f"the mask is added to the scores viewed as `{code_of(first.func.value)}"
                      f".{first.func.attr.value}({_args(first)})`, a shape graphlint cannot give the mask "
                      "(-1 or a starred size)")
    expanded = f"{code_of(atom(mask))}.expand({_args(first)}).reshape({_args(second)})"
    return ViewedMask(first.func.value, cst.parse_expression(expanded), mask)


def _parts(value: cst.BaseExpression | None, name: str) -> tuple[cst.Call, cst.BaseExpression] | None:
    if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, cst.Add):
        return None
    for view, mask in ((value.left, value.right), (value.right, value.left)):
        called, receiver, _, keywords = call_parts(view)
        if called in _VIEWS and not keywords and isinstance(receiver, cst.Name) and receiver.value == name:
            return view, mask
    return None


def _sizes(call: cst.Call) -> list[cst.BaseExpression]:
    """The sizes a view is given, one by one or as one tuple."""
    values = [a.value for a in call.args]
    if len(values) == 1 and isinstance(values[0], (cst.Tuple, cst.List)):
        return [e.value for e in values[0].elements]
    return values


def _args(call: cst.Call) -> str:
    return ", ".join(code_of(a.value) if a.star == "" else f"{a.star}{code_of(a.value)}" for a in call.args)


def adds_to(function: cst.FunctionDef, parameter: str) -> bool:
    """`function` returns its `parameter` plus terms that do not read it, maybe viewed in another shape and viewed
    back (SAM's add_decomposed_rel_pos: `attn = (attn.view(A) + rel_h + rel_w).view(B); return attn`): then it
    adds to the scores what it returns for zeros, which is a mask."""
    body = statements_of(function)
    last = body[-1] if body else None
    if not isinstance(last, cst.SimpleStatementLine) or len(last.body) != 1 or not isinstance(last.body[0], cst.Return):
        return False
    value, made = last.body[0].value, None
    if isinstance(value, cst.Name) and value.value == parameter:
        made = next((s for s in reversed(body[:-1]) if parameter in assigned_names(s)), None)
        value = redefinition(made, parameter) if made is not None else None
    if value is None or any(parameter in assigned_names(s) or parameter in {n.value for n in names_read(s)}
                            for s in body[:-1] if s is not made):
        return False
    name, receiver, _, _ = call_parts(value)
    if name in _VIEWS and receiver is not None:
        value = receiver
    terms, pending = [], [value]
    while pending:
        term = pending.pop()
        if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, cst.Add):
            pending += [term.left, term.right]
        else:
            terms.append(term)
    reading = [t for t in terms if parameter in {n.value for n in names_read(t)}]
    if len(reading) != 1 or len(terms) < 2:
        return False
    name, receiver, _, _ = call_parts(reading[0])
    alone = reading[0] if name not in _VIEWS else receiver
    return isinstance(alone, cst.Name) and alone.value == parameter and \
        all(parameter not in {n.value for n in names_read(a)} for a in (reading[0].args if name in _VIEWS else ()))
