"""GL107 unfused-activation: SiLU, GELU, Mish or softmax written out elementwise instead of the one-kernel op."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic

from torch import fx

from graphlint.memory.savings import chain_savings
from graphlint.ops import DIV, MUL, arg, op, ran_in_library
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Match, Matched, Problem, Rule
from graphlint.walk import operands

_ADD = frozenset({"add"})
_RANDOM = ("rand", "normal", "bernoulli", "multinomial", "poisson", "dropout")  # ops whose two calls differ
_TANH_INNER = MUL | frozenset({"add", "pow"})
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class UnfusedActivation(Rule):
    id = "GL107"
    name = "unfused-activation"
    severity = Severity.NOTE
    tags = ("performance", "activation", "memory")
    precision = "high"
    summary = "An activation written out elementwise (SiLU, GELU, Mish, softmax) that torch runs as one kernel."
    what = """
        Activations spelled out as formulas that have an exact library equivalent:

        - `x * torch.sigmoid(x)` or `x / (1 + torch.exp(-x))`: `F.silu(x)`;
        - `0.5 * x * (1 + torch.erf(x / math.sqrt(2)))`, in any order of the factors, halved by `/ 2`, or with
          the cumulative distribution made first (`cdf = 0.5 * (1.0 + torch.erf(...))`, then `x * cdf`):
          `F.gelu(x)`;
        - `0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))`, with the cube as
          `torch.pow(x, 3)`, `x ** 3` or `x * x * x`, the constant as `0.7978845608` or
          `torch.sqrt(torch.tensor(2.0 / torch.pi))`, and the same orders:
          `F.gelu(x, approximate="tanh")`;
        - `x * torch.tanh(F.softplus(x))`, also with the softplus written out as `torch.log1p(torch.exp(x))` or
          `torch.log(1 + torch.exp(x))`: `F.mish(x)`;
        - `torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)`, with or without subtracting the maximum first:
          `torch.softmax(x, dim)`.

        The input may be one variable or the same expression written in each place (`self.fc(x) *
        torch.sigmoid(self.fc(x))`, `(y + b) * 0.5 * (1 + torch.erf((y + b) / math.sqrt(2)))`), never two draws
        of a random op. The finding points at the outermost expression of the formula, once per line with the
        number of layers that run it. Not flagged: formulas without an exact library form (QuickGELU, `x *
        torch.sigmoid(1.702 * x)`, which differs from GELU by up to about 0.02, and Swish with a `beta`),
        gates such as `a * torch.sigmoid(b)` and gated units such as SwiGLU (`F.silu(a) * b`), and code
        inside installed libraries.
    """
    why = """
        Each step of a hand-written activation is its own kernel that reads and writes the whole tensor, and
        autograd keeps several of the intermediates for backward (`x * sigmoid(x)` keeps both `x` and the
        sigmoid; the GELU formulas keep four or five tensors). The library op is one kernel forward and one
        backward, saving only its input. The hand-written softmax can also overflow: `exp` of a logit above
        about 88 is `inf` in float32, while `softmax` subtracts the maximum first.
    """
    example = """
        h = self.fc1(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        gate = h * torch.sigmoid(h)
    """
    instead = """
        h = F.gelu(self.fc1(x), approximate="tanh")
        gate = F.silu(h)          # or nn.SiLU(), nn.GELU(approximate="tanh"), nn.Mish()
    """
    fixes = """
        Safe, once proven: `--fix` replaces the formula by the library call, on the same input as written and
        with the file's own names for torch and `torch.nn.functional` (`import torch as t` gives `t.softmax`;
        an import is added only when the file has none): `h * torch.sigmoid(h)`, `h.sigmoid() * h`,
        `h * F.sigmoid(h)` and `h / (1 + torch.exp(-h))` become `F.silu(h)`, the erf and tanh GELU formulas become `F.gelu(h)` and
        `F.gelu(h, approximate="tanh")`, `h * torch.tanh(F.softplus(h))` (or its softplus written out) becomes `F.mish(h)`, and
        `torch.exp(x) / torch.exp(x).sum(dim, keepdim=True)` becomes `torch.softmax(x, dim)`, also when the
        exponentials are a variable and the maximum along `dim` is subtracted first (`torch.softmax` subtracts
        it itself); a helper variable that only fed the formula (`inner = ...`, `cdf = ...`, `e = ...`) is
        deleted. A formula in a helper function, an activation module's `forward` or a lambda is rewritten
        there, once, whatever calls it. Left alone, with the reason: formulas whose input is spelled
        differently in its two places, and exponentials not divided by their own sum.
    """
    bad_examples = (
        Example(
            title="an MLP with a tanh GELU in every layer and a hand-written SiLU and Mish",
            source='''
                import math
                import torch
                from torch import nn
                import torch.nn.functional as F


                def new_gelu(x):
                    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
                    return 0.5 * x * (1.0 + torch.tanh(inner))  # expect: GL107


                class MLP(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.up = nn.Linear(dim, 4 * dim)
                        self.down = nn.Linear(4 * dim, dim)

                    def forward(self, x):
                        h = new_gelu(self.up(x))
                        h = h * torch.sigmoid(h)  # expect: GL107
                        return self.down(h * torch.tanh(F.softplus(h)))  # expect: GL107


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.layers = nn.ModuleList(MLP() for _ in range(3))

                    def forward(self, x):
                        for layer in self.layers:
                            x = x + layer(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 8, 16),)
            ''',
            fixed='''
                import math
                import torch
                from torch import nn
                import torch.nn.functional as F


                def new_gelu(x):
                    return F.gelu(x, approximate="tanh")  # expect: GL107


                class MLP(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.up = nn.Linear(dim, 4 * dim)
                        self.down = nn.Linear(4 * dim, dim)

                    def forward(self, x):
                        h = new_gelu(self.up(x))
                        h = F.silu(h)  # expect: GL107
                        return self.down(F.mish(h))  # expect: GL107


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.layers = nn.ModuleList(MLP() for _ in range(3))

                    def forward(self, x):
                        for layer in self.layers:
                            x = x + layer(x)
                        return x


                def make():
                    return Model(), (torch.randn(2, 8, 16),)
            ''',
        ),
        Example(
            title="an erf GELU and a softmax spelled out with exp",
            source='''
                import math
                import torch
                from torch import nn


                class Head(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 5)

                    def forward(self, x):
                        h = self.fc(x)
                        h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))  # expect: GL107
                        logits = self.out(h)
                        e = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
                        return e / e.sum(dim=-1, keepdim=True)  # expect: GL107


                def make():
                    return Head(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import math
                import torch
                from torch import nn


                class Head(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 16)
                        self.out = nn.Linear(16, 5)

                    def forward(self, x):
                        h = self.fc(x)
                        h = nn.functional.gelu(h)  # expect: GL107
                        logits = self.out(h)
                        return torch.softmax(logits, dim=-1)  # expect: GL107


                def make():
                    return Head(), (torch.randn(4, 16),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the library activations, a sigmoid GELU approximation, a gate and SwiGLU",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Block(nn.Module):
                    def __init__(self, dim=16):
                        super().__init__()
                        self.gate = nn.Linear(dim, 4 * dim)
                        self.up = nn.Linear(dim, 4 * dim)
                        self.down = nn.Linear(4 * dim, dim)
                        self.act = nn.GELU(approximate="tanh")

                    def forward(self, x):
                        h = F.silu(self.gate(x)) * self.up(x)
                        h = self.act(h) + F.mish(h) + F.gelu(h)
                        quick = h * torch.sigmoid(1.702 * h)
                        gated = h * torch.sigmoid(self.up(x))
                        return self.down(quick + gated).softmax(-1)


                def make():
                    return Block(), (torch.randn(2, 8, 16),)
            ''',
        ),
    )

    def check(self, capture):
        for node in capture.ops:
            name = op(node)
            if name not in ("sigmoid", "tanh", "erf", "exp") or ran_in_library(node):
                continue
            found = _activation(node)
            if found is not None:
                outer, library = found
                if not ran_in_library(outer):
                    # Inside a custom autograd.Function's forward (a hand-written memory-efficient Swish) autograd
                    # keeps none of the chain's steps: say "saves less" only when the chain keeps more.
                    saves = chain_savings(capture, outer)
                    yield Problem(
                        node=outer,
                        message=(f"{_WHAT[library]} written out elementwise in {{where}}{{occurrences}}; "
                                 f"{library} runs it as one kernel"
                                 + (" and saves less for backward." if saves > 0 else ".")),
                        fix=activation_call.bound(library=library),
                        match=ActivationMatch(formula=outer, transcendental=node),
                        saves_bytes=saves,
                    )


@dataclass(frozen=True)
class ActivationMatch(Match, Generic[Matched]):
    """What GL107's fix is built from: the formula's last op, and the one sigmoid, tanh, erf or exp it is built
    on, from which the fixer reads the formula's input."""

    formula: Matched
    transcendental: Matched


