"""GL106's fix: a LayerNorm or RMSNorm written by hand replaced by `F.layer_norm` / `F.rms_norm` with the module's
own weight, bias and eps: the whole method when it is only the norm, else the normalising expression in place.
Proven on the model before `--fix` writes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.formulas import (assigned_once, factors_of, held, input_of, is_difference, is_self_attribute,
                                        unparenthesized, value_of)
from graphlint.rewrite.contract import (FixSite, ImportNames, LINE_LENGTH, Rewrite, atom, call_parts, code_of,
                                        dead_definitions, is_namespace, laid_out, names_read, one_line)
from graphlint.rewrite.source import all_nodes, is_number, path_to

if TYPE_CHECKING:
    from graphlint.rewrite.contract import Role


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
    found = _root(_as_operation(site.node, site.imports), site.function, site.imports, _matched(site.match.root))
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
    found = _root(step, site.function, site.imports, _matched(site.match.root))
    if found is None:
        return "the root of the statistic is not a factor of the normalising step"
    root, numerator = found
    eps = _eps(root, site.imports)
    if eps is None:
        return "the epsilon could not be read from the normalising step"
    factors = factors_of(numerator)
    if kind == "LayerNorm":
        matched = _matched(site.match.centred)
        centred = [f for f in factors if is_difference(_as_operation(value_of(f, site.function), site.imports))
                   and (matched is None or _computes(f, matched, site.function))]
        if len(centred) != 1:
            return "the centred input is not written as `x - mean` in the normalising step"
        x = unparenthesized(_as_operation(value_of(centred[0], site.function), site.imports).left)
        if isinstance(centred[0], cst.Name) and not _same_here(x, site.function):
            return "the centred input is computed from a value that changes before the normalising step"
    else:
        plain = [f for f in factors if not is_number(f) and not is_self_attribute(f)]
        if len(plain) != 1:
            return "the normalised input could not be told apart from the factors multiplying it"
        centred = plain
        x = unparenthesized(plain[0])
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
    blocks = [n for n in (path_to(function, node) or [])[:-1] if isinstance(n, cst.IndentedBlock)]
    return blocks[-1] if blocks else None


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


def _matched(role: Role | None) -> cst.CSTNode | None:
    """The node of one of GL106's match (`site.match.root`) as it ran in the source; None when the rule matched
    none or it ran in no file of the user's."""
    return role.node if role is not None else None


