"""One target cannot change what the next one sees, and the same input gives byte-identical reports."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy
import torch

from conftest import lint_file, write
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


def test_reports_are_byte_identical_across_runs_and_hash_seeds_and_a_run_writes_nothing_but_its_cache(
        project_dir, tmp_path_factory):
    write(project_dir, "messy.py", MESSY.code)
    reports = tmp_path_factory.mktemp("reports")  # outside the project, which must not change
    before = sorted(p.name for p in project_dir.iterdir())
    runs = []
    for run, seed in enumerate(("0", "1", "4242")):
        # The first run writes the cache; the others capture again (--no-cache), under other hash seeds.
        result = subprocess.run([sys.executable, "-m", "graphlint", "check", "messy.py:make", "--format", "sarif",
                                 "--report", f"json={reports / seed}.json", *(["--no-cache"] if run else [])],
                                cwd=project_dir, capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed},
                                timeout=300)
        assert result.returncode == 1, result.stderr
        runs.append({"sarif": result.stdout.decode(), "json": (reports / f"{seed}.json").read_text(encoding="utf-8")})
        if not run:  # a run writes nothing in the project but its cache
            after = sorted(p.name for p in project_dir.iterdir())
            assert set(after) - set(before) <= {".graphlint_cache", "__pycache__"}
    for output_format in ("sarif", "json"):
        assert runs[0][output_format] == runs[1][output_format] == runs[2][output_format], \
            f"{output_format} differs between runs"
    assert str(project_dir) not in runs[0]["sarif"] and str(project_dir) not in runs[0]["json"]
    assert "time" not in json.loads(runs[0]["sarif"])["runs"][0]["invocations"][0]


def test_findings_come_in_a_stable_order(tmp_path):
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    keys = [(f.location.path, f.location.line, f.location.column, f.rule_id) for f in report.findings]
    assert keys == sorted(keys)
