"""GL108 debug-mode-on: the target's code left anomaly detection or an autograd profiler running."""

from __future__ import annotations

from graphlint.capture.debug import ANOMALY, NVTX, PROFILER
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule

_SUBJECT = {ANOMALY: "Anomaly detection", PROFILER: "The autograd profiler", NVTX: "emit_nvtx"}
_FIX = {
    ANOMALY: "switch it on only while hunting a NaN, for example behind a command-line flag",
    PROFILER: "profile in a separate run, not in the model's own code",
    NVTX: "wrap only the profiling run in emit_nvtx, not the model's own code",
}


class DebugModeOn(Rule):
    id = "GL108"
    name = "debug-mode-on"
    severity = Severity.WARNING
    tags = ("performance", "debugging")
    precision = "high"
    summary = "Anomaly detection or an autograd profiler is switched on by the model's own code."
    what = """
        The target's code (at import, in the factory or in the forward) switches on a debugging mode of torch's
        that stays on for the forward or part of it:

        - anomaly detection: `torch.autograd.set_detect_anomaly(True)`, `with torch.autograd.detect_anomaly():`;
        - the autograd profiler: `torch.autograd.profiler.profile`, `torch.profiler.profile`, and
          `torch.autograd.profiler.emit_nvtx`.

        The finding points at the line that switched it on, or at the target factory when the mode was on
        before graphlint could watch (switched on by another module imported earlier). Graphlint's own backward
        always runs with anomaly detection off, and a target's import cannot leave anomaly detection on for the
        next target.
    """
    why = """
        Anomaly detection records a Python stack trace for every autograd node in the forward and checks every
        gradient for NaN in the backward, a check that copies a value to the host per node; training runs many
        times slower. A profiler records every op. Both are meant for a debugging run and are easily left on.
    """
    example = """
        torch.autograd.set_detect_anomaly(True)      # at import, "while we look for that NaN"

        def forward(self, x):
            with torch.autograd.profiler.profile():
                return self.net(x)
    """
    instead = """
        if args.detect_anomaly:                      # only when asked for
            torch.autograd.set_detect_anomaly(True)

        def forward(self, x):
            return self.net(x)                       # profile from the training script, when needed
    """
    bad_examples = (
        Example(
            title="anomaly detection switched on in the factory and a profiler around the forward's work",
            source='''
                import torch
                from torch import nn


                class Model(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(8, 8)

                    def forward(self, x):
                        with torch.autograd.profiler.profile():  # expect: GL108
                            return self.fc(x).relu()


                def make():
                    torch.autograd.set_detect_anomaly(True)  # expect: GL108
                    return Model(), (torch.randn(4, 8),)
            ''',
        ),
        Example(
            title="anomaly detection switched on at import",
            source='''
                import torch
                from torch import nn

                torch.autograd.set_detect_anomaly(True)  # expect: GL108


                def make():
                    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), (torch.randn(4, 8),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="anomaly detection behind a flag that is off, and switched off explicitly",
            source='''
                import torch
                from torch import nn

                DEBUG = False


                def make():
                    if DEBUG:
                        torch.autograd.set_detect_anomaly(True)
                    torch.autograd.set_detect_anomaly(False)
                    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), (torch.randn(4, 8),)
            ''',
        ),
    )

    def check(self, capture):
        for switch in capture.debug_switches:
            when = "is switched on here" if switch.switched_on_at else "was already on when this target was imported"
            yield Problem(
                stack=switch.switched_on_at,
                message=f"{_SUBJECT[switch.kind]} {when}, which slows every forward and backward{{occurrences}}; "
                        f"{_FIX[switch.kind]}.",
            )
