"""The fused call: its arguments, `scale=` left out where it is the default, laid out as a formatter would."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from .chain import Chain, Reading, as_operand, compact, to_layout
from .masks import dtype_extreme, is_causal
from graphlint.rewrite.contract import Refused, atom, code_of, laid_out, names_read
from graphlint.rewrite.source import local_assignments, self_assignments


def fused_call(reading: Reading, callee: str) -> cst.Call:
    chain = reading.chain
    if chain.q is None or chain.v is None or chain.values_product is None:
        raise Refused("the scores or the values product could not be found")
    arguments = [chain.q, chain.k, chain.v]
    keywords: list[tuple[str, str]] = []
    if chain.mask is not None:
        guard = code_of(chain.guard) if chain.guard is not None else None
        mask = code_of(chain.mask)
        causal = is_causal(reading)
        cast = False
        from_scores = chain.names & {n.value for n in names_read(chain.mask)}
        if from_scores and not causal:
            raise Refused(f"the mask is computed from `{sorted(from_scores)[0]}`, which the fused call does not make")
        if causal:
            chain.fill = None  # no row of a causal mask is fully masked: the fill never shows
        elif chain.fill is not None:
            mask = _additive(reading, code_of(atom(chain.mask)) if isinstance(chain.mask, (cst.IfExp, cst.Lambda))
                             else mask)
        elif reading.mask_cast and chain.mask_source is None:  # an added float mask of a dtype of its own
            mask = f"{code_of(atom(chain.mask))}.to({code_of(atom(chain.q))}.dtype)"
            cast = True
        if causal:
            keywords.append(("is_causal", "True" if guard is None else guard))
        elif guard is None or guard.replace(" ", "") == f"{mask}isnotNone":
            keywords.append(("attn_mask", mask))  # `if mask is not None: scores += mask`: None is no mask
        else:
            # A comparison or call binds tighter than `... if ... else ...`; only such a mask needs parentheses.
            shown = code_of(atom(chain.mask)) if isinstance(chain.mask, (cst.IfExp, cst.Lambda)) and \
                chain.fill is None and not cast else mask
            keywords.append(("attn_mask", f"{shown} if {guard} else None"))
    if chain.dropout_p is not None:
        p = code_of(chain.dropout_p)
        keywords.append(("dropout_p", f"{p} if self.training else 0.0" if chain.dropout_in_training_only else p))
    scale = _scale(chain, _local_definitions(reading))
    if scale is not None and reading.default_scale and _spelled_as_a_root(reading):
        scale = None  # the graph saw the default's value: 1/sqrt(the head dim) through a variable or attribute
    if scale is not None:
        keywords.append(("scale", scale))
    parts = [code_of(a) for a in arguments] + [f"{k}={v}" for k, v in keywords]
    call = cst.parse_expression(f"{callee}({_layout(reading, callee, parts)})")
    return to_layout(call, *chain.out_layout) if chain.out_layout is not None else call


def _additive(reading: Reading, keep: str) -> str:
    """A finite fill as the float mask the fused call adds to the scores: 0 where a key takes part, the fill
    elsewhere, in the query's dtype (a dtype's lowest number stays that, in the query's dtype)."""
    chain = reading.chain
    where, needs = reading.names.torch_call("where")
    finfo, more = reading.names.torch_call("finfo")
    if needs or more:
        raise Refused("the file does not import torch, which the mask for a finite fill needs")
    query = code_of(atom(chain.q))
    if dtype_extreme(chain.fill, reading.names):
        fill = f"{finfo}({query}.dtype).min"
    else:
        fill = code_of(chain.fill)
        from_scores = chain.names & {n.value for n in names_read(chain.fill)}
        if from_scores:
            raise Refused(f"the fill is computed from `{sorted(from_scores)[0]}`, which the fused call does not make")
    return f"{where}({keep}, {query}.new_zeros(()), {fill})"


