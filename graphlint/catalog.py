"""The built-in rules as `graphlint rules`, `graphlint rule ID` and a session's rule list read them: from their
modules' source, without importing the modules (a rule's `check` needs the capture, and the capture needs torch).

A rule module's class body states its metadata as literals: strings, numbers, tuples, `Severity.WARNING`, the
tags of graphlint.tags and `Example(...)` models. `builtin_rules` parses each module of graphlint.rules and makes,
for every top-level `Rule` subclass, a stand-in class: a subclass of `Rule` with the same name, module and class
attributes, and no `check` of its own, so that everything read from a rule class (its documentation, its
`RuleInfo`) reads the same. A module whose source says more than that (a base class of its own, a computed
attribute, a method that overrides one of `Rule`'s) is imported as the rule engine imports it;
tests/test_torch_free_commands.py checks that no built-in module needs it and that every stand-in equals its rule.
The rules that run are always the imported ones (graphlint.engine.load_rules).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import operator
import pkgutil
from pathlib import Path
from types import ModuleType

from graphlint.rule import Rule

# Modules whose names a rule's metadata, or the bases of the module's other classes, may use: they import no torch,
# so they are imported, not read (typing: a rule's match is a `Match, Generic[Matched]`, which is no rule).
PLAIN_MODULES = ("graphlint.results", "graphlint.rule", "graphlint.tags", "graphlint.sizes", "typing")
# The attributes a rule's metadata is made of (graphlint.rule.Rule's class attributes).
METADATA = frozenset({"id", "name", "severity", "tags", "precision", "default_enabled", "summary", "what", "why",
                      "example", "instead", "fixes", "bad_examples", "good_examples", "reads_findings"})
# Top-level statements with statements inside, which may define a class the module then has.
_BLOCKS = (ast.If, ast.Try, ast.With, ast.For, ast.While, ast.AsyncWith, ast.AsyncFor, ast.Match,
           *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


class NotLiteral(Exception):
    """A module's source says more than literal metadata: only importing it tells its rules."""


def builtin_rules() -> list[type[Rule]]:
    """A class per built-in rule, module by module in name order: the stand-in read from its source, or the rule
    itself where the module has to be imported."""
    import graphlint.rules as package

    rules: list[type[Rule]] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        name = f"{package.__name__}.{info.name}"
        try:
            rules += read_rules(_source(name), name)
        except (NotLiteral, SyntaxError):
            rules += defined_rules(importlib.import_module(name))
    return rules


def defined_rules(module: ModuleType) -> list[type[Rule]]:
    """The Rule subclasses an imported module defines (not those it imports)."""
    return [value for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__]


def read_rules(source: str, module: str) -> list[type[Rule]]:
    """The stand-ins of the `Rule` subclasses that the source of `module` defines; `NotLiteral` when its source
    does not state them as literals."""
    tree = ast.parse(source)
    names = _imported_names(tree)
    rules = []
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef):
            if _is_rule_class(statement, names):
                rules.append(_stand_in(statement, names, module))
        elif isinstance(statement, _BLOCKS) and any(isinstance(node, ast.ClassDef) for node in ast.walk(statement)):
            raise NotLiteral(f"a class defined under a {type(statement).__name__} statement")
    return rules


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)  # its package, graphlint.rules, is already imported: nothing else is
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        raise NotLiteral(f"no source for {module}")  # installed as bytecode only
    try:
        return importlib.util.decode_source(Path(origin).read_bytes())
    except (OSError, UnicodeDecodeError) as error:
        raise NotLiteral(f"the source of {module} cannot be read ({error})") from None


def _is_function(statement: ast.stmt) -> bool:
    return isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))


def _imported_names(tree: ast.Module) -> dict[str, object]:
    """The names a module imports at its top level from PLAIN_MODULES, with their objects."""
    names = {}
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module in PLAIN_MODULES:
            module = importlib.import_module(statement.module)
            for alias in statement.names:
                if alias.name != "*" and hasattr(module, alias.name):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


def _is_rule_class(node: ast.ClassDef, names: dict[str, object]) -> bool:
    """Whether a top-level class is a rule: its one base is graphlint.rule.Rule. A class with a base that cannot be
    read (a base class of the module's own, a library's) might be one."""
    bases = []
    for base in node.bases:
        try:
            bases.append(_value(base, names))
        except NotLiteral:
            raise NotLiteral(f"class {node.name} has a base class that only the import tells") from None
    if not any(isinstance(base, type) and issubclass(base, Rule) for base in bases):
        return False
    if bases != [Rule] or node.keywords or node.decorator_list:
        raise NotLiteral(f"class {node.name} is more than a direct subclass of Rule")
    return True


def _stand_in(node: ast.ClassDef, names: dict[str, object], module: str) -> type[Rule]:
    attributes: dict[str, object] = {"__module__": module, "__qualname__": node.name, "__doc__": ast.get_docstring(node)}
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            target, value = statement.targets[0].id, statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
            target, value = statement.target.id, statement.value
        elif _is_function(statement):
            if statement.name != "check" and hasattr(Rule, statement.name):
                raise NotLiteral(f"{node.name}.{statement.name} overrides Rule's")
            continue
        elif isinstance(statement, (ast.Expr, ast.Pass, ast.AnnAssign)):
            continue  # the docstring; an annotation without a value binds nothing
        else:
            raise NotLiteral(f"class {node.name} has a {type(statement).__name__} statement")
        if target in METADATA:
            attributes[target] = _value(value, names)
    return type(node.name, (Rule,), attributes)


def _value(node: ast.expr, names: dict[str, object]) -> object:
    """The value of a literal expression: constants, tuples, lists, dicts, arithmetic, the names of PLAIN_MODULES
    and their attributes (`Severity.WARNING`), and calls of graphlint.rule.Example."""
    from graphlint.rule import Example

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_value(item, names) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_value(key, names): _value(value, names) for key, value in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute) and not node.attr.startswith("_"):
        owner = _value(node.value, names)
        if isinstance(owner, type) and hasattr(owner, node.attr):
            return getattr(owner, node.attr)  # Severity.WARNING
    if isinstance(node, ast.Subscript):  # Generic[Matched]
        try:
            return _value(node.value, names)[_value(node.slice, names)]
        except (TypeError, LookupError):
            raise NotLiteral(f"{ast.unparse(node)[:60]!r} cannot be read") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        operand = _value(node.operand, names)
        if isinstance(operand, (int, float)):
            return _OPERATORS[type(node.op)](operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, names), _value(node.right, names)
        small = not isinstance(node.op, ast.Pow) or (isinstance(right, int) and 0 <= right <= 128)
        if small and all(isinstance(side, (int, float)) for side in (left, right)) or \
                isinstance(node.op, ast.Add) and all(isinstance(side, str) for side in (left, right)):
            return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.Call) and _value(node.func, names) is Example \
            and not any(isinstance(arg, ast.Starred) for arg in node.args) \
            and all(keyword.arg is not None for keyword in node.keywords):
        return Example(*(_value(arg, names) for arg in node.args),
                       **{keyword.arg: _value(keyword.value, names) for keyword in node.keywords})
    raise NotLiteral(f"{ast.unparse(node)[:60]!r} is not a literal")
