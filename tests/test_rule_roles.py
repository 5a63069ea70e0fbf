"""Rules hand their fixers the nodes they matched in the graph, as a typed record (`Problem.match`, a
`graphlint.rule.Match` of named nodes), and the fixers build the rewrite from them: where the source read on its
own leads to another expression than the one the graph ran, the fix is refused, never written."""

from __future__ import annotations

import sys
import textwrap

from conftest import findings_of, lint_file, write
from graphlint.capture import capture_target, load_target
from graphlint.engine import rule_by_id
from graphlint.ops import op
from graphlint.target import TargetSpec

PYPROJECT = '[project]\nname = "user-project"\nversion = "0"\n'


def _model(tmp_path, source: str):
    write(tmp_path, "pyproject.toml", PYPROJECT)
    return write(tmp_path, "model.py", textwrap.dedent(source))


def _problems(path, rule_id: str):
    sys.path.insert(0, str(path.parent))
    try:
        capture = capture_target(load_target(TargetSpec.parse(f"{path}:make", path.parent)), "meta")
    finally:
        sys.path.remove(str(path.parent))
    return list(rule_by_id(rule_id)().check(capture))


def _roles(problem) -> list[tuple[str, str]]:
    """The match's fields and the ops of their nodes, in field order; the rules give no untyped roles."""
    assert problem.roles == ()
    return [(name, op(node)) for name, node in problem.match.nodes()]


# -- GL204 ------------------------------------------------------------------------------------------------------

LOG_OF_ONE_MINUS_A_PICKED_SIGMOID = '''
    import torch
    from torch import nn


    class Flags(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 3)

        def forward(self, x):
            p = torch.sigmoid(self.fc(x))
            return torch.log(1 - p[:, 0])


    def make():
        return Flags(), (torch.randn(4, 16),)
'''


def test_gl204_hands_its_fixer_the_log_the_picks_the_complement_and_the_sigmoid(tmp_path):
    path = _model(tmp_path, LOG_OF_ONE_MINUS_A_PICKED_SIGMOID)
    [problem] = _problems(path, "GL204")
    assert type(problem.match).__name__ == "LogSoftmaxMatch"
    assert _roles(problem) == [("log", "log"), ("probabilities", "sigmoid"), ("complement", "rsub"),
                               ("picks", "getitem")]
    assert problem.match.log is problem.node
    [finding] = findings_of(lint_file(path, device="meta"), "GL204")
    assert finding.fix.message == "torch.log(1 - p[:, 0]) → nn.functional.logsigmoid(-self.fc(x))[:, 0]"


# The log reads the parameter `probs`, the softmax made in forward; the name is rebound to a sigmoid only after
# the log. A reading of the source alone takes the one assignment of `probs` for what the log reads.
PARAMETER_REBOUND_AFTER_THE_LOG = '''
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 10)
            self.gate = nn.Linear(16, 10)

        def forward(self, x):
            return self.score(F.softmax(self.fc(x), dim=-1), x)

        def score(self, probs, x):
            log_p = torch.log(probs)
            probs = torch.sigmoid(self.gate(x))
            return log_p * probs


    def make():
        return Gated(), (torch.randn(4, 16),)
'''


def test_gl204_fix_takes_the_softmax_the_graph_ran_not_the_sigmoid_the_name_is_later_assigned(tmp_path):
    path = _model(tmp_path, PARAMETER_REBOUND_AFTER_THE_LOG)
    [problem] = _problems(path, "GL204")
    assert _roles(problem) == [("log", "log"), ("probabilities", "softmax")]
    assert problem.match.complement is None and problem.match.picks == ()
    [finding] = findings_of(lint_file(path, device="meta"), "GL204")
    assert finding.fix is None  # F.logsigmoid(self.gate(x)) would compute another value
    assert finding.no_fix == ("the probabilities are made in another function or statement graphlint cannot read "
                              "back; take the log of the logits with F.log_softmax / F.logsigmoid where they are made")


# -- GL107 ------------------------------------------------------------------------------------------------------

# The numerator `e` is the parameter, the exponentials made in forward; the name is rebound to other
# exponentials only after the division.
SOFTMAX_OF_A_PARAMETER_REBOUND_AFTER = '''
    import torch
    from torch import nn


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 10)
            self.other = nn.Linear(16, 10)

        def forward(self, x):
            return self.normalise(torch.exp(self.fc(x)), x)

        def normalise(self, e, x):
            probs = e / e.sum(-1, keepdim=True)
            e = torch.exp(self.other(x))
            return probs + e


    def make():
        return Head(), (torch.randn(4, 16),)
'''


def test_gl107_fix_takes_the_exponentials_the_graph_ran_not_those_the_name_is_later_assigned(tmp_path):
    path = _model(tmp_path, SOFTMAX_OF_A_PARAMETER_REBOUND_AFTER)
    [problem] = _problems(path, "GL107")
    assert type(problem.match).__name__ == "ActivationMatch"
    assert _roles(problem) == [("formula", "div"), ("transcendental", "exp")]
    assert problem.match.formula is problem.node
    [finding] = findings_of(lint_file(path, device="meta"), "GL107")
    assert finding.fix is None  # torch.softmax(self.other(x), -1) would compute another value
    assert finding.no_fix == "the exponentials are not divided by their own sum in one expression"


