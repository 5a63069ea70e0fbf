"""Forwards from the softmax to the product with the values: casts, transposes of the probabilities, and
dropout (a module, a functional call, or one under a guard) into `dropout_p=`."""

from __future__ import annotations

import libcst as cst

from .chain import CASTS, MATMULS, Reading, einsum_spec, to_layout, transposed, without_transpose
from graphlint.rewrite.contract import Refused, atom, call_parts, code_of, is_namespace, names_read
from graphlint.rewrite.source import assigned_names, is_target, path_to, plain_assignment


def walk_to_values(reading: Reading, softmax: cst.CSTNode, statement: cst.SimpleStatementLine) -> None:
    chain = reading.chain
    if reading.helper_dropout is not None:  # the helper that returns the probabilities drops them out first
        positional, keywords = reading.helper_dropout
        _functional_dropout(reading, [None, *positional], keywords)
    current = softmax
    while True:
        path = path_to(statement, current)
        if path is None or len(path) < 2:
            raise Refused("the softmax's result could not be followed")
        parent = path[-2]
        if isinstance(parent, cst.Assign):
            if len(parent.targets) != 1 or not isinstance(parent.targets[0].target, cst.Name) or \
                    len(statement.body) != 1:
                raise Refused("the probabilities are assigned to more than one plain variable")
            name = parent.targets[0].target.value
            chain.consumed.append(statement)
            chain.names.add(name)
            statement, current = _next_use(reading, name, statement)
            continue
        if isinstance(parent, cst.Arg):
            parent = path[-3]
        if isinstance(parent, cst.Attribute) and len(path) >= 3 and isinstance(path[-3], cst.Call):
            call = path[-3]  # current.to(dtype), current.matmul(v)
            name, _, positional, _ = call_parts(call)
            if name in CASTS:
                current = call
                continue
            if name in ("transpose", "swapaxes", "permute", "t"):
                _permuted(reading, name, positional)
                current = call
                continue
            if name in MATMULS and len(positional) == 1:
                _values(reading, call, positional[0], statement)
                return
            raise Refused(f"the probabilities pass through `.{name}()`, which the fused call cannot express")
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("mT", "T"):
            _permuted(reading, "t" if parent.attr.value == "T" else "mT", [])
            current = parent
            continue
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.MatrixMultiply):
            if parent.left is current:
                _values(reading, parent, parent.right, statement)
            else:
                _values(reading, parent, parent.left, statement, probabilities_first=False)
            return
        if isinstance(parent, cst.Call):
            name, receiver, positional, keywords = call_parts(parent)
            if name in MATMULS and receiver is not None and is_namespace(receiver, reading.names) and \
                    len(positional) == 2 and current in positional:
                first = positional[0] is current
                _values(reading, parent, positional[1] if first else positional[0], statement, probabilities_first=first)
                return
            if name in MATMULS and receiver is not None and len(positional) == 1 and positional[0] is current:
                _values(reading, parent, receiver, statement, probabilities_first=False)  # v.matmul(p)
                return
            if name == "einsum" and len(positional) == 3 and current in positional[1:]:
                _einsum_values(reading, parent, positional, statement, current)
                return
            if name == "dropout" and receiver is not None and is_namespace(receiver, reading.names) and positional and \
                    positional[0] is current:
                _functional_dropout(reading, positional, keywords)
                current = parent
                continue
            if receiver is not None and (code_of(receiver) == "self" or code_of(receiver).startswith("self.")) and \
                    len(positional) == 1 and positional[0] is current and reading.dropout_after:
                _set_dropout(reading, cst.parse_expression(f"{code_of(parent.func)}.p"), True)
                current = parent
                continue
            if receiver is None and _is_module(reading, parent.func) and len(positional) == 1 and \
                    positional[0] is current and reading.dropout_after:  # a dropout module passed in
                callee = code_of(parent.func)
                _set_dropout(reading, cst.parse_expression(f"{callee}.p if {callee}.training else 0.0"), False)
                current = parent
                continue
        raise Refused(f"the probabilities pass through `{code_of(parent)}`, which the fused call cannot express")


def _permuted(reading: Reading, name: str, positional: list[cst.BaseExpression]) -> None:
    """The probabilities transposed or permuted on their way to the values product: the order of their
    dimensions is followed, so that `v @ p.transpose(-2, -1)` can be read as the transpose of `p @ vᵀ`."""
    rank = reading.rank
    if rank is None:
        raise Refused(f"the probabilities pass through `.{name}()` and their rank is not known")
    try:
        dims = [int(code_of(a)) for a in positional]
        if len(positional) == 1 and isinstance(positional[0], (cst.Tuple, cst.List)):
            dims = [int(code_of(e.value)) for e in positional[0].elements]
    except ValueError:
        raise Refused(f"the probabilities are permuted by `{', '.join(code_of(a) for a in positional)}`, "
                      "which graphlint cannot read") from None
    order = reading.order
    if name in ("t", "mT"):
        if name == "t" and rank != 2:
            raise Refused("the probabilities pass through `.t()` of more than two dimensions")
        dims = [rank - 2, rank - 1]
        name = "transpose"
    if name in ("transpose", "swapaxes") and len(dims) == 2:
        a, b = (d % rank for d in dims)
        order[a], order[b] = order[b], order[a]
    elif name == "permute" and sorted(d % rank for d in dims) == list(range(rank)):
        reading.order = [order[d % rank] for d in dims]
    else:
        raise Refused(f"the probabilities pass through `.{name}()`, which the fused call cannot express")


