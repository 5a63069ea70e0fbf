"""Rules hand their fixers the nodes they matched in the graph (`Problem.roles`), and the fixers build the rewrite
from them: where the source read on its own leads to another expression than the one the graph ran, the fix is
refused, never written."""

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
    return [(name, op(node)) for name, node in problem.roles]


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
    assert _roles(problem) == [("log", "log"), ("complement", "rsub"), ("pick", "getitem"),
                               ("probabilities", "sigmoid")]
    assert problem.roles[0][1] is problem.node
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
    assert _roles(problem) == [("formula", "div"), ("transcendental", "exp")]
    assert problem.roles[0][1] is problem.node
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
