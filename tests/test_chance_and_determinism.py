"""Every capture draws the same (torch, Python's `random` and NumPy seeded alike), so a run is repeatable; a
verdict that holds only for this draw says so; attention with a bias computed from its own scores is not
reported as fusable, and never mixed into a finding with configurations that are."""

from __future__ import annotations

import random

import torch

from conftest import findings_of, line_of, lint_file, write

RECYCLING = '''
import random

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return (q @ k.transpose(-2, -1) / 4.0).softmax(dim=-1) @ v


class Recycler(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.attn = Attention(dim)
        self.rare = nn.Linear(dim, dim)

    def forward(self, x):
        for _ in range(random.randrange(5) + 1):
            x = x + self.attn(x)
        if random.random() < 0.01:
            x = self.rare(x)
        return x


def make():
    return Recycler(), (torch.randn(2, 8, 16),)
'''


def _findings(report):
    return [(f.rule_id, f.location.line, f.location.column, f.message, f.occurrences) for f in report.findings]


def test_a_forward_that_draws_from_random_gives_the_same_findings_every_run(tmp_path):
    path = write(tmp_path, "model.py", RECYCLING)
    runs = [_findings(lint_file(path)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert any(rule == "GL101" for rule, *_ in runs[0])


def test_counts_and_unused_parameters_say_they_hold_for_this_draw(tmp_path):
    path = write(tmp_path, "model.py", RECYCLING)
    report = lint_file(path, device="cpu")
    [unused] = findings_of(report, "GL203")
    assert "rare.weight" in unused.message
    assert "draws from `random`, and another draw may use them" in unused.message
    [attention] = findings_of(report, "GL101")
    if attention.occurrences > 1:
        assert "on this capture's draw" in attention.message and "`random`" in attention.message
    # Plain PyTorch: on some other draw the rarely used layer does get a gradient.
    import importlib.util

    spec = importlib.util.spec_from_file_location("recycling_plain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    used_on_some_draw = False
    for seed in range(2000):
        random.seed(seed)
        model, args = module.make()
        model(*args).sum().backward()
        if model.rare.weight.grad is not None:
            used_on_some_draw = True
            break
    assert used_on_some_draw


def test_a_forward_without_draws_says_nothing_of_chance(tmp_path):
    path = write(tmp_path, "model.py", RECYCLING.replace("random.randrange(5) + 1", "3")
                 .replace("random.random() < 0.01", "False"))
    report = lint_file(path)
    assert all("draw" not in f.message for f in report.findings)
    [attention] = findings_of(report, "GL101")
    assert attention.occurrences == 3 and "(3 occurrences)" in attention.message


COPE = '''
import torch
from torch import nn


class CoPE(nn.Module):
    """A contextual position bias: made from the attention logits themselves."""

    def __init__(self, max_pos, dim):
        super().__init__()
        self.max_pos = max_pos
        self.pos_emb = nn.Parameter(torch.randn(max_pos, dim))

    def forward(self, query, attn_logits):
        gates = attn_logits.sigmoid()
        pos = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=self.max_pos - 1)
        floor = pos.floor().long()
        logits_int = query @ self.pos_emb.t()
        w = pos - floor
        return logits_int.gather(-1, floor) * (1 - w) + logits_int.gather(-1, (floor + 1).clamp(max=self.max_pos - 1)) * w


class Attention(nn.Module):
    def __init__(self, dim=16, cope=False):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.cope = CoPE(8, dim) if cope else None

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        sim = q @ k.transpose(-2, -1) * 0.25
        if self.cope is not None:
            sim = sim + self.cope(q, sim)
        attn = sim.softmax(dim=-1)
        return attn @ v


def make():
    return nn.Sequential(Attention(cope=CONFIGS[0]), Attention(cope=CONFIGS[1])), (torch.randn(2, 8, 16),)
'''


def test_attention_with_a_bias_made_from_its_scores_is_not_reported(tmp_path):
    path = write(tmp_path, "model.py", COPE.replace("CONFIGS[0]", "True").replace("CONFIGS[1]", "True"))
    report = lint_file(path)
    assert report.errors == [] and findings_of(report, "GL101") == []


def test_plain_configurations_of_the_same_line_are_reported_alone_and_not_fixed(tmp_path):
    mixed = lint_file(write(tmp_path / "mixed", "model.py", COPE.replace("CONFIGS[0]", "True")
                            .replace("CONFIGS[1]", "False")))
    [finding] = findings_of(mixed, "GL101")
    assert finding.occurrences == 1 and " in 1;" in finding.message  # only the plain layer, `1`, not `0`
    assert finding.fix is None and "bias computed from the scores" in finding.no_fix
    plain = lint_file(write(tmp_path / "plain", "model.py", COPE.replace("CONFIGS[0]", "False")
                            .replace("CONFIGS[1]", "False")))
    [finding] = findings_of(plain, "GL101")
    assert finding.occurrences == 2 and "other configurations" not in finding.no_fix


def test_the_bias_really_reads_the_scores_in_plain_pytorch(tmp_path):
    """The gradient of the output reaches the scores through the bias too: the fused call has no such path."""
    namespace: dict = {}
    exec(compile(COPE.replace("CONFIGS[0]", "True").replace("CONFIGS[1]", "True"), "cope_model", "exec"), namespace)
    cope = namespace["CoPE"](8, 16)
    query = torch.randn(2, 8, 16)
    logits = torch.randn(2, 8, 8, requires_grad=True)
    cope(query, logits).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


DROPPED_FIRST = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        nn.Linear(dim, dim)  # built and dropped: CPython gives its id to the next module
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x):
        return self.norm(self.conv(x))


def make():
    return nn.Sequential(*[Block() for _ in range(3)]), (torch.randn(2, 8, 6, 6),)
'''


def test_a_module_that_reuses_a_dropped_modules_id_is_placed_where_it_was_built(tmp_path):
    path = write(tmp_path, "model.py", DROPPED_FIRST)
    runs = [_findings(lint_file(path)) for _ in range(2)]
    assert runs[0] == runs[1]
    gl105 = [line for rule, line, *_ in runs[0] if rule == "GL105"]
    # the bias before the norm belongs at the conv's construction, never at the forward line that calls it
    assert gl105 == [line_of(path, "self.conv = nn.Conv2d")]