def _values(reading: Reading, product: cst.BaseExpression, values: cst.BaseExpression,
            statement: cst.SimpleStatementLine, probabilities_first: bool = True) -> None:
    """`p @ v` as it is; `v @ pᵀ` (the probabilities transposed, on the right) as the transpose of
    `p @ vᵀ`; any other order of the probabilities' dimensions contracts something else than the keys."""
    rank = reading.rank or 2
    natural, swapped = list(range(rank)), list(range(rank - 2)) + [rank - 1, rank - 2]
    if probabilities_first and reading.order not in ([], natural):
        raise Refused("the probabilities are permuted before the values product, which then does not "
                      "contract the keys")
    if not probabilities_first:
        if reading.order != swapped:
            raise Refused("the values product takes the probabilities on the right without transposing "
                          "them, which does not contract the keys")
        values = without_transpose(values, rank) or transposed(values)
        reading.chain.out_layout = ("xy", "yx")
    reading.chain.v = values
    reading.chain.values_product = product
    reading.chain.values_statement = statement


def _einsum_values(reading: Reading, product: cst.Call, positional, statement, probabilities: cst.CSTNode) -> None:
    """`einsum(p, v)` over the key dimension in any layout: v is brought to (batch..., key, value dim) and
    the fused call's (batch..., query, value dim) to the einsum's output layout."""
    spec = einsum_spec(positional)
    why = "the values einsum does not contract the probabilities' key dimension with the values"
    if spec is None:
        raise Refused(why)
    (p, v), out = spec
    values = positional[2]
    if positional[2] is probabilities:
        (v, p), values = (p, v), positional[1]  # einsum(v, p)
    if reading.order and reading.order != list(range(len(p))):
        if len(reading.order) != len(p):
            raise Refused(why)
        p = "".join(p[reading.order.index(d)] for d in range(len(p)))  # the letters of p's own dimensions
    batch, i, j = p[:-2], p[-2], p[-1]
    rest = [c for c in v if c not in p]
    if len(rest) != 1 or len(v) != len(p) or len(out) != len(p) or set(v) != set(batch + j + rest[0]) or \
            set(out) != set(batch + i + rest[0]):
        raise Refused(why)
    reading.chain.v, reading.chain.values_product, reading.chain.values_statement = \
        to_layout(values, v, batch + j + rest[0]), product, statement
    reading.chain.out_layout = (batch + i + rest[0], out)


def _guarded_dropout(reading: Reading, statement: cst.If, name: str) -> bool:
    """`if dropout is not None: p = dropout(p)` (or under any flag), with `dropout` a module: its `p` while
    it trains and the guard holds."""
    body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
    if statement.orelse is not None or len(body) != 1 or not plain_assignment(body[0], name):
        return False
    call = body[0].body[0].value
    module = call.func if isinstance(call, cst.Call) else None
    if module is None or not _is_module(reading, module) or len(call.args) != 1 or \
            code_of(call.args[0].value) != name:
        return False
    test, callee = code_of(statement.test), code_of(module)
    if test.replace(" ", "") != f"{callee}isnotNone" and not reading.dropout_after:
        return False
    _set_dropout(reading, cst.parse_expression(f"{callee}.p if {test} and {callee}.training else 0.0"), False)
    return True


def _is_module(reading: Reading, func: cst.BaseExpression) -> bool:
    """`self.drop` or a parameter of the function (`dropout` passed in): a module that is called."""
    if isinstance(func, cst.Attribute):
        return code_of(func.value) == "self"
    return isinstance(func, cst.Name) and func.value in {p.name.value for p in reading.function.params.params}


def _functional_dropout(reading: Reading, positional, keywords) -> None:
    p = positional[1] if len(positional) > 1 else keywords.get("p", cst.Float("0.5"))
    training = positional[2] if len(positional) > 2 else keywords.get("training")
    if training is None:
        _set_dropout(reading, p, False)  # F.dropout trains by default
    elif code_of(training) == "self.training":
        _set_dropout(reading, p, True)
    elif code_of(training) == "True":
        _set_dropout(reading, p, False)
    elif code_of(training) != "False":  # `training=module.training`, a flag passed in
        _set_dropout(reading, cst.parse_expression(f"{code_of(atom(p))} if {code_of(training)} else 0.0"), False)


def _set_dropout(reading: Reading, p: cst.BaseExpression, training_only: bool) -> None:
    if reading.chain.dropout_p is not None:
        raise Refused("the probabilities pass through two dropouts")
    reading.chain.dropout_p, reading.chain.dropout_in_training_only = p, training_only


def _next_use(reading: Reading, name: str, after: cst.SimpleStatementLine) -> tuple[cst.SimpleStatementLine, cst.Name]:
    body = list(reading.block)
    for statement in body[body.index(after) + 1:]:
        uses = [n for n in names_read(statement) if n.value == name]
        if not uses:
            continue
        if isinstance(statement, cst.If) and _guarded_dropout(reading, statement, name):
            reading.chain.consumed.append(statement)
            continue
        if isinstance(statement, cst.If) and name not in assigned_names(statement):
            continue  # a read under a flag (BLIP's `if self.save_attention:`): checks.py says why it stays
        if isinstance(statement, cst.If):  # BLIP's `if head_mask is not None: probs = probs * head_mask`
            raise Refused(f"`if {code_of(statement.test)}:` changes the probabilities `{name}` before the values "
                          "product; the fused call applies nothing to them")
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            raise Refused(f"`{name}` is used in a compound statement; the rewrite keeps to plain ones")
        targets = assigned_names(statement)
        reads = [n for n in uses if not (n.value in targets and is_target(statement, n))]
        if not reads:
            raise Refused(f"`{name}` is reassigned before it reaches the values product")
        return statement, reads[0]  # the first read; any other is checked with the chain's names
    raise Refused(f"the probabilities `{name}` never reach a product with the values in this block")
