"""GL101's fix: softmax attention written by hand in one function, rewritten as one
`F.scaled_dot_product_attention` call, or for `transformers` models, `attn_implementation="sdpa"`.

The rule hands over what it matched in the graph (whether dropout follows the softmax, the scores' rank); the
rewrite then reads the chain from the source, starting at the softmax the finding points at: backwards through
the statements that compute the scores (scales, one mask, casts, a mask under `if mask is not None:` or
`if flag:`) to the `q · kᵀ` product, and forwards through casts and dropout to the product with the values.
Each piece maps to one argument of the fused call:

- `q @ k.transpose(-2, -1)` (also `matmul`, `bmm`, `baddbmm`, an `einsum` in any layout) gives `q` and `k`,
  transposed or permuted into (batch..., sequence, head dim); any other right operand `kt` gives
  `kt.transpose(-2, -1)`, which is the same key;
- every `* s` and `/ d`, on the scores or on `q`/`k`, multiplies into `scale=`; no scale at all is `scale=1.0`,
  since the fused call's default is 1/sqrt(head dim);
- `+ m` is `attn_mask=m` (scaled with the scores when a scale follows it); `masked_fill(c, -inf)` is
  `attn_mask=` "not c" (the fused call's boolean mask says which positions take part); `torch.where(c, scores,
  fill)` is `attn_mask=c`; a mask built from `tril`/`triu` of ones is `is_causal=True`;
- dropout on the probabilities is `dropout_p=<p> if self.training else 0.0`; float32 upcasts are dropped
  (the fused kernels accumulate in float32 themselves).

The statements that only fed the chain are deleted. Probabilities also read after the values product
(returned or stored for visualisation) give an unsafe fix that puts None there. Anything else is left alone
with the reason: a chain across functions, two masks, an input reassigned between the scores and the values.
Whatever a safe rewrite produces is proven on the model before `--fix` writes it (graphlint.fix.prove), so a
mistake here is refused, never written.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field

import libcst as cst

from graphlint.fix.rewrite import (FixSite, ImportNames, Rewrite, atom, call_parts, code_of, dead_definitions, is_namespace,
                                   laid_out, names_read, one_line)
from graphlint.fix.source import (all_nodes, all_parameters, assigned_names, binding_names, block_of, bound_arguments,
                                  calls_function, calls_in, class_of, deletes, functions_in, import_bindings,
                                  indent_of, inside, is_target, keeps_a_tensor, local_assignments, mutated_in_place,
                                  path_to, plain_assignment, plain_name_assignment, presence_test, redefinition,
                                  root_name, self_assignments, statements_of, substituted)
from graphlint.ops import CAST, MATMUL_LIKE
from graphlint.results import UNSAFE

_BUILTINS = frozenset(dir(builtins))
# The rule's op vocabulary (graphlint.ops), as the calls appear in the source: a cast, or `contiguous`, which
# changes only the layout; the two-operand products (`baddbmm`, `addmm` and `einsum` are read on their own).
_CASTS = CAST | {"contiguous"}
_MATMULS = MATMUL_LIKE - {"baddbmm", "einsum", "rmatmul"}
_NEG_INF = ('float("-inf")', "float('-inf')", '-float("inf")', "-float('inf')", "-math.inf", "-torch.inf",
            "float(\"-Inf\")", "-np.inf", "-numpy.inf")


class _Refused(Exception):
    """The chain cannot be rewritten exactly; the message says why, in the user's terms."""


@dataclass
class _Inlined:
    """A helper the scores pass through (`s = self.scores(q, k)`, `s = apply_mask(s, m)`), read as if its body
    were written at the call: its parameters stand for what the call passes."""

    function: cst.FunctionDef
    args: dict[str, cst.BaseExpression]  # parameter → the caller's expression (a default when not passed)
    call_statement: cst.BaseStatement  # the caller's statement that calls it
    block: tuple  # the helper's statements
    module: cst.Module  # the file the helper is in: its other names are that module's globals


@dataclass
class _Chain:
    q: cst.BaseExpression | None = None
    k: cst.BaseExpression | None = None
    v: cst.BaseExpression | None = None
    factors: list[cst.BaseExpression] = field(default_factory=list)  # multiplied into the scale
    divisors: list[cst.BaseExpression] = field(default_factory=list)
    mask: cst.BaseExpression | None = None  # additive (float) or boolean "take part" mask
    mask_source: cst.BaseExpression | None = None  # the user's mask expression, for the causal test
    keep_when_true: bool = True  # the polarity of `mask_source`
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


def rewrite_attention(site: FixSite, rank: int | None = None, default_scale: bool = False) -> Rewrite | str:
    """The fused call in place of the product with the values, and the chain's statements deleted.

    The rule hands over what it matched in the graph as the site's roles (the products, the steps between them,
    other uses of the probabilities), the rank of the scores (so that `k.transpose(2, 3)` of a 4-d key is
    read as the transpose of its last two dimensions) and whether the numbers the graph scaled them by came to
    the fused call's default (so that `scale=self.scale` holding 1/sqrt(head dim) is left out)."""
    try:
        return _Rewriter(site, rank, default_scale).rewrite()
    except _Refused as why:
        return str(why)


