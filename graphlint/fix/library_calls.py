"""Fixes that put a library call where a formula was written by hand (GL106 norms, GL107 activations, GL204
log-probabilities) or change a layer's construction (GL105 `bias=False`).

Each reads the expression the finding points at; what the formula computes was already established on the
graph by the rule, so the rewrite only has to find the formula's input in the source. Whatever it writes is
proven on the model before `--fix` writes it.
"""

from __future__ import annotations

import libcst as cst

from graphlint.fix.rewrite import (LINE_LENGTH, FixSite, ImportNames, Rewrite, atom, call_parts, code_of, dead_definitions,
                                   is_namespace, laid_out, names_read, one_line)
from graphlint.fix.source import all_nodes, inside
from graphlint.results import UNSAFE


def _input_of(node: cst.CSTNode, names: tuple[str, ...], imports: ImportNames) -> cst.BaseExpression | None:
    """`x` of `torch.<name>(x)`, `F.<name>(x)` or `x.<name>()`, for one of `names`."""
    name, receiver, positional, _ = call_parts(node)
    if name not in names:
        return None
    if is_namespace(receiver, imports):
        return positional[0] if positional else None
    return receiver


def _without_parentheses(site: FixSite, node: cst.CSTNode, new: cst.CSTNode) -> tuple[cst.CSTNode, cst.CSTNode]:
    """(what to replace, by what): a formula a formatter wrapped in parentheses over several lines (`return (`,
    the formula, `)`) is replaced with its parentheses when it is the statement's whole value and the call
    needs none; else just the formula."""
    if getattr(node, "lpar", None) and not getattr(new, "lpar", None) and isinstance(new, cst.Call) and \
            site.function is not None:
        for statement in all_nodes(site.function):
            if isinstance(statement, (cst.Assign, cst.Return)) and statement.value is node:
                return statement, statement.with_changes(value=new)
    return node, new


def _is_number(node: cst.BaseExpression, value: float | None = None) -> bool:
    try:
        number = float(code_of(node))
    except ValueError:
        return False
    return value is None or number == value


# -- GL107 ----------------------------------------------------------------------------------------------------

def activation_call(site: FixSite, library: str) -> Rewrite | str:
    """GL107's fix of one formula; `library` is the rule's name for the exact call ("F.silu(x)", ...)."""
    node = site.node
    x = _formula_input(node, library, site)
    if isinstance(x, str):
        return x
    if library == "torch.softmax(x, dim)":
        x, dim = x
        callee, imports = site.imports.torch_call("softmax")
        new = cst.parse_expression(f"{callee}({code_of(x)}, {code_of(dim).strip().rstrip(',')})")
    else:
        callee, imports = site.imports.functional_call(library.split("(")[0].removeprefix("F."))
        extra = ', approximate="tanh"' if "tanh" in library else ""
        new = cst.parse_expression(f"{callee}({code_of(x)}{extra})")
    return Rewrite(*_without_parentheses(site, node, new), f"{one_line(node)} → {code_of(new)}",
                   removed=dead_definitions(site.function, node, new), imports=imports)


def _formula_input(node: cst.CSTNode, library: str, site: FixSite):
    """The formula's input `x` as the user wrote it ((x, dim) for the softmax), or why it cannot be read."""
    imports, function = site.imports, site.function
    if not isinstance(node, cst.BinaryOperation):
        return "the formula is not one expression graphlint can rewrite"
    if library == "torch.softmax(x, dim)":
        return _softmax_input(node, site)
    if library == "F.silu(x)" and isinstance(node.operator, cst.Divide):
        return _swish_input(node, imports)
    factors = _factors(node, function)
    if library in ("F.silu(x)", "F.mish(x)"):
        inner = ("sigmoid",) if library == "F.silu(x)" else ("tanh",)
        for index, factor in enumerate(factors):
            argument = _input_of(factor, inner, imports)
            if argument is None:
                continue
            if library == "F.mish(x)":
                argument = _softplus_input(argument, imports)
            others = factors[:index] + factors[index + 1:]
            if argument is not None and len(others) == 1 and code_of(others[0]) == code_of(argument):
                return argument
        return "the formula's input is not written the same way on both sides"
    # GELU: 0.5 * x * (1 + core) in any order of the factors, `/ 2` for the half, the cdf in a variable.
    candidates = [f for f in factors if not _is_number(f) and not _calls(f, ("tanh", "erf"))]
    if len(candidates) == 2:  # x * cdf(x), the cumulative distribution in a helper function the graph went through
        candidates = [c for c, other in zip(candidates, candidates[::-1], strict=True) if _helper_of(other, c) is not None]
    if len(candidates) == 1 and len(factors) >= 2:
        x = candidates[0]
        return _bare(x)
    return "the formula's input could not be told apart from its constants"