def _computes(node: cst.BaseExpression, matched: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """Whether `node`, an operand of the normalising step, is `matched`, the expression the graph ran (also as
    read from method-style arithmetic, which puts a copy of it in parentheses), or a variable the function assigns
    it once and does not take as a parameter."""
    if node is matched or unparenthesized(node).deep_equals(unparenthesized(matched)):
        return True
    return isinstance(node, cst.Name) and held(node, function) is matched


def _leads_to_root(node: cst.BaseExpression, root: cst.CSTNode, function: cst.FunctionDef | None,
                   depth: int = 6) -> bool:
    """Whether `node`, an operand of the normalising step, computes `root`, the root the graph ran, or its
    reciprocal (`1 / root`, `root.reciprocal()`), reading the variables the function assigns once and does not
    take as parameters (a parameter rebound after the step holds the caller's value there)."""
    if _computes(node, root, function):
        return True
    if depth == 0:
        return False
    if isinstance(node, cst.Name):
        value = held(node, function)
        return value is not None and _leads_to_root(value, root, function, depth - 1)
    bare = unparenthesized(node)
    if isinstance(bare, cst.BinaryOperation) and isinstance(bare.operator, cst.Divide) and is_number(bare.left, (1,)):
        return _leads_to_root(bare.right, root, function, depth - 1)
    name, receiver, _, _ = call_parts(bare)
    return name == "reciprocal" and receiver is not None and _leads_to_root(receiver, root, function, depth - 1)


def _root(node: cst.CSTNode, function: cst.FunctionDef | None, imports: ImportNames, matched: cst.CSTNode | None = None):
    """(what the root is taken of, with the variables the function assigns once written out; the numerator) of a
    normalising step: `y / sqrt(s)`, `y / s ** 0.5`, `y * rsqrt(s)`, `y * s ** -0.5`, `y * (1 / sqrt(s))`,
    `y * sqrt(s).reciprocal()`, either order for a product; None otherwise. With `matched`, the root the graph ran
    (GL106's `match.root`), only an operand that computes it is read as the root."""
    if not isinstance(node, cst.BinaryOperation):
        return None
    if isinstance(node.operator, cst.Divide):
        if matched is not None and not _leads_to_root(node.right, matched, function):
            return None
        inside = _root_of(_expanded(node.right, function), 0.5, imports)
        return (inside, node.left) if inside is not None else None
    if not isinstance(node.operator, cst.Multiply):
        return None
    for side, other in ((node.right, node.left), (node.left, node.right)):
        if matched is not None and not _leads_to_root(side, matched, function):
            continue
        root = unparenthesized(_expanded(side, function))
        inside = _root_of(root, -0.5, imports)
        if inside is None and isinstance(root, cst.BinaryOperation) and isinstance(root.operator, cst.Divide) and \
                is_number(root.left, (1,)):
            inside = _root_of(unparenthesized(root.right), 0.5, imports)
        if inside is None and call_parts(root)[0] == "reciprocal":
            inside = _root_of(unparenthesized(call_parts(root)[1]), 0.5, imports)
        if inside is not None:
            return inside, other
    return None


def _root_of(node: cst.BaseExpression, exponent: float, imports: ImportNames) -> cst.BaseExpression | None:
    """s of `sqrt(s)`, `s.sqrt()`, `s ** 0.5` or `s.pow(0.5)` (exponent 0.5); of `rsqrt(s)`, `s ** -0.5`...
    (exponent -0.5); None otherwise."""
    node = unparenthesized(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        return node.left if is_number(node.right, (exponent,)) else None
    inside = input_of(node, ("sqrt",) if exponent > 0 else ("rsqrt",), imports)
    if inside is not None:
        return inside
    name, receiver, positional, keywords = call_parts(node)
    if name == "pow":
        power = keywords.get("exponent")
        if is_namespace(receiver, imports):
            base, power = (positional[0] if positional else None), (positional[1] if len(positional) > 1 else power)
        else:
            base, power = receiver, (positional[0] if positional else power)
        if base is not None and power is not None and is_number(power, (exponent,)):
            return base
    return None


def _expanded(node: cst.BaseExpression, function: cst.FunctionDef | None, depth: int = 3) -> cst.BaseExpression:
    """`node` with each variable that the function assigns once replaced by what it is assigned, in parentheses
    (`rms` of `x * rms` becomes `(1 / torch.sqrt(ms + eps))`), for reading a formula spread over statements."""
    if function is None or depth == 0:
        return node
    replacements = {}
    for name in names_read(node):
        value = assigned_once(function, name.value)
        if value is not None and name.value not in {n.value for n in names_read(value)}:
            replacements[name] = atom(value)
    if not replacements:
        return node
    if node in replacements:
        return _expanded(replacements[node], function, depth - 1)
    # Matched as the names read (by identity); a name's value depends only on its spelling.
    by_name = {name.value: value for name, value in replacements.items()}
    swapped = m.replace(node, m.MatchIfTrue(lambda n: n in replacements), lambda name, _: by_name[name.value])
    return _expanded(swapped, function, depth - 1)


def _same_here(x: cst.BaseExpression, function: cst.FunctionDef | None) -> bool:
    """Whether `x`, read from a variable's assignment, means the same where the variable is read: every variable
    it reads is assigned at most once."""
    return all(assigned_once(function, n.value) is not None or _never_assigned(function, n.value) for n in names_read(x))


def _never_assigned(function: cst.FunctionDef | None, name: str) -> bool:
    if function is None:
        return False
    return not any(isinstance(n, cst.AssignTarget) and name in {m.value for m in names_read(n.target)}
                   for n in all_nodes(function.body))


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr) and \
        isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _eps(inside: cst.BaseExpression, imports: ImportNames) -> cst.BaseExpression | None:
    """`self.eps` of `variance + self.eps` (or `variance.add(self.eps)`), what the root is taken of: the number,
    attribute of self or plain name added to the statistic."""
    inside = unparenthesized(inside)
    name, receiver, positional, keywords = call_parts(inside)
    if name == "add" and not keywords:
        sides = positional[:2] if is_namespace(receiver, imports) else [receiver, *positional[:1]]
    elif isinstance(inside, cst.BinaryOperation) and isinstance(inside.operator, cst.Add):
        sides = [inside.right, inside.left]
    else:
        return None
    for kinds in ((lambda side: is_number(side) or is_self_attribute(side)), (lambda side: isinstance(side, cst.Name))):
        found = [side for side in sides if kinds(side)]
        if found:
            return found[0] if len(found) == 1 else None
    return None


def _self_attributes(function: cst.FunctionDef, exclude: str) -> list[str]:
    """`self.x` read anywhere in the function's body, each once, in the order written, but `exclude`."""
    read = (code_of(n) for n in m.findall(function.body, m.Attribute(value=m.Name("self", lpar=[], rpar=[]))))
    return [text for text in dict.fromkeys(read) if text != exclude]


def _added_attributes(function: cst.FunctionDef) -> list[cst.Attribute]:
    """The `self.x` that a `+` of the function's body adds, either side."""
    self_attribute = m.Attribute(value=m.Name("self", lpar=[], rpar=[]))
    return [side for added in m.findall(function.body, m.BinaryOperation(operator=m.Add()))
            for side in (added.left, added.right) if m.matches(side, self_attribute)]
