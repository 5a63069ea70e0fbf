"""Backwards from the softmax's input to the `q · kᵀ` product: the scales (into `scale=`), casts, helpers the
scores pass through, and the masks met on the way (fix/masks.py)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from .chain import (CASTS, MATMULS, Reading, compact, definition, einsum_spec, helper_called, here,
                                               is_parameter, to_layout, transposed, without_transpose)
from .chosen import chosen_bias
from .loops import list_statement, summed, summed_in_a_loop
from .masks import fill_of, set_mask, very_negative
from .views import ViewedMask, adds_to, viewed_fill, viewed_mask
from graphlint.rewrite.contract import ImportNames, Refused, atom, call_parts, code_of, is_namespace, names_read
from graphlint.rewrite.source import inside, is_number, plain_name_assignment, redefinition, substituted


@dataclass
class _Back:
    """Where the backward walk stands: the expression it reads (None once it reached the scores product), the
    statement that holds it, and whether it met a scale (which runs after anything met from there on)."""

    node: cst.BaseExpression | None
    statement: cst.BaseStatement
    scaled: bool = False


def walk_to_scores(reading: Reading, expression: cst.BaseExpression, statement: cst.SimpleStatementLine) -> None:
    """Walk back from the softmax's input to the scores product, collecting scale and mask: one step a time, by
    what the expression is (a variable, an operator, a call), until a step reaches the product."""
    back = _Back(expression, statement)
    while back.node is not None:
        reading.at = reading.scopes[0].call_statement if reading.scopes else back.statement
        step = _STEPS.get(type(back.node))
        if step is None or not step(reading, back):
            raise Refused(f"the scores pass through `{code_of(back.node)}`, which the fused call cannot express")


def _back_through_name(reading: Reading, back: _Back) -> bool:
    """A variable: what its caller passed (in a helper), the loop that summed biases into it, or the statement
    that last assigned it (an `if` that masks it is read by `_back_into_guard`)."""
    chain, name = reading.chain, back.node.value
    if reading.guarded is not None and chain.mask is None:
        raise Refused(f"`if {code_of(reading.guarded.test)}:` does more to the scores than mask them")
    reading.guarded = None
    if reading.scopes and is_parameter(reading, name, back.statement):
        scope = reading.scopes.pop()  # back in the caller, at what it passed
        back.node, back.statement = scope.args[name], scope.call_statement
        return True
    looped = summed_in_a_loop(reading, name, back.statement)
    if looped is not None:  # `for b in [m, bias]: s += b`: their sum is the mask
        back.statement = _take_the_loop(reading, name, *looped, back.scaled)
        return True
    # A mask under an `if`: the first one met, or an earlier additive one that adds to a later one.
    assigned = definition(reading, name, back.statement, guarded=reading.guard_if is None)
    if not reading.scopes:  # a helper's own statements stay: other callers may need them
        chain.consumed.append(assigned)
        chain.names.add(name)
        chain.scores_names.add(name)
    back.statement = assigned
    upcast = _upcast_only(assigned, name)
    if upcast is not None:  # `if self.upcast: s = s.float()`: the fused kernels accumulate in float32
        back.node = upcast
    elif isinstance(assigned, cst.If):
        _back_into_guard(reading, back, assigned, name)
    else:
        back.node = redefinition(assigned, name)
    return True


def _back_into_guard(reading: Reading, back: _Back, guard: cst.If, name: str) -> None:
    """`if test:` whose last statements mask the scores (added, or filled, maybe in a view of them), after
    statements that prepare the mask (kept as the walk's setup, or folded into the mask)."""
    chain = reading.chain
    reading.guarded = guard
    if chain.mask is None:
        chain.guard = here(reading, guard.test)
    *setup, masking = guard.body.body
    viewed = viewed_mask(setup[-1], masking, name) if setup else None
    if viewed is not None:  # `s = s.view(A) + m; s = s.view(B)`: the two statements mask
        setup = setup[:-1]
        reading.masking = (guard.body.body[-2], masking)
    elif len(setup) >= 2 and (viewed := viewed_fill(setup[-2], setup[-1], masking, name)):
        setup = setup[:-2]  # `s = s.view(A); s = s.masked_fill(c, f); s = s.view(B)`: the three
        reading.masking = tuple(guard.body.body[-3:])
    made = _made_for_the_mask(reading, guard, setup) if setup and chain.mask is not None else None
    if made is not None:  # fairseq: `if attn_mask is not None: attn_mask = attn_mask.unsqueeze(0)`
        setup = []
    _keep_the_setup(reading, guard, setup, masking)
    if viewed is not None and viewed.fill is not None:
        if not very_negative(fill_of(reading, viewed.fill), reading.names):
            raise Refused(f"masked_fill fills with {code_of(viewed.fill)}, not with -inf or the dtype's minimum")
        set_mask(reading, viewed.mask, False, fill=viewed.fill)
        back.node = viewed.scores
    elif viewed is not None:
        set_mask(reading, viewed.mask, True, additive=True, scaled=back.scaled)
        back.node = viewed.scores
    else:
        back.node = redefinition(masking, name)
        if made:
            back.node = substituted(back.node, made)


def _keep_the_setup(reading: Reading, guard: cst.If, setup: list, masking: cst.BaseStatement) -> None:
    """Statements a guard runs before it masks (`m = mask[:, None]`) stay for now, for masks.inline_setup:
    only before the first mask met, and only where the fused call goes."""
    if not setup:
        return
    if reading.chain.mask is not None:
        raise Refused(f"`if {code_of(guard.test)}:` computes more than a second mask")
    if reading.scopes:
        raise Refused(f"`{reading.scopes[-1].function.name.value}` prepares the mask under `if {code_of(guard.test)}:`; "
                      "graphlint rewrites such a guard only where the fused call goes")
    reading.guard_if, reading.setup = guard, list(setup)
    reading.chain.consumed[-1:] = reading.masking or [masking]


def _back_through_operation(reading: Reading, back: _Back) -> bool:
    """`q @ kᵀ` ends the walk; `/ d` and `* s` scale, `- row max` shifts (which the softmax ignores), `+ m`
    masks; any other operator cannot be expressed."""
    chain, node = reading.chain, back.node
    if m.matches(node.operator, m.MatrixMultiply()):
        chain.scores_product = node
        _product(reading, node.left, node.right)
        back.node = None
    elif m.matches(node.operator, m.Divide()):
        back.scaled = _scaled(reading)
        chain.divisors.append(here(reading, node.right))
        back.node = node.left
    elif m.matches(node.operator, m.Multiply()):
        back.scaled = _scaled(reading)
        tensor, factor = _split_scale(node)
        chain.factors.append(here(reading, factor))
        back.node = tensor
    elif m.matches(node.operator, m.Subtract()) and _row_max_of(node.right, node.left):
        back.node = node.left  # the softmax ignores a shift by its row's maximum; the fused call needs none
    elif m.matches(node.operator, m.Add()):
        tensor, mask = _chain_side(reading, node.left, node.right, back.statement)
        set_mask(reading, mask, True, additive=True, scaled=back.scaled)
        back.node = tensor
    else:
        return False
    return True


def _back_through_call(reading: Reading, back: _Back) -> bool:
    """A call the walk knows by name (casts, masks, scales, products), else a helper of the project's that the
    walk reads as if written at the call."""
    name, receiver, positional, keywords = call_parts(back.node)
    step = _CALL_STEPS.get(name)
    return bool(step is not None and step(reading, back, name, receiver, positional, keywords)) or \
        _back_into_helper(reading, back)


def _back_through_cast(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    """`s.float()`, `s.contiguous()`: the fused kernels accumulate in float32 themselves."""
    if receiver is None or is_namespace(receiver, reading.names):
        return False
    reading.chain.scores_cast |= back.statement is not reading.softmax_statement  # a variable holds the cast
    back.node = receiver
    return True


def _back_through_masked_fill(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    """`s.masked_fill(c, -inf)` (or `torch.masked_fill(s, c, -inf)`): "not c" takes part."""
    method = receiver is not None and not is_namespace(receiver, reading.names)
    target, args = (receiver, positional) if method else (positional[0] if positional else None, positional[1:])
    condition = args[0] if args else keywords.get("mask")
    fill = args[1] if len(args) > 1 else keywords.get("value")
    if target is None or condition is None or fill is None:
        raise Refused("masked_fill's arguments could not be read")
    if not very_negative(fill_of(reading, fill), reading.names):
        raise Refused(f"masked_fill fills with {code_of(fill)}, not with -inf or the dtype's minimum")
    set_mask(reading, condition, False, fill=fill)
    back.node = target
    return True


def _back_through_where(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    """`torch.where(c, s, -inf)` (c takes part) or `torch.where(c, -inf, s)` ("not c" does)."""
    if len(positional) != 3:
        return False
    condition, when_true, when_false = positional
    if very_negative(fill_of(reading, when_false), reading.names):
        set_mask(reading, condition, True, fill=when_false)
        back.node = when_true
    elif very_negative(fill_of(reading, when_true), reading.names):
        set_mask(reading, condition, False, fill=when_true)
        back.node = when_false
    else:
        raise Refused("torch.where does not fill with -inf or the dtype's minimum")
    return True


def _back_through_view(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    """`s = s.view(B)` after `s = s.view(A) + m`: the two statements add the mask."""
    if not isinstance(receiver, cst.Name) or reading.scopes:
        return False
    viewed = _viewed_mask(reading, receiver.value, back.statement)
    if viewed is None:
        return False
    back.statement = reading.chain.consumed[-1]
    set_mask(reading, viewed.mask, True, additive=True, scaled=back.scaled)
    back.node = viewed.scores
    return True


def _back_through_scale(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    """`s.mul(f)`, `s.div(d)`: into `scale=`."""
    if receiver is None or is_namespace(receiver, reading.names) or len(positional) != 1:
        return False
    back.scaled = _scaled(reading)
    (reading.chain.factors if name == "mul" else reading.chain.divisors).append(here(reading, positional[0]))
    back.node = receiver
    return True


def _reached_matmul(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    left, right = _operands(receiver, positional, reading.names)
    reading.chain.scores_product = back.node
    _product(reading, left, right)
    back.node = None
    return True


def _reached_einsum(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    reading.chain.scores_product = back.node
    _einsum_scores(reading, positional)
    back.node = None
    return True


def _reached_baddbmm(reading: Reading, back: _Back, name: str, receiver, positional, keywords) -> bool:
    if not is_namespace(receiver, reading.names) or len(positional) != 3:
        return False
    reading.chain.scores_product = back.node
    _baddbmm(reading, positional, keywords, back.scaled, back.statement)
    back.node = None
    return True


def _back_into_helper(reading: Reading, back: _Back) -> bool:
    """A helper of the project's: one that only adds to the scores it is passed gives the mask (SAM's
    `if self.use_rel_pos: attn = add_decomposed_rel_pos(attn, q, ...)`); any other is read from its return."""
    inlined = helper_called(reading, back.node, back.statement)
    if inlined is None:
        return False
    added = _added_by(reading, back.node, inlined) if reading.guarded is not None else None
    if added is not None:
        set_mask(reading, added[1], True, additive=True, scaled=back.scaled)
        back.node = added[0]
        return True
    reading.scopes.append(inlined)
    back.statement = inlined.block[-1]
    back.node = back.statement.body[0].value
    return True


_STEPS = {cst.Name: _back_through_name, cst.BinaryOperation: _back_through_operation, cst.Call: _back_through_call}
_CALL_STEPS = {
    **dict.fromkeys(CASTS, _back_through_cast),
    "masked_fill": _back_through_masked_fill,
    "where": _back_through_where,
    **dict.fromkeys(("view", "reshape"), _back_through_view),
    **dict.fromkeys(("mul", "div"), _back_through_scale),
    **dict.fromkeys(MATMULS, _reached_matmul),
    "einsum": _reached_einsum,
    **dict.fromkeys(("baddbmm", "addmm"), _reached_baddbmm),
}


def _viewed_mask(reading: Reading, name: str, back: cst.BaseStatement) -> ViewedMask | None:
    """The mask of `name = name.view(A) + m` just before `back` (`name = name.view(B)`), its statement
    taken into the chain; None when `name` was set otherwise."""
    try:
        add = definition(reading, name, back)
    except Refused:
        return None
    viewed = viewed_mask(add, back, name)
    if viewed is not None:
        reading.chain.consumed.append(add)
    return viewed


def _scaled(reading: Reading) -> bool:
    if reading.guarded is not None:
        raise Refused(f"the scores are scaled only `if {code_of(reading.guarded.test)}:`, which the fused call "
                      "cannot express")
    return True


def _baddbmm(reading: Reading, positional, keywords, scaled: bool, statement: cst.BaseStatement) -> None:
    """`baddbmm(bias, q, kᵀ, beta=1, alpha=s)` (or `addmm`) is `s * q @ kᵀ + bias`: `scale=s`,
    `attn_mask=bias`; with `beta=0` the bias is ignored."""
    bias, left, right = positional
    beta = keywords.get("beta")
    chosen = chosen_bias(reading, bias, beta, statement) if beta is not None else None
    if chosen is not None:  # `if mask is None: b, beta = ..., 0 else: b, beta = mask, 1`
        _take_the_choice(reading, chosen, bias, beta, scaled)
        beta = None if code_of(chosen[0]) != "None" else cst.Integer("0")
        bias = chosen[0]
    if beta is not None and not is_number(beta, (0.0, 1.0)):
        raise Refused(f"baddbmm scales its bias by beta={code_of(beta)}, which the fused call cannot express")
    if keywords.get("alpha") is not None:
        reading.chain.factors.append(here(reading, keywords["alpha"]))
    if beta is None or not is_number(beta, (0.0,)):
        at = reading.at
        if chosen is not None and not reading.scopes:
            reading.at = chosen[1]  # the chosen bias is read in the `if`; it must not change from there on
        set_mask(reading, bias, True, additive=True, scaled=scaled)
        reading.at = at
    _product(reading, left, right)


def _take_the_choice(reading: Reading, chosen, bias: cst.Name, beta: cst.Name, scaled: bool) -> None:
    """The `if`/`else` that chose the bias goes with the chain (a helper's own statements stay)."""
    mask, choice = chosen
    if scaled and "None" in {n.value for n in names_read(mask)}:
        raise Refused(f"the bias chosen under `if {code_of(choice.test)}:` is scaled after the product, with no "
                      "bias in one branch")
    if not reading.scopes:
        reading.chain.consumed.append(choice)
        reading.chain.names.update((bias.value, beta.value))


def _take_the_loop(reading: Reading, name: str, loop: cst.For, items: list, scaled: bool) -> cst.For:
    """The biases a loop adds to the scores are one mask, their sum; the loop (and its list, when nothing else
    reads it) goes with the chain (a helper's own statements stay)."""
    mask, made = summed(items), list_statement(reading, loop) if not reading.scopes else None
    if mask is not None:
        if not reading.scopes:
            reading.at = made or loop  # the biases are read where the list is made; they must not change from there on
        set_mask(reading, mask, True, additive=True, scaled=scaled)
    if not reading.scopes:
        reading.chain.consumed.extend((loop, made) if made is not None else (loop,))
        reading.chain.names.update((name, loop.target.value))
        reading.chain.scores_names.add(name)
    return loop


def _chain_side(reading: Reading, left, right, statement) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """Of `a + b`, (the scores, the mask): the scores are the side that leads back to the product."""
    for tensor, other in ((left, right), (right, left)):
        if _leads_to_product(reading, tensor, statement):
            return tensor, other
    raise Refused("neither side of the addition leads back to the scores product")


def _leads_to_product(reading: Reading, node, statement, depth: int = 0) -> bool:
    if depth > 12:
        return False
    if isinstance(node, cst.Name):
        if reading.scopes and is_parameter(reading, node.value, statement):  # what the helper's caller passed
            scope = reading.scopes.pop()
            try:
                return _leads_to_product(reading, scope.args[node.value], scope.call_statement, depth + 1)
            finally:
                reading.scopes.append(scope)
        try:
            assigned = definition(reading, node.value, statement, guarded=True)
        except Refused:
            return False
        value = redefinition(assigned.body.body[-1] if isinstance(assigned, cst.If) else assigned, node.value)
        return value is not None and _leads_to_product(reading, value, assigned, depth + 1)
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, cst.MatrixMultiply) or any(
            _leads_to_product(reading, n, statement, depth + 1) for n in (node.left, node.right))
    if isinstance(node, cst.Call):
        name, receiver, positional, _ = call_parts(node)
        if name in MATMULS or name == "einsum":
            return True
        try:
            if helper_called(reading, node, statement) is not None:
                return True  # a helper of the project's: the walk reads it
        except Refused:
            return False
        candidates = ([receiver] if receiver is not None and not is_namespace(receiver, reading.names) else []) + positional
        return any(_leads_to_product(reading, n, statement, depth + 1) for n in candidates)
    return False


def _product(reading: Reading, left: cst.BaseExpression, right: cst.BaseExpression) -> None:
    chain = reading.chain
    chain.q = here(reading, _peel_scale(reading, left))
    key = here(reading, _peel_scale(reading, right))
    untransposed = without_transpose(key, reading.rank)
    if untransposed is None and isinstance(key, cst.Name):
        untransposed = _transposed_variable(reading, key)
    chain.k = untransposed if untransposed is not None else transposed(key)


def _transposed_variable(reading: Reading, key: cst.Name) -> cst.BaseExpression | None:
    """`k` for `kt` made by `kt = k.transpose(2, 3)` in this block and read nowhere else; the statement goes."""
    try:
        statement = definition(reading, key.value, reading.softmax_statement)
    except Refused:
        return None
    untransposed = without_transpose(redefinition(statement, key.value), reading.rank)
    reads = [n for n in names_read(reading.function) if n.value == key.value]
    if untransposed is None or len(reads) != 2:  # the assignment and the product
        return None
    reading.chain.consumed.append(statement)
    reading.chain.names.add(key.value)
    return untransposed


def _peel_scale(reading: Reading, operand: cst.BaseExpression) -> cst.BaseExpression:
    """`q * s` or `q / d` as an operand of the product, also under a reshape (`(q * s).view(...)`): the
    scale moves into `scale=`."""
    name, receiver, _, _ = call_parts(operand)
    if name in ("view", "reshape") and isinstance(receiver, cst.BinaryOperation) and \
            isinstance(receiver.operator, (cst.Multiply, cst.Divide)):
        # The product was a fresh contiguous tensor; its input may not be, so `view` becomes `reshape`.
        return operand.with_changes(func=operand.func.with_changes(
            value=atom(_peel_scale(reading, receiver.with_changes(lpar=[], rpar=[]))), attr=cst.Name("reshape")))
    while isinstance(operand, cst.BinaryOperation) and isinstance(operand.operator, (cst.Multiply, cst.Divide)):
        if isinstance(operand.operator, cst.Divide):
            reading.chain.divisors.append(here(reading, operand.right))
            operand = operand.left
        else:
            operand, factor = _split_scale(operand)
            reading.chain.factors.append(here(reading, factor))
    return operand


def _einsum_scores(reading: Reading, positional: list[cst.BaseExpression]) -> None:
    """Any layout of `q·k` over one shared dimension, the scores ending in (query, key): q and k are
    transposed or permuted into the fused call's (batch..., sequence, head dim)."""
    spec = einsum_spec(positional)
    why = "the scores einsum does not contract one dimension of q and k into scores ending in (query, key)"
    if spec is None:
        raise Refused(why)
    (a, b), out = spec
    shared = [c for c in a if c in b and c not in out]
    if len(out) < 2 or len(shared) != 1 or len(a) != len(out) or len(b) != len(out):
        raise Refused(why)
    batch, i, j, d = out[:-2], out[-2], out[-1], shared[0]
    if set(a) != set(batch + i + d) or set(b) != set(batch + j + d):
        raise Refused(why)
    reading.chain.q = here(reading, to_layout(_peel_scale(reading, positional[1]), a, batch + i + d))
    reading.chain.k = here(reading, to_layout(_peel_scale(reading, positional[2]), b, batch + j + d))


def fold_prescaled(reading: Reading) -> None:
    """`q = q * self.scale` on its own line before the scores, with nothing else reading the scaled `q`: the
    factor moves into `scale=` and the statement goes (the fused call scales the scores itself)."""
    chain = reading.chain
    if reading.scopes or chain.values_statement is None:
        return
    body = list(reading.block)
    first = min((body.index(s) for s in chain.consumed if s in body), default=None)
    for part in ("q", "k"):
        name = getattr(chain, part)
        if not isinstance(name, cst.Name) or first is None:
            continue
        try:
            statement = definition(reading, name.value, body[first])
        except Refused:
            continue
        value = redefinition(statement, name.value)
        if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, (cst.Multiply, cst.Divide)):
            continue
        tensor, factor = (_split_scale(value) if isinstance(value.operator, cst.Multiply) else (value.left, value.right))
        if not isinstance(tensor, cst.Name) or tensor.value != name.value or not _scalar_like(factor):
            continue
        later = body[body.index(statement) + 1:]
        reads = [n for s in later if s not in chain.consumed for n in names_read(s) if n.value == name.value]
        if any(not inside(n, chain.values_product) for n in reads):  # the scaled `q` is read elsewhere too
            continue
        (chain.factors if isinstance(value.operator, cst.Multiply) else chain.divisors).append(factor)
        reading.reads.append(({n.value for n in names_read(factor)}, statement))
        chain.consumed.append(statement)


def _upcast_only(statement: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """`name` of `if flag: name = name.float()` (a guard whose one statement only casts it, or copies it: Uni-Core's
    `if not inplace: input = input.clone()`, whose values are the same); None otherwise."""
    if not m.matches(statement, m.If(body=m.IndentedBlock(body=[m.DoNotCare()]), orelse=None)):
        return None
    value = redefinition(statement.body.body[0], name)
    cast, receiver, _, _ = call_parts(value)
    if (cast in CASTS or cast == "clone") and isinstance(receiver, cst.Name) and receiver.value == name:
        return receiver
    return None


def _operands(receiver, positional, names: ImportNames) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    if receiver is not None and not is_namespace(receiver, names):
        if len(positional) != 1:
            raise Refused("the scores product's operands could not be read")
        return receiver, positional[0]
    if len(positional) != 2:
        raise Refused("the scores product's operands could not be read")
    return positional[0], positional[1]


def _split_scale(node: cst.BinaryOperation) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(tensor, factor) of `a * b`: the factor is the side that is plainly a number or computed from shapes."""
    if _scalar_like(node.left) and not _scalar_like(node.right):
        return node.right, node.left
    return node.left, node.right


def _scalar_like(node: cst.BaseExpression) -> bool:
    text = code_of(node)
    return isinstance(node, (cst.Integer, cst.Float)) or any(
        marker in text for marker in ("math.", "**", ".shape", ".size(", "sqrt", "scale", "scaling"))


def _row_max_of(shift: cst.BaseExpression, scores: cst.BaseExpression) -> bool:
    """`scores.max(dim=-1, keepdim=True)[0]` (`.values`, `torch.max(scores, -1, keepdim=True)[0]`, `amax`,
    `logsumexp`, `.detach()` on any): a value per row of the last dimension, which the softmax over it ignores."""
    while call_parts(shift)[0] == "detach" and call_parts(shift)[1] is not None:
        shift = call_parts(shift)[1]
    picked = isinstance(shift, cst.Subscript) and len(shift.slice) == 1 and \
        isinstance(shift.slice[0].slice, cst.Index) and code_of(shift.slice[0].slice.value) == "0"
    if picked or (isinstance(shift, cst.Attribute) and shift.attr.value == "values"):
        shift = shift.value
        if call_parts(shift)[0] != "max":
            return False
    name, receiver, positional, keywords = call_parts(shift)
    if name not in ("max", "amax", "logsumexp") or receiver is None:
        return False
    args = positional if receiver is not None and code_of(receiver) not in ("torch",) else positional[1:]
    tensor = receiver if code_of(receiver) != "torch" else (positional[0] if positional else None)
    dim = args[0] if args else keywords.get("dim")
    keepdim = args[1] if len(args) > 1 else keywords.get("keepdim")
    return tensor is not None and compact(tensor) == compact(scores) and dim is not None and \
        compact(dim) in ("-1", "(-1,)", "[-1]") and keepdim is not None and code_of(keepdim) == "True"


def _made_for_the_mask(reading: Reading, guard: cst.If, setup: list) -> dict | None:
    """`{name: value}` of a guard's one statement before it masks, `name = value`, when nothing after the guard
    reads `name` (fairseq's `attn_mask = attn_mask.unsqueeze(0)`): the whole `if` goes, so the mask is the value."""
    if reading.scopes or len(setup) != 1 or not plain_name_assignment(setup[0]) or guard not in reading.block:
        return None
    name, value = setup[0].body[0].targets[0].target.value, setup[0].body[0].value
    later = list(reading.block)[list(reading.block).index(guard) + 1:]
    if any(n.value == name for s in later for n in names_read(s)):
        return None
    return {name: value}


ZEROS = "_scores_shaped_zeros"  # stands for zeros shaped as the scores until q and k are read (zeros_for_added)


def _added_by(reading: Reading, call: cst.Call, helper) -> tuple | None:
    """(the scores, the mask) of a helper that only adds to the scores it is passed (views.adds_to): the mask is
    the helper called on zeros of the scores' shape, the rest of its arguments as they are."""
    first = helper.function.params.params[0].name.value if helper.function.params.params else None
    if reading.scopes or first is None or not adds_to(helper.function, first) or \
            not isinstance(helper.args.get(first), cst.Name) or len(call.args) < 1 or call.args[0].keyword:
        return None
    return helper.args[first], call.with_changes(args=[call.args[0].with_changes(value=cst.Name(ZEROS)),
                                                       *call.args[1:]])


def zeros_for_added(reading: Reading) -> None:
    """The zeros a mask made by a helper is computed from: shaped as the scores, `q`'s rows by `k`'s."""
    chain = reading.chain
    if chain.mask is not None and ZEROS in {n.value for n in names_read(chain.mask)}:
        q, k = code_of(atom(chain.q)), code_of(atom(chain.k))
        zeros = cst.parse_expression(f"{q}.new_zeros(*{q}.shape[:-1], {k}.shape[-2])")
        chain.mask = substituted(chain.mask, {ZEROS: zeros})