def _swish_input(node: cst.BinaryOperation, imports: ImportNames):
    """x of `x / (1 + torch.exp(-x))`, or why it cannot be read."""
    total = _bare(node.right)
    if isinstance(total, cst.BinaryOperation) and isinstance(total.operator, cst.Add):
        for one, other in ((total.left, total.right), (total.right, total.left)):
            negated = _input_of(other, ("exp",), imports) if _is_number(one, 1) else None
            if isinstance(negated, cst.UnaryOperation) and isinstance(negated.operator, cst.Minus) and \
                    code_of(_bare(negated.expression)) == code_of(_bare(node.left)):
                return _bare(node.left)
    return "the formula's input is not written the same way on both sides"


def _softplus_input(node: cst.BaseExpression, imports: ImportNames) -> cst.BaseExpression | None:
    """x of `F.softplus(x)`, `torch.log1p(torch.exp(x))` or `torch.log(1 + torch.exp(x))`; None otherwise."""
    found = _input_of(node, ("softplus",), imports)
    if found is None and (inside := _input_of(node, ("log1p",), imports)) is not None:
        found = _input_of(inside, ("exp",), imports)
    if found is None and (inside := _input_of(node, ("log",), imports)) is not None:
        inside = _bare(inside)
        if isinstance(inside, cst.BinaryOperation) and isinstance(inside.operator, cst.Add):
            for one, other in ((inside.left, inside.right), (inside.right, inside.left)):
                if _is_number(one, 1) and (found := _input_of(other, ("exp",), imports)) is not None:
                    break
    return found


