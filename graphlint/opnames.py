"""Canonical op names: every alias torch has for an op is recorded under one name.

`torch.multiply`, `Tensor.multiply` and `a * b` are all `mul`; `torch.special.expit` is `sigmoid`;
`torch.linalg.matmul` is `matmul`. The capture folds names once, when it records a call, so the op families in
`graphlint.ops` and every rule list each op once. The canonical name is the short torch name (`torch.X` or
`Tensor.X`) where one exists. This module imports nothing heavy: locating spans reads it without torch.
"""

from __future__ import annotations

# Two op families (graphlint.ops has the others) that the source rewrites read too, kept here below torch.
MATMUL_LIKE = frozenset({"matmul", "rmatmul", "bmm", "baddbmm", "mm", "einsum"})
CAST = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as"})

# The name a call is recorded under (graphlint.capture.forward.op_name: a function's __name__, an operator
# dunder without its underscores) -> the canonical name: every alias torch documents ("Alias for ...") in
# torch, Tensor, torch.special and torch.linalg, and `//`. tests/test_op_names.py checks the table against torch.
# These also have in-place variants, folded the same way (`x.multiply_(2)` is `mul_`).
_WITH_IN_PLACE = {
    "multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "negative": "neg",
    "absolute": "abs", "clip": "clamp", "fix": "trunc",
    "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne",
    "arccos": "acos", "arccosh": "acosh", "arcsin": "asin", "arcsinh": "asinh", "arctan": "atan",
    "arctan2": "atan2", "arctanh": "atanh", "swapaxes": "transpose", "swapdims": "transpose",
}
_WITHOUT_IN_PLACE = {
    "floordiv": "floor_divide", "concat": "cat", "concatenate": "cat", "moveaxis": "movedim", "row_stack": "vstack",
    "ger": "outer", "nelement": "numel", "trapz": "trapezoid",
    "linalg_matmul": "matmul", "linalg_diagonal": "diagonal", "linalg_det": "det", "linalg_inv": "inverse",
    "linalg_pinv": "pinverse", "linalg_slogdet": "slogdet", "linalg_matrix_exp": "matrix_exp",
    "linalg_matrix_power": "matrix_power", "linalg_householder_product": "orgqr",
    "special_expit": "sigmoid", "special_erf": "erf", "special_erfc": "erfc", "special_erfinv": "erfinv",
    "special_exp2": "exp2", "special_expm1": "expm1", "special_log1p": "log1p", "special_logsumexp": "logsumexp",
    "special_softmax": "softmax", "special_log_softmax": "log_softmax", "special_logit": "logit",
    "special_round": "round", "special_sinc": "sinc", "special_xlogy": "xlogy", "special_i0": "i0",
    "special_digamma": "digamma", "special_psi": "digamma", "special_gammaln": "lgamma",
    "special_multigammaln": "mvlgamma", "special_polygamma": "polygamma", "special_gammainc": "igamma",
    "special_gammaincc": "igammac",
}
ALIASES = {**_WITH_IN_PLACE, **{f"{alias}_": f"{name}_" for alias, name in _WITH_IN_PLACE.items()}, **_WITHOUT_IN_PLACE}

_SPELLINGS: dict[str, set[str]] = {}
for _alias, _name in ALIASES.items():
    # How the alias is written in source: `torch.special.expit(...)` is a call named `expit`.
    _SPELLINGS.setdefault(_name, {_name}).add(_alias.removeprefix("special_").removeprefix("linalg_"))


def canonical(name: str) -> str:
    """The one name an op is recorded under, whichever alias the code called."""
    return ALIASES.get(name, name)


def spellings(name: str) -> frozenset[str]:
    """The names a call to the canonical op `name` can have in source (`mul`: `mul`, `multiply`)."""
    return frozenset(_SPELLINGS.get(name, (name,)))
