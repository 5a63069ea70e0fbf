"""Reading Python source as libcst trees: what a statement assigns or changes, the functions a module or class
defines and how a call binds their parameters, and paths between nodes. The fixes read the user's code with
these, so that a chain written across statements, `if` blocks and helpers is followed the same way everywhere.

Shapes are said with libcst matchers (`libcst.matchers`); the walks over a tree are `collect` (every node a
matcher matches) and `find` (the path down to the first one), which the fixers use too.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.contract import absolute_import_from, atom, call_parts, code_of, names_read

# What `collect` and `find` match nodes with: `m.Call()`, `m.Name("x") | m.Attribute()`, `m.MatchIfTrue(f)`.
Matcher = m.BaseMatcherNode | m.MatchIfTrue


class _Walk(cst.CSTVisitor):
    """The one walk behind `collect` and `find`, keeping the path from the root down to the node it is at."""

    def __init__(self, matcher: Matcher | None, prune: Matcher | None, first: bool) -> None:
        super().__init__()
        self.matcher, self.prune, self.first = _test(matcher), _test(prune), first
        self.path: list[cst.CSTNode] = []
        self.found: list = []  # the matched nodes, or with `first` the path down to the one matched

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.path.append(node)
        if self.first and self.found:
            return False
        if self.matcher is None or self.matcher(node):
            self.found.append(list(self.path) if self.first else node)
            if self.first:
                return False
        return self.prune is None or not self.prune(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.path.pop()


def _test(matcher: Matcher | None) -> Callable[[cst.CSTNode], bool] | None:
    """`matcher` as a function of the node (m.matches declines a bare MatchIfTrue, which findall takes)."""
    if matcher is None or isinstance(matcher, m.MatchIfTrue):
        return matcher.func if matcher is not None else None
    return lambda node: m.matches(node, matcher)


def collect(root: cst.CSTNode, matcher: Matcher | None = None, *, prune: Matcher | None = None) -> list[cst.CSTNode]:
    """Every node of `root`, `root` included, that `matcher` matches (every node when None), in source order. A
    node that `prune` matches is matched itself but not walked into: `prune=m.FunctionDef()` keeps to the code of
    the function being walked, `prune=m.Else()` leaves `else:` blocks out."""
    walk = _Walk(matcher, prune, first=False)
    root.visit(walk)
    return walk.found


def find(root: cst.CSTNode, matcher: Matcher, *, prune: Matcher | None = None) -> list[cst.CSTNode] | None:
    """The path from `root` down to the first node in source order that `matcher` matches, both included (the
    node is its last element, what is around it the others); None when no node matches. `prune` as in `collect`."""
    walk = _Walk(matcher, prune, first=True)
    root.visit(walk)
    return walk.found[0] if walk.found else None


def is_number(node: cst.BaseExpression, values: tuple[float, ...] = ()) -> bool:
    """A number written as a literal (`2`, `0.5`, `-1e9`); one of `values` when they are given."""
    try:
        number = float(code_of(node))
    except ValueError:
        return False
    return not values or number in values


def plain_assignment(statement: cst.CSTNode, name: str) -> bool:
    """`name = ...` alone on its line."""
    return m.matches(statement, _assigned_alone(m.Name(name)))


def _assigned_alone(target: m.BaseMatcherNode) -> m.SimpleStatementLine:
    """A line that is one `target = ...`, with a single target."""
    return m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=target)])])


def functions_in(node: cst.Module | cst.ClassDef) -> list[cst.FunctionDef]:
    """The functions a module or class body defines directly."""
    body = node.body if isinstance(node, cst.Module) else (node.body.body if isinstance(node.body, cst.IndentedBlock) else ())
    return [s for s in body if isinstance(s, cst.FunctionDef)]


def all_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node of `node`, itself included, in source order."""
    return collect(node)


_DOCSTRING = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])


