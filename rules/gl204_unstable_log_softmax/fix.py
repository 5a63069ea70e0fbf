"""GL204's fix: `torch.log` of a softmax (or of probabilities picked from one) rewritten as `log_softmax` of the
logits, with the file's own names for `torch.nn.functional`; proven on the model before `--fix` writes it."""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.formulas import assigned_once, holds, input_of, unparenthesized, without_parentheses
from graphlint.rewrite.contract import (FixSite, ImportNames, Rewrite, atom, call_parts, code_of, dead_definitions,
                                        is_namespace, names_read, one_line)
from graphlint.rewrite.source import all_nodes, inside, is_number


# Calls through which a log may be taken instead: each only picks, arranges or casts the values, so the log of
# what they pick is what they pick of the log.
_PICKS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "movedim", "contiguous", "squeeze",
    "unsqueeze", "expand", "expand_as", "flatten", "unflatten", "t", "clone", "gather", "index_select",
    "take_along_dim", "select", "narrow", "float", "double", "half", "bfloat16", "to", "type", "type_as",
})


def log_probabilities(site: FixSite) -> Rewrite | str:
    """`log(softmax(x, dim))` → `F.log_softmax(x, dim)`; `log(sigmoid(x))` → `F.logsigmoid(x)`;
    `log(1 - sigmoid(x))` → `F.logsigmoid(-x)`; the log of probabilities picked, arranged or cast first
    (`probs[rows, y].log()`, `probs.gather(1, y)`) → the same picks of the log-probabilities. The probabilities
    may be computed inside the log or in a variable the function assigns once (`probs = F.softmax(x, -1)`,
    deleted when nothing else reads it)."""
    node, names = site.node, site.imports
    log_name = call_parts(node)[0]
    inside = input_of(node, ("log", "log2", "log10"), names)
    if inside is None:
        return "the log is not a call graphlint can rewrite"
    outer, picked = _picked(inside, names)  # picked: the node in the log's own expression
    assignments: list[cst.BaseExpression] = []
    matched = _matched(site)
    if matched is None:  # the graph's nodes are not in this file's source: read the source alone
        base = _resolved(picked, site.function, assignments)
    else:  # the complement's node, else the probabilities' node, that the graph ran
        base = _reached(picked, matched[0] or matched[1], site.function, assignments)
    complement = isinstance(base, cst.BinaryOperation) and isinstance(base.operator, cst.Subtract) and \
        is_number(base.left, (1,))
    inner, made = (base, picked) if not complement else _picked(base.right, names)
    if not complement:
        source = base
    elif matched is None:
        source = _resolved(made, site.function, assignments)
    else:
        source = _reached(made, matched[1], site.function, assignments)
    name, receiver, positional, keywords = call_parts(source)
    if name in ("softmax", "sigmoid") and receiver is not None and code_of(receiver) == "self":
        # `self.softmax(h)` calls a module: its dim is set where it was built, and it is no tensor method of self.
        return f"the {name} is the module `self.{name}`; take the log of the logits with F.log_softmax instead"
    if name == "softmax" and not complement:
        x = positional[0] if is_namespace(receiver, names) and positional else receiver
        if x is None:
            return "the softmax's arguments could not be read"
    elif name == "sigmoid":
        x = input_of(source, ("sigmoid",), names)
    else:
        return ("the probabilities are made in another function or statement graphlint cannot read back; take "
                "the log of the logits with F.log_softmax / F.logsigmoid where they are made")
    logits = _logits_variable(site, node, source, x, assignments)
    if isinstance(logits, str):
        return logits
    inserted = ()
    if logits is not None:  # the probabilities stay for their other readers: their logits get a name both read
        statement, variable = logits
        inserted, x_read = ((statement, f"{variable} = {code_of(x)}"),), cst.Name(variable)
    else:
        x_read = x
    if name == "softmax":
        rest = [a for a in source.args if a.value is not x]
        arguments = ", ".join([code_of(x_read)] + [code_of(a).strip().rstrip(",").strip() for a in rest])
        callee, imports = names.functional_call("log_softmax")
        log_form = cst.parse_expression(f"{callee}({arguments})")
    else:
        callee, imports = names.functional_call("logsigmoid")
        log_form = cst.parse_expression(f"{callee}({'-' + code_of(atom(x_read)) if complement else code_of(x_read)})")
    if complement:  # 1 - picks(sigmoid(x)) is picks(sigmoid(-x))
        log_form = inner.deep_replace(made, log_form) if inner is not made else log_form
    new = outer.deep_replace(picked, log_form) if outer is not picked else log_form
    removed = () if inserted else dead_definitions(site.function, node, new)
    if log_name != "log":  # log2(p) = log(p) / log(2), in parentheses where the call was an operand
        math_name = "math" if "math" in names.modules else None
        if math_name is None and "math" in names.bound:
            return "the module binds `math` to something else, and a log2 or log10 needs math.log for its base"
        new = cst.parse_expression(f"{code_of(atom(new))} / math.log({2 if log_name == 'log2' else 10})")
        new = new if _stands_alone(node, site.function) else atom(new)
        imports = imports + (() if math_name else ("import math",))
    return Rewrite(*without_parentheses(site, node, new), f"{one_line(node)} → {code_of(new)}", imports=imports,
                   removed=removed, inserted=inserted, also=((x, x_read),) if inserted else ())