@LazyFixer
def activation_call():
    """GL107's fix: the library activation in place of its formula."""
    from .fix import activation_call

    return activation_call


_WHAT = {
    "F.silu(x)": "SiLU (x * sigmoid(x))",
    "F.mish(x)": "Mish (x * tanh(softplus(x)))",
    "F.gelu(x)": "GELU (the erf formula)",
    'F.gelu(x, approximate="tanh")': "GELU (the tanh formula)",
    "torch.softmax(x, dim)": "Softmax (exp(x) / exp(x).sum(dim))",
}


def _activation(node: fx.Node) -> tuple[fx.Node, str] | None:
    """(the outermost node of the formula, the library call), starting from its one transcendental op."""
    name = op(node)
    x = arg(node, 0, "input")
    if not isinstance(x, fx.Node):
        return None
    if name == "sigmoid":
        outer = _times(node, x)
        return (outer, "F.silu(x)") if outer is not None else None
    if name == "exp":
        return _swish_by_exp(node, x) or _softmax(node, x)
    if name == "tanh" and op(x) == "softplus":
        inner = arg(x, 0, "input")
        beta, threshold = arg(x, 1, "beta", 1), arg(x, 2, "threshold", 20)
        outer = _times(node, inner) if beta == 1 and threshold == 20 else None
        return (outer, "F.mish(x)") if outer is not None else None
    if name == "tanh" and (inner := _softplus_by_hand(x)) is not None:
        outer = _times(node, inner)
        return (outer, "F.mish(x)") if outer is not None else None
    if name in ("erf", "tanh"):
        for outer, base in _half_x_times_one_plus(node):
            if name == "erf" and _same_value(_scaled(x, 1 / math.sqrt(2)), base):
                return outer, "F.gelu(x)"
            if name == "tanh" and _is_tanh_gelu_input(x, base):
                return outer, 'F.gelu(x, approximate="tanh")'
    return None