SILU_OF_A_SIGMOID = '''
    import torch
    from torch import nn


    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            s = torch.sigmoid(self.fc(x))
            return torch.sigmoid(s) * s


    def make():
        return Gate(), (torch.randn(4, 16),)
'''


def test_gl107_fix_reads_the_input_of_the_sigmoid_the_graph_ran(tmp_path):
    path = _model(tmp_path, SILU_OF_A_SIGMOID)
    [problem] = _problems(path, "GL107")
    assert _roles(problem) == [("formula", "mul"), ("transcendental", "sigmoid")]
    [finding] = findings_of(lint_file(path, device="meta"), "GL107")
    assert finding.fix.message == "torch.sigmoid(s) * s → nn.functional.silu(s)"


# -- GL106 ------------------------------------------------------------------------------------------------------

LAYER_NORM_BY_HAND = '''
    import torch
    from torch import nn


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            h = self.fc(x)
            mu = h.mean(-1, keepdim=True)
            var = (h - mu).pow(2).mean(-1, keepdim=True)
            return (h - mu) / torch.sqrt(var + 1e-5)


    def make():
        return Encoder(), (torch.randn(4, 16),)
'''


def test_gl106_hands_its_fixer_the_step_the_root_the_statistics_and_the_centred_input(tmp_path):
    path = _model(tmp_path, LAYER_NORM_BY_HAND)
    [problem] = _problems(path, "GL106")
    assert type(problem.match).__name__ == "NormMatch"
    assert _roles(problem) == [("step", "div"), ("root", "sqrt"), ("statistic", "mean"), ("mean", "mean"),
                               ("centred", "sub")]
    assert problem.match.step is problem.node
    assert problem.match.mean is not problem.match.statistic  # the centring mean, not the variance
    [finding] = findings_of(lint_file(path, device="meta"), "GL106")
    assert finding.fix.message == "LayerNorm by hand → nn.functional.layer_norm(h, (h.shape[-1],), eps=1e-5)"


# The centred input `xc` is the parameter, made in forward from the linear layer's output; the name is rebound to
# the centred input of `x` only after the step. A reading of the source alone takes that one assignment for what
# the step divides.
CENTRED_PARAMETER_REBOUND_AFTER_THE_STEP = '''
    import torch
    from torch import nn


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            h = self.fc(x)
            return self.standardise(h - h.mean(-1, keepdim=True), x)

        def standardise(self, xc, x):
            var = xc.pow(2).mean(-1, keepdim=True)
            out = xc / torch.sqrt(var + 1e-5)
            xc = x - x.mean(-1, keepdim=True)
            return out + xc


    def make():
        return Encoder(), (torch.randn(4, 16),)
'''


def test_gl106_fix_takes_the_centred_input_the_graph_ran_not_the_one_the_name_is_later_assigned(tmp_path):
    path = _model(tmp_path, CENTRED_PARAMETER_REBOUND_AFTER_THE_STEP)
    [problem] = _problems(path, "GL106")
    assert [name for name, _ in _roles(problem)] == ["step", "root", "statistic", "mean", "centred"]
    [finding] = findings_of(lint_file(path, device="meta"), "GL106")
    assert finding.fix is None  # F.layer_norm(x, ...) would normalise the input, not the linear layer's output
    assert finding.no_fix == "`standardise` takes more than one input besides self"  # shown when the inline fix fails too


# The root `r` is the parameter, made in forward with eps 1e-5; the name is rebound to another root, with eps 1e-2,
# only after the step.
ROOT_PARAMETER_REBOUND_AFTER_THE_STEP = '''
    import torch
    from torch import nn


    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            h = self.fc(x)
            return self.scale(h, torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5))

        def scale(self, h, r):
            out = h * r
            r = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-2)
            return out + r


    def make():
        return Mixer(), (torch.randn(4, 16),)
'''


def test_gl106_fix_takes_the_root_the_graph_ran_not_the_one_the_name_is_later_assigned(tmp_path):
    path = _model(tmp_path, ROOT_PARAMETER_REBOUND_AFTER_THE_STEP)
    problems = _problems(path, "GL106")
    assert [_roles(p) for p in problems] == [[("step", "mul"), ("root", "rsqrt"), ("statistic", "mean")]]
    assert problems[0].match.mean is None and problems[0].match.centred is None  # an RMSNorm centres nothing
    [finding] = findings_of(lint_file(path, device="meta"), "GL106")
    assert finding.fix is None  # F.rms_norm(h, (h.shape[-1],), eps=1e-2) would take the later eps
    assert finding.no_fix == "`scale` takes more than one input besides self"  # shown when the inline fix fails too
