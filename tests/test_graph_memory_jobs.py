"""`graphlint graph` and `graphlint memory` run as jobs of the session, as `check` does: the model in a child of
the command, within --timeout, answered from the result cache while nothing it depends on changed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import run_graphlint, write
from test_cache_and_jobs import run_without_torch

pytestmark = pytest.mark.cli  # CI runs these against the installed wheel too

# Every factory call appends a line to calls.txt beside the model: a run answered from the cache adds none.
MODEL = '''
import os
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


def _called():
    with open(os.path.join(HERE, "calls.txt"), "a") as calls:
        calls.write(f"{os.getpid()} {os.getppid()}\\n")


def make():
    _called()
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)), (torch.randn(4, 8),)


def leaves():
    os._exit(3)


def sleeps():
    time.sleep(60)
    return make()
'''


@pytest.fixture
def model(project_dir):
    write(project_dir, "model.py", MODEL)
    return project_dir


def calls(folder) -> list[tuple[int, int]]:
    """(pid, parent pid) of every call of the factory so far."""
    path = folder / "calls.txt"
    lines = path.read_text().split("\n") if path.exists() else []
    return [tuple(int(n) for n in line.split()) for line in lines if line]


def _started(model, *args: str) -> subprocess.CompletedProcess:
    """The real command, with every factory call it makes checked to be in a child of it, not in it."""
    process = subprocess.Popen([sys.executable, "-m", "graphlint", *args], cwd=model, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    before = len(calls(model))
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    made = calls(model)[before:]
    assert made and all(pid != process.pid and parent == process.pid for pid, parent in made)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


# One project's run of commands for each of `graph` and `memory`: each command checks what its comment says, and
# the run as a whole starts the real command as few times as those checks need.
@pytest.mark.command
def test_graph_runs_the_model_in_a_child_and_answers_from_one_cache_entry_per_capture(model):
    # The model runs in a child of the command, not in it.
    first = _started(model, "graph", "model.py:make", "--format", "json")
    made = len(calls(model))
    # A second run is answered from the cache: the same report, no factory call.
    second = run_graphlint("graph", "model.py:make", "--format", "json", cwd=model)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout and len(calls(model)) == made
    # Other formats and the picture's options are rendered from the same entry: they are not the capture's.
    dot = run_graphlint("graph", "model.py:make", "--format", "dot", "--depth", "1", cwd=model)
    assert dot.returncode == 0 and dot.stdout.startswith("digraph"), dot.stderr
    assert len(calls(model)) == made
    # A report from the cache is drawn without importing torch.
    without_torch = run_without_torch("graph", "model.py:make", "--format", "dot", "--depth", "1", cwd=model)
    assert without_torch.returncode == 0, without_torch.stderr
    assert without_torch.stdout == dot.stdout
    # --no-cache runs the model again, and gives the same report.
    again = run_graphlint("graph", "model.py:make", "--format", "json", "--no-cache", cwd=model)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and len(calls(model)) > made
    made = len(calls(model))
    # --vary is another entry: the model runs again, at the grown batch.
    varied = run_graphlint("graph", "model.py:make", "--vary", "batch", cwd=model)
    assert varied.returncode == 0, varied.stderr
    assert len(calls(model)) > made and "batch 8:" in varied.stdout


@pytest.mark.command
def test_memory_runs_the_model_in_a_child_and_measures_again_when_an_option_or_the_model_changes(model):
    # The model runs in a child of the command, not in it.
    first = _started(model, "memory", "model.py:make", "--format", "json")
    made = len(calls(model))
    # A second run is answered from the cache: the same report, no factory call.
    second = run_graphlint("memory", "model.py:make", "--format", "json", cwd=model)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout and len(calls(model)) == made
    # --no-cache runs the model again, and gives the same report.
    again = run_graphlint("memory", "model.py:make", "--format", "json", "--no-cache", cwd=model)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and len(calls(model)) > made
    # An option that changes the answer is not answered from another option's entry: --batch, then --optimizer.
    made = len(calls(model))
    bigger = run_graphlint("memory", "model.py:make", "--format", "json", "--batch", "16", cwd=model)
    assert bigger.returncode == 0, bigger.stderr
    assert len(calls(model)) > made
    assert (json.loads(first.stdout)[0]["batch"], json.loads(bigger.stdout)[0]["batch"]) == (4, 16)
    made = len(calls(model))
    other = run_graphlint("memory", "model.py:make", "--format", "json", "--optimizer", "sgd", cwd=model)
    assert len(calls(model)) > made and json.loads(other.stdout)[0]["optimizer"] == "sgd"
    # Editing the model measures it again, with the options of an entry already cached.
    made = len(calls(model))
    write(model, "model.py", MODEL.replace("nn.Linear(16, 2)", "nn.Linear(16, 3)"))
    edited = run_graphlint("memory", "model.py:make", "--format", "json", cwd=model)
    assert edited.returncode == 0, edited.stderr
    assert len(calls(model)) > made


def test_a_graph_of_a_model_that_leaves_the_process_is_one_line_and_exit_2(model):
    result = run_graphlint("graph", "model.py:leaves", cwd=model)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("graphlint: error: model.py:leaves: its process exited with code 3 (os._exit")
    assert "Traceback" not in result.stderr


def test_memory_of_a_model_that_leaves_the_process_is_one_line_and_exit_2_and_the_other_targets_are_reported(model):
    result = run_graphlint("memory", "model.py:leaves", "model.py:make", "--format", "json", cwd=model)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("graphlint: error: model.py:leaves: its process exited with code 3 (os._exit")
    assert "during the measurement" in line and "Traceback" not in result.stderr
    [measured] = json.loads(result.stdout)
    assert measured["target"] == "model.py:make" and measured["peak_bytes"] > 0


@pytest.mark.parametrize("command", ["graph", "memory"])
def test_timeout_stops_a_model_that_does_not_return(model, command):
    result = run_graphlint(command, "model.py:sleeps", "--timeout", "3", cwd=model)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("graphlint: error: model.py:sleeps: did not finish within 3 s (--timeout)")
    assert not calls(model)  # stopped in its sleep, before the model was made


@pytest.mark.parametrize("command", ["check", "graph", "memory"])
def test_the_commands_pick_targets_and_write_outputs_alike(model, command):
    unwritable = run_graphlint(command, "model.py:make", "--output", "no/such/folder/out", cwd=model)
    assert unwritable.returncode == 2
    assert unwritable.stderr.strip().splitlines()[-1] == ("graphlint: error: cannot write no/such/folder/out: "
                                                          "No such file or directory")
    assert not calls(model)  # said before the target ran, not after its lint or measurement
    none = run_graphlint(command, cwd=model)  # no TARGET, and no [tool.graphlint] targets
    assert none.returncode == 2 and len(none.stderr.strip().splitlines()) == 1
    wanted = "takes one TARGET" if command == "graph" else "no targets: pass TARGET"
    assert wanted in none.stderr
