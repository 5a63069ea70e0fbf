"""The mask: an additive one (two summed), a `masked_fill` or `torch.where` fill turned into the fused call's
boolean "take part" mask, a causal one read as `is_causal=True`, and a guard that prepares it."""

from __future__ import annotations

import libcst as cst

from .chain import Reading, as_operand, definition, here
from graphlint.rewrite.contract import ImportNames, Refused, atom, call_parts, code_of, names_read
from graphlint.rewrite.source import (assigned_names, inside, keeps_a_tensor, local_assignments, plain_name_assignment,
                                      presence_test, redefinition, root_name, self_assignments, substituted)


def fill_of(reading: Reading, node: cst.BaseExpression) -> cst.BaseExpression:
    """A fill value as written where it is made: `max_neg_value = -torch.finfo(sim.dtype).max` for the
    variable, the value of `torch.full([], value, ...)`."""
    function = reading.scopes[-1].function if reading.scopes else reading.function
    for _ in range(4):
        if isinstance(node, cst.Name):
            made = local_assignments(function, node.value)
            if len(made) != 1:
                return node
            node = made[0]
            continue
        name, _, positional, keywords = call_parts(node)
        if name in ("full", "full_like", "tensor", "as_tensor") and (len(positional) >= (2 if name != "tensor" and
                                                                                      name != "as_tensor" else 1)):
            node = positional[1] if name in ("full", "full_like") else positional[0]
            continue
        return node
    return node


def _scaled_mask(reading: Reading, mask: cst.BaseExpression, scaled: bool) -> cst.BaseExpression:
    """An additive mask met before a scale on the way back is scaled with the scores: `(s + m) * c` is
    `s * c + m * c`, so `attn_mask=m * c`."""
    if not scaled:
        return mask
    chain = reading.chain
    text = " / ".join([" * ".join([code_of(as_operand(mask, cst.Multiply))] +
                                  [code_of(as_operand(f, cst.Multiply)) for f in chain.factors])] +
                      [code_of(as_operand(d, cst.Divide)) for d in chain.divisors])
    return cst.parse_expression(text)


def set_mask(reading: Reading, mask, keep_when_true: bool, additive: bool = False, scaled: bool = False,
             fill: cst.BaseExpression | None = None) -> None:
    """The one mask: `mask` is the user's expression, added (`additive`, scaled with the scores when a scale
    follows it) or saying which positions take part (`keep_when_true`) or are filled, with `fill`."""
    chain = reading.chain
    if chain.mask is not None:
        _add_mask(reading, mask, additive, scaled)
        return
    mask = here(reading, mask)
    if additive:
        chain.mask, chain.mask_source = _scaled_mask(reading, mask, scaled), None
    else:
        chain.mask, chain.mask_source = mask if keep_when_true else _negated(mask), mask
        value = fill_of(reading, fill) if fill is not None else None
        if value is not None and not _infinite(value, reading.names):
            chain.fill = here(reading, value)  # emit.py writes it into an additive mask
    chain.keep_when_true = keep_when_true


def _infinite(node: cst.BaseExpression, names: ImportNames) -> bool:
    return names.as_torch(code_of(node)).replace(" ", "") in {t.replace(" ", "") for t in _NEG_INF}


def dtype_extreme(node: cst.BaseExpression, names: ImportNames) -> bool:
    """`torch.finfo(x.dtype).min` or `-torch.finfo(x.dtype).max`: the fill is the dtype's lowest number."""
    text = names.as_torch(code_of(node)).replace(" ", "")
    return text.startswith(("torch.finfo(", "-torch.finfo(")) and text.endswith((").min", ").max"))


FILL_REASON = ("on a row whose every key is masked, the fill `{fill}` gives an even average and no gradient to "
               "the scores, which no mask of the fused call gives (its outputs there {outputs})")


def _add_mask(reading: Reading, mask, additive: bool, scaled: bool) -> None:
    """A second additive mask met on the way back (`s = s + bias`, later `s = s + mask`): the fused call
    takes their sum, with the condition either is added under (`bias + mask if g else bias`), or both."""
    chain = reading.chain
    if additive and chain.mask_source is not None and chain.fill is None:
        _added_before_a_fill(reading, mask, scaled)
        return
    if not additive or chain.mask_source is not None:
        raise Refused("the scores are masked twice; the fused call takes one mask")
    earlier_guard = here(reading, reading.guarded.test) if reading.guarded is not None else None
    earlier = _scaled_mask(reading, here(reading, mask), scaled)
    later = chain.mask
    total = f"{_summand(earlier)} + {_summand(later)}"
    if earlier_guard is not None and chain.guard is not None:  # Uni-Core: `if mask is not None` and `if bias ...`
        later_alone = f"{code_of(later)} if {code_of(chain.guard)} else None"
        total = f"({total} if {code_of(chain.guard)} else {code_of(earlier)}) if {code_of(earlier_guard)} " \
                f"else ({later_alone})"
    elif chain.guard is not None:
        total = f"{total} if {code_of(chain.guard)} else {code_of(earlier)}"
    elif earlier_guard is not None:
        total = f"{total} if {code_of(earlier_guard)} else {code_of(later)}"
    chain.mask, chain.guard = cst.parse_expression(total), None


