"""A bias for `baddbmm` chosen in an `if`/`else`, as diffusers writes it:

    if attention_mask is None:
        baddbmm_input = torch.empty(...)
        beta = 0
    else:
        baddbmm_input = attention_mask
        beta = 1
    scores = torch.baddbmm(baddbmm_input, query, key.transpose(-1, -2), beta=beta, alpha=self.scale)

A branch with `beta = 0` adds nothing (baddbmm ignores its input then), one with `beta = 1` adds its bias: the
fused call's mask is that bias in its branch and None in the other (`attn_mask=attention_mask` here, since None
is no mask), and the `if`/`else` goes."""

from __future__ import annotations

import libcst as cst

from .chain import Reading
from graphlint.rewrite.contract import Refused, code_of, names_read
from graphlint.rewrite.source import assigned_names, is_number, mutated_in_place, plain_assignment


def chosen_bias(reading: Reading, bias: cst.BaseExpression, beta: cst.BaseExpression,
                statement: cst.BaseStatement) -> tuple[cst.BaseExpression | None, cst.If] | None:
    """(the mask the choice adds, None for no mask; the `if`) for `baddbmm(bias, ..., beta=beta)` with both set
    in each branch of the last `if`/`else` before `statement`; None when they are set otherwise."""
    if not isinstance(bias, cst.Name) or not isinstance(beta, cst.Name):
        return None
    body = list(reading.scopes[-1].block if reading.scopes else reading.block)
    if statement not in body:
        return None
    names = {bias.value, beta.value}
    choice = next((s for s in reversed(body[: body.index(statement)])
                   if names & assigned_names(s) or any(mutated_in_place(s, n) for n in names)), None)
    if not isinstance(choice, cst.If) or not isinstance(choice.orelse, cst.Else):
        return None
    why = f"the bias `{bias.value}` and `{beta.value}` are chosen under `if {code_of(choice.test)}:`"
    added = [_added(branch, bias.value, beta.value, why) for branch in (choice.body, choice.orelse.body)]
    if all(a is None for a in added):
        return cst.Name("None"), choice
    test = choice.test
    given = _compared_with_none(test)
    if added[1] is None:  # `if mask is not None: b, beta = mask, 1 else: ..., 0`
        if given is not None and not given[1] and code_of(added[0]) == given[0]:
            return added[0], choice
        return cst.parse_expression(f"{code_of(added[0])} if {code_of(test)} else None"), choice
    if added[0] is None:  # `if mask is None: ..., 0 else: b, beta = mask, 1`
        if given is not None and given[1] and code_of(added[1]) == given[0]:
            return added[1], choice
        return cst.parse_expression(f"None if {code_of(test)} else {code_of(added[1])}"), choice
    return cst.parse_expression(f"{code_of(added[0])} if {code_of(test)} else {code_of(added[1])}"), choice


def _added(block: cst.BaseSuite, bias: str, beta: str, why: str) -> cst.BaseExpression | None:
    """What one branch adds to the product: its bias when its beta is 1, None when 0."""
    statements = list(block.body) if isinstance(block, cst.IndentedBlock) else []
    set_bias = [s for s in statements if plain_assignment(s, bias)]
    set_beta = [s for s in statements if plain_assignment(s, beta)]
    if len(statements) != 2 or len(set_bias) != 1 or len(set_beta) != 1:
        raise Refused(f"{why}, whose branches do more than set each of them once")
    value, factor = set_bias[0].body[0].value, set_beta[0].body[0].value
    if not is_number(factor, (0.0, 1.0)):
        raise Refused(f"{why}, with beta = {code_of(factor)}, which the fused call cannot express")
    if bias in {n.value for n in names_read(value)}:
        raise Refused(f"{why}, and `{bias}` is computed from itself")
    return None if is_number(factor, (0.0,)) else value


def _compared_with_none(test: cst.BaseExpression) -> tuple[str, bool] | None:
    """(`m`, True) for `m is None`, (`m`, False) for `m is not None`; None for any other test."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or \
            code_of(test.comparisons[0].comparator) != "None":
        return None
    operator = test.comparisons[0].operator
    if isinstance(operator, cst.Is):
        return code_of(test.left), True
    if isinstance(operator, cst.IsNot):
        return code_of(test.left), False
    return None
