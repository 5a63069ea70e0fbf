"""GL101's fix for `transformers` models: `attn_implementation="sdpa"` where the model is built."""

from __future__ import annotations

import libcst as cst

from graphlint.rewrite.contract import FixSite, Rewrite


def use_sdpa_in_transformers(site: FixSite) -> Rewrite | str:
    """`attn_implementation="sdpa"` on the user's `from_config` / `from_pretrained` call."""
    node = site.node
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or \
            node.func.attr.value not in ("from_config", "from_pretrained", "_from_config"):
        return ('the model is not built here by from_config or from_pretrained; build it with '
                'attn_implementation="sdpa"')
    value = cst.SimpleString('"sdpa"')
    args = list(node.args)
    for index, argument in enumerate(args):
        if argument.keyword is not None and argument.keyword.value == "attn_implementation":
            args[index] = argument.with_changes(value=value)
            break
    else:
        if any(a.star == "**" for a in args):
            return "the call passes **kwargs, which may already set attn_implementation"
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(value=value, keyword=cst.Name("attn_implementation"),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
    new = node.with_changes(args=args)
    return Rewrite(node, new, 'attn_implementation="sdpa"')
