"""A helper that returns the probabilities (`def softmax(x, dim): return F.softmax(x, dim, dtype=torch.float32)`,
MMCV's `embedded_gaussian`): whether it only hands them back, and why a caller that multiplies them with the
values cannot be read at the helper's call. Reads only source, so chain.py can use it."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from graphlint.rewrite.contract import Refused, call_parts, code_of, names_read
from graphlint.rewrite.source import (calls_in, class_of, deletes, functions_in, path_to,
                                      plain_name_assignment)
from graphlint.opnames import CAST

_CASTS = CAST | {"contiguous"}


def returned_from(helper: cst.FunctionDef, softmax: cst.CSTNode, statement: cst.BaseStatement,
                  body: list[cst.BaseStatement], namespaces: frozenset | set = frozenset()) -> cst.Call | None:
    """The helper hands back the softmax's result as it is: through casts and plain variables to its one
    `return`, read nowhere after the softmax (a `del` aside); an earlier `if test: return` of the same softmax
    with another cast (fairseq's `if onnx_trace: return F.softmax(x.float(), dim=dim)`) is the same result.
    Returns the functional dropout the probabilities pass through on the way (Uni-Core's `softmax_dropout`), if
    any: the caller's fused call takes its `p`."""
    why = f"`{helper.name.value}` does more with the probabilities than return them"
    current, walked, names, dropout = softmax, [], set(), None
    while True:
        walked.append(statement)
        path = path_to(statement, current) or []
        parent = path[-2] if len(path) >= 2 else None
        if isinstance(parent, cst.Arg) and parent.keyword is None and len(path) >= 3 and dropout is None and \
                _functional_dropout(path[-3], parent, namespaces):
            current = dropout = path[-3]  # `F.dropout(F.softmax(x, dim=-1), p=p, training=t)`
            continue
        if isinstance(parent, cst.Attribute) and len(path) >= 3 and isinstance(path[-3], cst.Call) and \
                call_parts(path[-3])[0] in _CASTS:
            current = path[-3]
            continue
        if isinstance(parent, cst.Return):
            break
        if not isinstance(parent, cst.Assign) or not plain_name_assignment(statement):
            raise Refused(why + _used_in(statement))
        name = parent.targets[0].target.value
        names.add(name)
        later = [s for s in body[body.index(statement) + 1:] if name in {n.value for n in names_read(s)}
                 and not deletes(s)]
        if not later:
            raise Refused(f"`{helper.name.value}` computes the probabilities as `{name}` and never returns them")
        statement = later[0]
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 \
            else None
        value = getattr(small, "value", None) if isinstance(small, (cst.Assign, cst.Return)) else None
        current = next((n for n in names_read(value) if n.value == name), None) if value is not None else None
        if current is None:
            raise Refused(why + _used_in(statement))
    first = body.index(walked[0])
    early = [s for s in body[:-1] if m.findall(s, m.Return())]
    if statement is not body[-1] or any(not _same_softmax_returned(s, softmax) for s in early):
        raise Refused(f"`{helper.name.value}` returns more than once, not always the same softmax")
    # Statements before the softmax read the scores under the same name (`w = w.softmax(-1)`): not its result.
    for s in body[first:]:
        if s not in walked and not deletes(s) and names & {n.value for n in names_read(s)}:
            raise Refused(why + _used_in(s))
    return dropout


def _functional_dropout(call: cst.CSTNode, arg: cst.Arg, namespaces) -> bool:
    """`arg` is the tensor of `F.dropout(arg, ...)` (a module of torch, not a method or a module of the model)."""
    name, receiver, _, _ = call_parts(call) if isinstance(call, cst.Call) else (None,) * 4
    return name == "dropout" and receiver is not None and code_of(receiver).split(".")[0] in namespaces and \
        call.args[0] is arg


def _used_in(statement: cst.BaseStatement) -> str:
    shown = code_of(statement).strip().splitlines()[0] if code_of(statement).strip() else ""
    return f" (`{shown}`)" if 0 < len(shown) <= 60 else ""


def _same_softmax_returned(statement: cst.BaseStatement, softmax: cst.CSTNode) -> bool:
    """`if test: return F.softmax(x.float(), dim=dim)` (no else) where the last return is `F.softmax(x, dim=dim,
    dtype=torch.float32)`: the same softmax of the same input over the same dimension, cast otherwise."""
    if not isinstance(statement, cst.If) or statement.orelse is not None or \
            not isinstance(statement.body, cst.IndentedBlock) or len(statement.body.body) != 1:
        return False
    line = statement.body.body[0]
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or not isinstance(line.body[0], cst.Return):
        return False
    return _softmax_of(line.body[0].value) is not None and _softmax_of(line.body[0].value) == _softmax_of(softmax)


def _softmax_of(node) -> tuple[str, str] | None:
    """(input without casts, dim) of `F.softmax(x, dim=d)`, `torch.softmax(x.float(), d)`, `x.softmax(d)`."""
    name, receiver, positional, keywords = call_parts(node) if isinstance(node, cst.Call) else (None,) * 4
    if name != "softmax":
        return None
    namespace = receiver is not None and code_of(receiver) in ("F", "torch", "nn.functional", "torch.nn.functional")
    if receiver is not None and not namespace:
        tensor, rest = receiver, positional
    else:
        tensor, rest = (positional[0] if positional else keywords.get("input")), positional[1:]
    dim = rest[0] if rest else keywords.get("dim")
    while call_parts(tensor)[0] in _CASTS and call_parts(tensor)[1] is not None:
        tensor = call_parts(tensor)[1]
    return (code_of(tensor), code_of(dim)) if tensor is not None and dim is not None else None


def why_not_called(helper: cst.FunctionDef, caller: cst.FunctionDef, module: cst.Module, calls: int) -> str:
    """Why `caller` cannot be read at a call of `helper`: it calls it through a name chosen at run time
    (MMCV's `pairwise_func = getattr(self, self.mode)`), through a submodule of another class (Megatron's
    `self.scale_mask_softmax(scores, mask)`), or some other number of times than once."""
    helper_name, caller_name = helper.name.value, caller.name.value
    for call in calls_in(caller):
        name, _, positional, _ = call_parts(call)
        if name == "getattr" and len(positional) == 2 and code_of(positional[0]) == "self":
            return (f"`{caller_name}` calls `{helper_name}` through `getattr(self, {code_of(positional[1])})`, "
                    f"chosen at run time; the fused call in its place would compute `{helper_name}` whatever "
                    f"`{code_of(positional[1])}` names")
    owner, theirs = class_of(module, caller), class_of(module, helper)
    if calls == 0 and owner is not None and theirs is not None and owner is not theirs:
        held = [code_of(t.target) for n in _made_of(owner, theirs) for t in n.targets]
        through = f"the module `{held[0]}`" if held else "a module"
        return (f"the softmax is in `{theirs.name.value}.{helper_name}`, which `{caller_name}` reaches through "
                f"{through}; graphlint reads only helpers `{caller_name}` calls itself")
    return f"`{caller_name}` calls `{helper_name}` {calls} times"


def module_call(helper: cst.FunctionDef, caller: cst.FunctionDef, module: cst.Module) -> cst.Call | None:
    """The one call `self.attr(...)` in `caller` of a submodule whose class's `forward` is `helper`, or only
    passes its parameters on to `helper` (Megatron: `return self.forward_torch_softmax(input, mask)`), with
    `self.attr = ThatClass(...)` in the caller's class; None otherwise. Its `self` is `self.attr` there."""
    owner, theirs = class_of(module, caller), class_of(module, helper)
    if owner is None or theirs is None or owner is theirs:
        return None
    forward = next((f for f in functions_in(theirs) if f.name.value == "forward"), None)
    if forward is None or (forward is not helper and not _passes_on(forward, helper)):
        return None
    held = {code_of(t.target) for n in _made_of(owner, theirs) for t in n.targets}
    calls = [c for c in calls_in(caller) if code_of(c.func) in held]
    return calls[0] if len(calls) == 1 and len(held) == 1 else None


def _made_of(owner: cst.ClassDef, made: cst.ClassDef) -> list[cst.Assign]:
    """The assignments in `owner`'s methods of a call named as the class `made` (`self.attr = ThatClass(...)`)."""
    called = m.Assign(value=m.MatchIfTrue(lambda value: call_parts(value)[0] == made.name.value))
    return [n for f in functions_in(owner) for n in m.findall(f, called)]


def _passes_on(forward: cst.FunctionDef, helper: cst.FunctionDef) -> bool:
    """`def forward(self, a, b): return self.helper(a, b)`, the two with the same parameters."""
    body = forward.body.body if isinstance(forward.body, cst.IndentedBlock) else ()
    names = [p.name.value for p in forward.params.params]
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or \
            not isinstance(body[0].body[0], cst.Return) or names != [p.name.value for p in helper.params.params]:
        return False
    name, receiver, positional, keywords = call_parts(body[0].body[0].value)
    return name == helper.name.value and code_of(receiver) == "self" and not keywords and \
        [code_of(a) for a in positional] == names[1:]
