"""Probabilities read or changed under flags the capture did not take (BART's `if layer_head_mask is not None:`
and `if output_attentions:`, BLIP's `if self.save_attention:`): the fused call cannot serve those statements,
so the fix is the guarded fallback `transformers` writes for SDPA itself:

    if layer_head_mask is None and not output_attentions:
        attn_output = F.scaled_dot_product_attention(...)
        attn_weights_reshaped = None      # what the not-taken `if`'s `else:` assigns
    else:
        <the statements as written, from the scores to the values product>

The fused branch is the walk's rewrite of a copy of the function in which each such `if` is replaced by its
`else:` (the path the capture took); its condition is exactly the complement of the `if`s, so each case computes
what it did. Refused where a statement under such an `if` ran in the graph, where the condition holds a call or
is assigned between the attention's first statement and the `if` (a guard before it would read another value),
and where the fused branch would leave a name unset that later code reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from .branches import with_block
from .chain import Reading, anchor_at_the_values, block_in
from graphlint.rewrite.contract import Refused, Rewrite, code_of, names_read
from graphlint.rewrite.source import assigned_names, calls_in, indent_of, inside, mutated_in_place, path_to
from graphlint.results import SAFE


@dataclasses.dataclass(frozen=True)
class _Fallback(cst.If):
    """An `if` written at the column of the statement it replaces: every line after its first is indented by
    `outer`, as the block around it is."""

    outer: str = ""

    def _codegen_impl(self, state, is_elif: bool = False) -> None:
        start = len(state.tokens)
        state.increase_indent(self.outer)
        super()._codegen_impl(state, is_elif)
        state.decrease_indent()
        if state.tokens[start:start + 1] == [self.outer]:
            del state.tokens[start]  # the edit starts at the old statement's column
        state.pop_trailing_newline()


def guarded_fallback(site, rank: int | None, default_scale: bool, why: Refused,
                     rewrite: Callable[[Reading], Rewrite], mask_cast: bool = False) -> Rewrite:
    """The fused call under the complement of the `if`s that read the probabilities, the original statements
    in the `else:`; raises `why` where no such `if` stands in the way or the fused path cannot be read."""
    reading = Reading(site, rank, default_scale, mask_cast)
    anchor_at_the_values(reading)
    values = reading.match.values
    block = list(reading.block)
    end = next((i for i, s in enumerate(block) if values is not None and inside(values.node, s)), None)
    if reading.scopes or reading.start is not None or end is None or reading.softmax_statement not in block:
        raise why
    start = block.index(reading.softmax_statement)
    made, guards = set(assigned_names(reading.softmax_statement)), []
    for statement in block[start + 1:end]:
        if isinstance(statement, cst.If) and made & {n.value for n in names_read(statement)} and \
                not _module_call_alone(statement):
            guards.append(statement)
        made |= assigned_names(statement)
    if not guards or any(inside(r.node, g) for r in reading.match.nodes() for g in guards):
        raise why  # nothing under a flag, or a flag the graph took: the reason stands
    for guard in guards:
        if not isinstance(guard.body, cst.IndentedBlock) or (guard.orelse is not None and (
                not isinstance(guard.orelse, cst.Else) or not isinstance(guard.orelse.body, cst.IndentedBlock))):
            raise why
        if calls_in(guard.test):
            raise Refused(f"`if {code_of(guard.test)}:` calls a function; the fused call's guard would call it "
                          "once more, before the attention")
    not_taken = {id(g): list(g.orelse.body.body) if g.orelse is not None else [] for g in guards}
    path = [s for b in block for s in (not_taken[id(b)] if id(b) in not_taken else [b])]
    indent = indent_of(reading.module, reading.softmax_statement)
    reading.function = with_block(reading.function, guards[0], path)
    reading.block, reading.softmax_statement = block_in(reading.function, reading.softmax)
    reading.indent = ""  # the fused call is laid out inside the `if`, whose lines take the block's indent
    try:
        inner = rewrite(reading)
    except Refused:
        raise why from None
    if inner.inserted:
        raise why
    copy = list(reading.block)
    # `(out, probs) if output_attentions else (out,)` after the attention: read only where that flag holds, so
    # the flag joins the guard and the read stays as written.
    chosen = [_chosen_by_a_flag(reading.function, e) for e in reading.chain.elsewhere]
    if any(c is None for c in chosen):
        raise why
    also = [(old, new) for old, new in inner.also if not any(old is e for e in reading.chain.elsewhere)]
    if any(s not in copy for s in inner.removed) or any(not any(inside(old, s) for s in copy) for old, _ in also):
        raise why
    first = min([copy.index(s) for s in inner.removed] + [copy.index(block[end])])
    if copy[first] not in block:
        raise why
    real = block[block.index(copy[first]):end + 1]
    tests = [(g.test, real[:real.index(g)] if g in real else None) for g in guards]
    for choice in dict.fromkeys(chosen):
        until = next((i for i, s in enumerate(block) if inside(choice, s)), None)
        tests.append((choice.test, block[block.index(real[0]):until] if until is not None and until > end else None))
    _check_guards_unchanged(tests)
    replaced = {id(old): new for old, new in ((inner.old, inner.new), *also)}
    fused = [s.visit(_Replace(replaced)) for s in copy[first:copy.index(block[end]) + 1] if s not in inner.removed]
    unset = {n for s in inner.removed for n in assigned_names(s)} - {n for s in fused for n in assigned_names(s)}
    in_choices = {id(n) for c in chosen for n in names_read(c.body)}
    read_after = {n.value for s in block[end + 1:] for n in names_read(s) if id(n) not in in_choices} & unset
    if read_after:
        raise Refused(f"`{sorted(read_after)[0]}` is read after the attention, and the fused branch would not set "
                      "it; the attention stays as written")
    test = cst.parse_expression(" and ".join(dict.fromkeys(_complement(t) for t, _ in tests)))
    fused[0] = fused[0].with_changes(leading_lines=())
    kept = [real[0].with_changes(leading_lines=()), *real[1:]]
    node = _Fallback(test=test, body=cst.IndentedBlock(body=fused),
                     orelse=cst.Else(body=cst.IndentedBlock(body=kept)), outer=indent)
    parts = [p for p in inner.message.split("; ") if not p.endswith("returned or stored as None")]
    message = f"{parts[0]} where `{code_of(test)}`, the statements as written otherwise" + \
        "".join(f"; {p}" for p in parts[1:])
    applicability = inner.applicability if len(parts) > 1 or not reading.chain.elsewhere else SAFE
    # The lines before each later statement (comments, blank lines) move into the `else:` with it.
    between = tuple(line for statement in real[1:] for line in statement.leading_lines)
    return Rewrite(real[0], node, message, removed=(*real[1:], *between), imports=inner.imports,
                   applicability=applicability)


def _chosen_by_a_flag(function: cst.FunctionDef, read: cst.BaseExpression) -> cst.IfExp | None:
    """The conditional expression whose first value holds `read`, when its test calls nothing."""
    path = path_to(function, read) or []
    choice = next((n for n in reversed(path) if isinstance(n, cst.IfExp)), None)
    if choice is None or not inside(read, choice.body) or calls_in(choice.test):
        return None
    return choice


def _module_call_alone(guard: cst.If) -> bool:
    """`if self.dropout is not None: p = self.dropout(p)`: a guarded dropout, which values.py reads."""
    body = guard.body.body if isinstance(guard.body, cst.IndentedBlock) else ()
    if guard.orelse is not None or len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine):
        return False
    small = body[0].body[0]
    return isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and len(small.value.args) == 1 and \
        code_of(small.value.args[0].value) == code_of(small.targets[0].target)


def _check_guards_unchanged(tests: list) -> None:
    """The fused call's guard is read before the attention's first statement; each test is read where it is
    (with the statements before it there), so nothing in between may assign what it reads (a name, or the
    attribute itself)."""
    for test, before in tests:
        if before is None:
            raise Refused(f"`{code_of(test)}` is not read in the block the fused call is in, after it")
        tested = {code_of(n) for n in _operands(test)}
        for statement in before:
            targets = assigned_names(statement) | _attribute_targets(statement)
            changed = sorted(t for t in tested if t in targets or mutated_in_place(statement, t))
            if changed:
                raise Refused(f"`{changed[0]}` is assigned between the attention's first statement and where "
                              f"`{code_of(test)}` reads it; a guard before the attention would read another value, "
                              "so the attention stays as written")


def _operands(test: cst.BaseExpression) -> Sequence[cst.CSTNode]:
    """The names and attribute chains a test reads: `self.save_attention`, `layer_head_mask`."""
    return m.findall(test, m.Attribute() | m.Name())


def _attribute_targets(statement: cst.CSTNode) -> set[str]:
    """What a statement assigns, as written: each name and attribute chain of its targets."""
    return {code_of(t) for node in m.findall(statement, m.AssignTarget() | m.AugAssign()) for t in _operands(node.target)}


def _complement(test: cst.BaseExpression) -> str:
    """The test that holds exactly where `test` does not: `x is not None` → `x is None`, `flag` → `not flag`."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        operator = test.comparisons[0].operator
        swapped = {cst.IsNot: "is", cst.Is: "is not", cst.NotIn: "in", cst.In: "not in"}.get(type(operator))
        if swapped is not None:
            return f"{code_of(test.left)} {swapped} {code_of(test.comparisons[0].comparator)}"
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        inner = test.expression
        return code_of(inner) if inner.lpar or not isinstance(inner, cst.BooleanOperation) else f"({code_of(inner)})"
    if isinstance(test, (cst.Name, cst.Attribute)):
        return f"not {code_of(test)}"
    return f"not ({code_of(test)})"


class _Replace(cst.CSTTransformer):
    """The rewrite's replacements, found by identity (libcst.matchers.replace matches the original node but hands
    its callable the rebuilt one, so a replacement keyed by the original has no matcher)."""

    def __init__(self, replaced: dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.replaced = replaced

    def on_leave(self, original_node, updated_node):
        return self.replaced.get(id(original_node), updated_node)
