"""What a rule's fix is: a function from the libcst node at a finding's span to the node that replaces it.

A rule attaches such a function to a `Problem` (`Problem.fix`); locate calls it on the node it found for
the finding and turns the answer into text edits (`graphlint.results.Edit`). A rule that cannot express the
rewrite exactly returns a reason instead, and the finding says why it was left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import libcst as cst


@dataclass(frozen=True)
class FixSite:
    """The located expression, and the small statement it is or that consists of it (`x.mul_(2)` on its
    own line, `x *= 2`), or None when the expression is part of a larger statement; the function and class
    around it and the whole module, for rewrites that read or change more than the one expression."""

    node: cst.CSTNode
    statement: cst.BaseSmallStatement | None
    function: cst.FunctionDef | None = None
    classdef: cst.ClassDef | None = None
    module: cst.Module | None = None
    indent: str = ""  # the leading whitespace of the expression's first line, for rewrites over several lines


@dataclass(frozen=True)
class Rewrite:
    """Replace `old` (the site's node, its statement, or a node inside them) by `new`."""

    old: cst.CSTNode
    new: cst.CSTNode
    message: str  # what the fix does, in the user's terms: "x *= 2 → x = x * 2"
    # Further statements the rewrite makes unnecessary: whole lines (`cst.SimpleStatementLine`) to delete.
    removed: tuple[cst.SimpleStatementLine, ...] = ()


# A rule's fix: a Rewrite, or a one-line reason why this occurrence is left alone.
Fixer = Callable[[FixSite], "Rewrite | str"]


# Expressions that need no parentheses as an operand, a receiver or after a unary operator.
ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString)
# Receivers whose functions take the tensor as their first argument: `torch.log(x)`, `F.softmax(x, -1)`.
_NAMESPACES = ("torch", "F", "functional", "torch.special")


def code_of(node: cst.CSTNode) -> str:
    """The source text of a libcst node, as it would be written in a module."""
    return cst.Module(body=[]).code_for_node(node)


def atom(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node`, in parentheses unless it is an atom or has them already."""
    if isinstance(node, ATOMS) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def call_parts(node: cst.CSTNode) -> tuple[str | None, cst.BaseExpression | None, list[cst.BaseExpression], dict]:
    """(the called name, its receiver or None, positional arguments, keyword arguments) of a call;
    (None, None, [], {}) for anything else."""
    if not isinstance(node, cst.Call):
        return None, None, [], {}
    positional = [a.value for a in node.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    if isinstance(node.func, cst.Attribute):
        return node.func.attr.value, node.func.value, positional, keywords
    if isinstance(node.func, cst.Name):
        return node.func.value, None, positional, keywords
    return None, None, positional, keywords


def is_namespace(receiver: cst.BaseExpression | None) -> bool:
    """Whether a call on `receiver` takes its tensor first (`torch.`, `F.`, a bare name) rather than being a
    method of the tensor (`x.softmax(-1)`)."""
    if receiver is None:
        return True
    text = code_of(receiver)
    return text in _NAMESPACES or text.endswith(".functional")


def functional_name(module: cst.Module | None, name: str) -> str:
    """How `module` can call torch.nn.functional's `name`: through its alias of torch.nn.functional
    (`import torch.nn.functional as F`, `from torch.nn import functional`), else through `torch.nn.functional`."""
    for statement in module.body if module is not None else ():
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if code_of(alias.name) == "torch.nn.functional" and alias.asname is not None:
                        return f"{code_of(alias.asname.name)}.{name}"
            if isinstance(small, cst.ImportFrom) and small.module is not None and \
                    code_of(small.module) == "torch.nn" and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if code_of(alias.name) == "functional":
                        prefix = code_of(alias.asname.name) if alias.asname is not None else "functional"
                        return f"{prefix}.{name}"
    return f"torch.nn.functional.{name}"


def names_read(node: cst.CSTNode) -> list[cst.Name]:
    """The variable names in `node`: not attribute names (`mask` of `self.mask`) nor keyword names."""
    found: list[cst.Name] = []

    class _Collector(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False

        def visit_Arg(self, argument: cst.Arg) -> bool:
            argument.value.visit(self)
            return False

    node.visit(_Collector())
    return found


def dead_definitions(function: cst.FunctionDef | None, old: cst.CSTNode, new: cst.CSTNode) -> tuple:
    """The statements `name = ...` of `function` whose only reader was `old` and that `new` no longer reads:
    the `inner = ...` of a formula the rewrite replaced by one call."""
    if function is None:
        return ()
    kept = {n.value for n in names_read(new)}
    inside = {id(n) for n in names_read(old)}
    candidates = {n.value for n in names_read(old)} - kept
    removed = []
    for statement in function.body.body:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            continue
        small = statement.body[0]
        if not isinstance(small, cst.Assign) or len(small.targets) != 1 or \
                not isinstance(small.targets[0].target, cst.Name) or small.targets[0].target.value not in candidates:
            continue
        name = small.targets[0].target
        others = [n for n in names_read(function) if n.value == name.value and n is not name and id(n) not in inside]
        if not others:
            removed.append(statement)
    return tuple(removed)