def _helper_of(call: cst.BaseExpression, x: cst.BaseExpression) -> cst.Call | None:
    """`call` when it is a plain function called on `x` alone (`cdf(x)`), else None."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and len(call.args) == 1 and \
            call.args[0].keyword is None and not call.args[0].star and code_of(call.args[0].value) == code_of(x):
        return call
    return None


def _softmax_input(node: cst.BinaryOperation, site: FixSite):
    """(x, dim argument) of `torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)`, also with the exponentials in a
    variable the function assigns once (`e = torch.exp(x - x.max(-1, keepdim=True).values)`, `e / e.sum(-1, ...)`)."""
    imports, function = site.imports, site.function
    numerator = node.left
    exponentials = _value_of(numerator, function)
    x = _input_of(exponentials, ("exp",), imports)
    name, receiver, positional, keywords = call_parts(node.right)
    summed = positional[0] if is_namespace(receiver, imports) and positional else receiver
    rest = positional[1:] if is_namespace(receiver, imports) else positional
    dim = rest[0] if rest else keywords.get("dim")
    if x is None or name != "sum" or summed is None or dim is None or not isinstance(node.operator, cst.Divide) or \
            code_of(_value_of(summed, function)) != code_of(exponentials):
        return "the exponentials are not divided by their own sum in one expression"
    bare = _bare(x)
    if _is_difference(bare) and _is_max_of(bare.right, bare.left, dim, imports):
        x = bare.left  # the maximum subtracted for stability: softmax subtracts it itself
    return x, cst.Arg(dim, keyword=cst.Name("dim") if "dim" in keywords else None,
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")) if "dim" in keywords
                      else cst.MaybeSentinel.DEFAULT)


def _is_max_of(node: cst.BaseExpression, x: cst.BaseExpression, dim: cst.BaseExpression, imports: ImportNames) -> bool:
    """`x.max(dim, keepdim=True).values` / `[0]`, `x.amax(dim, keepdim=True)`, `torch.max(x, dim, keepdim=True)[0]`
    or `x.max()`: constant along `dim`."""
    if isinstance(node, cst.Attribute) and node.attr.value == "values":
        node = node.value
    elif isinstance(node, cst.Subscript) and len(node.slice) == 1 and code_of(node.slice[0]).strip().rstrip(",") == "0":
        node = node.value
    name, receiver, positional, keywords = call_parts(node)
    if name in ("max", "amax") and is_namespace(receiver, imports) and positional:  # torch.max(x, dim, ...)
        receiver, positional = positional[0], positional[1:]
    if name not in ("max", "amax") or receiver is None or code_of(receiver) != code_of(x):
        return False
    if not positional and not keywords:
        return name == "max"
    given = positional[0] if positional else keywords.get("dim")
    keep = keywords.get("keepdim", positional[1] if len(positional) > 1 else None)
    return given is not None and code_of(given) == code_of(dim) and keep is not None and code_of(keep) == "True"


def _calls(node: cst.CSTNode, names: tuple[str, ...]) -> bool:
    """Whether `node` calls one of `names` anywhere inside."""
    return any(call_parts(n)[0] in names for n in all_nodes(node) if isinstance(n, cst.Call))


def _factors(node: cst.BaseExpression, function: cst.FunctionDef | None = None) -> list[cst.BaseExpression]:
    """The operands of a product, flattened: `0.5 * x * (1 + t)` is [0.5, x, (1 + t)]; a division by a number
    is a factor too (`x * (1 + t) / 2` is [x, (1 + t), 2]), and with `function`, a variable it assigns once to a
    product with a tanh or erf in it is read as what it holds (`x * cdf`)."""
    if function is not None and isinstance(node, cst.Name):
        value = _assigned_once(function, node.value)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)) and \
                _calls(value, ("tanh", "erf")):
            return _factors(value, function)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        bare = node.with_changes(lpar=[], rpar=[])
        return _factors(bare.left, function) + _factors(bare.right, function)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide) and _is_number(node.right):
        return _factors(node.with_changes(lpar=[], rpar=[]).left, function) + [node.right]
    return [node]


# -- GL204 ----------------------------------------------------------------------------------------------------

# Calls through which a log may be taken instead: each only picks, arranges or casts the values, so the log of
# what they pick is what they pick of the log.
_PICKS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "movedim", "contiguous", "squeeze",
    "unsqueeze", "expand", "expand_as", "flatten", "unflatten", "t", "clone", "gather", "index_select",
    "take_along_dim", "select", "narrow", "float", "double", "half", "bfloat16", "to", "type", "type_as",
})


def log_probabilities(site: FixSite) -> Rewrite | str:
    """`log(softmax(x, dim))` → `F.log_softmax(x, dim)`; `log(sigmoid(x))` → `F.logsigmoid(x)`;
    `log(1 - sigmoid(x))` → `F.logsigmoid(-x)`; the log of probabilities picked, arranged or cast first
    (`probs[rows, y].log()`, `probs.gather(1, y)`) → the same picks of the log-probabilities. The probabilities
    may be computed inside the log or in a variable the function assigns once (`probs = F.softmax(x, -1)`,
    deleted when nothing else reads it)."""
    node, names = site.node, site.imports
    log_name = call_parts(node)[0]
    inside = _input_of(node, ("log", "log2", "log10"), names)
    if inside is None:
        return "the log is not a call graphlint can rewrite"
    outer, picked = _picked(inside, names)  # picked: the node in the log's own expression
    assignments: list[cst.BaseExpression] = []
    base = _resolved(picked, site.function, assignments)
    complement = isinstance(base, cst.BinaryOperation) and isinstance(base.operator, cst.Subtract) and \
        _is_number(base.left, 1)
    inner, made = (base, picked) if not complement else _picked(base.right, names)
    source = _resolved(made, site.function, assignments) if complement else base
    name, receiver, positional, keywords = call_parts(source)
    if name == "softmax" and not complement:
        x = positional[0] if is_namespace(receiver, names) and positional else receiver
        if x is None:
            return "the softmax's arguments could not be read"
    elif name == "sigmoid":
        x = _input_of(source, ("sigmoid",), names)
    else:
        return ("the probabilities are made in another function or statement graphlint cannot read back; take "
                "the log of the logits with F.log_softmax / F.logsigmoid where they are made")
    logits = _logits_variable(site, node, source, x, assignments)
    if isinstance(logits, str):
        return logits
    inserted = ()
    if logits is not None:  # the probabilities stay for their other readers: their logits get a name both read
        statement, variable = logits
        inserted, x_read = ((statement, f"{variable} = {code_of(x)}"),), cst.Name(variable)
    else:
        x_read = x
    if name == "softmax":
        rest = [a for a in source.args if a.value is not x]
        arguments = ", ".join([code_of(x_read)] + [code_of(a).strip().rstrip(",").strip() for a in rest])
        callee, imports = names.functional_call("log_softmax")
        log_form = cst.parse_expression(f"{callee}({arguments})")
    else:
        callee, imports = names.functional_call("logsigmoid")
        log_form = cst.parse_expression(f"{callee}({'-' + code_of(atom(x_read)) if complement else code_of(x_read)})")
    if complement:  # 1 - picks(sigmoid(x)) is picks(sigmoid(-x))
        log_form = inner.deep_replace(made, log_form) if inner is not made else log_form
    new = outer.deep_replace(picked, log_form) if outer is not picked else log_form
    removed = () if inserted else dead_definitions(site.function, node, new)
    if log_name != "log":  # log2(p) = log(p) / log(2), in parentheses where the call was an operand
        math_name = "math" if "math" in names.modules else None
        if math_name is None and "math" in names.bound:
            return "the module binds `math` to something else, and a log2 or log10 needs math.log for its base"
        new = cst.parse_expression(f"{code_of(atom(new))} / math.log({2 if log_name == 'log2' else 10})")
        new = new if _stands_alone(node, site.function) else atom(new)
        imports = imports + (() if math_name else ("import math",))
    return Rewrite(*_without_parentheses(site, node, new), f"{one_line(node)} → {code_of(new)}", imports=imports,
                   removed=removed, inserted=inserted, also=((x, x_read),) if inserted else ())


def _stands_alone(node: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """Whether `node` is a whole assigned, returned or passed value, where an operation needs no parentheses."""
    if function is None:
        return False
    for parent in all_nodes(function):
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.Return, cst.Arg, cst.Element)) and \
                getattr(parent, "value", None) is node:
            return True
    return False


def _picked(value: cst.BaseExpression, imports: ImportNames) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(`value`, what it picks from): `probs` of `probs[rows, y].float()`, `probs.gather(1, y)`,
    `torch.gather(probs, 1, y)`; (value, value) when it picks nothing."""
    base = value
    while True:
        bare = _bare(base)
        if isinstance(bare, cst.Subscript):
            base = bare.value
            continue
        if isinstance(bare, cst.Attribute) and bare.attr.value in ("T", "mT"):
            base = bare.value
            continue
        name, receiver, positional, _ = call_parts(bare)
        if name in _PICKS and receiver is not None and not is_namespace(receiver, imports):
            base = receiver
        elif name in _PICKS and is_namespace(receiver, imports) and positional:
            base = positional[0]
        else:
            return value, base


