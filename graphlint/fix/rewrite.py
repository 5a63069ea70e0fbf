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


def code_of(node: cst.CSTNode) -> str:
    """The source text of a libcst node, as it would be written in a module."""
    return cst.Module(body=[]).code_for_node(node)
