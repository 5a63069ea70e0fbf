"""One typed request goes from the command line to the step unchanged: `graphlint memory`'s and `graphlint time`'s
jobs carry the frozen graphlint.memory.request.Request, pickled to a spawned child as it is, and the step
(graphlint.memory.step.run_step) receives that same value."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from conftest import write
from graphlint.memory import measure as measuring
from graphlint.memory.request import Distribution, Request
from graphlint.project import Project
from graphlint.run.graph_and_memory import memory_estimate
from graphlint.run.wire import MemoryJob, TimeJob

MODEL = '''
import torch
from torch import nn


def make():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)), (torch.randn(4, 8),)
'''


def test_a_request_is_frozen_plain_data():
    request = Request(optimizer="sgd", train_on="cpu", batch=3, distribution=Distribution("ddp", 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.batch = 4
    assert pickle.loads(pickle.dumps(request)) == request
    assert json.loads(json.dumps(dataclasses.asdict(request)))["distribution"]["world"] == 2
    assert hash(request) == hash(Request(optimizer="sgd", train_on="cpu", batch=3, distribution=Distribution("ddp", 2)))


def test_the_jobs_carry_the_request_itself(tmp_path):
    request = Request(optimizer="sgd", train_on="cpu", batch=3)
    project = Project(root=tmp_path)
    assert MemoryJob.of("model.py:make", tmp_path, project, request).request is request
    assert TimeJob.of("model.py:make", tmp_path, project, request, gpu="H100").request is request


def test_the_step_receives_the_request_the_job_was_given(tmp_path, monkeypatch):
    write(tmp_path, "model.py", MODEL)
    seen = []
    real = measuring.run_step

    def watched(model, args, kwargs, loss_fn, request, **others):
        seen.append(request)
        return real(model, args, kwargs, loss_fn, request, **others)

    monkeypatch.setattr(measuring, "run_step", watched)
    request = Request(optimizer="sgd", train_on="cpu", batch=3)
    job = pickle.loads(pickle.dumps(MemoryJob.of("model.py:make", tmp_path, Project(root=tmp_path), request)))
    answer = memory_estimate(job)
    assert not answer.result.errors and answer.report["batch"] == 3
    assert seen == [request]


ESTIMATED = '''
import sys
from types import SimpleNamespace

from graphlint.memory.estimate import estimate

blocks = [SimpleNamespace(nbytes=64, made=-1, phase="", module="", op="", dtype="float32", shape=(4, 4),
                          kind="parameter", freed=None, saved_by=[]),
          SimpleNamespace(nbytes=32, made=0, phase="forward", module="0", op="addmm.default", dtype="float32",
                          shape=(2, 4), kind="activation", freed=3, saved_by=["AddmmBackward0"])]
trace = SimpleNamespace(blocks=blocks, events=4, phase_starts={"forward": 0, "loss": 1, "backward": 2},
                        optimizer="sgd", device="meta", trainable=1, loss_found=True, module_types={"0": "Linear"},
                        module_inputs={}, roles={}, unseen_autocast=[], notes=[], distributed={})
print(estimate(trace).peak_bytes, "torch" in sys.modules)
'''


def test_an_estimate_is_read_from_a_trace_without_torch():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ESTIMATED], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["96", "False"], done.stderr
