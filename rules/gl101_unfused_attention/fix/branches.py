"""The same softmax at the end of both branches of an `if`/`else`, one branch masking the scores first, as
Swin's window attention writes it:

    if mask is not None:
        attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
    else:
        attn = self.softmax(attn)

is `if mask is not None: <the masking>` followed by one `attn = self.softmax(attn)`. The walk reads a copy of
the function written that way (the statements are the same nodes, only the `if` is new); the rewrite it gives
is put back in the terms of the real function, where the whole `if`/`else` goes."""

from __future__ import annotations

import dataclasses

import libcst as cst

from .chain import Reading, block_in
from graphlint.rewrite.contract import Refused, Rewrite, code_of
from graphlint.rewrite.source import indent_of, inside, path_to, plain_name_assignment


@dataclasses.dataclass(frozen=True)
class Branches:
    real: cst.If  # the `if`/`else` of the source
    single: cst.If  # the same `if` with only the masking, as the walk reads it
    softmax: cst.SimpleStatementLine  # the softmax statement that follows it in the walk's copy

    def restored(self, rewrite: Rewrite) -> Rewrite:
        """The rewrite in the terms of the real function: the `if`/`else` goes as a whole, or the chain is
        left alone."""
        if self.single not in rewrite.removed or self.softmax not in rewrite.removed:
            raise Refused(f"`if {code_of(self.real.test)}:` does more than mask the scores; the fused call would "
                          "leave part of it")
        removed = tuple(self.real if s is self.single else s for s in rewrite.removed
                        if s is self.single or not inside(s, self.real))
        also = tuple(pair for pair in rewrite.also if not inside(pair[0], self.real))
        return dataclasses.replace(rewrite, removed=removed, also=also)


def softmax_in_both_branches(reading: Reading) -> Branches | None:
    """Where the finding's softmax ends one branch of an `if`/`else` whose other branch ends in the same
    statement: the walk is set to read the function with the softmax after a plain `if` (None otherwise).
    Raises Refused when the branches compute different things."""
    if reading.scopes or reading.start is not None:
        return None
    path = path_to(reading.function, reading.softmax_statement) or []
    if len(path) < 4 or not isinstance(path[-2], cst.IndentedBlock):
        return None
    owner = path[-3]
    real = path[-4] if isinstance(owner, cst.Else) else owner
    if not isinstance(real, cst.If) or not isinstance(real.orelse, cst.Else) or \
            not isinstance(real.body, cst.IndentedBlock) or not isinstance(real.orelse.body, cst.IndentedBlock):
        return None
    test = code_of(real.test)
    first, other = list(real.body.body), list(real.orelse.body.body)
    if reading.softmax_statement not in (first[-1], other[-1]):
        return None
    if code_of(first[-1]).strip() != code_of(other[-1]).strip() or not plain_name_assignment(first[-1]):
        raise Refused(f"the branches of `if {test}:` end in different statements (`{code_of(first[-1]).strip()}`, "
                      f"`{code_of(other[-1]).strip()}`); the fused call would compute one of them")
    if len(other) > 1:
        raise Refused(f"the `else` of `if {test}:` also changes the scores before the softmax; graphlint rewrites "
                      "such a choice only when the `else` is the softmax alone")
    if len(first) < 2:
        return None  # nothing chosen: the same statement either way; left to the plain walk's reason
    softmax = first[-1]
    reading.softmax = _same_place(reading.softmax_statement, reading.softmax, softmax)
    single = real.with_changes(body=real.body.with_changes(body=tuple(first[:-1])), orelse=None)
    holder = next(n for n in reversed(path[:path.index(real)]) if isinstance(n, cst.IndentedBlock))
    body = [s for b in holder.body for s in ((single, softmax) if b is real else (b,))]
    reading.function = with_block(reading.function, real, body)
    reading.block, reading.softmax_statement = block_in(reading.function, reading.softmax)
    reading.indent = indent_of(reading.module, real)
    return Branches(real, single, softmax)


def _same_place(root: cst.CSTNode, node: cst.CSTNode, other: cst.CSTNode) -> cst.CSTNode:
    """The node at the place in `other` that `node` has in `root` (two statements of the same code)."""
    path = path_to(root, node) or [root]
    found = other
    for parent, child in zip(path, path[1:], strict=False):
        index = next(i for i, c in enumerate(parent.children) if c is child)
        found = found.children[index]
    return found


def with_block(function: cst.FunctionDef, real: cst.If, body: list) -> cst.FunctionDef:
    """`function` with the statement list that holds `real` replaced by `body`: only the blocks and statements
    around it are new nodes, every other statement is the same node."""
    path = path_to(function, real) or []
    holder = next(n for n in reversed(path) if isinstance(n, cst.IndentedBlock))
    new: cst.CSTNode = holder.with_changes(body=tuple(body))
    for parent, child in reversed(list(zip(path, path[1:], strict=False))[: path.index(holder)]):
        new = _replace_child(parent, child, new)
    return new


def _replace_child(parent: cst.CSTNode, child: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    for field in dataclasses.fields(parent):
        value = getattr(parent, field.name)
        if value is child:
            return parent.with_changes(**{field.name: new})
        if isinstance(value, (tuple, list)) and any(v is child for v in value):
            return parent.with_changes(**{field.name: type(value)(new if v is child else v for v in value)})
    raise Refused("the function around the `if` could not be read")
