"""GL107's fix: an activation written as its formula (`x * torch.sigmoid(x)`, the tanh GELU, a softmax from
`exp`) replaced by the library call on the same input. What the formula computes was established on the graph by
the rule; the rewrite only finds its input in the source, and is proven on the model before `--fix` writes it."""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.formulas import (calls_any, factors_of, holds, input_of, is_difference, unparenthesized,
                                        value_of, without_parentheses)
from graphlint.rewrite.contract import (FixSite, ImportNames, Rewrite, call_parts, code_of, dead_definitions, is_namespace,
                                        one_line)
from graphlint.rewrite.source import is_number


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
    return Rewrite(*without_parentheses(site, node, new), f"{one_line(node)} → {code_of(new)}",
                   removed=dead_definitions(site.function, node, new), imports=imports)


def _formula_input(node: cst.CSTNode, library: str, site: FixSite):
    """The formula's input `x` as the user wrote it ((x, dim) for the softmax), or why it cannot be read. With the
    rule's match, the sigmoid, tanh or exp it is built on is the one the graph ran (GL107's `match.transcendental`),
    not any factor or numerator that calls one."""
    imports, function = site.imports, site.function
    if not isinstance(node, cst.BinaryOperation):
        return "the formula is not one expression graphlint can rewrite"
    matched = site.match.transcendental
    core = matched.node if matched is not None else None  # None: it ran in no file of the user's
    if library == "torch.softmax(x, dim)":
        return _softmax_input(node, site, core)
    if library == "F.silu(x)" and isinstance(node.operator, cst.Divide):
        return _swish_input(node, imports, core)
    factors = factors_of(node, function)
    if library in ("F.silu(x)", "F.mish(x)"):
        inner = ("sigmoid",) if library == "F.silu(x)" else ("tanh",)
        for index, factor in enumerate(factors):
            if core is not None and not holds(factor, core, function):
                continue
            argument = input_of(factor, inner, imports)
            if argument is None:
                continue
            if library == "F.mish(x)":
                argument = _softplus_input(argument, imports)
            others = factors[:index] + factors[index + 1:]
            if argument is not None and len(others) == 1 and code_of(others[0]) == code_of(argument):
                return argument
        return "the formula's input is not written the same way on both sides"
    # GELU: 0.5 * x * (1 + core) in any order of the factors, `/ 2` for the half, the cdf in a variable.
    candidates = [f for f in factors if not is_number(f) and not calls_any(f, ("tanh", "erf"))]
    if len(candidates) == 2:  # x * cdf(x), the cumulative distribution in a helper function the graph went through
        candidates = [c for c, other in zip(candidates, candidates[::-1], strict=True) if _helper_of(other, c) is not None]
    if len(candidates) == 1 and len(factors) >= 2:
        x = candidates[0]
        return unparenthesized(x)
    return "the formula's input could not be told apart from its constants"


def _swish_input(node: cst.BinaryOperation, imports: ImportNames, core: cst.CSTNode | None):
    """x of `x / (1 + torch.exp(-x))`, the exp being `core` when the graph's is known, or why it cannot be read."""
    total = unparenthesized(node.right)
    if isinstance(total, cst.BinaryOperation) and isinstance(total.operator, cst.Add):
        for one, other in ((total.left, total.right), (total.right, total.left)):
            if core is not None and other is not core:
                continue
            negated = input_of(other, ("exp",), imports) if is_number(one, (1,)) else None
            if isinstance(negated, cst.UnaryOperation) and isinstance(negated.operator, cst.Minus) and \
                    code_of(unparenthesized(negated.expression)) == code_of(unparenthesized(node.left)):
                return unparenthesized(node.left)
    return "the formula's input is not written the same way on both sides"


def _softplus_input(node: cst.BaseExpression, imports: ImportNames) -> cst.BaseExpression | None:
    """x of `F.softplus(x)`, `torch.log1p(torch.exp(x))` or `torch.log(1 + torch.exp(x))`; None otherwise."""
    found = input_of(node, ("softplus",), imports)
    if found is None and (inside := input_of(node, ("log1p",), imports)) is not None:
        found = input_of(inside, ("exp",), imports)
    if found is None and (inside := input_of(node, ("log",), imports)) is not None:
        inside = unparenthesized(inside)
        if isinstance(inside, cst.BinaryOperation) and isinstance(inside.operator, cst.Add):
            for one, other in ((inside.left, inside.right), (inside.right, inside.left)):
                if is_number(one, (1,)) and (found := input_of(other, ("exp",), imports)) is not None:
                    break
    return found


def _helper_of(call: cst.BaseExpression, x: cst.BaseExpression) -> cst.Call | None:
    """`call` when it is a plain function called on `x` alone (`cdf(x)`), else None."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and len(call.args) == 1 and \
            call.args[0].keyword is None and not call.args[0].star and code_of(call.args[0].value) == code_of(x):
        return call
    return None


def _softmax_input(node: cst.BinaryOperation, site: FixSite, core: cst.CSTNode | None):
    """(x, dim argument) of `torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)`, also with the exponentials in a
    variable the function assigns once (`e = torch.exp(x - x.max(-1, keepdim=True).values)`, `e / e.sum(-1, ...)`);
    the numerator's exp is `core` when the graph's is known."""
    imports, function = site.imports, site.function
    numerator = node.left
    if core is not None and not holds(numerator, core, function):
        return "the exponentials are not divided by their own sum in one expression"
    exponentials = value_of(numerator, function)
    x = input_of(exponentials, ("exp",), imports)
    name, receiver, positional, keywords = call_parts(node.right)
    summed = positional[0] if is_namespace(receiver, imports) and positional else receiver
    rest = positional[1:] if is_namespace(receiver, imports) else positional
    dim = rest[0] if rest else keywords.get("dim")
    if x is None or name != "sum" or summed is None or dim is None or not isinstance(node.operator, cst.Divide) or \
            code_of(value_of(summed, function)) != code_of(exponentials):
        return "the exponentials are not divided by their own sum in one expression"
    bare = unparenthesized(x)
    if is_difference(bare) and _is_max_of(bare.right, bare.left, dim, imports):
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
