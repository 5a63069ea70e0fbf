"""Exact source spans with libcst: the `@` expression, the `.softmax(...)` call, the `nn.ReLU(inplace=True)`.

On Python 3.11+ a frame carries the position of the running instruction, and the span is the libcst node
with exactly that extent. Without positions (3.10), the node is searched on the frame's line by the op's
name (`matmul` finds `a @ b`, `torch.matmul(...)` and `.matmul(...)`). Every span lies inside the file, even
when the file changed after it ran; a file libcst cannot parse falls back to the whole line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from graphlint.files import read_source, split_lines
from graphlint.rewrite.edits import deleted_lines
from graphlint.rewrite.contract import Fixer, FixSite, Rewrite, Role, code_of
from graphlint.locate.lines import Span, chars, line_extent
from graphlint.locate.sites import Site
from graphlint.opnames import spellings
from graphlint.results import SAFE, UNSAFE, Edit, Fix

if TYPE_CHECKING:
    from graphlint.capture.modules import ModuleInfo
    from graphlint.rule import Match

# Ops that users write as operators rather than calls.
_BINARY = {
    "matmul": cst.MatrixMultiply, "mul": cst.Multiply, "div": cst.Divide,
    "add": cst.Add, "sub": cst.Subtract, "rsub": cst.Subtract, "pow": cst.Power,
    "floor_divide": cst.FloorDivide, "remainder": cst.Modulo,
}
_AUGMENTED = {
    "add_": cst.AddAssign, "sub_": cst.SubtractAssign, "mul_": cst.MultiplyAssign, "div_": cst.DivideAssign,
    "matmul_": cst.MatrixMultiplyAssign, "pow_": cst.PowerAssign,
}
# When several libcst nodes have the same extent, the one users think of as "the expression".
_PREFERENCE = (cst.Assign, cst.AugAssign, cst.Call, cst.BinaryOperation, cst.Subscript, cst.Attribute)


@dataclass
class _ParsedFile:
    lines: list[str]
    module: cst.Module | None = None
    positions: dict = field(default_factory=dict)  # libcst node -> CodeRange
    by_start: dict = field(default_factory=dict)  # (line, col) -> [node]
    by_end: dict = field(default_factory=dict)
    by_line: dict = field(default_factory=dict)  # start line -> [node], in source order
    statements: dict = field(default_factory=dict)  # (line, col) -> [small statement], for fixes


_INTERESTING: dict[type, bool] = {}
_INTERESTING_BASES = (cst.BaseExpression, cst.Assign, cst.AugAssign, cst.FunctionDef)


def _interesting(node: cst.CSTNode) -> bool:
    # Per node type, through the MRO: libcst's bases are ABCs, and isinstance against an ABC walks its whole
    # registry the first time it sees each type (0.2 s for one file).
    kind = type(node)
    known = _INTERESTING.get(kind)
    if known is None:
        known = _INTERESTING[kind] = any(base in kind.__mro__ for base in _INTERESTING_BASES)
    return known


class SourceSpans:
    """Finds spans for sites; each file is read and parsed once per run."""

    def __init__(self) -> None:
        self._files: dict[str, _ParsedFile | None] = {}

    def span(self, site: Site) -> Span:
        frame = site.frame
        parsed = self._parse(frame.file)
        if parsed is None:
            lines = read_lines(frame.file)
            return line_extent(lines, frame.line) if lines else (max(frame.line, 1), 1, max(frame.line, 1), 1)
        node = self._node(parsed, site)
        if node is None:
            return line_extent(parsed.lines, frame.line)
        return self._present(parsed, node, site)

    def fix(self, site: Site, fixer: Fixer, roles: tuple[tuple[str, Site], ...] = (),
            modules: Mapping[str, ModuleInfo] | None = None, match: Match | None = None) -> Fix | str:
        """A rule's fix at a site as text edits, or why there is none; `roles` and `match` are the other nodes the
        rule matched, handed to the fixer as the libcst nodes they ran at; `modules` are the model's as built (by
        path), to judge a fix that stops calling one of them."""
        parsed = self._parse(site.frame.file)
        node = self._node(parsed, site) if parsed is not None else None
        if node is None:
            return "graphlint could not find the expression in the source"
        statement = next((s for s in parsed.statements.get(_start(parsed, node), ())
                          if (s.value if isinstance(s, cst.Expr) else s) is node), None)
        function, classdef = _enclosing(parsed, node)
        line = parsed.lines[parsed.positions[node].start.line - 1]
        indent = line[: len(line) - len(line.lstrip())]
        files = {site.frame.file: parsed}

        def role(name: str, role_site: Site) -> Role | None:
            role_file = self._parse(role_site.frame.file)
            role_node = self._node(role_file, role_site) if role_file is not None else None
            if role_node is None:
                return None
            files.setdefault(role_site.frame.file, role_file)
            return Role(name, role_node, _enclosing(role_file, role_node)[0], role_file.module)

        found = tuple(found for name, role_site in roles if (found := role(name, role_site)) is not None)
        answer = fixer(FixSite(node, statement, function, classdef, parsed.module, indent, found,
                               match.resolved(role) if match is not None else None))
        if isinstance(answer, str):
            return answer
        def where(changed: cst.CSTNode) -> tuple[str, _ParsedFile]:
            # The file whose tree holds the node: a fix may edit the helper module a chain runs through.
            for path, candidate in files.items():
                if changed in candidate.positions:
                    return path, candidate
            raise ValueError(f"a fix edits a node of no parsed file: {code_of(changed)!r}")

        edits = []
        for old, new in ((answer.old, answer.new), *answer.also):
            path, in_file = where(old)
            edits.append(Edit(path, *_replaced_extent(in_file, old, new), code_of(new)))
        removed: dict[str, list] = {}
        for statement in answer.removed:
            path, in_file = where(statement)
            removed.setdefault(path, []).append((in_file.positions[statement].start.line, in_file.positions[statement].end.line))
        for path, statements in removed.items():
            lines = files[path].lines
            for first, last in deleted_lines(lines, statements):  # whole lines, with their line ends
                end = (last + 1, 1) if last < len(lines) else (last, len(lines[last - 1]) + 1)
                edits.append(Edit(path, first, 1, *end, ""))
        for statement, code in answer.inserted:
            path, in_file = where(statement)
            line = in_file.positions[statement].start.line
            text = in_file.lines[line - 1]
            edits.append(Edit(path, line, 1, line, 1, f"{text[: len(text) - len(text.lstrip())]}{code}\n"))
        imports_in = where(answer.old)[0]
        edits += _import_edits(files[imports_in], imports_in, answer.imports)
        message, applicability = _hooks_kept(answer, lambda call: _enclosing(where(call)[1], call)[1],
                                             lambda call: (_enclosing(where(call)[1], call)[0], where(call)[1].module),
                                             modules)
        return Fix(message, tuple(sorted(edits, key=lambda e: (e.path != site.frame.file, e.path, e.line, e.column))),
                   applicability)

    def _node(self, parsed: _ParsedFile, site: Site) -> cst.CSTNode | None:
        frame = site.frame
        node = None
        if site.style == "def":
            node = self._definition(parsed, frame.line)
        elif frame.col is not None:
            node = self._at_position(parsed, frame)
        if node is None:
            node = self._by_name(parsed, frame.line, site)
        return node

    def comments(self, path: str) -> list[tuple[int, int, int, str, bool]]:
        """Every comment of a file as (line, column, end column, text, alone on its line), 1-based columns;
        libcst parses strings properly, so a `#` inside a string is not a comment."""
        parsed = self._parse(path)
        if parsed is None:
            return []
        found = []
        for node, where in parsed.positions.items():
            if isinstance(node, cst.Comment):
                line = where.start.line
                alone = not parsed.lines[line - 1][: where.start.column].strip()
                found.append((line, where.start.column + 1, where.end.column + 1, node.value, alone))
        return sorted(found)

    # -- parsing ---------------------------------------------------------------------------------------------

    def _parse(self, path: str) -> _ParsedFile | None:
        if path in self._files:
            return self._files[path]
        parsed = None
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            module = cst.parse_module(data)
            if module.bytes != data:  # libcst lost text (a blank line before a last comment): its positions lie
                raise ValueError("libcst does not give the file back")
            wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
            positions = wrapper.resolve(PositionProvider)
            parsed = _ParsedFile(lines=split_lines(module.code), module=module, positions=positions)
            for node, where in positions.items():
                if _interesting(node):
                    start = (where.start.line, where.start.column)
                    parsed.by_start.setdefault(start, []).append(node)
                    parsed.by_end.setdefault((where.end.line, where.end.column), []).append(node)
                    parsed.by_line.setdefault(where.start.line, []).append(node)
                if isinstance(node, cst.BaseSmallStatement):
                    parsed.statements.setdefault((where.start.line, where.start.column), []).append(node)
            for nodes in parsed.by_line.values():
                nodes.sort(key=lambda n: (positions[n].start.column, -positions[n].end.line, -positions[n].end.column))
        except Exception:  # unreadable, undecodable, or not Python any more (changed on disk): whole lines will do
            parsed = None
        self._files[path] = parsed
        return parsed

    # -- finding the node ------------------------------------------------------------------------------------

    def _at_position(self, parsed: _ParsedFile, frame) -> cst.CSTNode | None:
        if not 1 <= frame.line <= len(parsed.lines) or not 1 <= frame.end_line <= len(parsed.lines):
            return None
        start = (frame.line, chars(parsed.lines[frame.line - 1], frame.col))
        end = (frame.end_line, chars(parsed.lines[frame.end_line - 1], frame.end_col))
        exact = [n for n in parsed.by_start.get(start, ()) if _end(parsed, n) == end]
        if exact:
            return min(exact, key=_preference)
        # A method call's instruction starts at the method name: take the call that ends there.
        around = [n for n in parsed.by_end.get(end, ()) if _start(parsed, n) <= start]
        if around:
            return max(around, key=lambda n: _start(parsed, n))
        return None

    def _by_name(self, parsed: _ParsedFile, line: int, site: Site) -> cst.CSTNode | None:
        candidates = parsed.by_line.get(line, ())
        if site.op:
            for node in candidates:
                if _matches_op(node, site.op):
                    return node
        for node in candidates:
            if isinstance(node, cst.Call):
                return node
        return None

    def _definition(self, parsed: _ParsedFile, line: int) -> cst.CSTNode | None:
        # co_firstlineno is the first decorator's line: the `def` itself may be a few lines further down.
        for number in range(line, min(line + 20, len(parsed.lines)) + 1):
            for node in parsed.by_line.get(number, ()):
                if isinstance(node, cst.FunctionDef):
                    return node
        return None

    # -- presenting it ---------------------------------------------------------------------------------------

    def _present(self, parsed: _ParsedFile, node: cst.CSTNode, site: Site) -> Span:
        where: CodeRange = parsed.positions[node]
        start = where.start
        end = where.end
        if isinstance(node, cst.FunctionDef):
            where = parsed.positions[node.name]
            start, end = where.start, where.end
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and site.style == "method":
            start = parsed.positions[node.func.dot].start  # `.softmax(-1)`, not the whole receiver chain
        elif isinstance(node, (cst.Subscript, cst.Attribute)):
            assign = _assignment_to(parsed, node)
            if assign is not None:  # `t[:, 0] = 0` and `self.w = nn.Parameter(...)`, not just the target
                end = parsed.positions[assign].end
        return (start.line, start.column + 1, end.line, end.column + 1)


def _hooks_kept(answer: Rewrite, class_around, around, modules) -> tuple[str, str]:
    """The fix's message and applicability: a fix that stops calling a submodule says so, and is safe only
    where nothing could observe it in the model as built (graphlint.rewrite.submodules), whichever fixer wrote it."""
    # Imported here: it brings libcst's matchers (0.2 s), which a finding without a fix never needs.
    from graphlint.rewrite.submodules import dropped_module_calls, judged

    olds = [answer.old, *(old for old, _ in answer.also), *answer.removed]
    news = [answer.new, *(new for _, new in answer.also), *(cst.parse_module(code) for _, code in answer.inserted)]
    dropped = dropped_module_calls(olds, news, class_around, around)
    if not dropped:
        return answer.message, answer.applicability
    quiet, clause = judged(dropped, news, modules)
    applicability = answer.applicability if quiet or answer.applicability != SAFE else UNSAFE
    return f"{answer.message}; {clause}", applicability


def _enclosing(parsed: _ParsedFile, node: cst.CSTNode) -> tuple[cst.FunctionDef | None, cst.ClassDef | None]:
    """The innermost function and class whose text contains `node`."""
    start, end = _start(parsed, node), _end(parsed, node)
    function = classdef = None
    for candidate, where in parsed.positions.items():
        if isinstance(candidate, (cst.FunctionDef, cst.ClassDef)) and \
                (where.start.line, where.start.column) <= start and end <= (where.end.line, where.end.column):
            innermost = function if isinstance(candidate, cst.FunctionDef) else classdef
            if innermost is None or _start(parsed, innermost) < _start(parsed, candidate):
                if isinstance(candidate, cst.FunctionDef):
                    function = candidate
                else:
                    classdef = candidate
    return function, classdef


def _replaced_extent(parsed: _ParsedFile, old: cst.CSTNode, new: cst.CSTNode) -> tuple[int, int, int, int]:
    """The 1-based span an edit replaces: the node's, widened over its own parentheses when the new node has
    none (libcst's positions leave them out), so that `(att @ v).t()` can become `f(...).t()`."""
    where = parsed.positions[old]
    (line, column), (end_line, end_column) = (where.start.line, where.start.column), (where.end.line, where.end.column)
    if not getattr(new, "lpar", ()) and len(getattr(old, "lpar", ())) == 1 and len(getattr(old, "rpar", ())) == 1:
        before = parsed.lines[line - 1][:column].rstrip()
        after = parsed.lines[end_line - 1][end_column:]
        if before.endswith("(") and after.lstrip().startswith(")"):
            column = len(before) - 1
            end_column += len(after) - len(after.lstrip()) + 1
    return line, column + 1, end_line, end_column + 1


def _import_edits(parsed: _ParsedFile, path: str, imports: tuple[str, ...]) -> list[Edit]:
    """Insert `imports` after the module's leading imports (after its docstring when it has none)."""
    if not imports:
        return []
    after = 0  # the last line of the leading docstring, `__future__` and import statements
    for index, statement in enumerate(parsed.module.body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and statement.body else None
        docstring = index == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        if not (docstring or isinstance(small, (cst.Import, cst.ImportFrom))):
            break
        after = parsed.positions[statement].end.line
    newline = parsed.module.default_newline
    text = "".join(f"{line}{newline}" for line in imports)
    if after >= len(parsed.lines):
        return [Edit(path, after, len(parsed.lines[after - 1]) + 1, after, len(parsed.lines[after - 1]) + 1,
                     newline + text.removesuffix(newline))]
    return [Edit(path, after + 1, 1, after + 1, 1, text)]


def _assignment_to(parsed: _ParsedFile, target: cst.BaseExpression) -> cst.Assign | None:
    where = parsed.positions[target]
    for node in parsed.by_start.get((where.start.line, where.start.column), ()):
        if isinstance(node, cst.Assign) and any(t.target is target for t in node.targets):
            return node
    return None


def _matches_op(node: cst.CSTNode, op: str) -> bool:
    if isinstance(node, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        return name in spellings(op)  # `torch.multiply(...)` for the op recorded as `mul`
    if isinstance(node, cst.BinaryOperation):
        return isinstance(node.operator, _BINARY.get(op, ()))
    if isinstance(node, cst.AugAssign):
        return isinstance(node.operator, _AUGMENTED.get(op, ()))
    if isinstance(node, cst.Attribute):
        return node.attr.value in spellings(op)
    if isinstance(node, cst.Subscript):
        return op in ("getitem", "setitem")
    return False


def _preference(node: cst.CSTNode) -> int:
    for rank, kind in enumerate(_PREFERENCE):
        if isinstance(node, kind):
            return rank
    return len(_PREFERENCE)


def _start(parsed: _ParsedFile, node) -> tuple[int, int]:
    where = parsed.positions[node]
    return (where.start.line, where.start.column)


def _end(parsed: _ParsedFile, node) -> tuple[int, int]:
    where = parsed.positions[node]
    return (where.end.line, where.end.column)


def read_lines(path: str) -> list[str] | None:
    text = read_source(path)
    return split_lines(text) if text is not None else None
