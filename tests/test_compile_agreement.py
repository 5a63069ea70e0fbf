"""benchmarks/compile_agreement.py judges GL301/GL302 findings by plain torch.compile's own log: its plain run
and its reading of torch's log are checked here on a model whose breaks and recompiles are known, so that a
verdict of the benchmark can be trusted both ways (a true finding confirmed, a made-up one not)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO, line_of, write

pytestmark = pytest.mark.compile

MODEL = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        print("step")
        for i in range(x.shape[0]):
            h = h + i
        return h * self.calls


def make_model():
    return Model(), (torch.randn(2, 8),)
'''


def _benchmark():
    spec = importlib.util.spec_from_file_location("compile_agreement", REPO / "benchmarks" / "compile_agreement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _finding(rule, path, line):
    return {"rule": rule, "location": {"path": str(path), "line": line}, "related": []}


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agreement")
    path = write(folder, "model.py", MODEL)
    benchmark = _benchmark()
    stderr, _ = benchmark.run_plain(f"{path}:make_model", timeout=300)
    return benchmark, path, benchmark.parse(stderr)


def test_the_plain_run_reads_torchs_own_log_of_every_call(plain_run):
    benchmark, path, (events, dropped, failed) = plain_run
    assert not dropped and not failed
    calls = {event.call for event in events}
    assert {"the factory's inputs", "the same inputs again", "batch 3", "batch 4"} <= calls
    breaks = [event for event in events if event.kind == "break"]
    assert (str(path), line_of(path, 'print("step")')) in {breaks[0].at, *breaks[0].frames}


def test_a_true_break_and_a_counter_that_never_settles_are_confirmed(plain_run):
    benchmark, path, (events, _, _) = plain_run
    verdict, event = benchmark.judge(_finding("GL301", path, line_of(path, 'print("step")')), events)
    assert verdict == "confirmed" and "print" in event.reason
    verdict, event = benchmark.judge(_finding("GL302", path, line_of(path, "self.calls += 1")), events)
    assert verdict == "confirmed" and "self.calls ==" in event.reason


def test_made_up_findings_are_not_confirmed(plain_run):
    benchmark, path, (events, _, _) = plain_run
    # Lines where plain torch.compile neither breaks nor fails a guard.
    assert benchmark.judge(_finding("GL301", path, line_of(path, "h = self.fc(x)")), events)[0] == "NOT CONFIRMED"
    assert benchmark.judge(_finding("GL302", path, line_of(path, "class Model")), events)[0] == "NOT CONFIRMED"
    # The forward's `def` line is where plain torch says the function recompiles, never the guard's line.
    assert benchmark.judge(_finding("GL302", path, line_of(path, "def forward")), events)[0].startswith("MISPLACED")


def test_a_break_graphlint_did_not_report_is_listed_as_missed(plain_run):
    benchmark, path, (events, _, _) = plain_run
    missed = benchmark.misses([], events)
    assert any(event.kind == "break" and (str(path), line_of(path, 'print("step")')) in event.frames
               for event in missed)
    named = [_finding("GL301", path, line_of(path, 'print("step")'))]
    assert not any(event.kind == "break" for event in benchmark.misses(named, events))
