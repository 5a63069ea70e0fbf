"""What a rule's fix is: a function from the libcst node at a finding's span to the node that replaces it.

A rule attaches such a function to a `Problem` (`Problem.fix`); locate calls it on the node it found for
the finding and turns the answer into text edits (`graphlint.results.Edit`). A rule that cannot express the
rewrite exactly returns a reason instead, and the finding says why it was left alone.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import TYPE_CHECKING
from collections.abc import Callable

import libcst as cst

if TYPE_CHECKING:
    from graphlint.rule import Match


@dataclass(frozen=True)
class Role:
    """One node a rule matched, as the libcst node it ran at: `name` is the rule's role ("scores", "values"),
    `function` the function around it, `module` the parsed file it is in (another file than the finding's
    when the pattern spans the project's files)."""

    name: str
    node: cst.CSTNode
    function: cst.FunctionDef | None
    module: cst.Module


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
    roles: tuple[Role, ...] = ()  # what the rule matched, resolved to source (graphlint.rule.Problem.roles)
    # What the rule matched, typed (graphlint.rule.Problem.match), each node a Role; None when it gave none.
    match: Match | None = None

    def role(self, name: str) -> tuple[Role, ...]:
        """The matched nodes of one role, in the order the rule gave them (the older, untyped form of `match`)."""
        return tuple(r for r in self.roles if r.name == name)

    @cached_property
    def imports(self) -> ImportNames:
        """How the module spells torch and torch.nn.functional."""
        return ImportNames.of(self.module)


@dataclass(frozen=True)
class Rewrite:
    """Replace `old` (the site's node, its statement, or a node inside them) by `new`."""

    old: cst.CSTNode
    new: cst.CSTNode
    message: str  # what the fix does, in the user's terms: "x *= 2 → x = x * 2"
    # Further statements the rewrite makes unnecessary: whole statements (lines, or an `if` block) to delete.
    removed: tuple[cst.BaseStatement, ...] = ()
    imports: tuple[str, ...] = ()  # import statements the new code needs that the module lacks
    also: tuple[tuple[cst.CSTNode, cst.CSTNode], ...] = ()  # further (old, new) replacements elsewhere
    applicability: str = "safe"  # results.SAFE, UNSAFE or DISPLAY_ONLY, declared by the fixer
    # New statements, each the code of one line put before a statement and indented like it: `logits = f(x)`.
    inserted: tuple[tuple[cst.BaseStatement, str], ...] = ()


# A rule's fix: a Rewrite, or a one-line reason why this occurrence is left alone.
Fixer = Callable[[FixSite], "Rewrite | str"]


class Refused(Exception):
    """Raised deep inside a fixer's reading when the rewrite cannot be exact; the message says why, in the user's
    terms, and the fixer returns it as its reason."""


# libcst's matchers are imported in the functions that match, not with this module: locating any finding imports
# this module, and the matchers cost about 0.2 s to import, which only a fix's rewriting needs.
@cache
def absolute_import_from():
    """The matcher of `from x import y`, not `from . import y` nor `from x import *`: the imports that bind a name
    graphlint can name."""
    import libcst.matchers as m

    return m.ImportFrom(module=m.DoesNotMatch(None), relative=[], names=m.DoesNotMatch(m.ImportStar()))


# Expressions that need no parentheses as an operand, a receiver or after a unary operator.
ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString)
# Receivers whose functions take the tensor first, when the module's imports are not known.
_NAMESPACES = ("torch", "F", "functional", "torch.special")


def code_of(node: cst.CSTNode) -> str:
    """The source text of a libcst node, as it would be written in a module."""
    return cst.Module(body=[]).code_for_node(node)