def _resolved(node: cst.BaseExpression, function: cst.FunctionDef | None, found: list) -> cst.BaseExpression:
    """What a variable the function assigns once holds (noted in `found`), else `node`; without parentheses."""
    if isinstance(node, cst.Name):
        value = _assigned_once(function, node.value)
        if value is not None:
            found.append(value)
            node = value
    return _bare(node)


def _assigns(statement: cst.BaseStatement, value: cst.BaseExpression) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and small.value is value for small in statement.body)


def _logits_variable(site: FixSite, log: cst.CSTNode, made: cst.BaseExpression, x: cst.BaseExpression,
                     assignments: list[cst.BaseExpression]) -> tuple[cst.BaseStatement, str] | None | str:
    """When the probabilities stay (something else reads them) and their logits are computed inside the softmax
    call (`p = F.softmax(self.head(x), -1)`), the statement that makes them and a free name for the logits, so
    that `logits = self.head(x)` is computed once and read by both; None when the logits can be read twice as
    they are; a reason when no such statement can be written."""
    if not assignments or not _calls_anything(x):
        return None
    others = [n for value in assignments for n in names_read(site.function)
              if _assigns_name(site.function, value, n) and not inside(n, log)]
    if not others:
        return None
    statement = next((s for s in all_nodes(site.function) if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                      and isinstance(s.body[0], cst.Assign) and s.body[0].value is made), None)
    if statement is None:
        return ("the probabilities are also read elsewhere and their logits are computed inside the same call; "
                "assign the logits to a variable first")
    bound = set(ImportNames.of(site.module).bound) | {n.value for n in all_nodes(site.function) if isinstance(n, cst.Name)}
    variable = next(v for v in ("logits", "logits_", *(f"logits{i}" for i in range(2, 99))) if v not in bound)
    return statement, variable


def _assigns_name(function: cst.FunctionDef, value: cst.BaseExpression, name: cst.Name) -> bool:
    """`name` reads the variable that `value` is assigned to, somewhere other than the log being rewritten."""
    for node in all_nodes(function):
        if isinstance(node, cst.Assign) and node.value is value and len(node.targets) == 1 and \
                isinstance(node.targets[0].target, cst.Name) and node.targets[0].target is not name:
            return node.targets[0].target.value == name.value
    return False


def _calls_anything(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Call) for n in all_nodes(node))


def _assigned_once(function: cst.FunctionDef | None, name: str) -> cst.BaseExpression | None:
    """What `name = ...` sets, when the function assigns `name` once and every variable that expression reads
    at most once too (so it means the same where the log is)."""
    if function is None:
        return None
    assigned: dict[str, list[cst.BaseExpression | None]] = {}

    class _Assignments(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                for bound in names_read(target.target):  # a name bound by unpacking holds no one expression
                    plain = isinstance(target.target, cst.Name)
                    assigned.setdefault(bound.value, []).append(node.value if plain else None)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name):
                assigned.setdefault(node.target.value, []).extend([node.value, node.value])

        def visit_For(self, node: cst.For) -> None:
            for bound in names_read(node.target):
                assigned.setdefault(bound.value, []).extend([node.iter, node.iter])

    function.visit(_Assignments())
    values = assigned.get(name, [])
    if len(values) != 1 or values[0] is None or any(len(assigned.get(n.value, [])) > 1 for n in names_read(values[0])):
        return None
    return values[0]


