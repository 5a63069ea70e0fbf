"""One target cannot change what the next one sees, and the same input gives byte-identical reports."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy
import torch

from conftest import lint_file, run_graphlint, write
from test_several_problems import MESSY

MESSES_WITH_EVERYTHING = '''
import random
import sys

import numpy
import torch
from torch import nn


def make():
    torch.set_default_dtype(torch.float64)
    torch.set_default_device("cpu")
    torch.set_grad_enabled(False)
    torch.set_anomaly_enabled(True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    torch.set_num_threads(1)
    torch.manual_seed(123)
    random.seed(5)
    numpy.random.seed(7)
    sys.path.append("/nonexistent/added-by-a-factory")
    return nn.Linear(4, 4), (torch.randn(2, 4),)


def checks_the_state():
    """The next target: fails if the previous one leaked any of its changes."""
    leaked = {
        "dtype": torch.get_default_dtype() != torch.float32,
        "grad": not torch.is_grad_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "precision": torch.get_float32_matmul_precision() != "highest",
        "path": "/nonexistent/added-by-a-factory" in sys.path,
    }
    if any(leaked.values()):
        raise RuntimeError(f"state leaked: {sorted(k for k, v in leaked.items() if v)}")
    return nn.Linear(4, 4), (torch.randn(2, 4),)
'''


def snapshot() -> dict:
    return {
        "default dtype": torch.get_default_dtype(), "default device": torch.get_default_device(),
        "torch function modes": torch._C._len_torch_function_stack(),
        "grad mode": torch.is_grad_enabled(), "anomaly mode": torch.is_anomaly_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "matmul precision": torch.get_float32_matmul_precision(), "threads": torch.get_num_threads(),
        "sys.path": list(sys.path), "torch random": torch.get_rng_state().tolist(),
        "python random": random.getstate(), "numpy random": repr(numpy.random.get_state()),
    }


def test_a_target_cannot_change_global_state_for_the_next_or_for_the_caller(tmp_path):
    path = write(tmp_path, "messy_state.py", MESSES_WITH_EVERYTHING)
    before = snapshot()
    first = lint_file(path, "make", device="cpu")
    second = lint_file(path, "checks_the_state", device="cpu")
    assert first.errors == [] and second.errors == []
    after = snapshot()
    assert [name for name in before if after[name] != before[name]] == []


def test_reports_are_byte_identical_across_runs_and_hash_seeds(project_dir):
    write(project_dir, "messy.py", MESSY.code)
    outputs = {}
    for output_format in ("sarif", "json"):
        runs = [
            subprocess.run([sys.executable, "-m", "graphlint", "check", "messy.py:make", "--no-cache",
                            "--format", output_format], cwd=project_dir, capture_output=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300).stdout
            for seed in ("0", "1", "4242")
        ]
        assert runs[0] == runs[1] == runs[2], f"{output_format} differs between runs"
        outputs[output_format] = runs[0].decode()
    assert str(project_dir) not in outputs["sarif"] and str(project_dir) not in outputs["json"]
    assert "time" not in json.loads(outputs["sarif"])["runs"][0]["invocations"][0]


def test_findings_come_in_a_stable_order(tmp_path):
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    keys = [(f.location.path, f.location.line, f.location.column, f.rule_id) for f in report.findings]
    assert keys == sorted(keys)


def test_a_run_writes_nothing_in_the_project_but_its_cache(project_dir):
    write(project_dir, "model.py", MESSY.code)
    before = sorted(p.name for p in project_dir.iterdir())
    result = run_graphlint("check", "model.py:make", cwd=project_dir)
    assert result.returncode == 1
    after = sorted(p.name for p in project_dir.iterdir())
    assert set(after) - set(before) <= {".graphlint_cache", "__pycache__"}
