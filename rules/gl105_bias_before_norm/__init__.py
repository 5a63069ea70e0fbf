"""GL105 bias-before-norm: a convolution or Linear bias that the batch norm right after it cancels out."""

from __future__ import annotations

import math

import torch
from torch import fx

from graphlint.capture import facts
from graphlint.ops import CAST, MAX_PASS_THROUGH_STEPS, arg, op, ran_in_library, tensor_meta
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Problem, Rule
from graphlint.walk import line

# Spatial dimensions after the channel axis of each layer's output; a Linear's features are its last axis.
_LAYERS = {"linear": 0, "conv1d": 1, "conv2d": 2, "conv3d": 3,
           "conv_transpose1d": 1, "conv_transpose2d": 2, "conv_transpose3d": 3}
_SAME_AXES = CAST | frozenset({"contiguous", "clone"})
_RESHAPES = frozenset({"view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze"})
_REARRANGES = frozenset({"transpose", "swapaxes", "swapdims", "permute", "t", "movedim", "moveaxis"})
_MAX_INDEX_ELEMENTS = 1 << 21  # larger outputs follow the bias's axis alone
# Calls that take a tensor for its shape, dtype or device only: as their second argument, or as their first.
_SHAPE_OF_SECOND = frozenset({"view_as", "reshape_as", "expand_as", "type_as"})
_SHAPE_OF_FIRST = frozenset({"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                             "randint_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"})


class BiasBeforeNorm(Rule):
    id = "GL105"
    name = "bias-before-norm"
    severity = Severity.WARNING
    tags = ("performance", "normalization", "memory")
    precision = "high"
    summary = "A Conv or Linear bias directly followed by a batch norm, which subtracts it again: it learns nothing."
    what = """
        A `Conv1d/2d/3d`, `ConvTranspose*d` or `Linear` with a bias whose output goes only into a norm that
        subtracts a per-channel mean computed over the batch: `BatchNorm1d/2d/3d` in training mode,
        `InstanceNorm*d`, `GroupNorm` with one channel per group, or their functional forms. Reshapes,
        flattens and permutes may sit in between as long as each channel of the norm still sees one bias value,
        whatever index the bias's axis has by then: `transpose(1, 2)` or `permute` before a `BatchNorm1d`,
        batch and tokens merged with `flatten(0, 1)` (LeViT's `bn(x.flatten(0, 1)).reshape_as(x)`), a conv in
        channels-last layout flattened to `(N, C)`, `unsqueeze`. Uses of the layer's output for its shape only
        (`reshape_as(x)`, `zeros_like(x)`) do not count as other uses.

        The finding points at the line that built the layer (the argument inside `nn.Sequential(...)` when it
        is there), once per line with the number of layers; the norm is a related location. Not flagged:
        `bias=False`; an activation, dropout or any other op between the two; a norm that does not subtract
        a per-channel mean over the batch (`LayerNorm` over the features, `GroupNorm` with several channels
        per group, a batch norm in eval mode); a reshape that spreads a Linear's features over channels and
        positions (a DCGAN generator's `Linear → view(C, 4, 4) → BatchNorm2d`), where each channel gets
        several bias values; a layer output that is also used elsewhere; layers in installed libraries.
    """
    why = """
        The norm subtracts the mean of each channel, and a bias adds one constant to each channel, so the
        bias is subtracted again exactly: it has no effect on the output and its gradient is zero (up to
        rounding). It still costs a parameter, a broadcast add (or a slower kernel) in the forward and a
        reduction in the backward in every layer. PyTorch's Performance Tuning Guide recommends disabling it;
        the norm's own shift (its `bias`) already does its job.
    """
    example = """
        self.block = nn.Sequential(
            nn.Conv2d(64, 128, 3, padding=1),
            nn.BatchNorm2d(128),
            nn.ReLU(inplace=True),
        )
    """
    instead = """
        self.block = nn.Sequential(
            nn.Conv2d(64, 128, 3, padding=1, bias=False),
            nn.BatchNorm2d(128),
            nn.ReLU(inplace=True),
        )
    """
    fixes = """
        Unsafe: `--fix --unsafe-fixes` builds the layer with `bias=False` (or turns `bias=True` into
        `bias=False`). Removing the bias removes `<layer>.bias` from the state dict, so existing checkpoints no
        longer load strictly and, in eval mode, a BatchNorm's running mean no longer matches: the fix is declared
        unsafe, is not shown with `[*]`, is not sent through the proof (which could never pass), and only
        `--unsafe-fixes` applies it, for code that has not been trained yet. Left alone: a bias passed by
        position or through `*args`/`**kwargs`.
    """
    bad_examples = (
        Example(
            title="VGG-style blocks in nn.Sequential, one of them already without the bias",
            source='''
                import torch
                from torch import nn


                def block(c_in, c_out):
                    return nn.Sequential(
                        nn.Conv2d(c_in, c_out, 3, padding=1),  # expect: GL105
                        nn.BatchNorm2d(c_out),
                        nn.ReLU(),
                    )


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.features = nn.Sequential(block(3, 8), block(8, 8), nn.AdaptiveAvgPool2d(1))
                        self.stem = nn.Conv2d(3, 3, 1, bias=False)
                        self.stem_norm = nn.BatchNorm2d(3)
                        self.head = nn.Linear(8, 4)

                    def forward(self, x):
                        x = self.stem_norm(self.stem(x))
                        return self.head(self.features(x).flatten(1))


                def make():
                    return Net(), (torch.randn(2, 3, 8, 8),)
            ''',
            fixed='''
                import torch
                from torch import nn


                def block(c_in, c_out):
                    return nn.Sequential(
                        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),  # expect: GL105
                        nn.BatchNorm2d(c_out),
                        nn.ReLU(),
                    )


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.features = nn.Sequential(block(3, 8), block(8, 8), nn.AdaptiveAvgPool2d(1))
                        self.stem = nn.Conv2d(3, 3, 1, bias=False)
                        self.stem_norm = nn.BatchNorm2d(3)
                        self.head = nn.Linear(8, 4)

                    def forward(self, x):
                        x = self.stem_norm(self.stem(x))
                        return self.head(self.features(x).flatten(1))


                def make():
                    return Net(), (torch.randn(2, 3, 8, 8),)
            ''',
        ),
        Example(
            title="a Linear and BatchNorm1d over tokens, and a Conv1d into a functional instance norm",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Mixer(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.proj = nn.Linear(dim, dim)  # expect: GL105
                        self.norm = nn.BatchNorm1d(dim)
                        self.conv = nn.Conv1d(dim, dim, 3, padding=1)  # expect: GL105
                        self.out = nn.Linear(dim, dim)

                    def forward(self, x):
                        h = torch.relu(self.norm(self.proj(x).transpose(1, 2)))
                        h = F.instance_norm(self.conv(h))
                        return self.out(torch.relu(h).transpose(1, 2))


                def make():
                    return Mixer(), (torch.randn(4, 8, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Mixer(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.proj = nn.Linear(dim, dim, bias=False)  # expect: GL105
                        self.norm = nn.BatchNorm1d(dim)
                        self.conv = nn.Conv1d(dim, dim, 3, padding=1, bias=False)  # expect: GL105
                        self.out = nn.Linear(dim, dim)

                    def forward(self, x):
                        h = torch.relu(self.norm(self.proj(x).transpose(1, 2)))
                        h = F.instance_norm(self.conv(h))
                        return self.out(torch.relu(h).transpose(1, 2))


                def make():
                    return Mixer(), (torch.randn(4, 8, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="bias=False, an activation in between, LayerNorm and GroupNorm, and a DCGAN generator's reshape",
            source='''
                import torch
                from torch import nn


                class Generator(nn.Module):
                    def __init__(self, z=8, c=16):
                        super().__init__()
                        self.c = c
                        self.project = nn.Linear(z, c * 4 * 4)
                        self.bn0 = nn.BatchNorm2d(c)
                        self.up = nn.ConvTranspose2d(c, c, 4, 2, 1, bias=False)
                        self.bn1 = nn.BatchNorm2d(c)
                        self.conv = nn.Conv2d(c, c, 3, padding=1)
                        self.bn2 = nn.BatchNorm2d(c)
                        self.grouped = nn.Conv2d(c, c, 3, padding=1)
                        self.gn = nn.GroupNorm(4, c)
                        self.fc = nn.Linear(c, c)
                        self.ln = nn.LayerNorm(c)

                    def forward(self, noise):
                        h = torch.relu(self.bn0(self.project(noise).view(-1, self.c, 4, 4)))
                        h = torch.relu(self.bn1(self.up(h)))
                        h = self.bn2(torch.relu(self.conv(h)))
                        h = torch.relu(self.gn(self.grouped(h)))
                        return torch.tanh(self.ln(self.fc(h.mean((2, 3)))))


                def make():
                    return Generator(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="a convolution output also used by a shortcut, and a model in eval mode",
            source='''
                import torch
                from torch import nn


                class Block(nn.Module):
                    def __init__(self, c=8):
                        super().__init__()
                        self.conv = nn.Conv2d(c, c, 3, padding=1)
                        self.bn = nn.BatchNorm2d(c)
                        self.fine_tuned = nn.Conv2d(c, c, 1)
                        self.frozen_bn = nn.BatchNorm2d(c)

                    def forward(self, x):
                        h = self.conv(x)
                        h = torch.relu(self.bn(h) + h)
                        return self.frozen_bn(self.fine_tuned(h))


                def make():
                    model = Block()
                    model.frozen_bn.eval()
                    return model, (torch.randn(2, 8, 6, 6),)
            ''',
        ),
    )

    def check(self, capture):
        for node in capture.ops:
            spatial = _LAYERS.get(op(node))
            if spatial is None or not _has_trained_bias(node) or ran_in_library(node):
                continue
            meta = tensor_meta(node)
            if meta is None or len(meta.shape) < 2:
                continue
            norm = _cancelling_norm(node, len(meta.shape) - 1 - spatial)
            if norm is not None:
                yield _problem(node, norm)


@LazyFixer
def without_bias():
    """GL105's fix: the layer built with bias=False."""
    from .fix import without_bias

    return without_bias


def _problem(layer: fx.Node, norm: fx.Node) -> Problem:
    kind = "Linear" if op(layer) == "linear" else op(layer).replace("conv_transpose", "ConvTranspose").replace("conv", "Conv")
    norm_name = op(norm).replace("_", " ")
    return Problem(
        node=layer,
        message=(f"The bias of this {kind} in {{where}}{{occurrences}} is cancelled by the {norm_name} right "
                 "after it, which subtracts each channel's mean: it always gets a zero gradient; build the layer "
                 "with bias=False."),
        related=((norm, f"the {norm_name} that cancels it"),),
        at_build_site=True,
        fix=without_bias,
    )


def _has_trained_bias(layer: fx.Node) -> bool:
    bias = arg(layer, 2, "bias")
    return isinstance(bias, fx.Node) and bias.op == "get_attr" and facts(bias).is_parameter


def _cancelling_norm(layer: fx.Node, axis: int) -> fx.Node | None:
    """The norm that alone uses the layer's output, through views that keep each of its channels fed by one
    bias value (the bias's axis as its channel axis, whatever index it has, perhaps merged with other
    per-sample axes), when it subtracts a mean per channel; None otherwise."""
    index = _bias_index(layer, axis)
    for user in line(_only_reader(layer), _only_reader, limit=MAX_PASS_THROUGH_STEPS):
        if op(user) in ("batch_norm", "instance_norm", "group_norm"):
            if not _subtracts_channel_mean(user):
                return None
            cancelled = _one_bias_per_channel(index) if index is not None else axis == 1
            return user if cancelled else None
        index = _replay(user, index) if index is not None else None
        axis = _axis_after(user, axis) if axis is not None else None
        if index is None and axis is None:
            return None
    return None


def _only_reader(node: fx.Node) -> fx.Node | None:
    """The one op that reads the node's values, taking it as its input; None when there are several or another
    use."""
    users = [user for user in node.users if not _reads_shape_only(user, node)]
    if len(users) != 1 or arg(users[0], 0, "input") is not node:
        return None
    return users[0]


def _bias_index(layer: fx.Node, axis: int) -> torch.Tensor | None:
    """A tensor of the layer output's shape holding, at each element, the index of the bias element added
    there; replaying the views on it shows which bias values each norm channel sees. None when too large,
    where the axis is followed instead."""
    meta = tensor_meta(layer)
    if meta is None or math.prod(meta.shape) > _MAX_INDEX_ELEMENTS:
        return None
    shape = [1] * len(meta.shape)
    shape[axis] = meta.shape[axis]
    return torch.arange(meta.shape[axis]).reshape(shape).expand(meta.shape)


def _replay(view: fx.Node, index: torch.Tensor) -> torch.Tensor | None:
    """The view applied to the index tensor; None when the op is not a pure rearrangement of elements."""
    name = op(view)
    after = tensor_meta(view)
    if after is None:
        return None
    if name in _SAME_AXES:
        out = index
    elif name in _RESHAPES:
        out = index.reshape(after.shape) if math.prod(after.shape) == index.numel() else None
    elif name in ("T", "mT"):
        out = getattr(index, name)
    elif name in _REARRANGES:
        try:
            out = getattr(index, name)(*view.args[1:], **view.kwargs)
        except Exception:  # arguments recorded as nodes or in a form the method does not take
            return None
    else:
        return None
    return out if out is not None and tuple(out.shape) == tuple(after.shape) else None


def _one_bias_per_channel(index: torch.Tensor) -> bool:
    """Whether every channel (axis 1) of the norm's input holds one bias element at all its positions."""
    if index.dim() < 2:
        return False
    per_channel = index.transpose(0, 1).reshape(index.shape[1], -1)
    return bool((per_channel == per_channel[:, :1]).all())


def _reads_shape_only(user: fx.Node, value: fx.Node) -> bool:
    """Whether `user` reads only the shape, dtype or device of `value`, not its numbers: `y.reshape_as(value)`
    (LeViT's `bn(x.flatten(0, 1)).reshape_as(x)`), `torch.zeros_like(value)`, `value.new_zeros(...)`."""
    name = op(user)
    if name in _SHAPE_OF_SECOND:
        return arg(user, 0, "input") is not value
    return name in _SHAPE_OF_FIRST


def _subtracts_channel_mean(norm: fx.Node) -> bool:
    name = op(norm)
    if name == "batch_norm":
        return arg(norm, 5, "training", False) is True
    if name == "instance_norm":
        return arg(norm, 5, "use_input_stats", True) is True
    meta = tensor_meta(arg(norm, 0, "input"))  # group_norm: one channel per group is an instance norm
    return meta is not None and len(meta.shape) >= 2 and arg(norm, 1, "num_groups") == meta.shape[1]


def _axis_after(view: fx.Node, axis: int) -> int | None:
    """Where the channel axis is in the view's output; None when the view mixes it with other dimensions."""
    name = op(view)
    if name in _SAME_AXES:
        return axis
    before, after = tensor_meta(arg(view, 0, "input")), tensor_meta(view)
    if before is None or after is None:
        return None
    ndim = len(before.shape)
    if name == "transpose" and len(view.args) >= 3:
        first, second = (d % ndim for d in view.args[1:3])
        return second if axis == first else first if axis == second else axis
    if name in ("t", "T", "mT"):  # 2-D transpose, all dimensions reversed, the last two swapped
        if name == "mT":
            return {ndim - 1: ndim - 2, ndim - 2: ndim - 1}.get(axis, axis)
        return ndim - 1 - axis
    if name in ("movedim", "moveaxis") and len(view.args) >= 3 and all(isinstance(d, int) for d in view.args[1:3]):
        order = list(range(ndim))
        source, destination = (d % ndim for d in view.args[1:3])
        order.insert(destination, order.pop(source))
        return order.index(axis)
    if name == "permute":
        dims = view.args[1:] if len(view.args) > 2 else view.args[1] if len(view.args) == 2 else view.kwargs.get("dims")
        order = [d % ndim for d in dims] if isinstance(dims, (list, tuple)) else []
        return order.index(axis) if axis in order else None
    if name in _RESHAPES:
        # The same size, with as many elements before it: the axis survived as one dimension.
        leading = math.prod(before.shape[:axis])
        places = [j for j in range(len(after.shape))
                  if after.shape[j] == before.shape[axis] and math.prod(after.shape[:j]) == leading]
        return places[0] if len(places) == 1 else None
    return None