# -- GL106 ----------------------------------------------------------------------------------------------------

def library_norm(site: FixSite, kind: str, channel: int | None = None, dims: int = 1,
                 flat: frozenset[str] = frozenset()) -> Rewrite | str:
    """GL106's fix of a hand-written LayerNorm or RMSNorm over `dims` trailing dimensions, or over the one
    dimension `channel` of a channels-first tensor; `flat` names the module's parameters of exactly the
    normalised shape that scale or shift the result (those the library call can take). A method that is only the
    norm (a module's `forward`, or a helper such as Llama's `_norm(self, x)` that `forward` calls between casts)
    becomes the one call with the module's own weight, bias and eps; a norm inside a larger function becomes the
    call in place of the normalising expression."""
    whole = _whole_method(site, kind, dims, flat) if channel is None else ""
    if isinstance(whole, Rewrite):
        return whole
    inline = _inline_norm(site, kind, channel, dims)
    return inline if isinstance(inline, Rewrite) else whole or inline


def _norm_call(callee: str, kind: str, x: cst.BaseExpression, weight: str | None, bias: str | None, eps: str,
               channel: int | None = None, dims: int = 1, line: tuple[str, str] | None = None) -> str:
    """The library call on `x`; over a channel dimension, the channels moved last and back again. `line` is
    (what precedes the call on its line, with indentation; what follows it), to lay a long call out."""
    name, sized = code_of(atom(x)), code_of(atom(_uncast(x)))
    if channel is not None:
        shape, moved = f"({sized}.shape[{channel}],)", f"{name}.movedim({channel}, -1)"
    else:
        shape, moved = (f"({sized}.shape[-1],)" if dims == 1 else f"{sized}.shape[-{dims}:]"), code_of(x)
    if weight is None and bias is None:
        parts = [moved, shape, f"eps={eps}"]
    elif kind == "RMSNorm":
        parts = [moved, shape, weight or "None", eps]
    else:
        parts = [moved, shape, weight or "None", bias or "None", eps]
    if channel is None:
        return f"{callee}({_arguments(callee, parts, line)})"
    back = f".movedim(-1, {channel})"
    whole = f"{callee}({', '.join(parts)}){back}"
    if line is None or len(line[0]) + len(whole) + len(line[1].rstrip()) <= LINE_LENGTH or \
            (line[1].strip() and not line[1].strip().startswith("#")):
        return whole
    indent = line[0][: len(line[0]) - len(line[0].lstrip())]
    if len(line[0]) + len(whole) - len(f"-1, {channel})") <= LINE_LENGTH:  # ruff splits the last call first
        return f"{callee}({', '.join(parts)}).movedim(\n{indent}    -1, {channel}\n{indent})"
    return f"{callee}({_arguments(callee, parts, (line[0], back + line[1]))}){back}"


def _arguments(callee: str, parts: list[str], line: tuple[str, str] | None) -> str:
    """A call's arguments as a formatter writes them when the call ends its line: on that line when it fits,
    else on one indented line of their own, else one a line with a trailing comma."""
    inside = ", ".join(parts)
    if line is None:
        return inside
    before, after = line
    indent = before[: len(before) - len(before.lstrip())]
    code_after = after.strip() and not after.strip().startswith(("#", "."))  # a call ending its line, or a chain's
    if code_after:
        return inside
    return laid_out(parts, indent, len(before) + len(callee) + len(inside) + 2 + len(after.rstrip()))


def _line_of(site: FixSite, node: cst.CSTNode) -> tuple[str, str] | None:
    """(what precedes `node` on its line, indentation included; what follows it there, a trailing comment
    included) when `node` is the whole value of a statement on one line of the function, else None."""
    if site.function is None:
        return None
    for line in all_nodes(site.function):
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and \
                isinstance(line.body[0], (cst.Assign, cst.Return)) and line.body[0].value is node:
            before, _, after = code_of(line.body[0]).partition(code_of(node))
            if "\n" not in before:
                return site.indent + before, after.split("\n")[0] + _comment(line)
    return None


def _comment(line: cst.SimpleStatementLine) -> str:
    """The trailing comment of a statement's line, as a formatter counts it, or ""."""
    comment = line.trailing_whitespace.comment
    return f"  {comment.value}" if comment is not None else ""


def _uncast(x: cst.BaseExpression) -> cst.BaseExpression:
    """`x` of `x.float()`, `x.to(torch.float32)`: the same shape, for writing the normalised shape."""
    name, receiver, _, _ = call_parts(x)
    while name in ("float", "double", "half", "bfloat16", "to", "type", "type_as") and receiver is not None:
        x = receiver
        name, receiver, _, _ = call_parts(x)
    return x


