"""GL106 unfused-norm: LayerNorm or RMSNorm written out by hand instead of the one-kernel op."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic

from torch import fx

from graphlint.capture import facts
from graphlint.memory.savings import norm_savings
from graphlint.ops import CAST, DIV, MUL, arg, op, ran_in_library, strip_casts, tensor_meta
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Match, Matched, Problem, Rule
from graphlint.walk import line


class UnfusedNorm(Rule):
    id = "GL106"
    name = "unfused-norm"
    severity = Severity.WARNING
    tags = ("performance", "normalization", "memory")
    precision = "high"
    summary = "LayerNorm or RMSNorm written out by hand; F.layer_norm and F.rms_norm run it as one kernel."
    what = """
        A normalisation over the last dimensions, or over the channels of a channels-first tensor (ConvNeXt's
        `u = x.mean(1, keepdim=True)`), spelled out step by step, with or without a float32 up-cast:

        - LayerNorm: the mean, the centred input `x - mean`, the biased variance (`(x - mean).pow(2).mean(-1,
          keepdim=True)`, `x.var(-1, keepdim=True, unbiased=False)` or `correction=0`, `torch.var_mean(x, -1,
          keepdim=True, correction=0)`, the square of a biased `std` or of `torch.std_mean`'s), `+ eps`, and
          the root: `rsqrt`, `** -0.5`, `1 / sqrt(...)` or `sqrt(...).reciprocal()` times the centred input, or
          the centred input divided by `sqrt` or `** 0.5`;
        - RMSNorm: the mean of squares (`x.pow(2)`, `x ** 2`, `x * x`, `x.square()`), `+ eps` (or `.add(eps)`),
          and the same roots, with `x`;

        followed or not by a learned scale and shift, also when the scale multiplies the input before the
        division (`self.scale * x / torch.sqrt(...)`). It is reported once per line with the number of layers
        that run it. The finding points at the normalising step (the product or division); the mean is a
        related location. Not flagged: `nn.LayerNorm`, `nn.RMSNorm` and their functional forms,
        `F.normalize` and `x / x.norm(dim=-1, keepdim=True)` (L2 normalisation), standardising by constants
        or by the unbiased standard deviation (the default of `var`, `std`, `var_mean` and `std_mean`), epsilon
        added to the standard deviation rather than the variance (`(x - mu) / (sigma + eps)`, as the Annotated
        Transformer writes it: not the library's formula, and rewriting it would change the numbers),
        statistics over the batch dimension, and normalisations inside installed libraries (`transformers`' own
        `LlamaRMSNorm`).
    """
    why = """
        Written out, a norm is five to eight kernels, each reading and writing the whole activation, and
        autograd saves most of the intermediates (the centred input, the squares, the reciprocal root) for
        backward, in every layer. `F.layer_norm` and `F.rms_norm` compute the same result in one kernel that
        saves only the input and two small per-row statistics, and their backward is one kernel too.
    """
    example = """
        class RMSNorm(nn.Module):
            def forward(self, x):
                variance = x.float().pow(2).mean(-1, keepdim=True)
                return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).type_as(x)
    """
    instead = """
        self.norm = nn.RMSNorm(dim, eps=eps)          # torch >= 2.4; or F.rms_norm(x, (dim,), weight, eps)
        self.norm = nn.LayerNorm(dim, eps=eps)        # or F.layer_norm(x, (dim,), weight, bias, eps)
    """
    fixes = """
        Safe, once proven: `--fix` replaces the body of a method that is only the norm (a norm module's `forward(self,
        x)`, or a helper such as Llama's `_norm(self, x)` that `forward` calls between `.float()` and `.type_as(x)`,
        which stay) with one call: `F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)` or `F.layer_norm(x,
        (x.shape[-1],), self.weight, self.bias, self.eps)`, keeping the module, its parameters and so every checkpoint;
        the float32 up-cast inside goes (the library kernels accumulate in float32). The scale and shift are the
        module's attributes that multiply and add, whatever their names (`self.g`, `self.gamma`, `self.scale`), taken
        into the call only when the capture saw them as parameters of exactly the normalised shape: a gain of shape `(1,
        1, dim)` or one used as `(1 + self.weight)` stays a product after the call. The epsilon is what the root adds to
        the statistic (`self.eps`, a number, or a plain name such as a function's `eps` argument). Any other norm, in
        the middle of a larger forward (`h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)`, `(h - mu) /
        torch.sqrt(var + eps)`, a helper function, a branch), becomes `F.rms_norm(h, (h.shape[-1],), eps=eps)` or
        `F.layer_norm(...)` in place of the normalising expression (also written with methods:
        `h.sub(mean).div(torch.sqrt(var + eps))`, `torch.mul(h, torch.rsqrt(...))`), what multiplies and adds after it
        staying as written, and the statistics' statements go when nothing else reads them. A norm over the channels of
        a channels-first tensor moves them last for the call and back: `F.layer_norm(x.movedim(1, -1), (x.shape[1],),
        eps=self.eps).movedim(-1, 1)`. The file's own names for `torch.nn.functional` are used, and a call too long for
        its line is laid out as ruff and black lay it out. Left alone, with the reason: a normalising step spread so
        that the centred input or the root cannot be read back from the source. `F.rms_norm` needs torch 2.4; on older
        torch the proof fails and nothing is written.
    """
    bad_examples = (
        Example(
            title="a hand-written RMSNorm with a float32 up-cast in every layer",
            source='''
                import torch
                from torch import nn


                class RMSNorm(nn.Module):
                    def __init__(self, dim, eps=1e-6):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))

                    def forward(self, x):
                        h = x.float()
                        variance = h.pow(2).mean(-1, keepdim=True)
                        h = h * torch.rsqrt(variance + self.eps)  # expect: GL106
                        return self.weight * h.to(x.dtype)


                class Block(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.norm = RMSNorm(dim)
                        self.fc = nn.Linear(dim, dim)

                    def forward(self, x):
                        return x + self.fc(self.norm(x))


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.layers = nn.ModuleList(Block() for _ in range(4))

                    def forward(self, x):
                        for layer in self.layers:
                            x = layer(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 8, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn


                class RMSNorm(nn.Module):
                    def __init__(self, dim, eps=1e-6):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))

                    def forward(self, x):
                        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


                class Block(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.norm = RMSNorm(dim)
                        self.fc = nn.Linear(dim, dim)

                    def forward(self, x):
                        return x + self.fc(self.norm(x))


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.layers = nn.ModuleList(Block() for _ in range(4))

                    def forward(self, x):
                        for layer in self.layers:
                            x = layer(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 8, 16),)
            ''',
        ),
        Example(
            title="a hand-written LayerNorm with a learned scale and shift",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class LayerNorm(nn.Module):
                    def __init__(self, dim, eps=1e-5):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))
                        self.bias = nn.Parameter(torch.zeros(dim))

                    def forward(self, x):
                        mean = x.mean(-1, keepdim=True)
                        var = x.var(-1, keepdim=True, unbiased=False)
                        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias  # expect: GL106


                class Encoder(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.norm = LayerNorm(16)

                    def forward(self, x):
                        return self.norm(torch.relu(self.fc(x)))


                def make():
                    return Encoder(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class LayerNorm(nn.Module):
                    def __init__(self, dim, eps=1e-5):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))
                        self.bias = nn.Parameter(torch.zeros(dim))

                    def forward(self, x):
                        return F.layer_norm(
                            x, (x.shape[-1],), self.weight, self.bias, self.eps
                        )  # expect: GL106


                class Encoder(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.norm = LayerNorm(16)

                    def forward(self, x):
                        return self.norm(torch.relu(self.fc(x)))


                def make():
                    return Encoder(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="ConvNeXt's LayerNorm over the channels of an image",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class LayerNorm2d(nn.Module):
                    def __init__(self, channels, eps=1e-6):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(channels))
                        self.bias = nn.Parameter(torch.zeros(channels))
                        self.eps = eps

                    def forward(self, x):
                        u = x.mean(1, keepdim=True)
                        s = (x - u).pow(2).mean(1, keepdim=True)
                        x = (x - u) / torch.sqrt(s + self.eps)  # expect: GL106
                        return self.weight[:, None, None] * x + self.bias[:, None, None]


                class Stem(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
                        self.norm = LayerNorm2d(8)

                    def forward(self, x):
                        return self.norm(self.conv(x))


                def make():
                    return Stem(), (torch.randn(2, 3, 16, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class LayerNorm2d(nn.Module):
                    def __init__(self, channels, eps=1e-6):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(channels))
                        self.bias = nn.Parameter(torch.zeros(channels))
                        self.eps = eps

                    def forward(self, x):
                        x = F.layer_norm(x.movedim(1, -1), (x.shape[1],), eps=self.eps).movedim(
                            -1, 1
                        )  # expect: GL106
                        return self.weight[:, None, None] * x + self.bias[:, None, None]


                class Stem(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
                        self.norm = LayerNorm2d(8)

                    def forward(self, x):
                        return self.norm(self.conv(x))


                def make():
                    return Stem(), (torch.randn(2, 3, 16, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the library norms, L2 normalisation, constant standardisation, batch statistics and eps on the std",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Model(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.ln = nn.LayerNorm(dim)
                        self.rms = nn.RMSNorm(dim, eps=1e-6)
                        self.fc = nn.Linear(dim, dim)

                    def forward(self, x):
                        x = (x - 0.5) / 0.25
                        h = self.rms(self.fc(self.ln(x)))
                        h = F.layer_norm(h, (h.shape[-1],)) + F.rms_norm(h, (h.shape[-1],))
                        unit = F.normalize(h, dim=-1) + h / h.norm(dim=-1, keepdim=True)
                        mean = h.mean(0, keepdim=True)
                        whitened = (h - mean) / torch.sqrt(((h - mean) ** 2).mean(0, keepdim=True) + 1e-5)
                        mu = h.mean(-1, keepdim=True)
                        standardised = (h - mu) / (h.std(-1, keepdim=True) + 1e-6)  # eps on the std: another formula
                        return unit + whitened + standardised


                def make():
                    return Model(), (torch.randn(4, 16),)
            ''',
        ),
    )

    def check(self, capture):
        for node in capture.ops:
            if _is_root(node) and not ran_in_library(node):
                found = _norm(node)
                if found is not None and not ran_in_library(found[0]):
                    problem = _problem(*found)
                    saves = norm_savings(capture, problem.node, found[1])
                    if saves <= 0:  # autograd keeps none of it (inside a custom autograd.Function's forward)
                        problem = replace(problem, message=problem.message.replace(
                            " and saves less for backward.", "."))
                    yield replace(problem, saves_bytes=saves)


@LazyFixer
def library_norm():
    """GL106's fix: F.layer_norm or F.rms_norm in place of the norm written by hand."""
    from .fix import library_norm

    return library_norm


def _problem(step: fx.Node, mean: fx.Node, kind: str, match: NormMatch[fx.Node]) -> Problem:
    library = "nn.LayerNorm / F.layer_norm" if kind == "LayerNorm" else "nn.RMSNorm / F.rms_norm"
    meta = tensor_meta(step)
    dims = _row_dims(mean.args[0] if op(mean) == "getitem" else mean) or (-1,)
    ndim = len(meta.shape) if meta is not None else 0
    trailing = ndim == 0 or dims == tuple(range(ndim - len(dims), ndim))  # unknown rank: the last dimension
    channel = None if trailing else dims[0]
    shape = tuple(meta.shape[d] for d in dims) if meta is not None else ()
    return Problem(
        node=step,
        message=(f"{kind} written out by hand in {{where}}{{occurrences}}; {library} runs it as one kernel and "
                 "saves less for backward."),
        related=((mean, "the mean it normalises by" if kind == "LayerNorm" else "the mean of squares"),),
        fix=library_norm.bound(kind=kind, channel=channel, dims=len(dims), flat=_flat_parameters(step, shape)),
        match=match,
    )


@dataclass(frozen=True)
class NormMatch(Match, Generic[Matched]):
    """What GL106's fix is built from: the normalising step, the root it divides by or multiplies with, the
    statistic under the root, and for a LayerNorm whose step normalises `x - mean` the centring mean and that
    centred input."""

    step: Matched
    root: Matched
    statistic: Matched
    mean: Matched | None = None
    centred: Matched | None = None


def _flat_parameters(step: fx.Node, shape: tuple[int, ...]) -> frozenset[str]:
    """The attribute names of the parameters of exactly the normalised shape that scale or shift the normalised
    value right after the step (or inside its numerator): those the library call can take as weight and bias."""
    found: set[str] = set()
    values = [a for a in step.args if isinstance(a, fx.Node) and op(a) in MUL]
    values += line(step, _scaled_or_shifted, limit=6)
    for value in values:
        for operand in value.args:
            operand = strip_casts(operand)
            meta = tensor_meta(operand)
            if isinstance(operand, fx.Node) and operand.op == "get_attr" and facts(operand).is_parameter and \
                    meta is not None and tuple(meta.shape) == shape:
                found.add(str(operand.target).rsplit(".", 1)[-1])
    return frozenset(found)


def _scaled_or_shifted(node: fx.Node) -> fx.Node | None:
    """The node's one user when it multiplies, adds to or casts it; None otherwise."""
    users = list(node.users)
    return users[0] if len(users) == 1 and op(users[0]) in MUL | CAST | frozenset({"add"}) else None


def _is_root(node: fx.Node) -> bool:
    """`rsqrt(s)`, `sqrt(s)`, `s ** -0.5` or `s ** 0.5`: the root of the statistic plus epsilon."""
    name = op(node)
    return name in ("rsqrt", "sqrt") or (name == "pow" and arg(node, 1, "exponent") in (-0.5, 0.5))


def _norm(root: fx.Node) -> tuple[fx.Node, fx.Node, str, NormMatch[fx.Node]] | None:
    """(normalising step, mean, "LayerNorm" or "RMSNorm", the match) for `rsqrt(stat + eps)`,
    `sqrt(stat + eps)` or `(stat + eps) ** -0.5`, where stat is the biased variance (`var`, `var_mean` with
    correction 0, a squared biased `std` or `std_mean`, the mean of squares of the centred input) or the mean of
    squares."""
    plus_eps = strip_casts(arg(root, 0, "input"))
    if not isinstance(plus_eps, fx.Node) or op(plus_eps) != "add" or len(plus_eps.args) != 2:
        return None
    stat, eps = plus_eps.args
    if not isinstance(stat, fx.Node):
        stat, eps = eps, stat
    if not isinstance(stat, fx.Node) or not isinstance(eps, float) or not 0 < eps < 0.1:
        return None
    stat = strip_casts(stat)
    variance = _biased_variance(stat)
    if variance is not None:
        reducer, base = variance
        dims = _row_dims(reducer)
        kind, centred, anchor = "LayerNorm", None, stat
    elif op(stat) == "mean":
        dims = _row_dims(stat)
        base = _squared(arg(stat, 0, "input"))
        if base is None:
            return None
        centred = base if _centring_mean(base, dims) is not None else None
        kind, anchor = ("LayerNorm" if centred is not None else "RMSNorm"), stat
    else:
        return None
    if dims is None:
        return None
    for step, numerator in _normalising_steps(root):
        for other in _factors(numerator):
            if kind == "RMSNorm" and other is base:
                return step, anchor, kind, NormMatch(step, root, stat)
            if kind == "LayerNorm":
                mean = _centring_mean(other, dims)
                x = base if centred is None else arg(centred, 0, "input")
                if mean is not None and strip_casts(_reduced(mean)) is strip_casts(x):
                    return step, mean, kind, NormMatch(step, root, stat, mean, other)
    return None


def _factors(numerator) -> list:
    """What a normalising step may normalise: its numerator, or a factor of it (`self.scale * x / sqrt(...)`)."""
    numerator = strip_casts(numerator)
    found = [numerator]
    if isinstance(numerator, fx.Node) and op(numerator) in MUL and len(numerator.args) == 2:
        found += [strip_casts(a) for a in numerator.args]
    return found


def _normalising_steps(root: fx.Node):
    """(step, what it normalises) for each use of the root: `y * rsqrt(...)` (either order), `y / sqrt(...)`,
    and `y * (1 / sqrt(...))` or `y * sqrt(...).reciprocal()`."""
    inverse = op(root) == "rsqrt" or (op(root) == "pow" and arg(root, 1, "exponent") == -0.5)
    for step in root.users:
        if not inverse and (op(step) == "reciprocal" or (op(step) == "rdiv" and step.args[1:2] in ((1,), (1.0,)))):
            for outer in step.users:
                other = _normalised(outer, step, inverse=True)
                if other is not None:
                    yield outer, other
            continue
        other = _normalised(step, root, inverse)
        if other is not None:
            yield step, other


def _biased_variance(stat: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the reducing call, its input) when `stat` is a biased variance: `var(..., correction=0)`, the variance
    of `var_mean(..., correction=0)`, or the square of a biased `std` or of `std_mean`'s deviation."""
    squared = _squared(stat)
    candidates = ((stat, ("var", "var_mean")),) + (((squared, ("std", "std_mean")),) if squared is not None else ())
    for value, names in candidates:
        reducer = value.args[0] if op(value) == "getitem" and value.args[1:2] == (0,) else value
        if isinstance(reducer, fx.Node) and op(reducer) in names and _biased(reducer):
            if op(reducer).endswith("_mean") and reducer is value:
                continue  # the tuple itself, not its first part
            return reducer, strip_casts(arg(reducer, 0, "input"))
    return None


def _reduced(mean: fx.Node):
    """The input of a mean: of `x.mean(...)`, or of the `var_mean`/`std_mean` whose second part it is."""
    if op(mean) == "getitem":
        return arg(mean.args[0], 0, "input")
    return arg(mean, 0, "input")


def _normalised(step: fx.Node, root: fx.Node, inverse: bool):
    """What `step` normalises: `y * root` (either order) for an inverse root, `y / root` for a root; None
    otherwise."""
    if len(step.args) != 2:
        return None
    first, second = step.args
    if inverse and op(step) in MUL:
        return first if second is root else second if first is root else None
    if not inverse and op(step) in DIV and second is root:
        return first
    return None


def _row_dims(stat: fx.Node) -> tuple[int, ...] | None:
    """The dimensions a keepdim mean or variance reduces when they are trailing ones, never the batch's."""
    meta = tensor_meta(arg(stat, 0, "input"))
    dim = arg(stat, 1, "dim")
    if meta is None or dim is None or not arg(stat, 2 if op(stat) == "mean" else 3, "keepdim", False):
        return None
    ndim = len(meta.shape)
    dims = tuple(sorted(d % ndim for d in (dim if isinstance(dim, (list, tuple)) else (dim,)) if isinstance(d, int)))
    if ndim < 2 or not dims or 0 in dims:
        return None
    if dims == tuple(range(ndim - len(dims), ndim)) or (len(dims) == 1 and ndim >= 3):
        return dims  # trailing dimensions, or the channels of a channels-first tensor (ConvNeXt's LayerNorm)
    return None


def _biased(var: fx.Node) -> bool:
    """LayerNorm divides by n: `unbiased=False` or `correction=0` (by keyword, or `unbiased` by position)."""
    return var.kwargs.get("unbiased") is False or var.kwargs.get("correction") in (0, 0.0) or \
        (len(var.args) > 2 and var.args[2] is False)


def _squared(value):
    """x for `x ** 2`, `x.pow(2)`, `x * x` or `x.square()` (casts around it allowed); None otherwise."""
    value = strip_casts(value)
    if not isinstance(value, fx.Node):
        return None
    name = op(value)
    if name == "pow" and arg(value, 1, "exponent") in (2, 2.0):
        return strip_casts(value.args[0])
    if name in MUL and len(value.args) == 2 and value.args[0] is value.args[1]:
        return strip_casts(value.args[0])
    if name == "square":
        return strip_casts(value.args[0])
    return None


def _centring_mean(centred, dims: tuple[int, ...]) -> fx.Node | None:
    """The mean in `x - x.mean(dims, keepdim=True)`; None when `centred` is not that."""
    if not isinstance(centred, fx.Node) or op(centred) != "sub" or len(centred.args) != 2:
        return None
    x, mean = centred.args
    if not isinstance(mean, fx.Node):
        return None
    reducer = mean.args[0] if op(mean) == "getitem" and mean.args[1:2] == (1,) else mean
    if not isinstance(reducer, fx.Node) or op(reducer) not in ("mean", "var_mean", "std_mean") or \
            _row_dims(reducer) != dims or (reducer is not mean and not op(reducer).endswith("_mean")):
        return None
    return mean if strip_casts(arg(reducer, 0, "input")) is strip_casts(x) else None
