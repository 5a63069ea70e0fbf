"""GL204 unstable-log-softmax: the log of a softmax or sigmoid taken in two steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic

from graphlint.ops import CAST, MAX_PASS_THROUGH_STEPS, SOFTMAX, VIEW, arg, op, ran_in_library
from graphlint.results import Severity
from graphlint.rule import Example, LazyFixer, Match, Matched, Problem, Rule
from graphlint.walk import chain

if TYPE_CHECKING:  # annotations only: the rule's module imports no torch of its own
    from torch import fx

_LOG = frozenset({"log", "log2", "log10"})
# Picking probabilities out (a hand-written cross-entropy) keeps them probabilities.
_PICK = VIEW | CAST | frozenset({"gather", "index_select", "take_along_dim", "select", "narrow"})


class UnstableLogSoftmax(Rule):
    id = "GL204"
    name = "unstable-log-softmax"
    severity = Severity.WARNING
    tags = ("correctness", "numerics", "nan")
    precision = "high"
    summary = "The log of a softmax or sigmoid taken in two steps; it is -inf with NaN gradients once a probability underflows."
    what = """
        `torch.log` (or `.log()`, `log2`, `log10`) applied to the output of a softmax or a sigmoid, directly or
        through views, casts and indexing: `torch.log(F.softmax(x, -1))`, `torch.log(torch.sigmoid(x))`,
        `torch.log(1 - torch.sigmoid(x))`, probabilities computed on one line and their log taken on another
        (or in another function), and hand-written cross-entropies built on them such as
        `-torch.log(probs[range(n), y]).mean()` or `-(y * probs.log()).sum(-1)`, in the forward or in the
        target's loss.

        The finding points at the `log` call; the softmax or sigmoid is a related location. Not flagged:
        `F.log_softmax`, `F.logsigmoid`, `F.cross_entropy`, `F.binary_cross_entropy_with_logits`, and a log
        whose input is clamped or has a constant added first (`torch.log(p + 1e-9)`, `torch.log(p.clamp(min=
        1e-8))`): finite, so not the failure this rule is about, and not equal to `log_softmax` (the epsilon
        caps the log at about -20.7 and changes every value a little), so no rewrite could keep the numbers;
        and code inside installed libraries.
    """
    why = """
        A softmax or sigmoid rounds the probabilities of very unlikely outcomes to exactly 0 once the logits
        are far apart (a gap of about 104 in float32, 17 in float16), and `1 - torch.sigmoid(x)` is already 0
        in float32 for `x` above about 17. The log is then `-inf`, the loss `inf` and the gradient `NaN`,
        which ruins the weights at the next optimizer step. `log_softmax` computes
        `x - logsumexp(x)` and `logsigmoid` computes `-softplus(-x)`, which are exact for any logits, and
        they are also one kernel instead of two.
    """
    example = """
        probs = F.softmax(logits, dim=-1)
        loss = -torch.log(probs[torch.arange(len(y)), y]).mean()
    """
    instead = """
        loss = F.cross_entropy(logits, y)
        # or, when the log-probabilities themselves are needed:
        log_probs = F.log_softmax(logits, dim=-1)
        loss = F.nll_loss(log_probs, y)
    """
    fixes = """
        Safe, once proven: `--fix` rewrites the log with the file's own names for `torch.nn.functional`
        (`fn.log_softmax` after `import torch.nn.functional as fn`, `nn.functional.` after `from torch import
        nn`; an import is added only when the file has none): `torch.log(F.softmax(x, dim=-1))`,
        `F.softmax(x, -1).log()` and `x.softmax(-1).log()` become `F.log_softmax(x, ...)` with the softmax's own
        arguments (`dtype=` included), `torch.log(torch.sigmoid(x))` becomes `F.logsigmoid(x)` and
        `torch.log(1 - torch.sigmoid(x))` becomes `F.logsigmoid(-x)`; a `log2` or `log10` becomes the same
        divided by `math.log(2)` or `math.log(10)` (adding `import math` when the module has none).
        Probabilities picked, arranged or cast before the log keep those steps, on the log-probabilities (the
        log of a pick is the pick of the log):
        `-torch.log(probs[rows, y])` becomes `-F.log_softmax(logits, dim=-1)[rows, y]` and
        `probs.gather(1, y).log()` becomes `F.log_softmax(...).gather(1, y)`. The probabilities may be a
        variable the function assigns once (`probs = F.softmax(logits, -1)`, `p = torch.sigmoid(logits)` read
        as `torch.log(1 - p)`), whose statement goes when nothing else reads it. When something else still
        reads them and their logits are computed inside the softmax call (`p = F.softmax(self.head(x), -1)`),
        the logits get a name of their own first (`logits = self.head(x)`), read by both the softmax and the
        log-softmax, so the layer runs once and a dropout inside it draws one mask. Left alone, with the
        reason: probabilities made in another function (a model that returns them to its loss), where the
        log-probabilities have to be made where the logits are (a loss is usually better written as
        `F.cross_entropy` there).
    """
    bad_examples = (
        Example(
            title="a classifier that returns the log of its softmax",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Classifier(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 10)

                    def forward(self, x):
                        return torch.log(F.softmax(self.fc(x), dim=-1))  # expect: GL204


                def make():
                    return Classifier(), (torch.randn(4, 16),)
            ''',
            fixed='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Classifier(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 10)

                    def forward(self, x):
                        return F.log_softmax(self.fc(x), dim=-1)  # expect: GL204


                def make():
                    return Classifier(), (torch.randn(4, 16),)
            ''',
        ),
        Example(
            title="probabilities from the model, a hand-written cross-entropy and binary cross-entropy in the loss",
            source='''
                import torch
                from torch import nn
                import graphlint


                class TwoHeads(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.body = nn.Linear(16, 16)
                        self.classes = nn.Linear(16, 10)
                        self.flag = nn.Linear(16, 1)

                    def forward(self, x):
                        h = torch.relu(self.body(x))
                        return self.classes(h).softmax(-1), torch.sigmoid(self.flag(h)).squeeze(-1)


                def cross_entropies(outputs):
                    probs, p = outputs
                    rows = torch.arange(probs.shape[0], device=probs.device)
                    y, t = rows % probs.shape[1], (rows % 2).to(p.dtype)
                    nll = -probs[rows, y].log().mean()  # expect: GL204
                    log_p = torch.log(p)  # expect: GL204
                    log_not_p = torch.log(1 - p)  # expect: GL204
                    return nll - (t * log_p + (1 - t) * log_not_p).mean()


                def make():
                    return graphlint.Target(TwoHeads(), (torch.randn(4, 16),), loss=cross_entropies)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="log_softmax, logsigmoid and the fused losses",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F
                import graphlint


                class TwoHeads(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.body = nn.Linear(16, 16)
                        self.classes = nn.Linear(16, 10)
                        self.flag = nn.Linear(16, 1)

                    def forward(self, x):
                        h = torch.relu(self.body(x))
                        return F.log_softmax(self.classes(h), -1), self.flag(h).squeeze(-1)


                def fused_losses(outputs):
                    log_probs, flag_logits = outputs
                    rows = torch.arange(log_probs.shape[0], device=log_probs.device)
                    y, t = rows % log_probs.shape[1], (rows % 2).to(flag_logits.dtype)
                    return F.nll_loss(log_probs, y) + F.binary_cross_entropy_with_logits(flag_logits, t) \
                        - F.logsigmoid(flag_logits).mean()


                def make():
                    return graphlint.Target(TwoHeads(), (torch.randn(4, 16),), loss=fused_losses)
            ''',
        ),
        Example(
            title="probabilities for sampling, a clamped log for an entropy bonus and a log with an epsilon",
            source='''
                import torch
                from torch import nn
                import torch.nn.functional as F


                class Policy(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(16, 6)

                    def forward(self, x):
                        probs = F.softmax(self.fc(x), dim=-1)
                        entropy = -(probs * torch.log(probs.clamp_min(1e-8))).sum(-1)
                        smoothed = torch.log(probs + 1e-9)  # finite, and not equal to log_softmax: left alone
                        return probs, entropy, smoothed


                def make():
                    return Policy(), (torch.randn(4, 16),)
            ''',
        ),
    )

    def check(self, capture):
        for node in capture.ops:
            if op(node) in _LOG and not ran_in_library(node):
                found = _probabilities(arg(node, 0, "input"))
                if found is not None:
                    yield _problem(node, *found)


def _probabilities(value) -> tuple[fx.Node, bool, tuple[fx.Node, ...]] | None:
    """(the softmax or sigmoid the value was picked from, whether it is `1 - sigmoid`, the picks and the `1 -`
    between the log and it, nearest the log first), or None."""
    found = chain(value, lambda n: op(n) in _PICK or _one_minus(n), stop=lambda n: op(n) in SOFTMAX | {"sigmoid"},
                  limit=MAX_PASS_THROUGH_STEPS)
    complements = sum(map(_one_minus, found.nodes))  # log(1 - sigmoid(x)) is logsigmoid(-x); once only
    if not found.found or complements > 1 or (complements and op(found.end) in SOFTMAX):
        return None
    return found.end, bool(complements), found.nodes


def _one_minus(node: fx.Node) -> bool:
    return op(node) == "rsub" and arg(node, 1, "other") == 1


@LazyFixer
def log_probabilities():
    """GL204's fix: log_softmax or logsigmoid of the logits."""
    from .fix import log_probabilities

    return log_probabilities