def use_sdpa_in_transformers(site: FixSite) -> Rewrite | str:
    """`attn_implementation="sdpa"` on the user's `from_config` / `from_pretrained` call."""
    node = site.node
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or \
            node.func.attr.value not in ("from_config", "from_pretrained", "_from_config"):
        return ('the model is not built here by from_config or from_pretrained; build it with '
                'attn_implementation="sdpa"')
    value = cst.SimpleString('"sdpa"')
    args = list(node.args)
    for index, argument in enumerate(args):
        if argument.keyword is not None and argument.keyword.value == "attn_implementation":
            args[index] = argument.with_changes(value=value)
            break
    else:
        if any(a.star == "**" for a in args):
            return "the call passes **kwargs, which may already set attn_implementation"
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(value=value, keyword=cst.Name("attn_implementation"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
    new = node.with_changes(args=args)
    return Rewrite(node, new, 'attn_implementation="sdpa"')


class _Rewriter:
    def __init__(self, site: FixSite, rank: int | None, default_scale: bool = False) -> None:
        if site.function is None:
            raise _Refused("the attention is not inside a function")
        self.site = site
        self.names = site.imports
        self.dropout_after = bool(site.role("probabilities dropout"))  # the graph saw dropout on them
        self.rank = rank
        self.default_scale = default_scale
        self.guarded: cst.If | None = None  # the `if` whose body the backward walk is in
        self.guard_if: cst.If | None = None  # an `if` that prepares the mask before masking the scores
        self.order: list[int] = list(range(rank)) if rank else []  # the probabilities' dimensions, as permuted
        self.setup: list[cst.BaseStatement] = []  # the statements it runs before the masking one
        self.chain = _Chain()
        # Where the fused call goes: the softmax's function, or the caller of a softmax helper.
        self.function, self.classdef, self.module, self.indent = site.function, site.classdef, site.module, site.indent
        self.softmax: cst.CSTNode = site.node
        self.start: tuple[cst.BaseExpression, cst.BaseStatement] | None = None  # the softmax's input in a helper
        self.scopes: list[_Inlined] = []  # the helpers the backward walk is inside, innermost last
        self.at: cst.BaseStatement | None = None  # the statement of the anchor function the walk reads
        self.reads: list[tuple[set[str], cst.BaseStatement]] = []  # the names each part reads, and where
        self.modules = tuple(dict.fromkeys((site.module, *(r.module for r in site.roles))))
        self.block, self.softmax_statement = self._block_of(site.function, site.node)
        self._anchor_at_the_values()

    def rewrite(self) -> Rewrite:
        chain = self.chain
        scores, statement = self.start or (self._softmax_input(self.softmax), self.softmax_statement)
        self._scores(scores, statement)
        self._probabilities(self.softmax, self.softmax_statement)
        self._inline_setup()
        self._fold_prescaled()
        self._check_matches_the_graph()
        self._check_names()
        self._check_inputs_unchanged()
        callee, imports = self.names.functional_call("scaled_dot_product_attention")
        call = self._call(callee)
        removed = tuple(s for s in dict.fromkeys(chain.consumed) if s is not chain.values_statement)
        # What only the deleted statements read goes too (`d_k = q.size(-1)` of a scale left out).
        removed += tuple(s for s in dead_definitions(self.function, (*removed, chain.values_product), call)
                         if s not in removed)
        if chain.elsewhere:
            # The documented trade: the weights are no longer computed, so what read them gets None.
            shown = ", ".join(dict.fromkeys(f"`{code_of(n)}`" for n in chain.elsewhere))
            return Rewrite(chain.values_product, call,
                           f"hand-written attention → {callee}(...); {shown} returned or stored as None",
                           removed=removed, imports=imports,
                           also=(*chain.renamed, *((n, cst.Name("None")) for n in chain.elsewhere)), applicability=UNSAFE)
        return Rewrite(chain.values_product, call, f"hand-written attention → {callee}(...)", removed=removed,
                       imports=imports, also=tuple(chain.renamed))

    # -- backwards: softmax input to the scores product --------------------------------------------------

    def _anchor_at_the_values(self) -> None:
        """A helper that returns the probabilities (`def _softmax(self, x): return F.softmax(x.float(), -1)`, or
        one that also makes and masks the scores) and a caller that multiplies them with the values: the
        rewrite happens in the caller, at the helper's call, and the helper is read as if written there."""
        values = self.site.role("values")
        if not values or values[0].function is None or values[0].function is self.function:
            return
        helper, caller = self.function, values[0].function
        body = statements_of(helper)
        if self.softmax_statement not in body:
            raise _Refused(f"the softmax is inside a block of `{helper.name.value}`; the attention chain spans "
                           "several functions")
        self._returned_from(helper, body)
        modules = ImportNames.of(values[0].module).modules
        calls = [c for c in calls_in(caller) if calls_function(c, helper, modules)]
        if len(calls) != 1:
            raise _Refused(f"`{caller.name.value}` calls `{helper.name.value}` {len(calls)} times")
        call = calls[0]
        args = bound_arguments(helper, call)
        if args is None:
            raise _Refused(f"the call of `{helper.name.value}` passes arguments graphlint cannot match to its parameters")
        module = values[0].module
        block, statement = self._block_of(caller, call)
        self.start = (self._softmax_input(self.softmax), self.softmax_statement)
        self.scopes = [_Inlined(helper, args, statement, tuple(body), self.module)]
        self.function, self.module, self.softmax = caller, module, call
        self.classdef = class_of(module, caller)
        self.block, self.softmax_statement = block, statement
        self.names = ImportNames.of(module)
        self.indent = indent_of(module, statement)

    def _returned_from(self, helper: cst.FunctionDef, body: list[cst.BaseStatement]) -> None:
        """The helper hands back the softmax's result as it is: through casts and plain variables to its one
        `return`, read nowhere else (a `del` aside)."""
        why = f"`{helper.name.value}` does more with the probabilities than return them"
        current, statement, walked, names = self.softmax, self.softmax_statement, [], set()
        while True:
            walked.append(statement)
            path = path_to(statement, current) or []
            parent = path[-2] if len(path) >= 2 else None
            if isinstance(parent, cst.Attribute) and len(path) >= 3 and isinstance(path[-3], cst.Call) and \
                    call_parts(path[-3])[0] in _CASTS:
                current = path[-3]
                continue
            if isinstance(parent, cst.Return):
                break
            if not isinstance(parent, cst.Assign) or not plain_name_assignment(statement):
                raise _Refused(why)
            name = parent.targets[0].target.value
            names.add(name)
            later = [s for s in body[body.index(statement) + 1:] if name in {n.value for n in names_read(s)}
                     and not deletes(s)]
            if not later:
                raise _Refused(why)
            statement = later[0]
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
                else None
            value = getattr(small, "value", None) if isinstance(small, (cst.Assign, cst.Return)) else None
            current = next((n for n in names_read(value) if n.value == name), None) if value is not None else None
            if current is None:
                raise _Refused(why)
        if statement is not body[-1] or any(isinstance(n, cst.Return) for s in body[:-1] for n in all_nodes(s)):
            raise _Refused(why)
        for s in body:
            if s not in walked and not deletes(s) and names & {n.value for n in names_read(s)}:
                raise _Refused(why)

    @staticmethod
    def _block_of(function: cst.FunctionDef, node: cst.CSTNode) -> tuple[tuple, cst.SimpleStatementLine]:
        try:
            return block_of(function, node)
        except ValueError:
            raise _Refused("the softmax is not in a plain statement of the function") from None

    def _softmax_input(self, call: cst.CSTNode) -> cst.BaseExpression:
        if not isinstance(call, cst.Call):
            raise _Refused("the softmax is not a call graphlint can rewrite")
        func = call.func
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if isinstance(func, cst.Attribute) and not is_namespace(func.value, self.names):
            if re.fullmatch(r"self(\.\w+)*", code_of(func.value)):  # `self.softmax(x)`, not `self.f(q).softmax(-1)`
                if len(positional) != 1:
                    raise _Refused("the softmax module is called with more than the scores")
                return positional[0]
            return func.value  # scores.softmax(-1)
        if not positional:
            raise _Refused("the softmax's input is passed by keyword")
        return positional[0]  # F.softmax(scores, dim=-1), torch.softmax(scores, -1)

    def _scores(self, expression: cst.BaseExpression, statement: cst.SimpleStatementLine) -> None:
        """Walk back from the softmax's input to the scores product, collecting scale and mask."""
        chain = self.chain
        node = expression
        scaled = False  # met a scale on the way back: it runs after anything met from here on
        while True:
            self.at = self.scopes[0].call_statement if self.scopes else statement
            if isinstance(node, cst.Name):
                if self.guarded is not None and chain.mask is None:
                    raise _Refused(f"`if {code_of(self.guarded.test)}:` does more to the scores than mask them")
                self.guarded = None
                if self.scopes and self._parameter(node.value, statement):
                    scope = self.scopes.pop()  # back in the caller, at what it passed
                    node, statement = scope.args[node.value], scope.call_statement
                    continue
                # A mask under an `if`: the first one met, or an earlier additive one that adds to a later one.
                assigned = self._definition(node.value, statement, guarded=self.guard_if is None)
                if not self.scopes:  # a helper's own statements stay: other callers may need them
                    chain.consumed.append(assigned)
                    chain.names.add(node.value)
                    chain.scores_names.add(node.value)
                statement = assigned
                upcast = _upcast_only(assigned, node.value)
                if upcast is not None:  # `if self.upcast: s = s.float()`: the fused kernels accumulate in float32
                    node = upcast
                    continue
                if isinstance(assigned, cst.If):
                    self.guarded = assigned
                    if chain.mask is None:
                        chain.guard = self._here(assigned.test)
                    *setup, masking = assigned.body.body
                    if setup and chain.mask is not None:
                        raise _Refused(f"`if {code_of(assigned.test)}:` computes more than a second mask")
                    if setup and self.scopes:
                        raise _Refused(f"`{self.scopes[-1].function.name.value}` prepares the mask under "
                                       f"`if {code_of(assigned.test)}:`; graphlint rewrites such a guard only where "
                                       "the fused call goes")
                    if setup:  # `if mask is not None: m = mask[:, None]; s = s + m`: the setup stays for now
                        self.guard_if, self.setup = assigned, list(setup)
                        chain.consumed[-1] = masking
                    node = redefinition(masking, node.value)
                else:
                    node = redefinition(assigned, node.value)
                continue
            if isinstance(node, cst.BinaryOperation):
                operator = node.operator
                if isinstance(operator, cst.MatrixMultiply):
                    chain.scores_product = node
                    self._product(node.left, node.right)
                    return
                if isinstance(operator, cst.Divide):
                    scaled = self._scaled()
                    chain.divisors.append(self._here(node.right))
                    node = node.left
                    continue
                if isinstance(operator, cst.Multiply):
                    scaled = self._scaled()
                    tensor, factor = _split_scale(node)
                    chain.factors.append(self._here(factor))
                    node = tensor
                    continue
                if isinstance(operator, cst.Add):
                    tensor, mask = self._chain_side(node.left, node.right, statement)
                    self._set_mask(mask, True, additive=True, scaled=scaled)
                    node = tensor
                    continue
                raise _Refused(f"the scores pass through `{code_of(node)}`, which the fused call cannot express")
            if isinstance(node, cst.Call):
                name, receiver, positional, keywords = call_parts(node)
                if name in _CASTS and receiver is not None and not is_namespace(receiver, self.names):
                    chain.scores_cast |= statement is not self.softmax_statement  # a variable holds the cast
                    node = receiver
                    continue
                if name == "masked_fill":
                    target, args = (receiver, positional) if receiver is not None and not is_namespace(receiver, self.names) \
                        else (positional[0] if positional else None, positional[1:])
                    condition = args[0] if args else keywords.get("mask")
                    fill = args[1] if len(args) > 1 else keywords.get("value")
                    if target is None or condition is None or fill is None:
                        raise _Refused("masked_fill's arguments could not be read")
                    if not _very_negative(self._fill(fill), self.names):
                        raise _Refused(f"masked_fill fills with {code_of(fill)}, not with -inf or the dtype's minimum")
                    self._set_mask(condition, False)
                    node = target
                    continue
                if name == "where" and len(positional) == 3:
                    condition, when_true, when_false = positional
                    if _very_negative(self._fill(when_false), self.names):
                        self._set_mask(condition, True)
                        node = when_true
                    elif _very_negative(self._fill(when_true), self.names):
                        self._set_mask(condition, False)
                        node = when_false
                    else:
                        raise _Refused("torch.where does not fill with -inf or the dtype's minimum")
                    continue
                if name in ("mul", "div") and receiver is not None and not is_namespace(receiver, self.names) and \
                        len(positional) == 1:
                    scaled = self._scaled()
                    (chain.factors if name == "mul" else chain.divisors).append(self._here(positional[0]))
                    node = receiver
                    continue
                if name in _MATMULS:
                    left, right = _operands(receiver, positional, self.names)
                    chain.scores_product = node
                    self._product(left, right)
                    return
                if name == "einsum":
                    chain.scores_product = node
                    self._einsum_scores(positional)
                    return
                if name in ("baddbmm", "addmm") and is_namespace(receiver, self.names) and len(positional) == 3:
                    chain.scores_product = node
                    self._baddbmm(positional, keywords, scaled)
                    return
                inlined = self._inlined(node, statement)
                if inlined is not None:
                    self.scopes.append(inlined)
                    statement = inlined.block[-1]
                    node = statement.body[0].value
                    continue
            raise _Refused(f"the scores pass through `{code_of(node)}`, which the fused call cannot express")

    def _inlined(self, call: cst.Call, statement: cst.BaseStatement) -> _Inlined | None:
        """The helper of this project that `call` runs (`self.scores(q, k)`, `apply_mask(s, m)`), when its body is
        plain statements ending in one `return`; None for anything else."""
        name, receiver, _, _ = call_parts(call)
        module_alias = receiver is not None and code_of(receiver) in ImportNames.of(self.module).modules
        if name is None or (receiver is not None and code_of(receiver) != "self" and not module_alias):
            return None
        here = self.scopes[-1].module if self.scopes else self.module
        if receiver is not None and not module_alias:
            owner = class_of(here, self.scopes[-1].function) if self.scopes else self.classdef
            found = [(here, f) for f in functions_in(owner) if f.name.value == name] if owner is not None else []
        else:
            found = [(m, f) for m in self.modules if m is not None for f in functions_in(m) if f.name.value == name]
        if len(found) != 1:
            return None
        module, function = found[0]
        body = statements_of(function)
        last = body[-1] if body else None
        if not isinstance(last, cst.SimpleStatementLine) or len(last.body) != 1 or not isinstance(last.body[0], cst.Return) \
                or last.body[0].value is None or any(isinstance(n, cst.Return) for s in body[:-1] for n in all_nodes(s)):
            raise _Refused(f"the scores come from `{name}`, which graphlint reads only when it ends in its one `return`")
        args = bound_arguments(function, call)
        if args is None:
            raise _Refused(f"the call of `{name}` passes arguments graphlint cannot match to its parameters")
        return _Inlined(function, args, statement, tuple(body), module)

    def _parameter(self, name: str, statement: cst.BaseStatement) -> bool:
        """`name` is a parameter of the helper the walk is in, not reassigned before `statement`."""
        scope = self.scopes[-1]
        block = list(scope.block)
        before = block[: block.index(statement)] if statement in block else block
        return name in scope.args and not any(name in assigned_names(s) for s in before)

    def _here(self, node: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """A part of the chain read inside helpers, in the terms of the function the fused call goes in: each
        helper's parameters replaced by what its caller passed."""
        if node is None:
            return None
        for depth in range(len(self.scopes) - 1, -1, -1):
            scope = self.scopes[depth]
            local = set().union(*(assigned_names(s) for s in scope.block)) if scope.block else set()
            read = {n.value for n in names_read(node)}
            inner = sorted(read & local)
            if inner:
                raise _Refused(f"`{inner[0]}` is computed inside `{scope.function.name.value}`, where the fused call "
                               "cannot read it")
            # What else the helper reads is its module's (a parameter's default too): it must mean the same there.
            defaults = {p.name.value for p in all_parameters(scope.function) if p.default is not None and
                        scope.args.get(p.name.value) is p.default}
            free = (read - set(scope.args)) | {n.value for name in read & defaults
                                               for n in names_read(scope.args[name])}
            outer = self.scopes[depth - 1] if depth else None
            self._same_names(scope, free, outer.function if outer else self.function, outer.module if outer else self.module)
            node = substituted(node, {name: value for name, value in scope.args.items() if name in read})
        self.reads.append(({n.value for n in names_read(node)}, self.at))
        return node

    @staticmethod
    def _same_names(scope: _Inlined, names: set[str], caller: cst.FunctionDef, module: cst.Module) -> None:
        """The helper's own module-level names (constants, imports) mean the same in the caller: not bound by
        the caller itself, and the caller's file the helper's or binding them by the same import."""
        shadowed = assigned_names(caller) | {p.name.value for p in all_parameters(caller)}
        for name in sorted(names):
            if name in shadowed and name != "self":
                raise _Refused(f"`{name}` in `{scope.function.name.value}` is its module's, but the caller binds "
                               "its own; the fused call there would read the caller's")
            if module is scope.module or name in _BUILTINS or name == "self":
                continue
            theirs, ours = import_bindings(scope.module), import_bindings(module)
            if name not in theirs or theirs[name] != ours.get(name):
                raise _Refused(f"`{name}` is a name of `{scope.function.name.value}`'s module, which the fused call in "
                               "the caller's file could not read as the helper does")

    def _fill(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """A fill value as written where it is made: `max_neg_value = -torch.finfo(sim.dtype).max` for the
        variable, the value of `torch.full([], value, ...)`."""
        function = self.scopes[-1].function if self.scopes else self.function
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

    def _scaled_mask(self, mask: cst.BaseExpression, scaled: bool) -> cst.BaseExpression:
        """An additive mask met before a scale on the way back is scaled with the scores: `(s + m) * c` is
        `s * c + m * c`, so `attn_mask=m * c`."""
        if not scaled:
            return mask
        chain = self.chain
        text = " / ".join([" * ".join([code_of(_operand(mask, cst.Multiply))] +
                                      [code_of(_operand(f, cst.Multiply)) for f in chain.factors])] +
                          [code_of(_operand(d, cst.Divide)) for d in chain.divisors])
        return cst.parse_expression(text)

    def _scaled(self) -> bool:
        if self.guarded is not None:
            raise _Refused(f"the scores are scaled only `if {code_of(self.guarded.test)}:`, which the fused call "
                           "cannot express")
        return True

    def _baddbmm(self, positional, keywords, scaled: bool) -> None:
        """`baddbmm(bias, q, kᵀ, beta=1, alpha=s)` (or `addmm`) is `s * q @ kᵀ + bias`: `scale=s`,
        `attn_mask=bias`; with `beta=0` the bias is ignored."""
        bias, left, right = positional
        beta = keywords.get("beta")
        if beta is not None and not _is_number(beta, (0.0, 1.0)):
            raise _Refused(f"baddbmm scales its bias by beta={code_of(beta)}, which the fused call cannot express")
        if keywords.get("alpha") is not None:
            self.chain.factors.append(self._here(keywords["alpha"]))
        if beta is None or not _is_number(beta, (0.0,)):
            self._set_mask(bias, True, additive=True, scaled=scaled)
        self._product(left, right)

    def _chain_side(self, left, right, statement) -> tuple[cst.BaseExpression, cst.BaseExpression]:
        """Of `a + b`, (the scores, the mask): the scores are the side that leads back to the product."""
        for tensor, other in ((left, right), (right, left)):
            if self._leads_to_product(tensor, statement):
                return tensor, other
        raise _Refused("neither side of the addition leads back to the scores product")

    def _leads_to_product(self, node, statement, depth: int = 0) -> bool:
        if depth > 12:
            return False
        if isinstance(node, cst.Name):
            try:
                assigned = self._definition(node.value, statement, guarded=True)
            except _Refused:
                return False
            value = redefinition(assigned.body.body[-1] if isinstance(assigned, cst.If) else assigned, node.value)
            return value is not None and self._leads_to_product(value, assigned, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            return isinstance(node.operator, cst.MatrixMultiply) or any(
                self._leads_to_product(n, statement, depth + 1) for n in (node.left, node.right))
        if isinstance(node, cst.Call):
            name, receiver, positional, _ = call_parts(node)
            if name in _MATMULS or name == "einsum":
                return True
            try:
                if self._inlined(node, statement) is not None:
                    return True  # a helper of the project's: the walk reads it
            except _Refused:
                return False
            candidates = ([receiver] if receiver is not None and not is_namespace(receiver, self.names) else []) + positional
            return any(self._leads_to_product(n, statement, depth + 1) for n in candidates)
        return False

    def _product(self, left: cst.BaseExpression, right: cst.BaseExpression) -> None:
        chain = self.chain
        chain.q = self._here(self._peel_scale(left))
        key = self._here(self._peel_scale(right))
        untransposed = _untransposed(key, self.rank)
        if untransposed is None and isinstance(key, cst.Name):
            untransposed = self._transposed_variable(key)
        chain.k = untransposed if untransposed is not None else _transpose(key)

    def _transposed_variable(self, key: cst.Name) -> cst.BaseExpression | None:
        """`k` for `kt` made by `kt = k.transpose(2, 3)` in this block and read nowhere else; the statement goes."""
        try:
            statement = self._definition(key.value, self.softmax_statement)
        except _Refused:
            return None
        untransposed = _untransposed(redefinition(statement, key.value), self.rank)
        reads = [n for n in names_read(self.function) if n.value == key.value]
        if untransposed is None or len(reads) != 2:  # the assignment and the product
            return None
        self.chain.consumed.append(statement)
        self.chain.names.add(key.value)
        return untransposed

    def _peel_scale(self, operand: cst.BaseExpression) -> cst.BaseExpression:
        """`q * s` or `q / d` as an operand of the product, also under a reshape (`(q * s).view(...)`): the
        scale moves into `scale=`."""
        name, receiver, _, _ = call_parts(operand)
        if name in ("view", "reshape") and isinstance(receiver, cst.BinaryOperation) and \
                isinstance(receiver.operator, (cst.Multiply, cst.Divide)):
            # The product was a fresh contiguous tensor; its input may not be, so `view` becomes `reshape`.
            return operand.with_changes(func=operand.func.with_changes(
                value=atom(self._peel_scale(receiver.with_changes(lpar=[], rpar=[]))), attr=cst.Name("reshape")))
        while isinstance(operand, cst.BinaryOperation) and isinstance(operand.operator, (cst.Multiply, cst.Divide)):
            if isinstance(operand.operator, cst.Divide):
                self.chain.divisors.append(self._here(operand.right))
                operand = operand.left
            else:
                operand, factor = _split_scale(operand)
                self.chain.factors.append(self._here(factor))
        return operand

    def _einsum_scores(self, positional: list[cst.BaseExpression]) -> None:
        """Any layout of `q·k` over one shared dimension, the scores ending in (query, key): q and k are
        transposed or permuted into the fused call's (batch..., sequence, head dim)."""
        spec = _einsum_spec(positional)
        why = "the scores einsum does not contract one dimension of q and k into scores ending in (query, key)"
        if spec is None:
            raise _Refused(why)
        (a, b), out = spec
        shared = [c for c in a if c in b and c not in out]
        if len(out) < 2 or len(shared) != 1 or len(a) != len(out) or len(b) != len(out):
            raise _Refused(why)
        batch, i, j, d = out[:-2], out[-2], out[-1], shared[0]
        if set(a) != set(batch + i + d) or set(b) != set(batch + j + d):
            raise _Refused(why)
        self.chain.q = self._here(_to_layout(self._peel_scale(positional[1]), a, batch + i + d))
        self.chain.k = self._here(_to_layout(self._peel_scale(positional[2]), b, batch + j + d))

    # -- forwards: softmax output to the product with the values ------------------------------------------

    def _probabilities(self, softmax: cst.CSTNode, statement: cst.SimpleStatementLine) -> None:
        chain = self.chain
        current = softmax
        while True:
            path = path_to(statement, current)
            if path is None or len(path) < 2:
                raise _Refused("the softmax's result could not be followed")
            parent = path[-2]
            if isinstance(parent, cst.Assign):
                if len(parent.targets) != 1 or not isinstance(parent.targets[0].target, cst.Name) or \
                        len(statement.body) != 1:
                    raise _Refused("the probabilities are assigned to more than one plain variable")
                name = parent.targets[0].target.value
                chain.consumed.append(statement)
                chain.names.add(name)
                statement, current = self._next_use(name, statement)
                continue
            if isinstance(parent, cst.Arg):
                parent = path[-3]
            if isinstance(parent, cst.Attribute) and len(path) >= 3 and isinstance(path[-3], cst.Call):
                call = path[-3]  # current.to(dtype), current.matmul(v)
                name, _, positional, _ = call_parts(call)
                if name in _CASTS:
                    current = call
                    continue
                if name in ("transpose", "swapaxes", "permute", "t"):
                    self._permuted(name, positional)
                    current = call
                    continue
                if name in _MATMULS and len(positional) == 1:
                    self._values(call, positional[0], statement)
                    return
                raise _Refused(f"the probabilities pass through `.{name}()`, which the fused call cannot express")
            if isinstance(parent, cst.Attribute) and parent.attr.value in ("mT", "T"):
                self._permuted("t" if parent.attr.value == "T" else "mT", [])
                current = parent
                continue
            if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.MatrixMultiply):
                if parent.left is current:
                    self._values(parent, parent.right, statement)
                else:
                    self._values(parent, parent.left, statement, probabilities_first=False)
                return
            if isinstance(parent, cst.Call):
                name, receiver, positional, keywords = call_parts(parent)
                if name in _MATMULS and receiver is not None and is_namespace(receiver, self.names) and \
                        len(positional) == 2 and current in positional:
                    first = positional[0] is current
                    self._values(parent, positional[1] if first else positional[0], statement, probabilities_first=first)
                    return
                if name in _MATMULS and receiver is not None and len(positional) == 1 and positional[0] is current:
                    self._values(parent, receiver, statement, probabilities_first=False)  # v.matmul(p)
                    return
                if name == "einsum" and len(positional) == 3 and current in positional[1:]:
                    self._einsum_values(parent, positional, statement, current)
                    return
                if name == "dropout" and receiver is not None and is_namespace(receiver, self.names) and positional and \
                        positional[0] is current:
                    self._functional_dropout(positional, keywords)
                    current = parent
                    continue
                if receiver is not None and (code_of(receiver) == "self" or code_of(receiver).startswith("self.")) and \
                        len(positional) == 1 and positional[0] is current and self.dropout_after:
                    self._set_dropout(cst.parse_expression(f"{code_of(parent.func)}.p"), True)
                    current = parent
                    continue
                if receiver is None and self._is_module(parent.func) and len(positional) == 1 and \
                        positional[0] is current and self.dropout_after:  # a dropout module passed in
                    callee = code_of(parent.func)
                    self._set_dropout(cst.parse_expression(f"{callee}.p if {callee}.training else 0.0"), False)
                    current = parent
                    continue
            raise _Refused(f"the probabilities pass through `{code_of(parent)}`, which the fused call cannot express")

    def _permuted(self, name: str, positional: list[cst.BaseExpression]) -> None:
        """The probabilities transposed or permuted on their way to the values product: the order of their
        dimensions is followed, so that `v @ p.transpose(-2, -1)` can be read as the transpose of `p @ vᵀ`."""
        rank = self.rank
        if rank is None:
            raise _Refused(f"the probabilities pass through `.{name}()` and their rank is not known")
        try:
            dims = [int(code_of(a)) for a in positional]
            if len(positional) == 1 and isinstance(positional[0], (cst.Tuple, cst.List)):
                dims = [int(code_of(e.value)) for e in positional[0].elements]
        except ValueError:
            raise _Refused(f"the probabilities are permuted by `{', '.join(code_of(a) for a in positional)}`, "
                           "which graphlint cannot read") from None
        order = self.order
        if name in ("t", "mT"):
            if name == "t" and rank != 2:
                raise _Refused("the probabilities pass through `.t()` of more than two dimensions")
            dims = [rank - 2, rank - 1]
            name = "transpose"
        if name in ("transpose", "swapaxes") and len(dims) == 2:
            a, b = (d % rank for d in dims)
            order[a], order[b] = order[b], order[a]
        elif name == "permute" and sorted(d % rank for d in dims) == list(range(rank)):
            self.order = [order[d % rank] for d in dims]
        else:
            raise _Refused(f"the probabilities pass through `.{name}()`, which the fused call cannot express")

    def _values(self, product: cst.BaseExpression, values: cst.BaseExpression,
                statement: cst.SimpleStatementLine, probabilities_first: bool = True) -> None:
        """`p @ v` as it is; `v @ pᵀ` (the probabilities transposed, on the right) as the transpose of
        `p @ vᵀ`; any other order of the probabilities' dimensions contracts something else than the keys."""
        rank = self.rank or 2
        natural, swapped = list(range(rank)), list(range(rank - 2)) + [rank - 1, rank - 2]
        if probabilities_first and self.order not in ([], natural):
            raise _Refused("the probabilities are permuted before the values product, which then does not "
                           "contract the keys")
        if not probabilities_first:
            if self.order != swapped:
                raise _Refused("the values product takes the probabilities on the right without transposing "
                               "them, which does not contract the keys")
            values = _untransposed(values, rank) or _transpose(values)
            self.chain.out_layout = ("xy", "yx")
        self.chain.v = values
        self.chain.values_product = product
        self.chain.values_statement = statement

    def _einsum_values(self, product: cst.Call, positional, statement, probabilities: cst.CSTNode) -> None:
        """`einsum(p, v)` over the key dimension in any layout: v is brought to (batch..., key, value dim) and
        the fused call's (batch..., query, value dim) to the einsum's output layout."""
        spec = _einsum_spec(positional)
        why = "the values einsum does not contract the probabilities' key dimension with the values"
        if spec is None:
            raise _Refused(why)
        (p, v), out = spec
        values = positional[2]
        if positional[2] is probabilities:
            (v, p), values = (p, v), positional[1]  # einsum(v, p)
        if self.order and self.order != list(range(len(p))):
            if len(self.order) != len(p):
                raise _Refused(why)
            p = "".join(p[self.order.index(d)] for d in range(len(p)))  # the letters of p's own dimensions
        batch, i, j = p[:-2], p[-2], p[-1]
        rest = [c for c in v if c not in p]
        if len(rest) != 1 or len(v) != len(p) or len(out) != len(p) or set(v) != set(batch + j + rest[0]) or \
                set(out) != set(batch + i + rest[0]):
            raise _Refused(why)
        self.chain.v, self.chain.values_product, self.chain.values_statement = \
            _to_layout(values, v, batch + j + rest[0]), product, statement
        self.chain.out_layout = (batch + i + rest[0], out)

    def _guarded_dropout(self, statement: cst.If, name: str) -> bool:
        """`if dropout is not None: p = dropout(p)` (or under any flag), with `dropout` a module: its `p` while
        it trains and the guard holds."""
        body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
        if statement.orelse is not None or len(body) != 1 or not plain_assignment(body[0], name):
            return False
        call = body[0].body[0].value
        module = call.func if isinstance(call, cst.Call) else None
        if module is None or not self._is_module(module) or len(call.args) != 1 or \
                code_of(call.args[0].value) != name:
            return False
        test, callee = code_of(statement.test), code_of(module)
        if test.replace(" ", "") != f"{callee}isnotNone" and not self.dropout_after:
            return False
        self._set_dropout(cst.parse_expression(f"{callee}.p if {test} and {callee}.training else 0.0"), False)
        return True

    def _is_module(self, func: cst.BaseExpression) -> bool:
        """`self.drop` or a parameter of the function (`dropout` passed in): a module that is called."""
        if isinstance(func, cst.Attribute):
            return code_of(func.value) == "self"
        return isinstance(func, cst.Name) and func.value in {p.name.value for p in self.function.params.params}

    def _functional_dropout(self, positional, keywords) -> None:
        p = positional[1] if len(positional) > 1 else keywords.get("p", cst.Float("0.5"))
        training = positional[2] if len(positional) > 2 else keywords.get("training")
        if training is None:
            self._set_dropout(p, False)  # F.dropout trains by default
        elif code_of(training) == "self.training":
            self._set_dropout(p, True)
        elif code_of(training) == "True":
            self._set_dropout(p, False)
        elif code_of(training) != "False":  # `training=module.training`, a flag passed in
            self._set_dropout(cst.parse_expression(f"{code_of(atom(p))} if {code_of(training)} else 0.0"), False)

    def _set_dropout(self, p: cst.BaseExpression, training_only: bool) -> None:
        if self.chain.dropout_p is not None:
            raise _Refused("the probabilities pass through two dropouts")
        self.chain.dropout_p, self.chain.dropout_in_training_only = p, training_only

    # -- masks ----------------------------------------------------------------------------------------------

    def _set_mask(self, mask, keep_when_true: bool, additive: bool = False, scaled: bool = False) -> None:
        """The one mask: `mask` is the user's expression, added (`additive`, scaled with the scores when a scale
        follows it) or saying which positions take part (`keep_when_true`) or are filled."""
        chain = self.chain
        if chain.mask is not None:
            self._add_mask(mask, additive, scaled)
            return
        mask = self._here(mask)
        if additive:
            chain.mask, chain.mask_source = self._scaled_mask(mask, scaled), None
        else:
            chain.mask, chain.mask_source = mask if keep_when_true else _negated(mask), mask
        chain.keep_when_true = keep_when_true

    def _add_mask(self, mask, additive: bool, scaled: bool) -> None:
        """A second additive mask met on the way back (`s = s + bias`, later `s = s + mask`): the fused call
        takes their sum, with the condition either is added under (`bias + mask if g else bias`)."""
        chain = self.chain
        if not additive or chain.mask_source is not None:
            raise _Refused("the scores are masked twice; the fused call takes one mask")
        earlier_guard = self._here(self.guarded.test) if self.guarded is not None else None
        if earlier_guard is not None and chain.guard is not None:
            raise _Refused("the scores take two masks under two conditions; the fused call takes one mask")
        earlier = self._scaled_mask(self._here(mask), scaled)
        later = chain.mask
        total = f"{_summand(earlier)} + {_summand(later)}"
        if chain.guard is not None:
            total = f"{total} if {code_of(chain.guard)} else {code_of(earlier)}"
        elif earlier_guard is not None:
            total = f"{total} if {code_of(earlier_guard)} else {code_of(later)}"
        chain.mask, chain.guard = cst.parse_expression(total), None

    def _causal(self) -> bool:
        """The mask keeps exactly the lower triangle, diagonal included: `tril(ones)`, or `triu(ones, 1)` as
        the positions to drop, directly or through a buffer or a local variable, sliced to the sequence."""
        chain = self.chain
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
        built = self._built_from(node)
        if built is None:
            return False
        text = code_of(built).replace(" ", "")
        root = root_name(built)
        if root is not None and "tril(" not in text and "triu(" not in text and self.classdef is not None:
            made = local_assignments(self.classdef, root)  # `causal = torch.tril(...)`, then the buffer
            if len(made) == 1:
                text += code_of(made[0]).replace(" ", "")
        if "ones" not in text:
            return False
        if "tril(" in text and "diagonal" not in text and text.count("tril(") == 1:
            return keep
        if "triu(" in text and ("diagonal=1" in text or ",1)" in text or ".triu(1)" in text):
            return not keep
        return False

    def _built_from(self, node) -> cst.BaseExpression | None:
        """The expression a mask variable or buffer was made from, when it is made once."""
        if isinstance(node, cst.Name):
            try:
                return redefinition(self._definition(node.value, self.softmax_statement), node.value)
            except _Refused:
                return None
        if isinstance(node, cst.Attribute) and code_of(node.value) == "self" and self.classdef is not None:
            found = self_assignments(self.classdef, node.attr.value)
            return found[0] if len(found) == 1 else None
        return node if isinstance(node, cst.Call) else None  # made where it is used

    # -- checks and the call ----------------------------------------------------------------------------

    def _definition(self, name: str, before: cst.BaseStatement, guarded: bool = False) -> cst.BaseStatement:
        """The statement of this block that last assigned `name` (a plain `name = ...`) before `before`; with
        `guarded`, also an `if test:` without else whose body is one `name = ...` (a mask under a flag)."""
        body = list(self.scopes[-1].block if self.scopes else self.block)
        if before not in body:
            raise _Refused(f"`{name}` is not computed in the same block as the attention")
        for statement in reversed(body[: body.index(before)]):
            if name in assigned_names(statement) or mutated_in_place(statement, name):
                if redefinition(statement, name) is not None:
                    return statement
                if guarded and isinstance(statement, cst.If) and statement.orelse is None and \
                        isinstance(statement.body, cst.IndentedBlock) and statement.body.body and \
                        all(name not in assigned_names(s) and not mutated_in_place(s, name)
                            for s in statement.body.body[:-1]) and \
                        redefinition(statement.body.body[-1], name) is not None:
                    return statement
                raise _Refused(f"`{name}` is {_how_assigned(statement, name)}, which the rewrite cannot follow")
        if name in self.names.namespaces:
            raise _Refused(f"`{name}` is a module, not the scores; graphlint could not read this call")
        function = self.scopes[-1].function if self.scopes else self.function
        if name in assigned_names(function):
            raise _Refused(f"`{name}` is computed outside the block the softmax is in (a branch or loop); the fused "
                           "call would have to replace the whole statement")
        raise _Refused(f"`{name}` comes from outside the function; the attention chain spans several functions")

    def _next_use(self, name: str, after: cst.SimpleStatementLine) -> tuple[cst.SimpleStatementLine, cst.Name]:
        body = list(self.block)
        for statement in body[body.index(after) + 1:]:
            uses = [n for n in names_read(statement) if n.value == name]
            if not uses:
                continue
            if isinstance(statement, cst.If) and self._guarded_dropout(statement, name):
                self.chain.consumed.append(statement)
                continue
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                raise _Refused(f"`{name}` is used in a compound statement; the rewrite keeps to plain ones")
            targets = assigned_names(statement)
            reads = [n for n in uses if not (n.value in targets and is_target(statement, n))]
            if not reads:
                raise _Refused(f"`{name}` is reassigned before it reaches the values product")
            return statement, reads[0]  # the first read; any other is checked with the chain's names
        raise _Refused(f"the probabilities `{name}` never reach a product with the values in this block")

    def _fold_prescaled(self) -> None:
        """`q = q * self.scale` on its own line before the scores, with nothing else reading the scaled `q`: the
        factor moves into `scale=` and the statement goes (the fused call scales the scores itself)."""
        chain = self.chain
        if self.scopes or chain.values_statement is None:
            return
        body = list(self.block)
        first = min((body.index(s) for s in chain.consumed if s in body), default=None)
        for part in ("q", "k"):
            name = getattr(chain, part)
            if not isinstance(name, cst.Name) or first is None:
                continue
            try:
                statement = self._definition(name.value, body[first])
            except _Refused:
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
            self.reads.append(({n.value for n in names_read(factor)}, statement))
            chain.consumed.append(statement)

    def _check_matches_the_graph(self) -> None:
        """The products the source's chain leads to are the ones the rule matched in the graph: the rewrite is
        built from the match, and a reading of the source that strays from it is refused, never written."""
        chain = self.chain
        for role, found in (("scores", chain.scores_product), ("values", chain.values_product)):
            matched = self.site.role(role)
            if not matched or found is None:
                continue
            node = matched[0].node
            if node is not found and path_to(found, node) is None and path_to(node, found) is None:
                raise _Refused(f"the source leads to another {role} product (`{code_of(found).strip()}`) than the one "
                               f"the graph ran (`{code_of(node).strip()}`)")

    def _inline_setup(self) -> None:
        """A guard that prepares the mask (`if mask is not None: m = mask[:, None]; s = s + m`): a variable made
        only for the mask is written into `attn_mask=` and its statement goes; what is left stays in the `if`,
        which must then still mean the same after it ran (it tests whether a mask was given)."""
        chain = self.chain
        if self.guard_if is None:
            return
        masking = self.guard_if.body.body[-1]
        for statement in reversed(list(self.setup)):
            if not plain_name_assignment(statement) or chain.mask is None:
                continue
            name, value = statement.body[0].targets[0].target.value, statement.body[0].value
            reads = [n for n in names_read(self.function) if n.value == name and not inside(n, statement)]
            later = self.setup[self.setup.index(statement) + 1:]
            if not reads or any(not inside(n, masking) for n in reads) or name in {n.value for n in names_read(value)} or \
                    {n.value for n in names_read(value)} & set().union(set(), *(assigned_names(s) for s in later)):
                continue
            # Read only by the masking statement: the mask takes its value, or it only made the fill.
            chain.mask = substituted(chain.mask, {name: value})
            if chain.mask_source is not None:
                chain.mask_source = substituted(chain.mask_source, {name: value})
            self.reads.append(({n.value for n in names_read(value)}, self.guard_if))
            self.setup.remove(statement)
            chain.consumed.append(statement)
        if not self.setup:
            chain.consumed = [s for s in chain.consumed if s is not masking and not inside(s, self.guard_if)]
            chain.consumed.append(self.guard_if)
            self.guard_if = None
            return
        changed = set().union(*(assigned_names(s) for s in self.setup)) & {n.value for n in names_read(chain.guard)}
        moved = {n.value for part in (chain.q, chain.k, chain.dropout_p, *chain.factors, *chain.divisors) if part is not None
                 for n in names_read(part)} & set().union(*(assigned_names(s) for s in self.setup))
        if moved:  # the scores were made before the `if`; the fused call would read the new value
            raise _Refused(f"`{sorted(moved)[0]}` changes between the scores and the values product")
        given = presence_test(chain.guard)
        if changed and (changed != {given} or not all(keeps_a_tensor(s, given) for s in self.setup
                                                      if given in assigned_names(s))):
            raise _Refused(f"`if {code_of(chain.guard)}:` changes `{sorted(changed)[0]}`, which it tests")

    def _check_names(self) -> None:
        """The chain's variables are used nowhere else: the fused call does not give them back. Reads after the
        values product (weights returned or stored for visualisation) are kept for an unsafe fix that puts
        None there; any other use leaves the chain alone."""
        chain = self.chain
        read_inside = set()
        for statement in chain.consumed:
            read_inside.update(id(n) for n in names_read(statement))
        if chain.values_product is not None:
            read_inside.update(id(n) for n in names_read(chain.values_product))
        everywhere = names_read(self.function)
        product_names = [id(n) for n in names_read(chain.values_product)] if chain.values_product is not None else []
        after = next((i for i, n in enumerate(everywhere) if id(n) in product_names), len(everywhere))
        bound = {id(n) for n in binding_names(self.function)}
        for name in chain.names:
            for index, node in enumerate(everywhere):
                if node.value != name or id(node) in read_inside:
                    continue
                if index >= after and self._detached_again(node):
                    read_inside.update(id(n) for n in names_read(chain.consumed[-1]))
                    continue
                if name in chain.scores_names and id(node) not in bound and self._metadata(node):
                    continue
                returned = None if index < after or id(node) in bound else self._returned_or_stored(node)
                if returned is None:
                    what = "scores" if name in chain.scores_names else "probabilities"
                    use = next((s for s in self.block if inside(node, s)), None)
                    shown = f" (`{one_line(use)}`)" if use is not None and len(one_line(use)) <= 60 else ""
                    raise _Refused(f"`{name}` is used outside the attention{shown}; the fused call does not give the "
                                   f"{what} back")
                chain.elsewhere.append(returned)

    def _detached_again(self, name: cst.Name) -> bool:
        """`qk = qk.detach()` after the values product, before the weights are returned: the statement goes
        with the chain, and the later reads of `qk` are the weights returned (noted in `chain.consumed`)."""
        statement = next((s for s in self.block if inside(name, s)), None)
        if statement is None or not plain_assignment(statement, name.value):
            return False
        value = statement.body[0].value
        while call_parts(value)[0] in _PASSED_ON and call_parts(value)[1] is not None:
            value = call_parts(value)[1]
        if not isinstance(value, cst.Name) or value.value != name.value:
            return False
        if statement not in self.chain.consumed:
            self.chain.consumed.append(statement)
        return True

    def _metadata(self, name: cst.Name) -> bool:
        """`scores.device` (and `scores.dtype` when no cast made the scores) read to build a bias or a mask: the
        query's, which is the same, takes its place (noted in `chain.renamed`)."""
        path = path_to(self.function, name) or []
        parent = path[-2] if len(path) >= 2 else None
        allowed = ("device",) if self.chain.scores_cast else ("device", "dtype")
        if not isinstance(parent, cst.Attribute) or parent.value is not name or parent.attr.value not in allowed or \
                self.chain.q is None:
            return False
        query = self.chain.q
        while not isinstance(query, cst.Name) and call_parts(query)[1] is not None:  # `q.permute(...)` is on q's device
            query = call_parts(query)[1]
        self.chain.renamed.append((parent, parent.with_changes(value=atom(query))))
        return True

    def _returned_or_stored(self, name: cst.Name) -> cst.BaseExpression | None:
        """`return out, name`, `self.weights = name`, `cache = (out, name.detach())`: the expression None can
        take the place of; None when the value is used otherwise."""
        path = path_to(self.function, name) or []
        parents = path[-2::-1]
        expression: cst.BaseExpression = name
        # `name.detach()`, `name.float().cpu()`: what is returned is still only the weights.
        while len(parents) >= 2 and isinstance(parents[0], cst.Attribute) and isinstance(parents[1], cst.Call) and \
                parents[1].func is parents[0] and parents[0].attr.value in _PASSED_ON:
            expression, parents = parents[1], parents[2:]
        if parents and isinstance(parents[0], cst.Element) and len(parents) > 1 and isinstance(parents[1], cst.Tuple):
            parents = parents[2:]
            if parents and isinstance(parents[0], cst.IfExp):  # `(out, probs) if output_attentions else (out,)`
                parents = parents[1:]
        stored = bool(parents) and (isinstance(parents[0], cst.Return) or
                                    (isinstance(parents[0], cst.Assign) and parents[0].value in path))
        return expression if stored else None

    def _check_inputs_unchanged(self) -> None:
        """q, k, the mask and the scale are read where the values product is; they must not change before."""
        chain = self.chain
        body = list(self.block)
        statements = [s for s in chain.consumed if s in body]
        if not statements or chain.values_statement not in body:
            return
        first = min(body.index(s) for s in statements)
        last = body.index(chain.values_statement)
        # The values are read where they always were, at the values product; the rest moves there, so each part
        # must not change between the statement that read it and the values product.
        reads = [(names, next((i for i, s in enumerate(body) if at is s or inside(at, s)), first))
                 for names, at in self.reads]
        reads.append(({n.value for part in (chain.guard, chain.dropout_p) if part is not None for n in names_read(part)},
                      first - 1))
        for names, read_at in reads:
            for statement in body[read_at + 1:last]:
                if statement in statements or statement is self.guard_if:  # its setup runs before the mask is read
                    continue
                changed = {n for n in names if n in assigned_names(statement) or mutated_in_place(statement, n)}
                if changed:
                    raise _Refused(f"`{sorted(changed)[0]}` changes between the scores and the values product")

    def _call(self, callee: str) -> cst.Call:
        chain = self.chain
        if chain.q is None or chain.v is None or chain.values_product is None:
            raise _Refused("the scores or the values product could not be found")
        arguments = [chain.q, chain.k, chain.v]
        keywords: list[tuple[str, str]] = []
        if chain.mask is not None:
            guard = code_of(chain.guard) if chain.guard is not None else None
            mask = code_of(chain.mask)
            causal = self._causal()
            from_scores = chain.names & {n.value for n in names_read(chain.mask)}
            if from_scores and not causal:
                raise _Refused(f"the mask is computed from `{sorted(from_scores)[0]}`, which the fused call does not make")
            if causal:
                keywords.append(("is_causal", "True" if guard is None else guard))
            elif guard is None or guard.replace(" ", "") == f"{mask}isnotNone":
                keywords.append(("attn_mask", mask))  # `if mask is not None: scores += mask`: None is no mask
            else:
                # A comparison or call binds tighter than `... if ... else ...`; only such a mask needs parentheses.
                shown = code_of(atom(chain.mask)) if isinstance(chain.mask, (cst.IfExp, cst.Lambda)) else mask
                keywords.append(("attn_mask", f"{shown} if {guard} else None"))
        if chain.dropout_p is not None:
            p = code_of(chain.dropout_p)
            keywords.append(("dropout_p", f"{p} if self.training else 0.0" if chain.dropout_in_training_only else p))
        scale = _scale(chain, self._local_definitions())
        if scale is not None and self.default_scale and self._spelled_as_a_root():
            scale = None  # the graph saw the default's value: 1/sqrt(the head dim) through a variable or attribute
        if scale is not None:
            keywords.append(("scale", scale))
        parts = [code_of(a) for a in arguments] + [f"{k}={v}" for k, v in keywords]
        call = cst.parse_expression(f"{callee}({self._layout(callee, parts)})")
        return _to_layout(call, *chain.out_layout) if chain.out_layout is not None else call

    def _spelled_as_a_root(self) -> bool:
        """The scale is one number written as an inverse square root (`self.scale = head_dim ** -0.5`, or a
        division by `math.sqrt(d)`), with no choice in it (`qk_scale or head_dim ** -0.5` may be set otherwise
        in another model, so it is kept even when this one holds the default)."""
        chain = self.chain
        if len(chain.factors) + len(chain.divisors) != 1:
            return False
        factor = (chain.factors or chain.divisors)[0]
        if isinstance(factor, cst.Attribute) and code_of(factor.value) == "self" and self.classdef is not None:
            made = self_assignments(self.classdef, factor.attr.value)
            if len(made) != 1:
                return False
            factor = made[0]
        elif isinstance(factor, cst.Name):
            made = local_assignments(self.function, factor.value)
            if len(made) != 1:
                return False
            factor = made[0]
        if any(isinstance(n, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) for n in all_nodes(factor)):
            return False
        text = _compact(factor)
        power = re.fullmatch(r"\(?(.+?)\)?\*\*\(?(-?)0\.5\)?", text)
        sqrt = re.fullmatch(r"(1(?:\.0)?/)?\(?(?:math\.)?sqrt\((.+)\)\)?", text)
        if chain.factors:  # `d ** -0.5`, `1 / math.sqrt(d)`
            root = power.group(1) if power and power.group(2) else sqrt.group(2) if sqrt and sqrt.group(1) else None
        else:  # `/ math.sqrt(d)`, `/ d ** 0.5`
            root = power.group(1) if power and not power.group(2) else sqrt.group(2) if sqrt and not sqrt.group(1) else None
        # One configuration shows only that the numbers agreed: what is under the root must also be named as the
        # head dimension (`head_dim`, `dim // heads`, `d_k`), not the model width that equals it with one head.
        return root is not None and _names_a_head_dim(root)

    def _layout(self, callee: str, parts: list[str]) -> str:
        """The call's arguments as a formatter writes them: on one line when the whole line fits, else on one
        indented line of their own, else one a line with a trailing comma."""
        indent, inside = self.indent, ", ".join(parts)
        statement = code_of(self.chain.values_statement.body[0]) if self.chain.values_statement is not None else ""
        product = code_of(self.chain.values_product)
        before, _, after = statement.partition(product)
        line = len(indent) + len(before.split("\n")[-1]) + len(callee) + len(inside) + 2 + len(after.split("\n")[0])
        return laid_out(parts, indent, line)

    def _local_definitions(self) -> dict[str, str]:
        """What each variable assigned exactly once in the function is set to, without spaces."""
        found: dict[str, list[str]] = {}

        class _Assignments(cst.CSTVisitor):
            def visit_Assign(self, node: cst.Assign) -> None:
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        found.setdefault(target.target.value, []).append(_compact(node.value))

        self.function.visit(_Assignments())
        return {name: values[0] for name, values in found.items() if len(values) == 1}


# Methods that hand the weights on unchanged in value, as when they are returned for inspection: `attn.detach()`.
_PASSED_ON = ("detach", "cpu", "float", "clone", "contiguous", "to", "type_as", "half", "bfloat16")


def _summand(node: cst.BaseExpression) -> str:
    """`node` as an operand of `+`, parenthesised only where it would bind looser."""
    loose = (cst.IfExp, cst.Lambda, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation)
    if isinstance(node, loose) or (isinstance(node, cst.BinaryOperation) and
                                   isinstance(node.operator, (cst.BitOr, cst.BitAnd, cst.BitXor, cst.LeftShift, cst.RightShift))):
        return code_of(atom(node))
    return code_of(node)


def _upcast_only(statement: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """`name` of `if flag: name = name.float()` (a guard whose one statement only casts it); None otherwise."""
    if not isinstance(statement, cst.If) or statement.orelse is not None or not isinstance(statement.body, cst.IndentedBlock) \
            or len(statement.body.body) != 1:
        return None
    value = redefinition(statement.body.body[0], name)
    cast, receiver, _, _ = call_parts(value)
    if cast in _CASTS and isinstance(receiver, cst.Name) and receiver.value == name:
        return receiver
    return None


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


# How code names the size of one attention head; the model width (`dim`, `d_model`) is not among them.
_HEAD_DIM = re.compile(r"head|(?<![a-z])d_?k(?![a-z])|d_?kv|key_?dim|kdim|qk_?dim|key_value_proj_dim|(?<![a-z])hs(?![a-z])")


def _names_a_head_dim(text: str) -> bool:
    return bool(_HEAD_DIM.search(text.lower()))


def _is_number(node: cst.BaseExpression, values: tuple[float, ...]) -> bool:
    try:
        return float(code_of(node)) in values
    except ValueError:
        return False


# -- helpers over libcst nodes ------------------------------------------------------------------------------

def _operands(receiver, positional, names: ImportNames) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    if receiver is not None and not is_namespace(receiver, names):
        if len(positional) != 1:
            raise _Refused("the scores product's operands could not be read")
        return receiver, positional[0]
    if len(positional) != 2:
        raise _Refused("the scores product's operands could not be read")
    return positional[0], positional[1]


def _split_scale(node: cst.BinaryOperation) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(tensor, factor) of `a * b`: the factor is the side that is plainly a number or computed from shapes."""
    if _scalar_like(node.left) and not _scalar_like(node.right):
        return node.right, node.left
    return node.left, node.right


def _scalar_like(node: cst.BaseExpression) -> bool:
    text = code_of(node)
    return isinstance(node, (cst.Integer, cst.Float)) or any(
        marker in text for marker in ("math.", "**", ".shape", ".size(", "sqrt", "scale"))


def _untransposed(key: cst.BaseExpression, rank: int | None) -> cst.BaseExpression | None:
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


def _transpose(node: cst.BaseExpression) -> cst.BaseExpression:
    return cst.parse_expression(f"{code_of(atom(node))}.transpose(-2, -1)")


def _einsum_spec(positional) -> tuple[tuple[str, str], str] | None:
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


def _to_layout(node: cst.BaseExpression, have: str, want: str) -> cst.BaseExpression:
    """`node`, whose dimensions are named by `have`, with them in the order `want`: itself, a transpose of the
    last two, or a permute."""
    if have == want:
        return node
    if have[:-2] == want[:-2] and have[-2:] == want[:-3:-1]:
        return _transpose(node)
    order = ", ".join(str(have.index(c)) for c in want)
    return cst.parse_expression(f"{code_of(atom(node))}.permute({order})")


def _very_negative(node: cst.BaseExpression, names: ImportNames) -> bool:
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


def _compact(node: cst.BaseExpression) -> str:
    return code_of(node.with_changes(lpar=[], rpar=[])).replace(" ", "")


def _scale(chain: _Chain, local: dict[str, str]) -> str | None:
    """The `scale=` argument; None when it is the fused call's default, 1/sqrt(the head dimension), written
    with the query's or key's own size (directly or through a variable assigned once: `d_k = q.size(-1)`)."""
    def substitute(match: re.Match) -> str:
        value = local.get(match.group(0))
        if value is None:
            return match.group(0)
        return value if re.fullmatch(r"[\w.]+(\(.*\)|\[.*\])?", value) else f"({value})"

    def resolved(node: cst.BaseExpression) -> str:
        text = _compact(node)
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
    numerator = " * ".join(code_of(_operand(f, cst.Multiply)) for f in chain.factors) if factors else "1"
    return " / ".join([numerator] + [code_of(_operand(d, cst.Divide)) for d in chain.divisors])


def _operand(node: cst.BaseExpression, operator: type) -> cst.BaseExpression:
    """`node` as an operand of `*` or `/`: parenthesised only where the precedence needs it (`1 / (a * b)`,
    not `1 / (d**0.5)`)."""
    bare = node.with_changes(lpar=[], rpar=[]) if isinstance(node, (cst.BinaryOperation, *_ATOMIC)) else node
    if isinstance(bare, cst.BinaryOperation) and not isinstance(bare.operator, cst.Power) and \
            not (operator is cst.Multiply and isinstance(bare.operator, cst.Multiply)):
        return atom(bare)
    return bare


_ATOMIC = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)