def _whole_method(site: FixSite, kind: str, dims: int, flat: frozenset[str]) -> Rewrite | str:
    function = site.function
    if function is None or site.classdef is None:
        return "the norm is not a method of a module; replace it with nn.LayerNorm or nn.RMSNorm"
    parameters = [p.name.value for p in function.params.params]
    if len(parameters) != 2 or parameters[0] != "self":
        return f"`{function.name.value}` takes more than one input besides self"
    x = parameters[1]
    found = _root(_as_operation(site.node, site.imports), site.function, site.imports)
    eps = _eps(found[0], site.imports) if found is not None else None
    if eps is None:
        return "the epsilon could not be read from the normalising step"
    weights = _self_attributes(function, exclude=code_of(eps))
    added = {code_of(n) for n in _added_attributes(function)}
    scale = [w for w in weights if w not in added]
    shift = [w for w in weights if w in added]
    if len(scale) > 1 or len(shift) > 1 or (kind == "RMSNorm" and shift):
        return "the norm's learned scale and shift could not be told apart"
    if any(w.removeprefix("self.") not in flat for w in scale + shift):
        return "the norm's learned scale or shift is not a parameter of the normalised shape that multiplies or adds"
    statements = list(function.body.body)
    if statements and _is_docstring(statements[0]):
        statements = statements[1:]
    last = statements[-1] if statements else None
    if not all(isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 for s in statements) or \
            not isinstance(last.body[0], cst.Return):
        return f"`{function.name.value}` does more than plain statements ending in a return"
    others = sorted({name for n in all_nodes(function.body) if isinstance(n, cst.Call)
                     and (name := call_parts(n)[0]) not in _NORM_STEPS})
    if others:
        return f"`{function.name.value}` computes more than the norm (it calls {', '.join(others)})"
    callee, imports = site.imports.functional_call("rms_norm" if kind == "RMSNorm" else "layer_norm")
    call = _norm_call(callee, kind, cst.Name(x), scale[0] if scale else None, shift[0] if shift else None,
                      code_of(eps), dims=dims, line=(site.indent + "return ", _comment(last)))
    new = cst.Return(value=cst.parse_expression(call), whitespace_after_return=cst.SimpleWhitespace(" "))
    return Rewrite(last.body[0], new, f"{kind} by hand → {one_line(new.value)}", removed=tuple(statements[:-1]),
                   imports=imports)


# What a method that is only a norm calls: the statistics, the root, arithmetic and casts.
_NORM_STEPS = frozenset({
    "mean", "var", "var_mean", "std", "std_mean", "pow", "square", "add", "sub", "mul", "div", "rsqrt", "sqrt",
    "reciprocal", "float", "double", "half", "bfloat16", "to", "type", "type_as",
})


def _inline_norm(site: FixSite, kind: str, channel: int | None, dims: int) -> Rewrite | str:
    """`x * rsqrt(mean(x²) + eps)` or `(x - mean) / sqrt(var + eps)` inside a larger function → the library call
    without weight (what the code multiplies and adds after it stays, as does a factor of the numerator such as
    `self.scale * x / sqrt(...)`); the statistics' statements go when nothing else reads them."""
    node = site.node
    step = _as_operation(node, site.imports)
    if not isinstance(step, cst.BinaryOperation) or not isinstance(step.operator, (cst.Multiply, cst.Divide)):
        return "the normalising step is not one product or quotient graphlint can rewrite"
    found = _root(step, site.function, site.imports)
    if found is None:
        return "the root of the statistic is not a factor of the normalising step"
    root, numerator = found
    eps = _eps(root, site.imports)
    if eps is None:
        return "the epsilon could not be read from the normalising step"
    factors = _factors(numerator)
    if kind == "LayerNorm":
        centred = [f for f in factors if _is_difference(_as_operation(_value_of(f, site.function), site.imports))]
        if len(centred) != 1:
            return "the centred input is not written as `x - mean` in the normalising step"
        x = _bare(_as_operation(_value_of(centred[0], site.function), site.imports).left)
        if isinstance(centred[0], cst.Name) and not _same_here(x, site.function):
            return "the centred input is computed from a value that changes before the normalising step"
    else:
        plain = [f for f in factors if not _is_number(f) and not _is_self_attribute(f)]
        if len(plain) != 1:
            return "the normalised input could not be told apart from the factors multiplying it"
        centred = plain
        x = _bare(plain[0])
    callee, imports = site.imports.functional_call("rms_norm" if kind == "RMSNorm" else "layer_norm")
    line = _line_of(site, node) if len(factors) == 1 else None
    call = cst.parse_expression(_norm_call(callee, kind, x, None, None, code_of(eps), channel, dims, line))
    new = call if len(factors) == 1 else numerator.deep_replace(centred[0], call)
    if new is not call:
        new = new.with_changes(lpar=list(node.lpar), rpar=list(node.rpar))
    return Rewrite(node, new, f"{kind} by hand → {one_line(call)}", removed=_dead_around(site.function, node, new),
                   imports=imports)


