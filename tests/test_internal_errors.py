"""graphlint's own bugs are reported as graphlint's, never blamed on the user's code, and never retried on CPU."""

from __future__ import annotations

import sys

import pytest

import graphlint.capture.device
from conftest import WITHOUT_COMPILE, lint_file, run_graphlint, write
from graphlint.capture.autograd import SavedTensorRecorder
from graphlint.capture.forward import ForwardRecorder

MODEL = '''
import torch
from torch import nn


def make():
    return nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.Linear(8, 2)), (torch.randn(4, 8),)
'''


def _fault_in(owner: type):
    """A method that raises, compiled as if it were written in `owner`'s own source file: a bug in graphlint."""
    source = "def _injected(*args, **kwargs):\n    raise RuntimeError('injected fault')\n"
    namespace: dict = {}
    exec(compile(source, sys.modules[owner.__module__].__file__, "exec"), namespace)
    return namespace["_injected"]


@pytest.fixture
def devices_tried(monkeypatch, tmp_path):
    """The devices the capture was attempted on, in order (written to a file: the target's own process makes
    the attempts)."""
    log = tmp_path / "devices.log"
    original = graphlint.capture.device._capture_on

    def counting(loaded, device, *rest):
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(device + "\n")
        return original(loaded, device, *rest)

    monkeypatch.setattr(graphlint.capture.device, "_capture_on", counting)
    return lambda: log.read_text(encoding="utf-8").split() if log.exists() else []


@pytest.mark.parametrize(
    ("owner", "method"),
    [
        (ForwardRecorder, "_record"),  # the forward recorder's bookkeeping
        (SavedTensorRecorder, "_pack"),  # a saved-tensor hook, called from inside autograd during the forward
        (SavedTensorRecorder, "_unpack"),  # the same hooks, during the backward
    ],
)
def test_a_fault_in_graphlints_recorder_is_an_internal_error_and_not_retried(tmp_path, monkeypatch, devices_tried,
                                                                               owner, method):
    monkeypatch.setattr(owner, method, _fault_in(owner))
    report = lint_file(write(tmp_path, "model.py", MODEL))
    [error] = report.errors
    assert error.message.startswith("internal error in graphlint while capturing (RuntimeError: injected fault)")
    assert "please report it with the output of --debug" in error.message
    assert "forward raised" not in error.message and "backward raised" not in error.message
    assert devices_tried() == ["meta"]


@pytest.mark.parametrize(
    ("forward", "message"),
    [
        ("raise ValueError('bad batch')", "the forward raised ValueError: bad batch"),
        ("return x @ torch.ones(3, 3)", "the forward raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        ("return self.fc(x, x)", "the forward raised TypeError"),
    ],
)
def test_the_users_own_errors_stay_the_users(tmp_path, forward, message):
    path = write(tmp_path, "model.py", f'''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                {forward}


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    [error] = lint_file(path, device="cpu").errors
    assert error.message.startswith(message), error.message
    assert "internal error" not in error.message


def test_a_module_built_with_bad_arguments_is_the_users_error(tmp_path):
    path = write(tmp_path, "model.py", '''
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__(unexpected=1)


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    [error] = lint_file(path, device="cpu").errors
    assert error.message.startswith("the factory raised TypeError"), error.message


SITECUSTOMIZE = '''
import graphlint.capture.forward as forward

# A fault compiled as part of graphlint's recorder, as a bug there would be.
source = "def _injected(*args, **kwargs):\\n    raise RuntimeError('injected fault')\\n"
namespace = {}
exec(compile(source, forward.__file__, "exec"), namespace)
forward.ForwardRecorder._record = namespace["_injected"]
'''


@pytest.mark.cli
def test_the_command_shows_the_traceback_of_an_internal_error_only_with_debug(project_dir):
    write(project_dir, "model.py", MODEL)
    write(project_dir / "inject", "sitecustomize.py", SITECUSTOMIZE)
    env = {"PYTHONPATH": str(project_dir / "inject")}
    plain = run_graphlint("check", *WITHOUT_COMPILE, "model.py:make", "--no-cache", cwd=project_dir, env=env)
    assert plain.returncode == 2
    assert "graphlint: error: model.py:make: internal error in graphlint while capturing (RuntimeError: injected fault)" \
        in plain.stderr
    assert "Traceback" not in plain.stderr
    debug = run_graphlint("check", *WITHOUT_COMPILE, "model.py:make", "--no-cache", "--debug", cwd=project_dir, env=env)
    assert debug.returncode == 2
    assert "Traceback" in debug.stderr and "in _injected" in debug.stderr


def test_a_fault_in_graphlints_own_code_past_the_stages_is_an_internal_error_not_the_targets_exit(tmp_path,
                                                                                                   monkeypatch):
    """Graphlint's code between the stages' handlers (here the cache's reading of what the target imported) is
    graphlint's: it was reported as the target's process exiting with code 1, as if the user's code had."""
    import graphlint.pipeline

    monkeypatch.setattr(graphlint.pipeline, "depends_on", _fault_in(graphlint.pipeline.depends_on))
    report = lint_file(write(tmp_path, "model.py", MODEL))
    [error] = report.errors
    assert error.message.startswith("internal error in graphlint during the "), error.message
    assert "(RuntimeError: injected fault); please report it with the output of --debug" in error.message
    assert "exited with code" not in error.message
