"""Every target runs in its own process: nothing one target does reaches another, and a target whose process
dies is that target's error, with the stage it reached; the other targets' findings are kept."""

from __future__ import annotations

import json

import pytest

from conftest import WITHOUT_COMPILE, line_of, run_graphlint, validate_sarif, write
from test_cli import ATTENTION, CLEAN

pytestmark = pytest.mark.cli

LAYERS_FUSED = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
'''
LAYERS_MANUAL = LAYERS_FUSED.replace("torch.nn.functional.scaled_dot_product_attention(q, k, v)",
                                     "torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # by hand")
MODEL = '''
import torch
from layers import Block


def target():
    return Block(), (torch.randn(2, 8, 16),)
'''


def test_same_named_sibling_modules_of_two_targets_stay_apart(project_dir):
    write(project_dir / "fused", "layers.py", LAYERS_FUSED)
    write(project_dir / "fused", "model.py", MODEL)
    manual = write(project_dir / "manual", "layers.py", LAYERS_MANUAL)
    write(project_dir / "manual", "model.py", MODEL)
    result = run_graphlint("check", *WITHOUT_COMPILE, "fused/model.py:target", "manual/model.py:target", "--no-cache",
                           "--format", "json", cwd=project_dir)
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)["findings"]
    assert finding["rule"] == "GL101" and finding["location"]["path"] == "manual/layers.py"
    assert finding["location"]["line"] == line_of(manual, "# by hand")


HOOKER = '''
import torch
from torch import nn

# A debugging helper that wraps every module's output, installed when the module is imported.
nn.modules.module.register_module_forward_hook(lambda module, args, output: output.clone())


def make():
    return nn.Linear(4, 4), (torch.randn(2, 4),)
'''
VICTIM = '''
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.Sigmoid()

    def forward(self, x):
        h = self.act(self.fc(x))
        h.mul_(2)  # overwrites the sigmoid's saved output
        return h


def make():
    return Gate(), (torch.randn(2, 4),)
'''


def test_a_global_module_hook_installed_by_one_target_does_not_reach_the_next(project_dir):
    write(project_dir, "hooker.py", HOOKER)
    victim = write(project_dir, "victim.py", VICTIM)
    result = run_graphlint("check", *WITHOUT_COMPILE, "hooker.py:make", "victim.py:make", "--no-cache", "--format", "json",
                           cwd=project_dir)
    findings = json.loads(result.stdout)["findings"]
    assert [(f["rule"], f["location"]["line"]) for f in findings] == [("GL201", line_of(victim, "h.mul_(2)"))]


EXITS_IN_FORWARD = '''
import sys

import torch
from torch import nn


class Quits(nn.Module):
    def forward(self, x):
        sys.exit(3)


def make():
    return Quits(), (torch.randn(2),)
'''
PARSES_ARGUMENTS = '''
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
options = parser.parse_args()  # a training script's module level: exits when imported without arguments


def make():
    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)
'''
HARD_EXIT = '''
import os

import torch
from torch import nn


class Leaves(nn.Module):
    def forward(self, x):
        os._exit(7)


def make():
    return Leaves(), (torch.randn(2),)
'''
SEGFAULT = '''
import ctypes

import torch
from torch import nn


class Crashes(nn.Module):
    def forward(self, x):
        ctypes.string_at(0)


def make():
    return Crashes(), (torch.randn(2),)
'''
NATIVE_HANG = '''
import ctypes

import torch
from torch import nn


class Sleeps(nn.Module):
    def forward(self, x):
        ctypes.CDLL(None).sleep(100)  # inside C: no Python signal handler runs here
        return x


def make():
    return Sleeps(), (torch.randn(2),)
