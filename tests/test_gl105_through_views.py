"""GL105 follows reshapes, flattens and permutes between a layer and a batch norm for as long as each channel
of the norm is fed by one bias value (the bias's axis as its channel axis, whatever index it has). Each spelling
is checked in plain PyTorch: flagged exactly when the bias gets a zero gradient in a training step."""

from __future__ import annotations

import pytest
import torch

from conftest import findings_of, line_of, lint_file, write

LINEAR_THEN_NORM = '''
import torch
from torch import nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)  # the layer
        self.bn = nn.BatchNorm1d(8)
        self.bn2d = nn.BatchNorm2d(8)
        self.tokens = nn.BatchNorm1d(5)
        self.flat = nn.BatchNorm1d(40)

    def forward(self, x):
        h = self.fc(x)
        return torch.tanh({expression})


def make():
    return Layer(), (torch.randn(4, 5, 16),)
'''

# expression -> whether the bias is cancelled (checked against plain PyTorch below)
SPELLINGS = {
    # batch and tokens merged, the feature axis kept (LeViT's Linear -> BatchNorm1d on token sequences)
    "self.bn(h.flatten(0, 1)).reshape_as(h)": True,
    "self.bn(h.reshape(-1, 8)).view_as(h) + torch.zeros_like(h)": True,
    "self.bn(h.view(20, 8))": True,
    # the feature axis moved to the channel position
    "self.bn(h.transpose(1, 2))": True,
    "self.bn(h.permute(0, 2, 1).contiguous())": True,
    "self.bn(h.mT)": True,
    "self.bn(h.movedim(-1, 1))": True,
    "self.bn(h.swapaxes(-1, -2))": True,
    "self.bn2d(h.permute(0, 2, 1).unsqueeze(-1))": True,
    "F.batch_norm(h.reshape(20, 8), None, None, training=True)": True,
    "F.group_norm(h.transpose(1, 2), 8)": True,
    # the features merged with the tokens into the channels: one bias value per channel still
    "self.flat(h.flatten(1))": True,
    # not cancelled
    "self.tokens(h)": False,  # the norm's channels are the tokens: each sees every bias value
    "self.bn(h.flatten(0, 1)) + h.flatten(0, 1)": False,  # the layer's output is used again
    "self.bn(h.reshape(8, 20).t())": False,  # the features spread over the positions
    "self.bn(torch.relu(h).transpose(1, 2))": False,
    "self.bn2d(h.reshape(4, 5, 8, 1).permute(0, 3, 1, 2).expand(4, 8, 5, 8).contiguous())": False,
}


@pytest.mark.parametrize("expression", SPELLINGS)
def test_gl105_follows_views_exactly_when_plain_pytorch_gives_the_bias_no_gradient(expression, tmp_path):
    path = write(tmp_path, "model.py", LINEAR_THEN_NORM.format(expression=expression))
    namespace = {"__name__": "plain_model"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    torch.manual_seed(0)
    model, args = namespace["make"]()
    model(*args).sum().backward()
    cancelled = bool(model.fc.bias.grad.abs().max() < 1e-5)
    assert cancelled == SPELLINGS[expression]
    report = lint_file(path)
    assert report.errors == []
    expected = [line_of(path, "# the layer")] if cancelled else []
    assert [f.location.line for f in findings_of(report, "GL105")] == expected


def test_a_conv_in_channels_last_layout_before_a_batch_norm_over_features(tmp_path):
    path = write(tmp_path, "model.py", '''
        import torch
        from torch import nn


        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)  # the layer
                self.bn = nn.BatchNorm1d(8)

            def forward(self, x):
                h = self.conv(x)
                b, c, height, width = h.shape
                return self.bn(h.permute(0, 2, 3, 1).reshape(-1, c)).view(b, height, width, c)


        def make():
            return Layer(), (torch.randn(2, 3, 6, 6),)
    ''')
    namespace = {"__name__": "plain_model"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    model, args = namespace["make"]()
    model(*args).tanh().sum().backward()
    assert model.conv.bias.grad.abs().max() < 1e-5
    [finding] = findings_of(lint_file(path), "GL105")
    assert finding.location.line == line_of(path, "# the layer")