def _innermost_block(function: cst.FunctionDef, node: cst.CSTNode) -> cst.IndentedBlock | None:
    """The innermost indented block of `function` that contains `node`."""
    found: list[cst.IndentedBlock] = []

    class _Blocks(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.open: list[cst.IndentedBlock] = []

        def visit_IndentedBlock(self, block: cst.IndentedBlock) -> None:
            self.open.append(block)

        def leave_IndentedBlock(self, block: cst.IndentedBlock) -> None:
            self.open.pop()

        def on_visit(self, visited: cst.CSTNode) -> bool:
            if visited is node and self.open:
                found.append(self.open[-1])
            return super().on_visit(visited)

    function.visit(_Blocks())
    return found[0] if found else None


def _dead_around(function: cst.FunctionDef | None, old: cst.CSTNode, new: cst.CSTNode) -> tuple:
    """`dead_definitions`, also in the block the rewrite is in when that is nested (ConvNeXt's norm under
    `elif self.data_format == "channels_first":`), where a statement goes only when nothing else in the whole
    function reads the name it sets."""
    removed = dead_definitions(function, old, new)
    block = _innermost_block(function, old) if function is not None else None
    if block is None or block is function.body:
        return removed
    nested = dead_definitions(function.with_changes(body=block), old, new)
    inside = {id(n) for part in (old, *nested) for n in names_read(part)}
    read = {n.value for n in names_read(function) if id(n) not in inside}
    return removed + tuple(s for s in nested if s.body[0].targets[0].target.value not in read)


def _as_operation(node: cst.CSTNode, imports: ImportNames) -> cst.CSTNode:
    """`a * b` for `a.mul(b)` or `torch.mul(a, b)` (and `div`, `sub`, `add` alike), to read method-style
    arithmetic as the operators; any other node as it is."""
    operators = {"mul": cst.Multiply, "div": cst.Divide, "sub": cst.Subtract, "add": cst.Add}
    name, receiver, positional, keywords = call_parts(node)
    if name not in operators or keywords:
        return node
    operands = positional if is_namespace(receiver, imports) else [receiver, *positional]
    if len(operands) != 2:
        return node
    return cst.BinaryOperation(left=atom(operands[0]), operator=operators[name](), right=atom(operands[1]))


def _root(node: cst.CSTNode, function: cst.FunctionDef | None, imports: ImportNames):
    """(what the root is taken of, with the variables the function assigns once written out; the numerator) of a
    normalising step: `y / sqrt(s)`, `y / s ** 0.5`, `y * rsqrt(s)`, `y * s ** -0.5`, `y * (1 / sqrt(s))`,
    `y * sqrt(s).reciprocal()`, either order for a product; None otherwise."""
    if not isinstance(node, cst.BinaryOperation):
        return None
    if isinstance(node.operator, cst.Divide):
        inside = _root_of(_expanded(node.right, function), 0.5, imports)
        return (inside, node.left) if inside is not None else None
    if not isinstance(node.operator, cst.Multiply):
        return None
    for side, other in ((node.right, node.left), (node.left, node.right)):
        root = _bare(_expanded(side, function))
        inside = _root_of(root, -0.5, imports)
        if inside is None and isinstance(root, cst.BinaryOperation) and isinstance(root.operator, cst.Divide) and \
                _is_number(root.left, 1):
            inside = _root_of(_bare(root.right), 0.5, imports)
        if inside is None and call_parts(root)[0] == "reciprocal":
            inside = _root_of(_bare(call_parts(root)[1]), 0.5, imports)
        if inside is not None:
            return inside, other
    return None


def _root_of(node: cst.BaseExpression, exponent: float, imports: ImportNames) -> cst.BaseExpression | None:
    """s of `sqrt(s)`, `s.sqrt()`, `s ** 0.5` or `s.pow(0.5)` (exponent 0.5); of `rsqrt(s)`, `s ** -0.5`...
    (exponent -0.5); None otherwise."""
    node = _bare(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        return node.left if _is_number(node.right, exponent) else None
    inside = _input_of(node, ("sqrt",) if exponent > 0 else ("rsqrt",), imports)
    if inside is not None:
        return inside
    name, receiver, positional, keywords = call_parts(node)
    if name == "pow":
        power = keywords.get("exponent")
        if is_namespace(receiver, imports):
            base, power = (positional[0] if positional else None), (positional[1] if len(positional) > 1 else power)
        else:
            base, power = receiver, (positional[0] if positional else power)
        if base is not None and power is not None and _is_number(power, exponent):
            return base
    return None


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` without its own parentheses."""
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def _expanded(node: cst.BaseExpression, function: cst.FunctionDef | None, depth: int = 3) -> cst.BaseExpression:
    """`node` with each variable that the function assigns once replaced by what it is assigned, in parentheses
    (`rms` of `x * rms` becomes `(1 / torch.sqrt(ms + eps))`), for reading a formula spread over statements."""
    if function is None or depth == 0:
        return node
    replacements = {}
    for name in names_read(node):
        value = _assigned_once(function, name.value)
        if value is not None and name.value not in {n.value for n in names_read(value)}:
            replacements[name] = atom(value)
    if not replacements:
        return node
    if node in replacements:
        return _expanded(replacements[node], function, depth - 1)

    class _Swap(cst.CSTTransformer):
        def on_leave(self, original, updated):
            return replacements.get(original, updated)

    return _expanded(node.visit(_Swap()), function, depth - 1)


def _value_of(node: cst.BaseExpression, function: cst.FunctionDef | None) -> cst.BaseExpression:
    """What a variable the function assigns once holds (`xc` of `xc = x - mu`), else `node`; without parentheses."""
    if isinstance(node, cst.Name):
        node = _assigned_once(function, node.value) or node
    return _bare(node)


def _same_here(x: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
    """Whether `x`, read from a variable's assignment, means the same where the variable is read: every variable
    it reads is assigned at most once."""
    return all(_assigned_once(function, n.value) is not None or _never_assigned(function, n.value) for n in names_read(x))


def _never_assigned(function: cst.FunctionDef | None, name: str) -> bool:
    if function is None:
        return False
    return not any(isinstance(n, cst.AssignTarget) and name in {m.value for m in names_read(n.target)}
                   for n in all_nodes(function.body))


def _is_difference(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract)


def _is_self_attribute(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and code_of(node.value) == "self"


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr) and \
        isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _eps(inside: cst.BaseExpression, imports: ImportNames) -> cst.BaseExpression | None:
    """`self.eps` of `variance + self.eps` (or `variance.add(self.eps)`), what the root is taken of: the number,
    attribute of self or plain name added to the statistic."""
    inside = _bare(inside)
    name, receiver, positional, keywords = call_parts(inside)
    if name == "add" and not keywords:
        sides = positional[:2] if is_namespace(receiver, imports) else [receiver, *positional[:1]]
    elif isinstance(inside, cst.BinaryOperation) and isinstance(inside.operator, cst.Add):
        sides = [inside.right, inside.left]
    else:
        return None
    for kinds in ((lambda side: _is_number(side) or _is_self_attribute(side)), (lambda side: isinstance(side, cst.Name))):
        found = [side for side in sides if kinds(side)]
        if found:
            return found[0] if len(found) == 1 else None
    return None


def _self_attributes(function: cst.FunctionDef, exclude: str) -> list[str]:
    found: list[str] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            text = code_of(node)
            if code_of(node.value) == "self" and text != exclude and text not in found:
                found.append(text)
            return True

    function.body.visit(_Visitor())
    return found


def _added_attributes(function: cst.FunctionDef) -> list[cst.Attribute]:
    found: list[cst.Attribute] = []

    class _Visitor(cst.CSTVisitor):
        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            if isinstance(node.operator, cst.Add):
                found.extend(s for s in (node.left, node.right)
                             if isinstance(s, cst.Attribute) and code_of(s.value) == "self")

    function.body.visit(_Visitor())
    return found


# -- GL105 ----------------------------------------------------------------------------------------------------

def without_bias(site: FixSite) -> Rewrite | str:
    """`bias=False` on the layer's construction call."""
    node = site.node
    if not isinstance(node, cst.Call):
        return "the layer is not built by a call on this line"
    args = list(node.args)
    for index, argument in enumerate(args):
        if argument.keyword is not None and argument.keyword.value == "bias":
            args[index] = argument.with_changes(value=cst.Name("False"))
            break
    else:
        if any(a.star for a in args):
            return "the layer is built with *args or **kwargs, which may already pass bias"
        if len([a for a in args if a.keyword is None]) >= (3 if call_parts(node)[0] == "Linear" else 8):
            return "bias is passed by position"
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(value=cst.Name("False"), keyword=cst.Name("bias"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
    new = node.with_changes(args=args)
    # Removing the bias removes its entry from the state dict: existing checkpoints would not load strictly.
    return Rewrite(node, new, f"{code_of(node)} → {code_of(new)}; the state dict loses the layer's bias",
                   applicability=UNSAFE)