def _added_before_a_fill(reading: Reading, mask, scaled: bool) -> None:
    """A mask added before a -inf fill (fairseq: `attn_mask` added, then the key padding filled): one float mask,
    -inf where the fill was and the added mask elsewhere, under the conditions each was applied under."""
    chain = reading.chain
    where, needs = reading.names.torch_call("where")
    if needs:
        raise Refused("the file does not import torch, which the mask joining an added mask and a fill needs")
    earlier = code_of(_scaled_mask(reading, here(reading, mask), scaled))
    plain = isinstance(chain.mask_source, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.UnaryOperation))
    source = code_of(chain.mask_source if plain else atom(chain.mask_source))
    both = f'{where}({source if not chain.keep_when_true else "~" + source}, float("-inf"), {earlier})'
    later = code_of(chain.mask)
    if chain.guard is not None:
        both, later = f"{both} if {code_of(chain.guard)} else {earlier}", f"{later} if {code_of(chain.guard)} else None"
    earlier_guard = here(reading, reading.guarded.test) if reading.guarded is not None else None
    total = f"({both}) if {code_of(earlier_guard)} else ({later})" if earlier_guard is not None else both
    chain.mask, chain.mask_source, chain.guard = cst.parse_expression(total), None, None


def is_causal(reading: Reading) -> bool:
    """The mask keeps exactly the lower triangle, diagonal included: `tril(ones)`, or `triu(ones, 1)` as
    the positions to drop, directly or through a buffer or a local variable, sliced to the sequence."""
    chain = reading.chain
    if chain.mask_source is None:
        return False
    node, keep = chain.mask_source, chain.keep_when_true
    for _ in range(8):
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            comparison = node.comparisons[0]
            value = code_of(comparison.comparator)
            if isinstance(comparison.operator, cst.Equal) and value in ("0", "0.0", "False"):
                keep = not keep
            elif not ((isinstance(comparison.operator, cst.NotEqual) and value in ("0", "0.0", "False")) or
                      (isinstance(comparison.operator, cst.Equal) and value in ("1", "1.0", "True"))):
                return False
            node = node.left
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            keep, node = not keep, node.expression
        elif isinstance(node, cst.Subscript):
            if not all(isinstance(e.slice, cst.Slice) for e in node.slice):
                return False
            node = node.value
        elif call_parts(node)[0] in ("bool", "logical_not") and call_parts(node)[1] is not None:
            name, node = call_parts(node)[:2]
            keep = keep if name == "bool" else not keep
        else:
            break
    built = _built_from(reading, node)
    if built is None or joins_masks(built):
        return False
    text = code_of(built).replace(" ", "")
    root = root_name(built)
    if root is not None and "tril(" not in text and "triu(" not in text and reading.classdef is not None:
        made = local_assignments(reading.classdef, root)  # `causal = torch.tril(...)`, then the buffer
        if len(made) == 1:
            text += code_of(made[0]).replace(" ", "")
    if "ones" not in text:
        return False
    if "tril(" in text and "diagonal" not in text and text.count("tril(") == 1:
        return keep
    if "triu(" in text and ("diagonal=1" in text or ",1)" in text or ".triu(1)" in text):
        return not keep
    return False


def joins_masks(node: cst.BaseExpression) -> bool:
    """`input_mask & causal_mask` (or `|`): a causal mask joined with another is no longer causal alone; the
    joined mask is passed as it is."""
    bare = node.with_changes(lpar=[], rpar=[]) if isinstance(node, cst.BinaryOperation) else node
    return isinstance(bare, cst.BinaryOperation) and isinstance(bare.operator, (cst.BitAnd, cst.BitOr, cst.BitXor))


def _built_from(reading: Reading, node) -> cst.BaseExpression | None:
    """The expression a mask variable or buffer was made from, when it is made once."""
    if isinstance(node, cst.Name):
        try:
            return redefinition(definition(reading, node.value, reading.softmax_statement), node.value)
        except Refused:
            return None
    if isinstance(node, cst.Attribute) and code_of(node.value) == "self" and reading.classdef is not None:
        found = self_assignments(reading.classdef, node.attr.value)
        return found[0] if len(found) == 1 else None
    return node if isinstance(node, cst.Call) else None  # made where it is used


