"""What must hold before the chain is rewritten: the products are the ones the graph ran, the chain's variables
are read nowhere else (or only returned, for an unsafe fix), and its inputs do not change before the values."""

from __future__ import annotations

import libcst as cst

from .chain import Reading
from graphlint.rewrite.contract import Refused, atom, call_parts, code_of, names_read, one_line
from graphlint.rewrite.source import assigned_names, binding_names, inside, mutated_in_place, path_to, plain_assignment


def check_matches_the_graph(reading: Reading) -> None:
    """The products the source's chain leads to are the ones the rule matched in the graph: the rewrite is
    built from the match, and a reading of the source that strays from it is refused, never written."""
    chain = reading.chain
    for role, matched, found in (("scores", reading.match.scores, chain.scores_product),
                                 ("values", reading.match.values, chain.values_product)):
        if matched is None or found is None:
            continue
        node = matched.node
        if node is not found and path_to(found, node) is None and path_to(node, found) is None:
            raise Refused(f"the source leads to another {role} product (`{code_of(found).strip()}`) than the one "
                          f"the graph ran (`{code_of(node).strip()}`)")


def check_names(reading: Reading) -> None:
    """The chain's variables are used nowhere else: the fused call does not give them back. Reads after the
    values product (weights returned or stored for visualisation) are kept for an unsafe fix that puts
    None there; any other use leaves the chain alone."""
    chain = reading.chain
    read_inside = set()
    for statement in chain.consumed:
        read_inside.update(id(n) for n in names_read(statement))
    if chain.values_product is not None:
        read_inside.update(id(n) for n in names_read(chain.values_product))
    everywhere = names_read(reading.function)
    product_names = [id(n) for n in names_read(chain.values_product)] if chain.values_product is not None else []
    after = next((i for i, n in enumerate(everywhere) if id(n) in product_names), len(everywhere))
    bound = {id(n) for n in binding_names(reading.function)}
    dels = {id(n) for s in reading.block if _deleting(s) for n in names_read(s)}
    rebound = _rebound(reading, everywhere, after)
    for name in chain.names:
        for index, node in enumerate(everywhere):
            if node.value != name or id(node) in read_inside or id(node) in dels:  # trim_dels rewrites a `del`
                continue
            if index >= rebound.get(name, len(everywhere)):  # `attn_weights = None` after the product: a new value
                continue
            use = next((s for s in reading.block if inside(node, s)), None)
            if index < after and isinstance(use, cst.SimpleStatementLine) and len(use.body) == 1 and \
                    isinstance(use.body[0], cst.Assert):  # fairseq's `assert list(w.size()) == [...]`: it goes
                chain.consumed.append(use)
                read_inside.update(id(n) for n in names_read(use))
                continue
            if index >= after and _detached_again(reading, node):
                read_inside.update(id(n) for n in names_read(chain.consumed[-1]))
                continue
            if name in chain.scores_names and id(node) not in bound and _metadata(reading, node):
                continue
            returned = None if index < after or id(node) in bound else _returned_or_stored(reading, node)
            if returned is None:
                what = "scores" if name in chain.scores_names else "probabilities"
                if isinstance(use, cst.If) and index < after:
                    raise Refused(_read_under_a_flag(name, use, node, what))
                shown = f" (`{one_line(use)}`)" if use is not None and len(one_line(use)) <= 60 else ""
                raise Refused(f"`{name}` is used outside the attention{shown}; the fused call does not give the "
                              f"{what} back")
            chain.elsewhere.append(returned)


def _detached_again(reading: Reading, name: cst.Name) -> bool:
    """`qk = qk.detach()` after the values product, before the weights are returned: the statement goes
    with the chain, and the later reads of `qk` are the weights returned (noted in `chain.consumed`)."""
    statement = next((s for s in reading.block if inside(name, s)), None)
    if statement is None or not plain_assignment(statement, name.value):
        return False
    value = statement.body[0].value
    while call_parts(value)[0] in _PASSED_ON and call_parts(value)[1] is not None:
        value = call_parts(value)[1]
    if not isinstance(value, cst.Name) or value.value != name.value:
        return False
    if statement not in reading.chain.consumed:
        reading.chain.consumed.append(statement)
    return True


def _metadata(reading: Reading, name: cst.Name) -> bool:
    """`scores.device` (and `scores.dtype` when no cast made the scores) read to build a bias or a mask: the
    query's, which is the same, takes its place (noted in `chain.renamed`)."""
    path = path_to(reading.function, name) or []
    parent = path[-2] if len(path) >= 2 else None
    allowed = ("device",) if reading.chain.scores_cast else ("device", "dtype")
    if not isinstance(parent, cst.Attribute) or parent.value is not name or parent.attr.value not in allowed or \
            reading.chain.q is None:
        return False
    query = reading.chain.q
    while not isinstance(query, cst.Name) and call_parts(query)[1] is not None:  # `q.permute(...)` is on q's device
        query = call_parts(query)[1]
    reading.chain.renamed.append((parent, parent.with_changes(value=atom(query))))
    return True


