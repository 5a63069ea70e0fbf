"""GL901 unused-suppression: a `# graphlint: ignore` comment that suppresses nothing."""

from __future__ import annotations

from graphlint.results import Severity
from graphlint.rule import Example, Rule
from graphlint.tags import UNUSED_SUPPRESSION_TAG


class UnusedSuppression(Rule):
    id = "GL901"
    name = "unused-suppression"
    severity = Severity.WARNING
    tags = ("suppression", "maintainability", UNUSED_SUPPRESSION_TAG)
    precision = "very-high"
    default_enabled = False
    summary = "A `# graphlint: ignore` comment that suppresses nothing."
    what = """
        A suppression comment (`# graphlint: ignore[GL101]`, a bare `# graphlint: ignore`, or
        `# graphlint: ignore-file[...]`) in a file the capture ran that no finding of this run needed. Only
        the codes of rules that ran are judged, so `--select GL1` does not make GL2xx suppressions look
        unused.

        Unlike the other rules it does not read the capture: it is worked out after them, from the comments
        they left unused. It is off by default; turn it on with `extend-select = ["GL901"]`.
    """
    why = """
        A suppression outlives the problem it hid: after a refactor it silences nothing, or worse, silences
        the next real finding on that line. Removing stale suppressions keeps them meaningful.
    """
    example = """
        probs = F.softmax(scores, dim=-1)  # graphlint: ignore[GL101]   (the attention now uses SDPA)
    """
    instead = """
        probs = F.softmax(scores, dim=-1)
    """
    bad_examples = (
        Example(
            title="a suppression on a line with nothing to suppress",
            source='''
                import torch
                from torch import nn


                class Head(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(8, 4)

                    def forward(self, x):
                        return torch.softmax(self.fc(x), dim=-1)  # graphlint: ignore[GL101]  # expect: GL901


                def make():
                    return Head(), (torch.randn(2, 8),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="a suppression that hides a finding",
            source='''
                import torch
                from torch import nn


                class Attention(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.qkv = nn.Linear(16, 48)

                    def forward(self, x):
                        q, k, v = self.qkv(x).chunk(3, dim=-1)
                        # graphlint: ignore[GL101]
                        probs = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
                        return probs @ v


                def make():
                    return Attention(), (torch.randn(2, 8, 16),)
            ''',
        ),
    )

    def check(self, capture):
        return ()  # worked out by graphlint.policy from the suppression comments, after every other rule