def statements_of(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    """A function's statements, its docstring left out."""
    body = list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []
    if body and m.matches(body[0], _DOCSTRING):
        body = body[1:]
    return body


def all_parameters(function: cst.FunctionDef) -> list[cst.Param]:
    """Every named parameter of a function, `*args` and `**kwargs` included."""
    params = function.params
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    found += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return found


def import_bindings(module: cst.Module) -> dict[str, str]:
    """Each name a module's imports bind → what it is bound to (`np` → `numpy`, `F` → `torch.nn.functional`,
    `sqrt` → `math.sqrt`)."""
    found: dict[str, str] = {}
    for node in collect(module, m.Import() | absolute_import_from()):
        for alias in node.names:
            name = code_of(alias.name)
            if isinstance(node, cst.ImportFrom):
                found[code_of(alias.asname.name) if alias.asname is not None else name] = f"{code_of(node.module)}.{name}"
            elif alias.asname is not None:
                found[code_of(alias.asname.name)] = name
            else:
                found[name.split(".")[0]] = name.split(".")[0]
    return found


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call in `node`, in source order."""
    return collect(node, m.Call())


def calls_function(call: cst.Call, function: cst.FunctionDef, modules: tuple[str, ...] = ()) -> bool:
    """`self.name(...)` or `other.name(...)` of a method, `name(...)` or `ops.name(...)` (`ops` one of
    `modules`, the names the caller's imports bind) of a function."""
    name, receiver, _, _ = call_parts(call)
    params = function.params.params
    method = bool(params) and params[0].name.value in ("self", "cls")
    if name != function.name.value:
        return False
    if method:  # `self.scores(...)`, or a method of another object the caller holds: `attn.get_scores(...)`
        return receiver is not None and code_of(receiver) not in modules
    return receiver is None or code_of(receiver) in modules


def bound_arguments(function: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """Each parameter of `function` → what `call` passes for it (or its default); None when the call passes
    `*args`/`**kwargs` or leaves a parameter without a value."""
    params = function.params
    if isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None or any(a.star for a in call.args):
        return None
    ordered = [*params.posonly_params, *params.params]
    if call_parts(call)[1] is not None and ordered and ordered[0].name.value in ("self", "cls"):
        ordered = ordered[1:]  # bound by the call's receiver
        bound = {function.params.params[0].name.value: call_parts(call)[1]} if function.params.params else {}
    else:
        bound = {}
    positional = [a.value for a in call.args if a.keyword is None]
    if len(positional) > len(ordered):
        return None
    bound.update((p.name.value, value) for p, value in zip(ordered, positional, strict=False))
    bound.update((a.keyword.value, a.value) for a in call.args if a.keyword is not None)
    for p in (*ordered, *params.kwonly_params):
        if p.name.value not in bound:
            if p.default is None:
                return None
            bound[p.name.value] = p.default
    return bound


def class_of(module: cst.Module, function: cst.FunctionDef) -> cst.ClassDef | None:
    """The class whose body defines `function`, if any."""
    path = path_to(module, function) or []
    return next((n for n in reversed(path) if isinstance(n, cst.ClassDef)), None)


def indent_of(module: cst.Module, statement: cst.CSTNode) -> str:
    """The leading whitespace of a statement's line."""
    path = path_to(module, statement) or []
    return "".join(module.default_indent if b.indent is None else b.indent for b in path if isinstance(b, cst.IndentedBlock))


# In-place forms a chain is written with, statement by statement: `scores += bias`, `sim.masked_fill_(~m, v)`.
AUGMENTED = {cst.AddAssign: cst.Add, cst.MultiplyAssign: cst.Multiply, cst.DivideAssign: cst.Divide}
IN_PLACE = ("masked_fill_", "add_", "mul_", "div_")


def redefinition(statement: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """What a statement alone on its line sets `name` to: the value of `name = ...`, `name + b` for
    `name += b`, `name.masked_fill(...)` for `name.masked_fill_(...)`; None for any other statement."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.DoNotCare()])):
        return None
    small = statement.body[0]
    if plain_assignment(statement, name):
        return small.value
    if m.matches(small, m.AugAssign(target=m.Name(name), operator=m.MatchIfTrue(lambda op: type(op) in AUGMENTED))):
        return cst.BinaryOperation(left=cst.Name(name), operator=AUGMENTED[type(small.operator)](), right=atom(small.value))
    if changed_in_place(statement, name):
        call = small.value
        return call.with_changes(func=call.func.with_changes(attr=cst.Name(call.func.attr.value[:-1])))
    condition = filled_where(statement, name)
    if condition is not None:  # `scores[c] = fill` is `scores.masked_fill(c, fill)`
        return cst.parse_expression(f"{name}.masked_fill({code_of(condition)}, {code_of(small.value)})")
    return None


def filled_where(statement: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """`c` of `name[c] = value` alone on its line."""
    filled = m.Subscript(value=m.Name(name), slice=[m.SubscriptElement(slice=m.Index(value=m.SaveMatchedNode(
        m.DoNotCare(), "condition")))])
    found = m.extract(statement, _assigned_alone(filled))
    return found["condition"] if found is not None else None


def changed_in_place(statement: cst.CSTNode, name: str) -> bool:
    """`name.masked_fill_(...)` (or `add_`, `mul_`, `div_`) alone on its line."""
    method = m.Attribute(value=m.Name(name), attr=m.Name(m.MatchIfTrue(IN_PLACE.__contains__)))
    return m.matches(statement, m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=method))]))


def deletes(statement: cst.CSTNode) -> bool:
    """`del x` alone on its line."""
    return m.matches(statement, m.SimpleStatementLine(body=[m.ZeroOrMore(m.Del())]))


def mutated_in_place(statement: cst.CSTNode, name: str) -> bool:
    """Whether a statement (or a block inside it) changes `name` in place: `name.masked_fill_(...)`,
    `name[c] = v`."""
    in_place = m.Name(m.MatchIfTrue(lambda method: method.endswith("_") and not method.startswith("_")))
    # `name[c] = v`, `name.data = v`, `name[i].x += v`: the object is changed, not rebound.
    of_name = m.MatchIfTrue(lambda value: _object_of(value) == name)
    written = m.Subscript(value=of_name) | m.Attribute(value=of_name)
    return find(statement, m.Call(func=m.Attribute(value=m.Name(name), attr=in_place)) |
                m.AssignTarget(target=written) | m.AugAssign(target=written)) is not None


def _object_of(target: cst.BaseExpression) -> str | None:
    """`x` of `x`, `x[i]`, `x.a[i]`: the variable whose object a write into `target` changes."""
    while isinstance(target, (cst.Subscript, cst.Attribute)):
        target = target.value
    return target.value if isinstance(target, cst.Name) else None


def plain_name_assignment(statement: cst.CSTNode) -> bool:
    """`name = ...` alone on its line, whatever the name."""
    return m.matches(statement, _assigned_alone(m.Name()))


def inside(node: cst.CSTNode, root: cst.CSTNode) -> bool:
    """Whether `node` is `root` or in it."""
    return path_to(root, node) is not None


def substituted(expression: cst.BaseExpression, values: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    """`expression` with each variable of `values` replaced by its value (parenthesised where needed)."""
    # Only variables: `self.mask`'s `mask` and the keyword of `f(mask=m)` are other names.
    variables = {id(n) for n in names_read(expression) if n.value in values}

    def value_of(name: cst.Name, _: dict) -> cst.BaseExpression:
        value = values[name.value]
        return atom(value.with_changes(lpar=[], rpar=[]) if value.lpar else value)

    return m.replace(expression, m.MatchIfTrue(lambda node: id(node) in variables), value_of)


# `None` and `self` as written, not `(None)`: what the code compared them with.
_NONE = m.Name("None", lpar=[])
_SELF = m.Name("self", lpar=[])


def presence_test(guard: cst.BaseExpression | None) -> str | None:
    """`m` of `m is not None` and of `exists(m)`: a guard that asks whether a mask was given."""
    given = m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=_NONE)])
    if guard is not None and m.matches(guard, given):
        return guard.left.value
    name, receiver, positional, keywords = call_parts(guard) if guard is not None else (None, None, [], {})
    if name == "exists" and receiver is None and len(positional) == 1 and not keywords and isinstance(positional[0], cst.Name):
        return positional[0].value
    return None


def keeps_a_tensor(statement: cst.CSTNode, name: str) -> bool:
    """`m = m[:, None]`, `m = m.unsqueeze(1)`, `m = f(m)`: a given mask stays given."""
    if not plain_assignment(statement, name):
        return False
    value = statement.body[0].value
    return isinstance(value, (cst.Call, cst.Subscript, cst.BinaryOperation, cst.UnaryOperation)) and \
        name in {n.value for n in names_read(value)}


def binding_names(node: cst.CSTNode) -> list[cst.Name]:
    """The names `node` assigns to (targets of `=`, `+=`, `for`)."""
    return _bound_names(node, _BINDINGS)


_BINDINGS = m.AssignTarget() | m.AugAssign(target=m.Name()) | m.For()


def _bound_names(node: cst.CSTNode, bindings: m.OneOf) -> list[cst.Name]:
    """The names bound by the nodes of `node` that `bindings` matches, in source order."""
    found: list[cst.Name] = []
    for binding in collect(node, bindings):
        if isinstance(binding, cst.AssignTarget):
            found.extend(n for n in names_read(binding.target) if binds(binding.target, n))
        elif isinstance(binding, cst.For):
            found.extend(names_read(binding.target))
        else:  # `x += ...`, `x: int = ...`
            found.append(binding.target)
    return found


def block_of(function: cst.FunctionDef, node: cst.CSTNode) -> tuple[tuple, cst.SimpleStatementLine]:
    """The statement list that holds the statement of `node`, and that statement."""
    path = path_to(function, node) or []
    line = next((n for n in path if isinstance(n, cst.SimpleStatementLine)), None)
    if line is None:
        raise ValueError("the node is not in a plain statement of the function")
    blocks = [n for n in path[:path.index(line)] if isinstance(n, cst.IndentedBlock)]
    return (blocks[-1].body if blocks else (), line)


def path_to(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode] | None:
    """The nodes from `root` down to `target`, both included; None when `target` is not inside."""
    return find(root, m.MatchIfTrue(lambda node: node is target))


def assigned_names(statement: cst.CSTNode) -> set[str]:
    """The names `statement` assigns to: targets of `=`, `+=`, `x: int = ...` and `for`."""
    return {n.value for n in _bound_names(statement, _BINDINGS | m.AnnAssign(target=m.Name()))}


def binds(target: cst.BaseExpression, name: cst.Name) -> bool:
    """A name the assignment binds (`a`, `a, b`), not one it reads (`x[i]`, `self.y`)."""
    if target is name:
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(binds(e.value, name) for e in target.elements)
    return False


def is_target(statement: cst.SimpleStatementLine, name: cst.Name) -> bool:
    """Whether the `=` that begins `statement` binds `name`."""
    small = statement.body[0]
    return isinstance(small, cst.Assign) and any(binds(t.target, name) for t in small.targets)


def root_name(node: cst.BaseExpression) -> str | None:
    """`causal` of `causal.view(1, 1, n, n).bool()`."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, (cst.Subscript, cst.Attribute)):
            node = node.value
        else:
            return None


def local_assignments(scope: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    """What the plain variable `name` is set to anywhere in `scope` (a class's methods, a function)."""
    to_name = m.AssignTarget(target=m.Name(name))
    return [node.value for node in collect(scope, m.Assign(targets=[m.ZeroOrMore(), to_name, m.ZeroOrMore()]))]


def self_assignments(classdef: cst.ClassDef, attribute: str) -> list[cst.BaseExpression]:
    """What `self.<attribute>` is set to in the class: `self.x = ...` and `self.register_buffer("x", ...)`."""
    found = []
    written = f"self.{attribute}"
    registered = m.Call(func=m.Attribute(value=_SELF, attr=m.Name("register_buffer")))
    for node in collect(classdef, m.Assign() | registered):
        if isinstance(node, cst.Call):
            positional = call_parts(node)[2]
            if len(positional) >= 2 and isinstance(positional[0], cst.SimpleString) and \
                    positional[0].evaluated_value == attribute:
                found.append(positional[1])
            continue
        for target in node.targets:
            if code_of(target.target) == written:
                found.append(node.value)
            elif isinstance(target.target, cst.Tuple) and isinstance(node.value, cst.Tuple) and \
                    len(target.target.elements) == len(node.value.elements):  # `self.h, self.scale = h, d ** -0.5`
                found.extend(v.value for e, v in zip(target.target.elements, node.value.elements, strict=True)
                             if code_of(e.value) == written)
    return found

