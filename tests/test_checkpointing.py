"""Activation checkpointing (torch.utils.checkpoint, reentrant or not, checkpoint_sequential, and the switches
libraries put on it): every parameter that really gets a gradient is clean, every rule sees the checkpointed
ops once, and a real cut inside a checkpointed block is still found. Checked against plain PyTorch."""

from __future__ import annotations

import pytest

from conftest import backward_in_plain_pytorch, findings_of, line_of, lint_file, write

LAYERS = 4

MODEL = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)  # the attention
        return x + self.out(probs @ v)


class Net(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.blocks = nn.Sequential(*(Block() for _ in range({layers})))
        self.how = how

    def forward(self, x):
        x = self.embed(x)
        if self.how == "sequential":
            return checkpoint_sequential(self.blocks, 2, x, use_reentrant=True)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.how == "reentrant")
        return x


def make_reentrant():
    return Net("reentrant"), (torch.randn(2, 8, 16),)


def make_non_reentrant():
    return Net("non-reentrant"), (torch.randn(2, 8, 16),)


def make_sequential():
    return Net("sequential"), (torch.randn(2, 8, 16),)
'''.replace("{layers}", str(LAYERS))

MODES = ["make_reentrant", "make_non_reentrant", "make_sequential"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("checkpointed"), "net.py", MODEL)


@pytest.mark.parametrize("factory", MODES)
def test_checkpointed_parameters_that_train_are_not_reported(model_file, factory):
    model = backward_in_plain_pytorch(model_file, factory)
    assert all(p.grad is not None for p in model.parameters())  # plain PyTorch: everything trains
    report = lint_file(model_file, factory)
    assert report.errors == [] and report.results[0].notes == []  # the backward ran
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []


@pytest.mark.parametrize("factory", MODES)
def test_rules_see_each_checkpointed_op_once(model_file, factory):
    [attention] = findings_of(lint_file(model_file, factory), "GL101")
    assert attention.location.line == line_of(model_file, "# the attention")
    assert attention.occurrences == LAYERS


CUT_INSIDE = {
    "detach": ("        q, k, v = self.qkv(x).chunk(3, dim=-1)",
               "        q, k, v = self.qkv(x).detach().chunk(3, dim=-1)  # the cut"),
    "no_grad": ("        q, k, v = self.qkv(x).chunk(3, dim=-1)",
                "        with torch.no_grad():\n            q, k, v = self.qkv(x).chunk(3, dim=-1)  # the cut"),
}


@pytest.mark.parametrize("factory", MODES)
@pytest.mark.parametrize("cut", CUT_INSIDE)
def test_a_real_cut_inside_a_checkpointed_block_is_still_reported(tmp_path, factory, cut):
    old, new = CUT_INSIDE[cut]
    path = write(tmp_path, "net.py", MODEL.replace(old, new))
    model = backward_in_plain_pytorch(path, factory)
    without_grad = [name for name, p in model.named_parameters() if p.grad is None]
    assert without_grad == [f"blocks.{i}.qkv.{w}" for i in range(LAYERS) for w in ("weight", "bias")]
    report = lint_file(path, factory)
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(path, "# the cut")
    assert finding.occurrences == LAYERS
    assert "blocks.0.qkv.weight" in finding.message and "(8 tensors in blocks)" in finding.message
    assert findings_of(report, "GL203") == []


TRANSFORMERS = '''
import torch
from transformers import AutoModelForCausalLM, LlamaConfig


def build(reentrant):
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # built here
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    return model, (), {"input_ids": torch.randint(0, 128, (2, 16))}


def reentrant():
    return build(True)


def non_reentrant():
    return build(False)
'''


@pytest.mark.transformers
@pytest.mark.parametrize("factory", ["reentrant", "non_reentrant"])
def test_a_transformers_model_with_gradient_checkpointing(tmp_path, factory):
    pytest.importorskip("transformers")
    path = write(tmp_path, "hf.py", TRANSFORMERS)
    report = lint_file(path, factory)
    assert report.errors == []
    assert not [note for note in report.results[0].notes if "backward" in note]  # the backward ran
    [attention] = findings_of(report, "GL101")
    assert attention.location.line == line_of(path, "# built here") and attention.occurrences == 2
    assert [f for f in report.findings if f.rule_id != "GL101"] == []


NO_INPUT_GRAD = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self, reentrant, frozen_embedding):
        super().__init__()
        self.embed = nn.Embedding(32, 16).requires_grad_(not frozen_embedding)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range({layers}))
        self.head = nn.Linear(16, 1)
        self.reentrant = reentrant

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)  # the checkpoint
        return self.head(x)


def reentrant_frozen():
    return Net(True, True), (torch.randint(0, 32, (2, 8)),)


def non_reentrant_frozen():
    return Net(False, True), (torch.randint(0, 32, (2, 8)),)


def reentrant_trained():
    return Net(True, False), (torch.randint(0, 32, (2, 8)),)
'''.replace("{layers}", str(LAYERS))


def test_a_reentrant_checkpoint_whose_inputs_need_no_grad_cuts_its_block(tmp_path):
    # the frozen-embedding mistake (LoRA with reentrant checkpointing): the block's backward never runs
    path = write(tmp_path, "net.py", NO_INPUT_GRAD)
    model = backward_in_plain_pytorch(path, "reentrant_frozen")
    without_grad = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert without_grad == [f"blocks.{i}.0.{w}" for i in range(LAYERS) for w in ("weight", "bias")]
    report = lint_file(path, "reentrant_frozen")
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(path, "# the checkpoint")
    assert finding.message.startswith("This reentrant torch.utils.checkpoint call")
    assert f"({2 * LAYERS} tensors in blocks)" in finding.message and finding.occurrences == LAYERS
    assert findings_of(report, "GL203") == []


@pytest.mark.parametrize("factory", ["non_reentrant_frozen", "reentrant_trained"])
def test_a_checkpoint_whose_block_trains_is_not_a_cut(tmp_path, factory):
    path = write(tmp_path, "net.py", NO_INPUT_GRAD)
    model = backward_in_plain_pytorch(path, factory)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    report = lint_file(path, factory)
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []


def test_a_failed_backward_does_not_make_reentrant_blocks_look_unused(tmp_path):
    # the backward fails inside the block's recompute, so only the checkpoint could tell what its parameters get
    old, new = CUT_INSIDE["detach"][0], ("        gates = torch.sigmoid(self.qkv(x))\n"
                                         "        gates.mul_(2)  # a write to what sigmoid saved\n"
                                         "        q, k, v = gates.chunk(3, dim=-1)")
    path = write(tmp_path, "net.py", MODEL.replace(old, new))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward_in_plain_pytorch(path, "make_reentrant")
    report = lint_file(path, "make_reentrant")
    assert [note for note in report.results[0].notes if "modified by an inplace operation" in note]
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []
