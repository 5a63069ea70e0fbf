"""GL108 finds torch's debugging modes switched on by the target's code, and the capture does not suffer from
them: graphlint's backward runs with anomaly detection off, and an import cannot leave it on for the next target."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import findings_of, line_of, lint_file, write
from graphlint.capture import capture_target, load_target
from graphlint.capture.debug import ANOMALY, PROFILER
from graphlint.target import TargetSpec

AT_IMPORT = '''
import torch
from torch import nn

torch.autograd.set_detect_anomaly(True)  # switched on


def make():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), (torch.randn(4, 8),)
'''

IN_FORWARD = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(2):
            with torch.autograd.detect_anomaly():  # switched on
                x = self.fc(x).relu()
        return x


def make():
    return Model(), (torch.randn(4, 8),)
'''

CLEAN = '''
import torch
from torch import nn


def make():
    return nn.Linear(8, 1), (torch.randn(4, 8),)
'''


@pytest.fixture(autouse=True)
def anomaly_left_off():
    yield
    torch.autograd.set_detect_anomaly(False)  # a plain import below really turns it on


def test_the_import_really_switches_anomaly_detection_on(tmp_path):
    path = write(tmp_path, "at_import.py", AT_IMPORT)
    spec = importlib.util.spec_from_file_location("plain_at_import", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert torch.is_anomaly_enabled()


def test_anomaly_detection_at_import_is_reported_at_its_line_and_the_backward_still_runs(tmp_path):
    path = write(tmp_path, "at_import.py", AT_IMPORT)
    report = lint_file(path)
    assert report.errors == [] and [n for r in report.results for n in r.notes] == []  # no "backward raised ... meta tensors"
    [finding] = findings_of(report, "GL108")
    assert finding.location.line == line_of(path, "# switched on")
    assert finding.message.startswith("Anomaly detection is switched on here, which slows every forward and backward")
    assert not torch.is_anomaly_enabled()


def test_an_import_cannot_leave_anomaly_detection_on_for_the_next_target(tmp_path):
    lint_file(write(tmp_path, "at_import.py", AT_IMPORT))
    report = lint_file(write(tmp_path, "clean.py", CLEAN))
    assert report.errors == [] and findings_of(report, "GL108") == []


def test_a_module_imported_once_keeps_its_import_time_finding_for_each_of_its_targets(tmp_path):
    path = write(tmp_path, "at_import.py", AT_IMPORT + "\n\nother = make\n")
    for name in ("make", "other"):
        [finding] = findings_of(lint_file(path, name), "GL108")
        assert finding.location.line == line_of(path, "# switched on")


def test_anomaly_detection_in_the_forward_is_one_finding_with_its_count(tmp_path):
    path = write(tmp_path, "in_forward.py", IN_FORWARD)
    report = lint_file(path)
    assert report.errors == [] and [n for r in report.results for n in r.notes] == []
    [finding] = findings_of(report, "GL108")
    assert finding.location.line == line_of(path, "# switched on")
    assert finding.occurrences == 2


def test_the_capture_records_each_switch_as_data(tmp_path):
    path = write(tmp_path, "in_forward.py", IN_FORWARD.replace(
        "        return x\n", "        with torch.autograd.profiler.profile():\n            return x * 2\n"))
    capture = capture_target(load_target(TargetSpec.parse(f"{path}:make", tmp_path)))
    assert [s.kind for s in capture.debug_switches] == [ANOMALY, ANOMALY, PROFILER]
    assert [s.switched_on_at[-1].line for s in capture.debug_switches] == [
        line_of(path, "# switched on")] * 2 + [line_of(path, "profiler.profile()")]
    assert not torch.is_anomaly_enabled() and not torch.autograd.profiler._is_profiler_enabled
