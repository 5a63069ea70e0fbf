"""The reading's state and what every part of it reads: `Reading` (where the fused call goes, the helpers the
backward walk is inside, what it has read so far, as a `Chain`), the softmax and its input, the statement that last assigned
a name, a part read inside a helper put in the caller's terms (graphlint.rewrite.inline), and the layouts of q, k
and v (transposes, einsum letters)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from graphlint.rewrite import inline
from .match import AttentionMatch
from .returned import module_call, returned_from, why_not_called
from .views import added_to_a_view, filled_in_a_view, viewed_back
from graphlint.rewrite.inline import Inlined
from graphlint.rewrite.contract import FixSite, ImportNames, Refused, atom, call_parts, code_of, is_namespace, names_read
from graphlint.rewrite.source import (assigned_names, block_of, bound_arguments, calls_function, calls_in,
                                      class_of, indent_of, mutated_in_place, redefinition, statements_of)
from graphlint.opnames import CAST, MATMUL_LIKE

# The rule's op vocabulary (graphlint.opnames), as the calls appear in the source: a cast, or `contiguous`, which
# changes only the layout; the two-operand products (`baddbmm`, `addmm` and `einsum` are read on their own).
CASTS = CAST | {"contiguous"}
MATMULS = MATMUL_LIKE - {"baddbmm", "einsum", "rmatmul"}


@dataclass
class Chain:
    """What the walk has read, in the terms of the function the fused call goes in: the call's arguments, and
    the statements and variables it replaces."""

    q: cst.BaseExpression | None = None
    k: cst.BaseExpression | None = None
    v: cst.BaseExpression | None = None
    factors: list[cst.BaseExpression] = field(default_factory=list)  # multiplied into the scale
    divisors: list[cst.BaseExpression] = field(default_factory=list)
    mask: cst.BaseExpression | None = None  # additive (float) or boolean "take part" mask
    mask_source: cst.BaseExpression | None = None  # the user's mask expression, for the causal test
    keep_when_true: bool = True  # the polarity of `mask_source`
    fill: cst.BaseExpression | None = None  # a finite fill (`-1e9`): the mask is written additive, the fix unsafe
    dropout_p: cst.BaseExpression | None = None
    dropout_in_training_only: bool = True
    consumed: list[cst.SimpleStatementLine] = field(default_factory=list)  # statements that only fed the chain
    names: set[str] = field(default_factory=set)  # variables that only carried the chain
    values_product: cst.BaseExpression | None = None
    values_statement: cst.SimpleStatementLine | None = None
    out_layout: tuple[str, str] | None = None  # (the fused call's output layout, the layout the code wants)
    guard: cst.BaseExpression | None = None  # `if guard:` around the mask (`if mask is not None:`, `if causal:`)
    elsewhere: list[cst.BaseExpression] = field(default_factory=list)  # later reads (returned, stored) of them
    scores_names: set[str] = field(default_factory=set)  # the variables of `names` that hold the scores
    scores_cast: bool = False  # a cast on the way from the scores product to the softmax
    renamed: list[tuple[cst.CSTNode, cst.CSTNode]] = field(default_factory=list)  # `scores.device` → `q.device`
    scores_product: cst.CSTNode | None = None  # where the source's chain starts


class Reading:
    """One reading of the attention chain in the source, from the softmax the finding points at: where the fused
    call goes, the helpers the backward walk is inside, and what it has read (`chain`). Every part of the reading
    is a function of it (scores, values, masks, checks, emit). Not a graph search: those are graphlint.walk's, over
    the captured graph, which this layer does not import."""

    def __init__(self, site: FixSite, rank: int | None, default_scale: bool = False, mask_cast: bool = False) -> None:
        self.match = AttentionMatch.from_site(site)  # what the rule matched in the graph, located in the source
        if _called_into(self.match, site.node):
            raise Refused(f"`{code_of(site.node.func)}` runs the attention in a file outside the project; graphlint "
                          "rewrites only the project's own files")
        if site.function is None:
            raise Refused("the attention is not inside a function")
        self.site = site
        self.names = site.imports
        self.dropout_after = self.match.dropout_after  # the graph saw dropout on them
        self.rank = rank
        self.default_scale = default_scale
        # An added mask the forward made with a dtype of its own: cast to the queries' (SDPA on the CPU computes
        # float64 queries with a float32 mask wrongly, where `scores + mask` promoted).
        self.mask_cast = mask_cast
        self.guarded: cst.If | None = None  # the `if` whose body the backward walk is in
        self.guard_if: cst.If | None = None  # an `if` that prepares the mask before masking the scores
        self.order: list[int] = list(range(rank)) if rank else []  # the probabilities' dimensions, as permuted
        self.setup: list[cst.BaseStatement] = []  # the statements it runs before the masking one
        self.masking: tuple[cst.BaseStatement, ...] = ()  # the guard's statements that mask, when not only its last
        self.chain = Chain()
        # Where the fused call goes: the softmax's function, or the caller of a softmax helper.
        self.function, self.classdef, self.module, self.indent = site.function, site.classdef, site.module, site.indent
        self.softmax: cst.CSTNode = site.node
        self.start: tuple[cst.BaseExpression, cst.BaseStatement] | None = None  # the softmax's input in a helper
        self.helper_dropout: tuple | None = None  # (positional, keywords) but the tensor, of a dropout in it
        self.scopes: list[Inlined] = []  # the helpers the backward walk is inside, innermost last
        self.at: cst.BaseStatement | None = None  # the statement of the anchor function the walk reads
        self.reads: list[tuple[set[str], cst.BaseStatement]] = []  # the names each part reads, and where
        self.modules = tuple(dict.fromkeys((site.module, *(r.module for r in self.match.nodes()))))
        self.block, self.softmax_statement = block_in(site.function, site.node)


def _called_into(match: AttentionMatch, node: cst.CSTNode) -> bool:
    """The products and the softmax all ran inside the one call at the finding, in code of no file of the
    project's (graphlint.locate places each at the project's call into that code)."""
    located = (match.scores, match.softmax, match.values)
    return isinstance(node, cst.Call) and None not in located and all(role.node is node for role in located)


def here(reading: Reading, node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """A part of the chain read inside helpers, in the terms of the function the fused call goes in (each
    helper's parameters replaced by what its caller passed); what it reads is noted with where (`reading.reads`)."""
    if node is None:
        return None
    node = inline.in_caller_terms(node, reading.scopes, reading.function, reading.module, upcasts_dropped=True)
    reading.reads.append(({n.value for n in names_read(node)}, reading.at))
    return node


def helper_called(reading: Reading, call: cst.Call, statement: cst.BaseStatement) -> Inlined | None:
    """The project's helper that `call` runs, read as if written at the call (graphlint.rewrite.inline.inlined)."""
    return inline.inlined(call, statement, reading.scopes, reading.module, reading.classdef, reading.modules)


def is_parameter(reading: Reading, name: str, statement: cst.BaseStatement) -> bool:
    """`name` is a parameter of the helper the walk is in, not reassigned before `statement`."""
    return inline.is_parameter(reading.scopes[-1], name, statement)


def softmax_input(reading: Reading, call: cst.CSTNode) -> cst.BaseExpression:
    if not isinstance(call, cst.Call):
        raise Refused("the softmax is not a call graphlint can rewrite")
    func = call.func
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if isinstance(func, cst.Attribute) and not is_namespace(func.value, reading.names):
        if re.fullmatch(r"self(\.\w+)*", code_of(func.value)):  # `self.softmax(x)`, not `self.f(q).softmax(-1)`
            if len(positional) != 1:
                raise Refused("the softmax module is called with more than the scores")
            return positional[0]
        return func.value  # scores.softmax(-1)
    if not positional:
        raise Refused("the softmax's input is passed by keyword")
    return positional[0]  # F.softmax(scores, dim=-1), torch.softmax(scores, -1)


def anchor_at_the_values(reading: Reading) -> None:
    """A helper that returns the probabilities (`def _softmax(self, x): return F.softmax(x.float(), -1)`, or
    one that also makes and masks the scores) and a caller that multiplies them with the values: the
    rewrite happens in the caller, at the helper's call, and the helper is read as if written there."""
    values = reading.match.values
    if values is None or values.function is None or values.function is reading.function:
        return
    helper, caller = reading.function, values.function
    body = statements_of(helper)
    if reading.softmax_statement not in body:
        raise Refused(f"the softmax is inside a block of `{helper.name.value}`; the attention chain spans "
                      "several functions")
    dropout = returned_from(helper, reading.softmax, reading.softmax_statement, body, reading.names.namespaces)
    modules = ImportNames.of(values.module).modules
    calls = [c for c in calls_in(caller) if calls_function(c, helper, modules)]
    held = module_call(helper, caller, values.module) if not calls else None
    if held is not None:  # `self.softmax_module(scores, mask)`: read as its forward, `self` being the module
        calls = [held]
    if len(calls) != 1:
        raise Refused(why_not_called(helper, caller, values.module, len(calls)))
    call = calls[0]
    args = bound_arguments(helper, call)
    if args is None:
        raise Refused(f"the call of `{helper.name.value}` passes arguments graphlint cannot match to its parameters")
    if held is not None:
        args[helper.params.params[0].name.value] = call.func
    module = values.module
    block, statement = block_in(caller, call)
    reading.start = (softmax_input(reading, reading.softmax), reading.softmax_statement)
    reading.scopes = [Inlined(helper, args, statement, tuple(body), reading.module)]
    if dropout is not None:  # its p and training flag, in the caller's terms, for values.py to read
        _, _, positional, keywords = call_parts(dropout)
        reading.at = statement
        reading.helper_dropout = ([here(reading, a) for a in positional[1:]], {k: here(reading, v) for k, v in keywords.items()})
    reading.function, reading.module, reading.softmax = caller, module, call
    reading.classdef = class_of(module, caller)
    reading.block, reading.softmax_statement = block, statement
    reading.names = ImportNames.of(module)
    reading.indent = indent_of(module, statement)


def block_in(function: cst.FunctionDef, node: cst.CSTNode) -> tuple[tuple, cst.SimpleStatementLine]:
    try:
        return block_of(function, node)
    except ValueError:
        raise Refused("the softmax is not in a plain statement of the function") from None


def definition(reading: Reading, name: str, before: cst.BaseStatement, guarded: bool = False) -> cst.BaseStatement:
    """The statement of this block that last assigned `name` (a plain `name = ...`) before `before`; with
    `guarded`, also an `if test:` without else whose body is one `name = ...` (a mask under a flag)."""
    body = list(reading.scopes[-1].block if reading.scopes else reading.block)
    if before not in body:
        raise Refused(f"`{name}` is not computed in the same block as the attention")
    for statement in reversed(body[: body.index(before)]):
        if name in assigned_names(statement) or mutated_in_place(statement, name):
            if redefinition(statement, name) is not None:
                return statement
            if guarded and isinstance(statement, cst.If) and statement.orelse is None and \
                    isinstance(statement.body, cst.IndentedBlock) and statement.body.body and \
                    all(name not in assigned_names(s) and not mutated_in_place(s, name)
                        for s in _before_the_masking(statement.body.body, name)) and \
                    redefinition(statement.body.body[-1], name) is not None:
                return statement
            raise Refused(f"`{name}` is {_how_assigned(statement, name)}, which the rewrite cannot follow")
    if name in reading.names.namespaces:
        raise Refused(f"`{name}` is a module, not the scores; graphlint could not read this call")
    function = reading.scopes[-1].function if reading.scopes else reading.function
    if name in assigned_names(function):
        raise Refused(f"`{name}` is computed outside the block the softmax is in (a branch or loop); the fused "
                      "call would have to replace the whole statement")
    raise Refused(f"`{name}` comes from outside the function; the attention chain spans several functions")


def _before_the_masking(body, name: str) -> tuple:
    """The statements of a guard before the one that masks the scores, or the two that add a mask to them
    viewed in another shape and view them back (fix/views.py)."""
    if len(body) >= 2 and added_to_a_view(body[-2], name) and viewed_back(body[-1], name):
        return tuple(body[:-2])
    if filled_in_a_view(body, name):  # view, masked_fill, view back
        return tuple(body[:-3])
    return tuple(body[:-1])


def _how_assigned(statement: cst.CSTNode, name: str) -> str:
    """What kind of statement sets `name`, in the user's terms, for a refusal."""
    if isinstance(statement, cst.If):
        return "assigned in an `if` with an `else`" if statement.orelse is not None else \
            f"assigned under `if {code_of(statement.test)}:` among other statements"
    if isinstance(statement, (cst.For, cst.While)):
        return "changed in a loop"
    if mutated_in_place(statement, name):
        return "changed in place in a way the fused call cannot express"
    return "assigned in a statement that does more than compute it"


def without_transpose(key: cst.BaseExpression, rank: int | None) -> cst.BaseExpression | None:
    """`k` from `k.transpose(-2, -1)` (or `torch.transpose(k, -2, -1)`, `swapaxes`), `k.mT`, `k.transpose(2, 3)`
    of a tensor of rank 4, `k.permute(0, 2, 1)` of rank 3, `k.t()` or `k.T` of a matrix; None otherwise."""
    if isinstance(key, cst.Attribute) and (key.attr.value == "mT" or (key.attr.value == "T" and rank == 2)):
        return key.value
    if rank == 2 and call_parts(key)[0] == "t" and isinstance(key, cst.Call) and not key.args:
        return key.func.value
    if not isinstance(key, cst.Call) or not isinstance(key.func, cst.Attribute) or any(a.keyword for a in key.args):
        return None
    name, args = key.func.attr.value, [a.value for a in key.args]
    try:
        if name in ("transpose", "swapaxes", "swapdims") and len(args) in (2, 3):
            tensor = args[0] if len(args) == 3 else key.func.value  # `torch.transpose(k, -2, -1)`, `k.transpose(-2, -1)`
            dims = {int(code_of(a)) for a in args[-2:]}
            if dims == {-2, -1} or (rank is not None and {d % rank for d in dims} == {rank - 2, rank - 1}):
                return tensor
        if name == "permute" and rank is not None and args:
            if len(args) == 2 and isinstance(args[1], (cst.Tuple, cst.List)):  # `torch.permute(k, (0, 2, 1))`
                tensor, order = args[0], [e.value for e in args[1].elements]
            elif len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
                tensor, order = key.func.value, [e.value for e in args[0].elements]
            else:
                tensor, order = key.func.value, args
            if [int(code_of(d)) % rank for d in order] == [*range(rank - 2), rank - 1, rank - 2]:
                return tensor
    except ValueError:
        return None
    return None


def transposed(node: cst.BaseExpression) -> cst.BaseExpression:
    return cst.parse_expression(f"{code_of(atom(node))}.transpose(-2, -1)")


def einsum_spec(positional) -> tuple[tuple[str, str], str] | None:
    if len(positional) != 3 or not isinstance(positional[0], cst.SimpleString):
        return None
    spec = positional[0].evaluated_value
    if not isinstance(spec, str) or "->" not in spec or "..." in spec:
        return None
    inputs, out = spec.replace(" ", "").split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or min(len(parts[0]), len(parts[1])) < 2 or \
            any(len(set(part)) != len(part) for part in (*parts, out)):  # a repeated index is a diagonal
        return None
    return (parts[0], parts[1]), out


def to_layout(node: cst.BaseExpression, have: str, want: str) -> cst.BaseExpression:
    """`node`, whose dimensions are named by `have`, with them in the order `want`: itself, a transpose of the
    last two, or a permute."""
    if have == want:
        return node
    if have[:-2] == want[:-2] and have[-2:] == want[:-3:-1]:
        return transposed(node)
    order = ", ".join(str(have.index(c)) for c in want)
    return cst.parse_expression(f"{code_of(atom(node))}.permute({order})")


def compact(node: cst.BaseExpression) -> str:
    return code_of(node.with_changes(lpar=[], rpar=[])).replace(" ", "")


def as_operand(node: cst.BaseExpression, operator: type) -> cst.BaseExpression:
    """`node` as an operand of `*` or `/`: parenthesised only where the precedence needs it (`1 / (a * b)`,
    not `1 / (d**0.5)`)."""
    bare = node.with_changes(lpar=[], rpar=[]) if isinstance(node, (cst.BinaryOperation, *_ATOMIC)) else node
    if isinstance(bare, cst.BinaryOperation) and not isinstance(bare.operator, cst.Power) and \
            not (operator is cst.Multiply and isinstance(bare.operator, cst.Multiply)):
        return atom(bare)
    return bare


_ATOMIC = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)