def _swish_by_exp(exp: fx.Node, negated: fx.Node) -> tuple[fx.Node, str] | None:
    """`x / (1 + exp(-x))`, SiLU with the sigmoid written out."""
    if op(negated) != "neg" or not isinstance(negated.args[0], fx.Node):
        return None
    x, total = negated.args[0], _only_user(exp)
    if total is None or op(total) != "add" or not _close(_other(total, exp), 1):
        return None
    quotient = _only_user(total)
    if quotient is not None and op(quotient) in DIV and quotient.args[:2] == (x, total):
        return quotient, "F.silu(x)"
    return None


def _softplus_by_hand(node: fx.Node) -> fx.Node | None:
    """x of `torch.log1p(torch.exp(x))` or `torch.log(1 + torch.exp(x))`, softplus written out; None otherwise."""
    exp = arg(node, 0, "input")
    if op(node) == "log":  # of 1 + exp(x), in either order
        total, exp = exp, None
        if isinstance(total, fx.Node) and op(total) == "add" and len(total.args) == 2:
            exp = next((a for a in total.args if isinstance(a, fx.Node) and _close(_other(total, a), 1)), None)
    elif op(node) != "log1p":
        return None
    if isinstance(exp, fx.Node) and op(exp) == "exp" and isinstance(arg(exp, 0, "input"), fx.Node):
        return arg(exp, 0, "input")
    return None