def inline_setup(reading: Reading) -> None:
    """A guard that prepares the mask (`if mask is not None: m = mask[:, None]; s = s + m`): a variable made
    only for the mask is written into `attn_mask=` and its statement goes; what is left stays in the `if`,
    which must then still mean the same after it ran (it tests whether a mask was given)."""
    chain = reading.chain
    if reading.guard_if is None:
        return
    masking = reading.guard_if.body.body[-1]
    masks = reading.masking or (masking,)  # a mask added to a view of the scores is two statements
    for statement in reversed(list(reading.setup)):
        if not plain_name_assignment(statement) or chain.mask is None:
            continue
        name, value = statement.body[0].targets[0].target.value, statement.body[0].value
        reads = [n for n in names_read(reading.function) if n.value == name and not inside(n, statement)]
        later = reading.setup[reading.setup.index(statement) + 1:]
        if not reads or any(not any(inside(n, m) for m in masks) for n in reads) or \
                name in {n.value for n in names_read(value)} or \
                {n.value for n in names_read(value)} & set().union(set(), *(assigned_names(s) for s in later)):
            continue
        # Read only by the masking statement: the mask takes its value, or it only made the fill.
        chain.mask = substituted(chain.mask, {name: value})
        if chain.mask_source is not None:
            chain.mask_source = substituted(chain.mask_source, {name: value})
        reading.reads.append(({n.value for n in names_read(value)}, reading.guard_if))
        reading.setup.remove(statement)
        chain.consumed.append(statement)
    if not reading.setup:
        chain.consumed = [s for s in chain.consumed if s not in masks and not inside(s, reading.guard_if)]
        chain.consumed.append(reading.guard_if)
        reading.guard_if = None
        return
    # The guard folded into the mask with an earlier bias (`bias + m if g else bias`) is still the `if`'s test.
    guard = chain.guard if chain.guard is not None else reading.guard_if.test
    changed = set().union(*(assigned_names(s) for s in reading.setup)) & {n.value for n in names_read(guard)}
    moved = {n.value for part in (chain.q, chain.k, chain.dropout_p, *chain.factors, *chain.divisors) if part is not None
             for n in names_read(part)} & set().union(*(assigned_names(s) for s in reading.setup))
    if moved:  # the scores were made before the `if`; the fused call would read the new value
        raise Refused(f"`{sorted(moved)[0]}` changes between the scores and the values product")
    given = presence_test(guard)
    if changed and (changed != {given} or not all(keeps_a_tensor(s, given) for s in reading.setup
                                                  if given in assigned_names(s))):
        raise Refused(f"`if {code_of(guard)}:` changes `{sorted(changed)[0]}`, which it tests")


_NEG_INF = ('float("-inf")', "float('-inf')", '-float("inf")', "-float('inf')", "-math.inf", "-torch.inf",
            "float(\"-Inf\")", "-np.inf", "-numpy.inf")


def _summand(node: cst.BaseExpression) -> str:
    """`node` as an operand of `+`, parenthesised only where it would bind looser."""
    loose = (cst.IfExp, cst.Lambda, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation)
    if isinstance(node, loose) or (isinstance(node, cst.BinaryOperation) and
                                   isinstance(node.operator, (cst.BitOr, cst.BitAnd, cst.BitXor, cst.LeftShift, cst.RightShift))):
        return code_of(atom(node))
    return code_of(node)


def very_negative(node: cst.BaseExpression, names: ImportNames) -> bool:
    text = names.as_torch(code_of(node)).replace(" ", "")
    if text in {t.replace(" ", "") for t in _NEG_INF} or (text.startswith("torch.finfo(") and text.endswith(").min")) \
            or (text.startswith("-torch.finfo(") and text.endswith(").max")):
        return True
    if text.startswith("-"):
        try:
            return float(text[1:]) >= 1e4
        except ValueError:
            return False
    return False


def _negated(condition: cst.BaseExpression) -> cst.BaseExpression:
    """The positions that take part, given those a `masked_fill` fills."""
    if isinstance(condition, cst.Comparison) and len(condition.comparisons) == 1:
        comparison = condition.comparisons[0]
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(comparison.operator))
        if flipped is not None:
            operator = flipped(whitespace_before=comparison.operator.whitespace_before,
                               whitespace_after=comparison.operator.whitespace_after)
            return condition.with_changes(comparisons=[comparison.with_changes(operator=operator)], lpar=[], rpar=[])
    if isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.BitInvert):
        return condition.expression
    return cst.UnaryOperation(operator=cst.BitInvert(), expression=atom(condition))
