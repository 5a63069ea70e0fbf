"""Reading Python source as libcst trees: what a statement assigns or changes, the functions a module or class
defines and how a call binds their parameters, and paths between nodes. The fixes read the user's code with
these, so that a chain written across statements, `if` blocks and helpers is followed the same way everywhere.
"""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.contract import atom, call_parts, code_of, names_read


def is_number(node: cst.BaseExpression, values: tuple[float, ...] = ()) -> bool:
    """A number written as a literal (`2`, `0.5`, `-1e9`); one of `values` when they are given."""
    try:
        number = float(code_of(node))
    except ValueError:
        return False
    return not values or number in values


def plain_assignment(statement: cst.CSTNode, name: str) -> bool:
    """`name = ...` alone on its line."""
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
        isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1 and \
        isinstance(statement.body[0].targets[0].target, cst.Name) and statement.body[0].targets[0].target.value == name


def functions_in(node: cst.Module | cst.ClassDef) -> list[cst.FunctionDef]:
    """The functions a module or class body defines directly."""
    body = node.body if isinstance(node, cst.Module) else (node.body.body if isinstance(node.body, cst.IndentedBlock) else ())
    return [s for s in body if isinstance(s, cst.FunctionDef)]


def all_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class _Collector(cst.CSTVisitor):
        def on_visit(self, child: cst.CSTNode) -> bool:
            found.append(child)
            return True

    node.visit(_Collector())
    return found


