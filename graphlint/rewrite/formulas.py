"""Reading a formula written by hand, shared by the fixes that put a library call in its place (GL106, GL107,
GL204): the input of `torch.<name>(x)` in any spelling, its factors, a variable's one value, a formula's
parentheses."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.contract import FixSite, ImportNames, call_parts, code_of, is_namespace, names_read
from graphlint.rewrite.source import all_nodes, is_number


def input_of(node: cst.CSTNode, names: tuple[str, ...], imports: ImportNames) -> cst.BaseExpression | None:
    """`x` of `torch.<name>(x)`, `F.<name>(x)` or `x.<name>()`, for one of `names`."""
    name, receiver, positional, _ = call_parts(node)
    if name not in names:
        return None
    if is_namespace(receiver, imports):
        return positional[0] if positional else None
    return receiver


def without_parentheses(site: FixSite, node: cst.CSTNode, new: cst.CSTNode) -> tuple[cst.CSTNode, cst.CSTNode]:
    """(what to replace, by what): a formula a formatter wrapped in parentheses over several lines (`return (`,
    the formula, `)`) is replaced with its parentheses when it is the statement's whole value and the call
    needs none; else just the formula."""
    if getattr(node, "lpar", None) and not getattr(new, "lpar", None) and isinstance(new, cst.Call) and \
            site.function is not None:
        for statement in all_nodes(site.function):
            if isinstance(statement, (cst.Assign, cst.Return)) and statement.value is node:
                return statement, statement.with_changes(value=new)
    return node, new


def calls_any(node: cst.CSTNode, names: tuple[str, ...]) -> bool:
    """Whether `node` calls one of `names` anywhere inside."""
    return any(call_parts(n)[0] in names for n in all_nodes(node) if isinstance(n, cst.Call))


def factors_of(node: cst.BaseExpression, function: cst.FunctionDef | None = None) -> list[cst.BaseExpression]:
    """The operands of a product, flattened: `0.5 * x * (1 + t)` is [0.5, x, (1 + t)]; a division by a number
    is a factor too (`x * (1 + t) / 2` is [x, (1 + t), 2]), and with `function`, a variable it assigns once to a
    product with a tanh or erf in it is read as what it holds (`x * cdf`)."""
    if function is not None and isinstance(node, cst.Name):
        value = assigned_once(function, node.value)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Multiply, cst.Divide)) and \
                calls_any(value, ("tanh", "erf")):
            return factors_of(value, function)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        bare = node.with_changes(lpar=[], rpar=[])
        return factors_of(bare.left, function) + factors_of(bare.right, function)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide) and is_number(node.right):
        return factors_of(node.with_changes(lpar=[], rpar=[]).left, function) + [node.right]
    return [node]


def assigned_once(function: cst.FunctionDef | None, name: str) -> cst.BaseExpression | None:
    """What `name = ...` sets, when the function assigns `name` once and every variable that expression reads
    at most once too (so it means the same where the log is)."""
    if function is None:
        return None
    assigned: dict[str, list[cst.BaseExpression | None]] = {}
    for node in m.findall(function, m.Assign() | m.AugAssign(target=m.Name()) | m.For()):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                for bound in names_read(target.target):  # a name bound by unpacking holds no one expression
                    assigned.setdefault(bound.value, []).append(node.value if isinstance(target.target, cst.Name) else None)
        else:  # an augmented assignment or a loop rebinds the name: it holds no one value
            for bound in names_read(node.target):
                assigned.setdefault(bound.value, []).extend([node.iter if isinstance(node, cst.For) else node.value] * 2)
    values = assigned.get(name, [])
    if len(values) != 1 or values[0] is None or any(len(assigned.get(n.value, [])) > 1 for n in names_read(values[0])):
        return None
    return values[0]


def holds(node: cst.BaseExpression, matched: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """Whether `node` reads `matched`, an expression the rule matched in the graph: it is that expression, or a
    variable the function assigns it to once and does not take as a parameter (a parameter assigned after it
    is read holds the caller's value where it is read)."""
    if node is matched:
        return True
    return isinstance(node, cst.Name) and held(node, function) is matched


def held(name: cst.Name, function: cst.FunctionDef | None) -> cst.BaseExpression | None:
    """What the variable `name` holds where it is read, when the function assigns it once and does not take it as
    a parameter (a parameter assigned after it is read holds the caller's value there); else None."""
    return None if _is_parameter(function, name.value) else assigned_once(function, name.value)


def _is_parameter(function: cst.FunctionDef | None, name: str) -> bool:
    if function is None:
        return False
    parameters = function.params
    every = (*parameters.posonly_params, *parameters.params, *parameters.kwonly_params,
             *(p for p in (parameters.star_arg, parameters.star_kwarg) if isinstance(p, cst.Param)))
    return any(p.name.value == name for p in every)


def unparenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` without its own parentheses."""
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def value_of(node: cst.BaseExpression, function: cst.FunctionDef | None) -> cst.BaseExpression:
    """What a variable the function assigns once holds (`xc` of `xc = x - mu`), else `node`; without parentheses."""
    if isinstance(node, cst.Name):
        node = assigned_once(function, node.value) or node
    return unparenthesized(node)


def is_difference(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract)


def is_self_attribute(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and code_of(node.value) == "self"
