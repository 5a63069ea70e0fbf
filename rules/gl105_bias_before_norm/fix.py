"""GL105's fix: a layer whose bias a following norm cancels built with `bias=False`. The state dict loses the
bias, so the fix is unsafe by declaration."""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.contract import FixSite, Rewrite, call_parts, code_of
from graphlint.results import UNSAFE


def without_bias(site: FixSite) -> Rewrite | str:
    """`bias=False` on the layer's construction call."""
    node = site.node
    if not isinstance(node, cst.Call):
        return "the layer is not built by a call on this line"
    args = list(node.args)
    for index, argument in enumerate(args):
        if argument.keyword is not None and argument.keyword.value == "bias":
            args[index] = argument.with_changes(value=cst.Name("False"))
            break
    else:
        if any(a.star for a in args):
            return "the layer is built with *args or **kwargs, which may already pass bias"
        if len([a for a in args if a.keyword is None]) >= (3 if call_parts(node)[0] == "Linear" else 8):
            return "bias is passed by position"
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(value=cst.Name("False"), keyword=cst.Name("bias"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
    new = node.with_changes(args=args)
    # Removing the bias removes its entry from the state dict: existing checkpoints would not load strictly.
    return Rewrite(node, new, f"{code_of(node)} → {code_of(new)}; the state dict loses the layer's bias",
                   applicability=UNSAFE)