def statements_of(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    """A function's statements, its docstring left out."""
    body = list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 and \
            isinstance(body[0].body[0], cst.Expr) and \
            isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
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

    class _Imports(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                dotted = code_of(alias.name)
                if alias.asname is not None:
                    found[code_of(alias.asname.name)] = dotted
                else:
                    found[dotted.split(".")[0]] = dotted.split(".")[0]

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
                return
            for alias in node.names:
                name = code_of(alias.name)
                found[code_of(alias.asname.name) if alias.asname is not None else name] = f"{code_of(node.module)}.{name}"

    module.visit(_Imports())
    return found


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _Collector(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(_Collector())
    return found


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
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if plain_assignment(statement, name):
        return small.value
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and small.target.value == name and \
            type(small.operator) in AUGMENTED:
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
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or \
            not isinstance(statement.body[0], cst.Assign) or len(statement.body[0].targets) != 1:
        return None
    target = statement.body[0].targets[0].target
    if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value == name and \
            len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
        return target.slice[0].slice.value
    return None


def changed_in_place(statement: cst.CSTNode, name: str) -> bool:
    """`name.masked_fill_(...)` (or `add_`, `mul_`, `div_`) alone on its line."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or \
            not isinstance(statement.body[0], cst.Expr):
        return False
    call = statement.body[0].value
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in IN_PLACE and \
        isinstance(call.func.value, cst.Name) and call.func.value.value == name


def deletes(statement: cst.CSTNode) -> bool:
    """`del x` alone on its line."""
    return isinstance(statement, cst.SimpleStatementLine) and all(isinstance(s, cst.Del) for s in statement.body)


def mutated_in_place(statement: cst.CSTNode, name: str) -> bool:
    """Whether a statement (or a block inside it) changes `name` in place: `name.masked_fill_(...)`,
    `name[c] = v`."""
    for n in all_nodes(statement):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Name) and \
                n.func.value.value == name and n.func.attr.value.endswith("_") and not n.func.attr.value.startswith("_"):
            return True
        if isinstance(n, (cst.AssignTarget, cst.AugAssign)):
            target = n.target
            while isinstance(target, (cst.Subscript, cst.Attribute)):
                target = target.value
            if isinstance(target, cst.Name) and target.value == name and target is not n.target:
                return True
    return False


def plain_name_assignment(statement: cst.CSTNode) -> bool:
    """`name = ...` alone on its line, whatever the name."""
    return isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
        isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1 and \
        isinstance(statement.body[0].targets[0].target, cst.Name)


def inside(node: cst.CSTNode, root: cst.CSTNode) -> bool:
    return path_to(root, node) is not None


def substituted(expression: cst.BaseExpression, values: dict[str, cst.BaseExpression]) -> cst.BaseExpression:
    """`expression` with each variable of `values` replaced by its value (parenthesised where needed)."""
    class _Substitute(cst.CSTTransformer):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            return False  # `self.mask`'s `mask` is not the variable; the receiver is substituted on leaving

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            return updated.with_changes(value=original.value.visit(self))

        def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
            return updated.with_changes(keyword=original.keyword)

        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            value = values.get(original.value)
            return updated if value is None else atom(value.with_changes(lpar=[], rpar=[]) if value.lpar else value)

    return expression.visit(_Substitute())


def presence_test(guard: cst.BaseExpression | None) -> str | None:
    """`m` of `m is not None` and of `exists(m)`: a guard that asks whether a mask was given."""
    if isinstance(guard, cst.Comparison) and len(guard.comparisons) == 1 and \
            isinstance(guard.comparisons[0].operator, cst.IsNot) and code_of(guard.comparisons[0].comparator) == "None" \
            and isinstance(guard.left, cst.Name):
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
    found: list[cst.Name] = []

    class _Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, target: cst.AssignTarget) -> None:
            found.extend(n for n in names_read(target.target) if binds(target.target, n))

        def visit_AugAssign(self, assign: cst.AugAssign) -> None:
            if isinstance(assign.target, cst.Name):
                found.append(assign.target)

        def visit_For(self, loop: cst.For) -> None:
            found.extend(names_read(loop.target))

    node.visit(_Targets())
    return found


def block_of(function: cst.FunctionDef, node: cst.CSTNode) -> tuple[tuple, cst.SimpleStatementLine]:
    """The statement list that holds the statement of `node`, and that statement."""
    found: list = []

    class _Finder(cst.CSTVisitor):
        def __init__(self) -> None:
            self.blocks: list = []

        def visit_IndentedBlock(self, block: cst.IndentedBlock) -> None:
            self.blocks.append(block)

        def leave_IndentedBlock(self, block: cst.IndentedBlock) -> None:
            self.blocks.pop()

        def visit_SimpleStatementLine(self, line: cst.SimpleStatementLine) -> bool:
            if not found and path_to(line, node) is not None:
                found.append((self.blocks[-1].body if self.blocks else (), line))
            return False

    function.visit(_Finder())
    if not found:
        raise ValueError("the node is not in a plain statement of the function")
    return found[0]


def path_to(root: cst.CSTNode, target: cst.CSTNode) -> list[cst.CSTNode] | None:
    """The nodes from `root` down to `target`, both included; None when `target` is not inside."""
    if root is target:
        return [root]
    for child in root.children:
        path = path_to(child, target)
        if path is not None:
            return [root, *path]
    return None


def assigned_names(statement: cst.CSTNode) -> set[str]:
    names = set()

    class _Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, target: cst.AssignTarget) -> None:
            names.update(n.value for n in names_read(target.target) if binds(target.target, n))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name):
                names.add(node.target.value)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if isinstance(node.target, cst.Name):
                names.add(node.target.value)

        def visit_For(self, node: cst.For) -> None:
            names.update(n.value for n in names_read(node.target))

    statement.visit(_Targets())
    return names


def binds(target: cst.BaseExpression, name: cst.Name) -> bool:
    """A name the assignment binds (`a`, `a, b`), not one it reads (`x[i]`, `self.y`)."""
    if target is name:
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(binds(e.value, name) for e in target.elements)
    return False


def is_target(statement: cst.SimpleStatementLine, name: cst.Name) -> bool:
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
    found = []

    class _Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
                found.append(node.value)

    scope.visit(_Finder())
    return found


def self_assignments(classdef: cst.ClassDef, attribute: str) -> list[cst.BaseExpression]:
    """What `self.<attribute>` is set to in the class: `self.x = ...` and `self.register_buffer("x", ...)`."""
    found = []

    class _Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if code_of(target.target) == f"self.{attribute}":
                    found.append(node.value)
                elif isinstance(target.target, cst.Tuple) and isinstance(node.value, cst.Tuple) and \
                        len(target.target.elements) == len(node.value.elements):  # `self.h, self.scale = h, d ** -0.5`
                    found.extend(v.value for e, v in zip(target.target.elements, node.value.elements, strict=True)
                                 if code_of(e.value) == f"self.{attribute}")

        def visit_Call(self, node: cst.Call) -> None:
            name, receiver, positional, keywords = call_parts(node)
            if name == "register_buffer" and receiver is not None and code_of(receiver) == "self" and \
                    len(positional) >= 2 and isinstance(positional[0], cst.SimpleString) and \
                    positional[0].evaluated_value == attribute:
                found.append(positional[1])

    classdef.visit(_Finder())
    return found