def _close(value, expected: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isclose(value, expected, rel_tol=1e-4)


def _other(node: fx.Node, one) -> object:
    """The other operand of a binary op that has `one` as an operand; None when `one` is not among them."""
    if len(node.args) != 2:
        return None
    first, second = node.args
    return second if first is one else first if second is one else None


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _times(node: fx.Node, x: fx.Node) -> fx.Node | None:
    """The product `x * node` (either order), or None: a gate multiplies by another tensor."""
    user = _only_user(node)
    if user is not None and op(user) in MUL and _same_value(_other(user, node), x):
        return user
    return None


def _scaled(node: fx.Node, factor: float) -> fx.Node | None:
    """x when `node` is `x * factor` or `x / (1 / factor)`."""
    if not isinstance(node, fx.Node) or len(node.args) != 2:
        return None
    first, second = node.args
    if op(node) in MUL:
        for value, constant in ((first, second), (second, first)):
            if isinstance(value, fx.Node) and _close(constant, factor):
                return value
    if op(node) in DIV and isinstance(first, fx.Node) and _close(second, 1 / factor):
        return first
    return None


def _half_x_times_one_plus(core: fx.Node) -> list[tuple[fx.Node, fx.Node]]:
    """(outermost node, x) for each reading of `0.5 * x * (1 + core)` in its usual spellings, also with the
    cumulative distribution made first (`cdf = 0.5 * (1.0 + core)`, then `x * cdf`)."""
    one_plus = _only_user(core)
    if one_plus is None or op(one_plus) not in _ADD or not _close(_other(one_plus, core), 1):
        return []
    product = _only_user(one_plus)
    if product is None or op(product) not in MUL | DIV:
        return []
    if _scaled(product, 0.5) is one_plus:  # cdf = 0.5 * (1 + core), then x * cdf
        outer = _only_user(product)
        x = _other(outer, product) if outer is not None and op(outer) in MUL else None
        return [(outer, x)] if isinstance(x, fx.Node) else []
    if op(product) not in MUL:
        return []
    factor = _other(product, one_plus)
    if not isinstance(factor, fx.Node):
        return []
    readings = []
    if (x := _scaled(factor, 0.5)) is not None:
        readings.append((product, x))  # 0.5 * x * (1 + core)
    halved = _only_user(product)
    if halved is not None and _scaled(halved, 0.5) is product:
        readings.append((halved, factor))  # x * (1 + core) * 0.5, or / 2
    return readings


def _constant(value) -> float | None:
    """A number, also one made into a tensor on the way (`torch.sqrt(torch.tensor(2.0 / torch.pi))`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, fx.Node) and op(value) == "tensor" and value.args:
        return _constant(value.args[0])
    if isinstance(value, fx.Node) and op(value) == "sqrt" and (inside := _constant(value.args[0])) is not None:
        return math.sqrt(inside) if inside >= 0 else None
    return None


def _is_tanh_gelu_input(value, x: fx.Node) -> bool:
    """Whether `value` is sqrt(2/pi) * (x + 0.044715 * x**3), however the product is spread out: it may use
    only x, constants, products, sums and the cube of x, and both constants must appear."""
    def spread(term) -> bool:  # a product or sum around x's terms, read further
        return isinstance(term, fx.Node) and op(term) in MUL | _ADD and not _same_value(term, x)

    terms = operands(value, spread, limit=16)
    if terms is None:
        return False
    constants: list[float] = []
    for node in terms:
        if _same_value(node, x):
            continue
        if (constant := _constant(node)) is not None:
            constants.append(constant)
        elif not isinstance(node, fx.Node) or op(node) not in _TANH_INNER:
            return False
        elif op(node) == "pow" and (node.args[0] is not x or arg(node, 1, "exponent") not in (3, 3.0)):
            return False

    def has(expected: float) -> bool:
        return any(_close(c, expected) for c in constants)

    return has(0.044715) and has(_SQRT_2_OVER_PI)


def _softmax(exp: fx.Node, x: fx.Node) -> tuple[fx.Node, str] | None:
    """`exp(x) / exp(x).sum(dim, keepdim=True)`, the numerator being this exp."""
    for user in exp.users:
        if op(user) not in DIV or len(user.args) != 2 or user.args[0] is not exp:
            continue
        total = user.args[1]
        if not isinstance(total, fx.Node) or op(total) != "sum" or not arg(total, 2, "keepdim", False):
            continue
        if arg(total, 1, "dim") is None:
            continue
        summed = arg(total, 0, "input")
        if summed is exp or (isinstance(summed, fx.Node) and op(summed) == "exp" and _same_value(arg(summed, 0, "input"), x)):
            return user, "torch.softmax(x, dim)"
    return None


def _same_value(a, b) -> bool:
    """The same node, or the same op on the same arguments (`torch.exp(x - m)` or `h + self.bias` written twice);
    never two draws of a random op."""
    if a is b:
        return True
    return (isinstance(a, fx.Node) and isinstance(b, fx.Node) and op(a) == op(b) and a.args == b.args
            and a.kwargs == b.kwargs and not any(word in (op(a) or "") for word in _RANDOM))
