"""GL101's match (rules/gl101_unfused_attention/fix/match.py): the rule fills one typed record of the nodes it matched, it
crosses locate as `Problem.roles`, and the fixer reads it back by attribute; a role name the two do not share
fails loudly on either side instead of leaving the fixer without the node."""

from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import write
from graphlint.capture import capture_target, load_target
from graphlint.engine import rule_by_id
from graphlint.ops import op
from graphlint.rules.gl101_unfused_attention.fix.match import AttentionMatch, Step
from graphlint.rewrite.contract import FixSite, Role
from graphlint.target import TargetSpec

MASKED_ATTENTION_WITH_DROPOUT_AND_WEIGHTS_RETURNED = '''
    import math
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Attention(nn.Module):
        def forward(self, q, k, v, mask):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
            scores = scores + mask
            weights = F.dropout(F.softmax(scores, dim=-1), 0.1, self.training)
            return weights @ v, weights


    def make():
        q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
        return Attention(), (q, k, v, torch.zeros(6, 6))
'''


def _problem(tmp_path):
    path = write(tmp_path, "model.py", textwrap.dedent(MASKED_ATTENTION_WITH_DROPOUT_AND_WEIGHTS_RETURNED))
    sys.path.insert(0, str(tmp_path))
    try:
        capture = capture_target(load_target(TargetSpec.parse(f"{path}:make", tmp_path)), "meta")
    finally:
        sys.path.remove(str(tmp_path))
    [problem] = rule_by_id("GL101")().check(capture)
    return problem


def _site(roles) -> FixSite:
    return FixSite(node=None, statement=None, roles=tuple(Role(name, node, None, None) for name, node in roles))


def test_the_rule_fills_the_match_and_the_fixer_reads_the_same_nodes_back_by_attribute(tmp_path):
    problem = _problem(tmp_path)
    match = AttentionMatch.from_site(_site(problem.roles))
    assert (op(match.scores.node), op(match.softmax.node), op(match.values.node)) == ("matmul", "softmax", "matmul")
    assert [step.kind for step in match.before] == ["scale", "mask"]
    assert [step.kind for step in match.after] == ["dropout"] and match.dropout_after
    assert len(match.elsewhere) == 1  # the weights are also returned
    assert [(name, role.node) for name, role in match.to_roles()] == list(problem.roles)


def test_a_role_the_fixer_does_not_know_fails_loudly():
    with pytest.raises(ValueError, match="no step 'dropuot' after the softmax"):
        AttentionMatch.from_site(_site([("scores", "q @ kᵀ"), ("probabilities dropuot", "dropout")]))
    with pytest.raises(ValueError, match="no role 'valeus'"):
        AttentionMatch.from_site(_site([("scores", "q @ kᵀ"), ("valeus", "p @ v")]))
    with pytest.raises(ValueError, match="no step 'scal' before the softmax"):
        AttentionMatch(softmax="softmax", before=(Step("scal", "mul"),))
    with pytest.raises(ValueError, match="two 'values' nodes"):
        AttentionMatch.from_site(_site([("values", "p @ v"), ("values", "p @ v")]))
    with pytest.raises(AttributeError):
        AttentionMatch.from_site(_site([("values", "p @ v")])).value  # noqa: B018 - the misspelt read is the test


def test_a_match_is_frozen():
    match = AttentionMatch(values="p @ v")
    with pytest.raises(AttributeError):
        match.values = "other"