def _stands_alone(node: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """Whether `node` is a whole assigned, returned or passed value, where an operation needs no parentheses."""
    if function is None:
        return False
    for parent in all_nodes(function):
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.Return, cst.Arg, cst.Element)) and \
                getattr(parent, "value", None) is node:
            return True
    return False


def _picked(value: cst.BaseExpression, imports: ImportNames) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """(`value`, what it picks from): `probs` of `probs[rows, y].float()`, `probs.gather(1, y)`,
    `torch.gather(probs, 1, y)`; (value, value) when it picks nothing."""
    base = value
    while True:
        bare = unparenthesized(base)
        if isinstance(bare, cst.Subscript):
            base = bare.value
            continue
        if isinstance(bare, cst.Attribute) and bare.attr.value in ("T", "mT"):
            base = bare.value
            continue
        name, receiver, positional, _ = call_parts(bare)
        if name in _PICKS and receiver is not None and not is_namespace(receiver, imports):
            base = receiver
        elif name in _PICKS and is_namespace(receiver, imports) and positional:
            base = positional[0]
        else:
            return value, base


def _matched(site: FixSite) -> tuple[cst.CSTNode | None, cst.CSTNode] | None:
    """(the `1 - p` or None, the softmax or sigmoid call) the rule matched, as the libcst nodes they ran at;
    None when the probabilities ran in no file of the user's (GL204's `match.probabilities`)."""
    made, complement = site.match.probabilities, site.match.complement
    if made is None:
        return None
    return (complement.node if complement is not None else None), made.node


def _reached(node: cst.BaseExpression, matched: cst.CSTNode, function: cst.FunctionDef | None,
             found: list) -> cst.BaseExpression | None:
    """`matched`, the node the graph ran, without parentheses, when the log's expression reads it: `node` is
    it, or a variable the function assigns it to once (that value noted in `found`); else None, for a source
    that leads elsewhere (the probabilities come from another function, or the name holds another value where
    the log reads it, such as a parameter assigned later)."""
    if not holds(node, matched, function):
        return None
    if node is not matched:
        found.append(matched)
    return unparenthesized(matched)


def _resolved(node: cst.BaseExpression, function: cst.FunctionDef | None, found: list) -> cst.BaseExpression:
    """What a variable the function assigns once holds (noted in `found`), else `node`; without parentheses."""
    if isinstance(node, cst.Name):
        value = assigned_once(function, node.value)
        if value is not None:
            found.append(value)
            node = value
    return unparenthesized(node)


def _logits_variable(site: FixSite, log: cst.CSTNode, made: cst.BaseExpression, x: cst.BaseExpression,
                     assignments: list[cst.BaseExpression]) -> tuple[cst.BaseStatement, str] | None | str:
    """When the probabilities stay (something else reads them) and their logits are computed inside the softmax
    call (`p = F.softmax(self.head(x), -1)`), the statement that makes them and a free name for the logits, so
    that `logits = self.head(x)` is computed once and read by both; None when the logits can be read twice as
    they are; a reason when no such statement can be written."""
    if not assignments or not _calls_anything(x):
        return None
    others = [n for value in assignments for n in names_read(site.function)
              if _assigns_name(site.function, value, n) and not inside(n, log)]
    if not others:
        return None
    statement = next((s for s in all_nodes(site.function) if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                      and isinstance(s.body[0], cst.Assign) and s.body[0].value is made), None)
    if statement is None:
        return ("the probabilities are also read elsewhere and their logits are computed inside the same call; "
                "assign the logits to a variable first")
    bound = set(ImportNames.of(site.module).bound) | {n.value for n in all_nodes(site.function) if isinstance(n, cst.Name)}
    variable = next(v for v in ("logits", "logits_", *(f"logits{i}" for i in range(2, 99))) if v not in bound)
    return statement, variable


def _assigns_name(function: cst.FunctionDef, value: cst.BaseExpression, name: cst.Name) -> bool:
    """`name` reads the variable that `value` is assigned to, somewhere other than the log being rewritten."""
    for node in all_nodes(function):
        if isinstance(node, cst.Assign) and node.value is value and len(node.targets) == 1 and \
                isinstance(node.targets[0].target, cst.Name) and node.targets[0].target is not name:
            return node.targets[0].target.value == name.value
    return False


def _calls_anything(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Call) for n in all_nodes(node))