'''

DYING = {
    "exits.py": (EXITS_IN_FORWARD, "the target called sys.exit(3) during the forward"),
    "script.py": (PARSES_ARGUMENTS, "the target called sys.exit(2) during the import; guard a script's own code"),
    "hard_exit.py": (HARD_EXIT, "its process exited with code 7 (os._exit or a native exit) during the forward"),
    "segfault.py": (SEGFAULT, "its process crashed with SIGSEGV (a segmentation fault in native code) during the "
                              "forward"),
}


def test_a_target_whose_process_dies_is_one_error_and_the_others_are_kept(project_dir):
    good = write(project_dir, "good.py", ATTENTION)
    for name, (source, _) in DYING.items():
        write(project_dir, name, source)
    targets = ["good.py:make", *(f"{name}:make" for name in DYING), "clean.py:make"]
    write(project_dir, "clean.py", CLEAN)
    result = run_graphlint("check", *targets, "--no-cache", "--format", "sarif", "--output", "out.sarif",
                           cwd=project_dir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for name, (_, message) in DYING.items():
        lines = [line for line in result.stderr.splitlines() if line.startswith(f"graphlint: error: {name}:make: ")]
        assert len(lines) == 1 and message in lines[0], result.stderr
    log = json.loads((project_dir / "out.sarif").read_text(encoding="utf-8"))
    validate_sarif(log)
    run = log["runs"][0]
    assert [r["ruleId"] for r in run["results"]] == ["GL301", "GL101"]  # the forward's print, the attention
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]} == {good.name}
    invocation = run["invocations"][0]
    assert invocation["executionSuccessful"] is False
    assert len(invocation["toolExecutionNotifications"]) == len(DYING)


def test_the_timeout_stops_a_hang_inside_native_code(project_dir):
    write(project_dir, "sleeps.py", NATIVE_HANG)
    write(project_dir, "good.py", ATTENTION)
    result = run_graphlint("check", *WITHOUT_COMPILE, "sleeps.py:make", "good.py:make", "--timeout", "5", "--no-cache",
                           cwd=project_dir)
    assert result.returncode == 2
    assert "graphlint: error: sleeps.py:make: did not finish within 5 s (--timeout) during the forward" \
        in result.stderr
    assert "GL101" in result.stdout


def test_one_job_and_two_jobs_give_byte_identical_reports(project_dir):
    write(project_dir, "good.py", ATTENTION)
    write(project_dir, "victim.py", VICTIM)
    write(project_dir, "clean.py", CLEAN)
    write(project_dir, "exits.py", EXITS_IN_FORWARD)
    targets = ["good.py:make", "victim.py:make", "exits.py:make", "clean.py:make"]
    reports = {}
    for jobs in ("1", "2"):  # one run writes both forms (--report: from the same run)
        result = run_graphlint("check", *targets, "-j", jobs, "--no-cache", "--format", "json", "--report",
                               f"sarif=jobs-{jobs}.sarif", cwd=project_dir)
        reports[jobs, "json"] = result.stdout
        reports[jobs, "sarif"] = (project_dir / f"jobs-{jobs}.sarif").read_text(encoding="utf-8")
    assert reports["1", "json"] == reports["2", "json"] and reports["1", "sarif"] == reports["2", "sarif"]
    assert [f["rule"] for f in json.loads(reports["1", "json"])["findings"]] == ["GL301", "GL101", "GL201"]


def test_a_parent_that_already_ran_parallel_cpu_work_still_gets_working_children(tmp_path):
    """graphlint.session.check inside a process that used torch's OpenMP pool (a test session, a notebook): a
    forked child cannot use that pool, so it runs its CPU ops on one thread instead of waiting forever."""
    import torch

    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.session import Options, check

    x = torch.randn(1000, 1000)
    assert (x @ x).isfinite().all()  # a parallel CPU op in this process
    path = write(tmp_path, "branchy.py", '''
        import torch


        class Branchy(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:  # needs real values: captured on CPU
                    return (x @ x).relu()
                return x


        def make():
            return Branchy(), (torch.randn(500, 500),)
    ''')
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    report = check([f"{path}:make"], project, Config(), Options(timeout=120))
    assert report.errors == [] and report.results[0].device == "cpu"
