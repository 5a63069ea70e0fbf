"""Biases added to the scores in a loop over a fixed list, as OpenFold writes it:

    biases = [mask_bias, pair_bias]
    for b in biases:
        a += b

is `a + mask_bias + pair_bias`: the fused call's mask is their sum, and the loop (and the list, when nothing
else reads it) goes. A list whose length the source does not fix (a parameter, one appended to) is refused."""

from __future__ import annotations

import libcst as cst

from .chain import Reading
from graphlint.rewrite.contract import Refused, atom, code_of, names_read
from graphlint.rewrite.source import assigned_names, inside, mutated_in_place, plain_assignment, redefinition


def summed_in_a_loop(reading: Reading, name: str, before: cst.BaseStatement) -> tuple[cst.For, list] | None:
    """(the loop, the biases it adds, in order) when the last statement before `before` that changes `name`
    is `for b in <fixed list>: name += b`; None when `name` is set otherwise."""
    body = list(reading.scopes[-1].block if reading.scopes else reading.block)
    if before not in body:
        return None
    loop = next((s for s in reversed(body[: body.index(before)])
                 if name in assigned_names(s) or mutated_in_place(s, name)), None)
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or \
            not isinstance(loop.body, cst.IndentedBlock) or len(loop.body.body) != 1:
        return None
    target = loop.target.value
    value = redefinition(loop.body.body[0], name)
    if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, cst.Add) or \
            {code_of(value.left), code_of(value.right)} != {name, target}:
        return None
    if loop.orelse is not None:
        raise Refused(f"the loop that adds `{target}` to `{name}` has an `else`")
    return loop, _elements(reading, loop, body)


def _elements(reading: Reading, loop: cst.For, body: list) -> list[cst.BaseExpression]:
    """The items of the loop's list, written in the loop or in one `biases = [...]` of the block that nothing
    changes before the loop."""
    iterable = loop.iter
    listed = iterable
    if isinstance(iterable, cst.Name):
        made = next((s for s in reversed(body[: body.index(loop)]) if iterable.value in assigned_names(s)), None)
        listed = made.body[0].value if made is not None and plain_assignment(made, iterable.value) else None
        between = body[body.index(made) + 1: body.index(loop)] if made is not None else []
        if listed is None or any(iterable.value in {n.value for n in names_read(s)} for s in between):
            raise Refused(f"the scores are summed with each bias of `{iterable.value}`, a list whose items "
                          "graphlint cannot read where the loop runs; the fused call takes one mask (their sum)")
    if not isinstance(listed, (cst.List, cst.Tuple)) or any(isinstance(e, cst.StarredElement) for e in listed.elements):
        raise Refused(f"the scores are summed with each item of `{code_of(iterable)}`, which is not a list "
                      "written out; the fused call takes one mask (their sum)")
    return [e.value for e in listed.elements]


def list_statement(reading: Reading, loop: cst.For) -> cst.BaseStatement | None:
    """The `biases = [...]` the loop reads, when nothing else in the function reads it (it goes too)."""
    if not isinstance(loop.iter, cst.Name):
        return None
    name = loop.iter.value
    body = list(reading.block)
    made = [s for s in body[: body.index(loop)] if plain_assignment(s, name)] if loop in body else []
    reads = [n for n in names_read(reading.function) if n.value == name]
    if len(made) != 1 or any(not inside(n, loop) and not inside(n, made[0]) for n in reads):
        return None
    return made[0]


def summed(items: list[cst.BaseExpression]) -> cst.BaseExpression | None:
    """`a + b + c`, each parenthesised where `+` would bind it otherwise; None for no items."""
    if not items:
        return None
    return cst.parse_expression(" + ".join(code_of(atom(i) if _loose(i) else i) for i in items))


def _loose(node: cst.BaseExpression) -> bool:
    """`node` binds looser than `+` (a comparison, `a & b`, a conditional)."""
    return isinstance(node, (cst.IfExp, cst.Lambda, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation)) or \
        (isinstance(node, cst.BinaryOperation) and
         isinstance(node.operator, (cst.BitOr, cst.BitAnd, cst.BitXor, cst.LeftShift, cst.RightShift)))