def _spelled_as_a_root(reading: Reading) -> bool:
    """The scale is one number written as an inverse square root (`self.scale = head_dim ** -0.5`, or a
    division by `math.sqrt(d)`), with no choice in it (`qk_scale or head_dim ** -0.5` may be set otherwise
    in another model, so it is kept even when this one holds the default)."""
    chain = reading.chain
    if len(chain.factors) + len(chain.divisors) != 1:
        return False
    factor = (chain.factors or chain.divisors)[0]
    if isinstance(factor, cst.Attribute) and code_of(factor.value) == "self" and reading.classdef is not None:
        made = self_assignments(reading.classdef, factor.attr.value)
        if len(made) != 1:
            return False
        factor = made[0]
    elif isinstance(factor, cst.Name):
        made = local_assignments(reading.function, factor.value)
        if len(made) != 1:
            return False
        factor = made[0]
    if m.findall(factor, m.BooleanOperation() | m.IfExp() | m.Lambda()):
        return False
    text = compact(factor)
    power = re.fullmatch(r"\(?(.+?)\)?\*\*\(?(-?)0\.5\)?", text)
    sqrt = re.fullmatch(r"(1(?:\.0)?/)?\(?(?:math\.)?sqrt\((.+)\)\)?", text)
    if chain.factors:  # `d ** -0.5`, `1 / math.sqrt(d)`
        root = power.group(1) if power and power.group(2) else sqrt.group(2) if sqrt and sqrt.group(1) else None
    else:  # `/ math.sqrt(d)`, `/ d ** 0.5`
        root = power.group(1) if power and not power.group(2) else sqrt.group(2) if sqrt and not sqrt.group(1) else None
    # One configuration shows only that the numbers agreed: what is under the root must also be named as the
    # head dimension (`head_dim`, `dim // heads`, `d_k`), not the model width that equals it with one head.
    return root is not None and _names_a_head_dim(root)


def _layout(reading: Reading, callee: str, parts: list[str]) -> str:
    """The call's arguments as a formatter writes them: on one line when the whole line fits, else on one
    indented line of their own, else one a line with a trailing comma."""
    indent, inside = reading.indent, ", ".join(parts)
    statement = code_of(reading.chain.values_statement.body[0]) if reading.chain.values_statement is not None else ""
    product = code_of(reading.chain.values_product)
    before, _, after = statement.partition(product)
    line = len(indent) + len(before.split("\n")[-1]) + len(callee) + len(inside) + 2 + len(after.split("\n")[0])
    return laid_out(parts, indent, line)


def _local_definitions(reading: Reading) -> dict[str, str]:
    """What each variable assigned exactly once in the function is set to, without spaces."""
    found: dict[str, list[str]] = {}
    for assign in m.findall(reading.function, m.Assign()):
        for target in assign.targets:
            if isinstance(target.target, cst.Name):
                found.setdefault(target.target.value, []).append(compact(assign.value))
    return {name: values[0] for name, values in found.items() if len(values) == 1}


# How code names the size of one attention head; the model width (`dim`, `d_model`) is not among them.
_HEAD_DIM = re.compile(r"head|(?<![a-z])d_?k(?![a-z])|d_?kv|key_?dim|kdim|qk_?dim|key_value_proj_dim|(?<![a-z])hs(?![a-z])")


def _names_a_head_dim(text: str) -> bool:
    return bool(_HEAD_DIM.search(text.lower()))


def _scale(chain: Chain, local: dict[str, str]) -> str | None:
    """The `scale=` argument; None when it is the fused call's default, 1/sqrt(the head dimension), written
    with the query's or key's own size (directly or through a variable assigned once: `d_k = q.size(-1)`)."""
    def substitute(match: re.Match) -> str:
        value = local.get(match.group(0))
        if value is None:
            return match.group(0)
        return value if re.fullmatch(r"[\w.]+(\(.*\)|\[.*\])?", value) else f"({value})"

    def resolved(node: cst.BaseExpression) -> str:
        text = compact(node)
        for _ in range(3):
            text = re.sub(r"(?<![\w.])[A-Za-z_]\w*(?![\w(])", substitute, text)
        return text

    factors, divisors = [resolved(f) for f in chain.factors], [resolved(d) for d in chain.divisors]
    sizes = {f"{form}{size}" for head in (chain.q, chain.k) if head is not None
             for size in ("size(-1)", "shape[-1]") for form in (f"{code_of(head)}.", f"({code_of(head)}).")}
    sizes |= {f"({size})" for size in sizes}
    roots = {form for size in sizes for form in (f"math.sqrt({size})", f"{size}**0.5", f"({size}**0.5)")}
    roots |= {f"({root})" for root in roots}
    inverse = {form for root in roots for form in (f"1/{root}", f"1.0/{root}")} | \
        {f"{size}**-0.5" for size in sizes} | {f"({size}**-0.5)" for size in sizes}
    inverse |= {f"({form})" for form in inverse}
    if (not divisors and len(factors) == 1 and factors[0] in inverse) or \
            (not factors and len(divisors) == 1 and divisors[0] in roots):
        return None
    if not factors and not divisors:
        return "1.0"
    numerator = " * ".join(code_of(as_operand(f, cst.Multiply)) for f in chain.factors) if factors else "1"
    return " / ".join([numerator] + [code_of(as_operand(d, cst.Divide)) for d in chain.divisors])