def atom(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node`, in parentheses unless it is an atom or has them already."""
    if isinstance(node, ATOMS) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


LINE_LENGTH = 88  # as ruff and black format by default: a longer call is split as they would split it


def laid_out(parts: list[str], indent: str, whole_line: int) -> str:
    """A call's arguments as a formatter writes them, given how long the line would be with the call on it:
    on that line when it fits, else on one indented line of their own, else one a line with a trailing comma."""
    inside = ", ".join(parts)
    if whole_line <= LINE_LENGTH:
        return inside
    if len(indent) + 4 + len(inside) <= LINE_LENGTH:
        return f"\n{indent}    {inside}\n{indent}"
    return "\n" + "".join(f"{indent}    {part},\n" for part in parts) + indent


def one_line(node: cst.CSTNode) -> str:
    """A node's code on one line, for a fix's message: `f(\n    x\n)` is `f(x)`."""
    code = " ".join(code_of(node).split())
    return code.replace("( ", "(").replace(", )", ")").replace(" )", ")")


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


def is_namespace(receiver: cst.BaseExpression | None, imports: ImportNames | None = None) -> bool:
    """Whether a call on `receiver` takes its tensor first (`torch.`, `F.`, `th.`, a bare name) rather than
    being a method of the tensor (`x.softmax(-1)`); `imports` says how the module spells torch."""
    if receiver is None:
        return True
    text = code_of(receiver)
    if imports is not None:
        return text in imports.namespaces
    return text in _NAMESPACES or text.endswith(".functional")


@dataclass(frozen=True)
class ImportNames:
    """How one module spells torch (`import torch as th`), torch.nn (`from torch import nn`) and
    torch.nn.functional (`import torch.nn.functional as F`), so that rewrites use the file's own names and add an
    import only when the module has none."""

    torch: tuple[str, ...] = ()
    nn: tuple[str, ...] = ()
    functional: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # every name an `import x` or `import x as y` binds: namespaces of calls
    bound: frozenset[str] = field(default_factory=frozenset)  # every name the module uses or binds

    @classmethod
    def of(cls, module: cst.Module | None) -> ImportNames:
        import libcst.matchers as m

        if module is None:
            return cls(("torch",), (), ("F",), ("torch", "F"), frozenset())
        torch, nn, functional, modules = [], [], [], []

        def add(found: list, name: str) -> None:
            if name not in found:
                found.append(name)

        names = set()
        for node in m.findall(module, m.Name() | m.Import() | absolute_import_from()):
            if isinstance(node, cst.Name):
                names.add(node.value)
                continue
            for alias in node.names:
                name = code_of(alias.name)
                asname = code_of(alias.asname.name) if alias.asname is not None else None
                if isinstance(node, cst.ImportFrom):
                    imported = (code_of(node.module), name)
                    if imported == ("torch", "nn"):
                        add(nn, asname or name)
                    elif imported in (("torch.nn", "functional"), ("torch", "functional")):
                        add(functional, asname or name)
                    continue
                add(modules, asname or name.split(".")[0])
                if asname is None:
                    if name.split(".")[0] == "torch":
                        add(torch, "torch")
                elif name == "torch":
                    add(torch, asname)
                elif name == "torch.nn":
                    add(nn, asname)
                elif name == "torch.nn.functional":
                    add(functional, asname)
        return cls(tuple(sorted(torch, key=lambda n: n != "torch")), tuple(nn),
                   tuple(sorted(functional, key=lambda n: n != "F")), tuple(modules), frozenset(names))

    @property
    def namespaces(self) -> frozenset[str]:
        """Receivers whose functions take the tensor first."""
        found = set(self.modules) | set(self.functional)
        for alias in self.torch:
            found |= {alias, f"{alias}.special", f"{alias}.linalg", f"{alias}.nn.functional", f"{alias}.fft"}
        found |= {f"{alias}.functional" for alias in self.nn}
        return frozenset(found)

    def functional_call(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(how the module calls torch.nn.functional's `name`, the import it needs first, if any)."""
        if self.functional:
            return f"{self.functional[0]}.{name}", ()
        if self.nn:
            return f"{self.nn[0]}.functional.{name}", ()
        if self.torch:
            return f"{self.torch[0]}.nn.functional.{name}", ()
        if "F" not in self.bound:
            return f"F.{name}", ("import torch.nn.functional as F",)
        return f"torch.nn.functional.{name}", ("import torch",)

    def torch_call(self, name: str) -> tuple[str, tuple[str, ...]]:
        """(how the module calls `torch.<name>`, the import it needs first, if any)."""
        if self.torch:
            return f"{self.torch[0]}.{name}", ()
        return f"torch.{name}", ("import torch",)

    def as_torch(self, text: str) -> str:
        """`text` with the module's alias of torch spelled `torch` (`-th.inf` → `-torch.inf`), for comparisons."""
        for alias in self.torch:
            if alias != "torch":
                text = re.sub(rf"(?<![\w.]){re.escape(alias)}\.", "torch.", text)
        return text


def names_read(node: cst.CSTNode) -> list[cst.Name]:
    """The variable names in `node`: not attribute names (`mask` of `self.mask`) nor keyword names."""
    import libcst.matchers as m

    found: list[cst.Name] = []
    others: set[int] = set()  # the attributes and keywords met so far: source order puts them after their owner
    for name in m.findall(node, m.Name() | m.Attribute() | m.Arg(keyword=m.Name())):
        if isinstance(name, cst.Attribute):
            others.add(id(name.attr))
        elif isinstance(name, cst.Arg):
            others.add(id(name.keyword))
        elif id(name) not in others:
            found.append(name)
    return found


def dead_definitions(function: cst.FunctionDef | None, old: cst.CSTNode | tuple, new: cst.CSTNode) -> tuple:
    """The statements `name = ...` of `function` whose only readers were `old` (a node, or several the rewrite
    removes) and other such statements, and that `new` no longer reads: the `inner = ...` of a formula the
    rewrite replaced by one call, and the `mu = ...` that only that `inner` read."""
    import libcst.matchers as m

    if function is None:
        return ()
    kept = {n.value for n in names_read(new)}
    olds = old if isinstance(old, tuple) else (old,)
    inside = {id(n) for part in olds for n in names_read(part)}
    candidates = {n.value for part in olds for n in names_read(part)} - kept
    removed: list = []
    assigned = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name(m.MatchIfTrue(
        lambda name: name in candidates)))])])  # `name = ...` alone on its line, of a name still a candidate
    changed = True
    while changed:
        changed = False
        for statement in function.body.body:
            if statement in removed or not m.matches(statement, assigned):
                continue
            small = statement.body[0]
            name = small.targets[0].target
            others = [n for n in names_read(function) if n.value == name.value and n is not name and id(n) not in inside]
            if not others:
                removed.append(statement)
                inside |= {id(n) for n in names_read(small.value)}
                candidates |= {n.value for n in names_read(small.value)} - kept
                changed = True
    return tuple(s for s in function.body.body if s in removed)