def _returned_or_stored(reading: Reading, name: cst.Name) -> cst.BaseExpression | None:
    """`return out, name`, `self.weights = name`, `cache = (out, name.detach())`: the expression None can
    take the place of; None when the value is used otherwise."""
    path = path_to(reading.function, name) or []
    parents = path[-2::-1]
    expression: cst.BaseExpression = name
    # `name.detach()`, `name.float().cpu()`, `name.view(b, h, q, k)` (OpenNMT-py): still only the weights;
    # `.mean(dim=0)` (fairseq's weights averaged over heads) is what they are returned as.
    while len(parents) >= 2 and isinstance(parents[0], cst.Attribute) and isinstance(parents[1], cst.Call) and \
            parents[1].func is parents[0] and parents[0].attr.value in _PASSED_ON + _RESHAPED + ("mean",):
        expression, parents = parents[1], parents[2:]
    if parents and isinstance(parents[0], cst.Element) and len(parents) > 1 and isinstance(parents[1], cst.Tuple):
        parents = parents[2:]
        if parents and isinstance(parents[0], cst.IfExp):  # `(out, probs) if output_attentions else (out,)`
            parents = parents[1:]
    stored = bool(parents) and (isinstance(parents[0], cst.Return) or
                                (isinstance(parents[0], cst.Assign) and parents[0].value in path))
    return expression if stored else None


def check_inputs_unchanged(reading: Reading) -> None:
    """q, k, the mask and the scale are read where the values product is; they must not change before."""
    chain = reading.chain
    body = list(reading.block)
    statements = [s for s in chain.consumed if s in body]
    if not statements or chain.values_statement not in body:
        return
    first = min(body.index(s) for s in statements)
    last = body.index(chain.values_statement)
    # The values are read where they always were, at the values product; the rest moves there, so each part
    # must not change between the statement that read it and the values product.
    reads = [(names, next((i for i, s in enumerate(body) if at is s or inside(at, s)), first))
             for names, at in reading.reads]
    reads.append(({n.value for part in (chain.guard, chain.dropout_p) if part is not None for n in names_read(part)},
                  first - 1))
    for names, read_at in reads:
        for statement in body[read_at + 1:last]:
            if statement in statements or statement is reading.guard_if:  # its setup runs before the mask is read
                continue
            changed = {n for n in names if n in assigned_names(statement) or mutated_in_place(statement, n)}
            if changed:
                raise Refused(f"`{sorted(changed)[0]}` changes between the scores and the values product")


# Methods that hand the weights on unchanged in value, as when they are returned for inspection: `attn.detach()`.
_PASSED_ON = ("detach", "cpu", "float", "clone", "contiguous", "to", "type_as", "half", "bfloat16")
# The same weights in another shape, returned so by OpenNMT-py (`attns = attn.view(batch, heads, q, k)`).
_RESHAPED = ("view", "reshape", "transpose", "permute", "squeeze", "unsqueeze", "flatten")


def _deleting(statement: cst.CSTNode) -> cst.Del | None:
    """The `del` of a statement that is only `del a, b`."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and \
            isinstance(statement.body[0], cst.Del):
        return statement.body[0]
    return None


def trim_dels(reading: Reading, call: cst.Call, removed: tuple) -> tuple[list, list]:
    """Uni-Fold's `del q, k` before the values product and `del attn, v` after it: the fused call reads q and k
    where the values product was, and the chain's variables are no longer made, so those names leave the `del`
    (a `del` frees memory; it computes nothing). Returns (statements to delete, (old, new) replacements)."""
    chain, body = reading.chain, list(reading.block)
    if chain.values_statement not in body:
        return [], []
    at = body.index(chain.values_statement)
    kept = [s for s in body if s not in removed and s is not chain.values_statement]
    made = set().union(*(assigned_names(s) for s in kept)) if kept else set()
    gone_names = {n for n in chain.names if n not in made}
    read = {n.value for n in names_read(call)}
    deletes, replaced = [], []
    for index, statement in enumerate(body):
        node = _deleting(statement)
        if node is None:
            continue
        targets = list(node.target.elements) if isinstance(node.target, cst.Tuple) else [cst.Element(node.target)]
        keep = [e for e in targets if not (isinstance(e.value, cst.Name) and (
            e.value.value in gone_names or (index < at and e.value.value in read)))]
        if len(keep) == len(targets):
            continue
        if not keep:
            deletes.append(statement)
        else:
            target = keep[0].value if len(keep) == 1 else cst.Tuple(
                [e.with_changes(comma=cst.MaybeSentinel.DEFAULT) for e in keep], lpar=[], rpar=[])
            replaced.append((node, node.with_changes(target=target)))
    return deletes, replaced


def _read_under_a_flag(name: str, guard: cst.If, node: cst.Name, what: str) -> str:
    """Why the chain stays when its variable is read in an `if` before the values product (BLIP's
    `if is_cross_attention and self.save_attention: self.save_attention_map(attention_probs)`): the statement
    cannot stay once they are not computed, and None in their place would break it where the flag holds."""
    read = next((s for s in guard.body.body if inside(node, s)), None) if isinstance(guard.body, cst.IndentedBlock) \
        else None
    shown = f" (`{one_line(read)}`)" if read is not None and len(one_line(read)) <= 60 else ""
    return (f"`{name}` is read under `if {code_of(guard.test)}:`{shown}; where that holds it needs the {what}, "
            "which the fused call does not give back, so the attention stays as written")


def _rebound(reading: Reading, everywhere: list, after: int) -> dict[str, int]:
    """Each name given a new value after the values product by a plain statement of the block that does not
    read it (fairseq's `attn_weights = None`), and where: what reads it from there reads the new value."""
    at = {id(n): i for i, n in enumerate(everywhere)}
    found: dict[str, int] = {}
    for statement in reading.block:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or \
                not isinstance(statement.body[0], cst.Assign) or len(statement.body[0].targets) != 1:
            continue
        target, value = statement.body[0].targets[0].target, statement.body[0].value
        index = at.get(id(target))
        if isinstance(target, cst.Name) and index is not None and index > after and \
                target.value not in {n.value for n in names_read(value)}:
            found.setdefault(target.value, index)
    return found