def _problem(log: fx.Node, source: fx.Node, complement: bool, between: tuple[fx.Node, ...]) -> Problem:
    if op(source) == "sigmoid":
        what = "1 - sigmoid" if complement else "a sigmoid"
        advice = ("use F.logsigmoid(-x)" if complement else "use F.logsigmoid(x)") + \
            " (or F.binary_cross_entropy_with_logits for a loss), which is exact for any logits"
    else:
        what = "a softmax"
        advice = "use F.log_softmax(x, dim) (or F.cross_entropy / F.nll_loss for a loss), which is exact for any logits"
    return Problem(
        node=log,
        message=(f"{op(log)} of {what} in {{where}}{{occurrences}} is -inf, with NaN gradients, as soon as a "
                 f"probability rounds to 0; {advice}."),
        related=((source, f"the {op(source)} whose log is taken"),),
        fix=log_probabilities,
        match=LogSoftmaxMatch(log=log, probabilities=source, complement=next(filter(_one_minus, between), None),
                              picks=tuple(n for n in between if not _one_minus(n))),
    )


@dataclass(frozen=True)
class LogSoftmaxMatch(Match, Generic[Matched]):
    """What GL204's fix is built from: the log, the softmax or sigmoid that makes the probabilities, the `1 - p`
    of a sigmoid's complement, and the other picks between the log and the probabilities, nearest the log first."""

    log: Matched
    probabilities: Matched
    complement: Matched | None = None
    picks: tuple[Matched, ...] = ()
