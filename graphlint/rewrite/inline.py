"""Reading a helper of the project as if its body were written at its call: `s = self.scores(q, k)` or
`s = apply_mask(s, m)` followed into the helper, and what is read there put back in the caller's terms.

A fixer that walks a chain of statements (GL101's, rules/gl101_unfused_attention/fix/) keeps the helpers it is
inside as a stack of `Inlined` scopes, innermost last; any other fixer can do the same. Whatever cannot be read exactly raises
`Refused` with the reason.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.contract import ImportNames, Refused, call_parts, code_of, names_read
from graphlint.rewrite.source import (all_parameters, assigned_names, bound_arguments, class_of, find, functions_in,
                                      import_bindings, plain_name_assignment, statements_of, substituted)

_BUILTINS = frozenset(dir(builtins))


@dataclass
class Inlined:
    """A helper the chain passes through (`s = self.scores(q, k)`, `s = apply_mask(s, m)`), read as if its body
    were written at the call: its parameters stand for what the call passes."""

    function: cst.FunctionDef
    args: dict[str, cst.BaseExpression]  # parameter → the caller's expression (a default when not passed)
    call_statement: cst.BaseStatement  # the caller's statement that calls it
    block: tuple  # the helper's statements
    module: cst.Module  # the file the helper is in: its other names are that module's globals


def inlined(call: cst.Call, statement: cst.BaseStatement, scopes: list[Inlined], module: cst.Module,
            classdef: cst.ClassDef | None, modules: tuple[cst.Module, ...]) -> Inlined | None:
    """The helper of this project that `call` runs (`self.scores(q, k)`, `apply_mask(s, m)`), when its body is
    plain statements ending in one `return`; None for anything else. `scopes` are the helpers the reading is
    already inside; `module` and `classdef` are the outermost function's, `modules` the files to look in."""
    name, receiver, _, _ = call_parts(call)
    module_alias = receiver is not None and code_of(receiver) in ImportNames.of(module).modules
    if name is None or (receiver is not None and code_of(receiver) != "self" and not module_alias):
        return None
    here = scopes[-1].module if scopes else module
    if receiver is not None and not module_alias:
        owner = class_of(here, scopes[-1].function) if scopes else classdef
        found = [(here, f) for f in functions_in(owner) if f.name.value == name] if owner is not None else []
    else:
        found = [(m, f) for m in modules if m is not None for f in functions_in(m) if f.name.value == name]
    if len(found) != 1:
        return None
    module, function = found[0]
    body = statements_of(function)
    returns = m.SimpleStatementLine(body=[m.Return(value=m.DoesNotMatch(None))])
    if not body or not m.matches(body[-1], returns) or any(find(s, m.Return()) for s in body[:-1]):
        raise Refused(f"the scores come from `{name}`, which graphlint reads only when it ends in its one `return`")
    args = bound_arguments(function, call)
    if args is None:
        raise Refused(f"the call of `{name}` passes arguments graphlint cannot match to its parameters")
    return Inlined(function, args, statement, tuple(body), module)


def is_parameter(scope: Inlined, name: str, statement: cst.BaseStatement) -> bool:
    """`name` is a parameter of the helper `scope`, not reassigned before `statement`."""
    block = list(scope.block)
    before = block[: block.index(statement)] if statement in block else block
    return name in scope.args and not any(name in assigned_names(s) for s in before)


def in_caller_terms(node: cst.BaseExpression, scopes: list[Inlined], function: cst.FunctionDef,
                    module: cst.Module, upcasts_dropped: bool = False) -> cst.BaseExpression:
    """A part of a chain read inside helpers, in the terms of `function` (in `module`), the outermost caller:
    each helper's parameters replaced by what its caller passed. With `upcasts_dropped`, a parameter only cast
    to float32 under a flag (`if self.upcast: q = q.float()`) is still the parameter: the fixer drops the cast."""
    for depth in range(len(scopes) - 1, -1, -1):
        scope = scopes[depth]
        local = set().union(*(assigned_names(s) for s in scope.block
                              if not (upcasts_dropped and upcast_only(s)))) if scope.block else set()
        read = {n.value for n in names_read(node)}
        inner = sorted(read & local)
        if inner:
            raise Refused(f"`{inner[0]}` is computed inside `{scope.function.name.value}`, where the fused call "
                          "cannot read it")
        # What else the helper reads is its module's (a parameter's default too): it must mean the same there.
        defaults = {p.name.value for p in all_parameters(scope.function) if p.default is not None and
                    scope.args.get(p.name.value) is p.default}
        free = (read - set(scope.args)) | {n.value for name in read & defaults
                                           for n in names_read(scope.args[name])}
        outer = scopes[depth - 1] if depth else None
        same_names(scope, free, outer.function if outer else function, outer.module if outer else module)
        node = substituted(node, {name: value for name, value in scope.args.items() if name in read})
    return node


def upcast_only(statement: cst.CSTNode) -> bool:
    """`if flag:` (no else) whose every statement is `x = x.float()` or `x = x.to(torch.float32)`."""
    if not m.matches(statement, m.If(orelse=None, body=m.IndentedBlock(body=[m.AtLeastN(n=1)]))):
        return False
    for line in statement.body.body:
        if not plain_name_assignment(line):
            return False
        target, value = line.body[0].targets[0].target, line.body[0].value
        name, receiver, positional, keywords = call_parts(value)
        upcast = (name == "float" and not positional) or \
            (name == "to" and [code_of(a) for a in positional] in (["torch.float32"], ["torch.float"]))
        if not upcast or keywords or code_of(receiver) != target.value:
            return False
    return True


def same_names(scope: Inlined, names: set[str], caller: cst.FunctionDef, module: cst.Module) -> None:
    """The helper's own module-level names (constants, imports) mean the same in the caller: not bound by
    the caller itself, and the caller's file the helper's or binding them by the same import."""
    shadowed = assigned_names(caller) | {p.name.value for p in all_parameters(caller)}
    for name in sorted(names):
        if name in shadowed and name != "self":
            raise Refused(f"`{name}` in `{scope.function.name.value}` is its module's, but the caller binds "
                          "its own; the fused call there would read the caller's")
        if module is scope.module or name in _BUILTINS or name == "self":
            continue
        theirs, ours = import_bindings(scope.module), import_bindings(module)
        if name not in theirs or theirs[name] != ours.get(name):
            raise Refused(f"`{name}` is a name of `{scope.function.name.value}`'s module, which the fused call in "
                          "the caller's file could not read as the helper does")
