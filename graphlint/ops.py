"""The vocabulary rules use to read the forward graph: op families and argument access.

Op names are the canonical names the capture gives: `matmul` stands for `a @ b`, `torch.matmul(a, b)`,
`a.matmul(b)` and `torch.linalg.matmul(a, b)` alike, `mul` for `torch.multiply` (graphlint.opnames), so a
family lists each op once.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphlint.capture.contract import facts
from graphlint.files import is_installed_file
from graphlint.opnames import CAST, MATMUL_LIKE  # kept there: the rewrites read them without torch
from graphlint.walk import chain, op  # op: rules read it from here, beside the op families

# How far a rule walks from one op of a pattern to the next (a longer path is other code, and the bound keeps
# every walk short): across the ops inside one pattern (attention's scale, mask and dropout; the work between
# two casts), and through the views, casts and picks in front of one value.
MAX_PATTERN_STEPS = 12
MAX_PASS_THROUGH_STEPS = 8

SOFTMAX = frozenset({"softmax", "_softmax", "_safe_softmax"})
MUL = frozenset({"mul"})  # a product of two values, as a hand-written formula spells it (`*`, torch.multiply)
DIV = frozenset({"div"})  # a quotient (`/`, torch.divide, torch.true_divide)
SCALE = MUL | DIV | frozenset({"mul_", "rmul", "div_", "rdiv"})
MASK = frozenset({"add", "add_", "radd", "sub", "sub_", "rsub", "masked_fill", "masked_fill_", "where"})
DROPOUT = frozenset({"dropout", "dropout_", "feature_dropout", "alpha_dropout", "native_dropout"})
MATMUL_CLASS = MATMUL_LIKE | frozenset({
    "linear", "addmm", "addbmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "bilinear",
})
# Work that is commonly and rightly done in float32 inside a half-precision model.
NUMERICALLY_SENSITIVE = frozenset({
    "softmax", "log_softmax", "_softmax", "_safe_softmax", "layer_norm", "rms_norm", "group_norm", "batch_norm",
    "instance_norm", "norm", "normalize", "var", "std", "var_mean", "std_mean", "mean", "sum", "pow", "rsqrt",
    "sqrt", "log", "log1p", "exp", "expm1", "logsumexp", "cumsum", "cross_entropy", "nll_loss", "mse_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "smooth_l1_loss", "l1_loss",
})
VIEW = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "transpose_", "permute", "contiguous", "squeeze",
    "unsqueeze", "expand", "expand_as", "flatten", "unflatten", "getitem", "t", "T", "mT", "clone", "movedim",
})


def is_own_code(node: fx.Node) -> bool:
    """Whether the project's own code made the call, not an installed library or one of torch.nn's modules."""
    known = facts(node)
    stack = known.stack
    if not stack or is_installed_file(stack[-1].file):
        return False
    return known.library_module is None


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """A call argument by position or keyword, as the capture recorded it."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def tensor_meta(node: Any) -> TensorMetadata | None:
    """The shape and dtype of a node's one output; None for a constant or a node with several outputs."""
    if isinstance(node, fx.Node):
        meta = facts(node).tensor_meta
        if isinstance(meta, TensorMetadata):
            return meta
    return None


def matmul_operands(node: fx.Node) -> list[Any]:
    """The two (or, for einsum, all) tensor operands of a matmul-like call."""
    name = op(node)
    if name == "einsum":
        operands = node.args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        return [o for o in operands if isinstance(o, fx.Node)]
    if name == "baddbmm":
        return [arg(node, 1, "batch1"), arg(node, 2, "batch2")]
    if name == "addmm":
        return [arg(node, 1, "mat1"), arg(node, 2, "mat2")]
    return [arg(node, 0, "input"), arg(node, 1, "other", node.kwargs.get("mat2"))]


def is_static(node: Any) -> bool:
    """Whether a value is a parameter, buffer or constant (seen through views and casts), not an activation."""
    return chain(node, VIEW | CAST, stop=lambda n: n.op == "get_attr", limit=16).found


def ran_in_library(node: fx.Node) -> bool:
    """Whether the op was called from an installed library's code (a `transformers` model's own RMSNorm),
    which its users cannot rewrite."""
    stack = facts(node).stack
    return bool(stack) and is_installed_file(stack[-1].file)


def strip_casts(node: Any) -> Any:
    """The value before any dtype conversions (`x.float()` is still `x` for a formula's shape)."""
    return chain(node, CAST, limit=MAX_PASS_THROUGH_STEPS).end


def row_max_shift(step: fx.Node, scores: fx.Node) -> bool:
    """`step` is `scores - scores.max(dim=-1, keepdim=True)[0]` (or `amax`, `logsumexp`): a shift by a value per
    row over the softmax's last dimension, which the softmax ignores (torchaudio's wav2vec2 guards overflow so)."""
    if op(step) != "sub" or len(step.args) < 2 or step.args[0] is not scores or not isinstance(step.args[1], fx.Node):
        return False
    shift = step.args[1]
    shift = chain(shift, ("detach",)).end
    if op(shift) == "getitem" and len(shift.args) == 2 and shift.args[1] == 0 and isinstance(shift.args[0], fx.Node):
        shift = shift.args[0]
        if op(shift) != "max":
            return False
    elif op(shift) not in ("amax", "logsumexp"):
        return False
    meta = tensor_meta(scores)
    dim = arg(shift, 1, "dim")
    dim = dim[0] if isinstance(dim, (list, tuple)) and len(dim) == 1 else dim
    return bool(shift.args) and shift.args[0] is scores and meta is not None and isinstance(dim, int) and \
        dim % len(meta.shape) == len(meta.shape) - 1 and arg(shift, 2, "keepdim") is True
