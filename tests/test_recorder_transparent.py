"""The pytest plugin's recorder, installed in this process as `pytest --graphlint` installs it: whatever the
test's code and objects do, a recorded call computes, raises, warns and leaves behind what it does without it."""

from __future__ import annotations

import random
import re
import warnings

import pytest
import torch
import torch.nn as nn

from graphlint import recorded
from graphlint.recorded import ModelRecorder


class Shape(tuple):
    """A library's representation type whose length cannot be taken (a lazily evaluated shape)."""

    def __len__(self):
        raise RuntimeError("the length of this shape is unknown")


class Opaque:
    def __repr__(self):
        raise ValueError("no repr")

    def __eq__(self, other):
        raise ValueError("no comparison")

    __hash__ = object.__hash__


class Net(nn.Module):
    def __init__(self, shape=None, extra=None, dim=4):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x, flag=False):
        y = self.fc(x)
        return y * 2 if flag else y


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.emb(ids).sum(-1)


@pytest.fixture
def recorder():
    recorder = ModelRecorder()
    recorder.install()
    try:
        yield recorder
    finally:
        recorder.uninstall()


def test_user_objects_whose_len_repr_and_eq_raise_do_not_reach_the_test(recorder):
    model = Net(Shape((1, 2)), extra=[Opaque(), Shape((3,))])
    assert model(torch.ones(2, 4)).shape == (2, 4)
    (recording,) = recorder.recordings.values()
    assert recording.site is not None and recording.problem is None, recording.problem
    assert "Opaque" in recording.configuration  # the failed repr is named by the type


def test_a_jit_trace_under_warnings_as_errors_sees_no_recorder(recorder):
    ids = torch.randint(0, 10, (2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace's own deprecation
        traced = torch.jit.trace(Lookup(), (ids,))
    recorder.uninstall()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        plain = torch.jit.trace(Lookup(), (ids,))
    # The recorder's copies are no part of the traced graph (the mangled class names differ between two traces).
    def unmangled(graph):
        return re.sub(r"___torch_mangle_\d+\.", "", str(graph))

    assert unmangled(traced.graph) == unmangled(plain.graph)
    (recording,) = recorder.recordings.values()
    assert recording.problem is None and recording.target.endswith("--input 'int64[2,3]:" +
                                                                   f"{int(ids.min())}..{int(ids.max()) + 1}'")


def test_graphlint_failing_while_recording_becomes_the_models_note(recorder, monkeypatch):
    def broken(*args):
        raise KeyError("graphlint's own bug")

    monkeypatch.setattr(recorded, "configuration_text", broken)
    assert Net()(torch.ones(1, 4)).shape == (1, 4)
    (recording,) = recorder.recordings.values()
    assert recording.cls.endswith("Net") and "graphlint could not record it (KeyError" in recording.problem
    assert recording.data is None and recording.target is None


def test_calls_inside_torch_func_and_fx_tracing_are_not_recorded_and_run_as_without_it(recorder):
    model = Net()
    x = torch.randn(3, 2, 4)
    out = torch.func.vmap(model)(x)
    torch.fx.symbolic_trace(nn.Sequential(Net()))
    assert torch.allclose(out, model.fc(x))
    assert recorder.recordings == {}


def _state():
    return (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_rng_state().clone(), random.getstate(),
            list(warnings.filters), torch.is_autocast_enabled("cpu"), torch.get_default_device())


def test_a_recorded_call_leaves_torchs_and_pythons_state_as_it_found_it(recorder):
    torch.manual_seed(0)
    model = Net(Shape((1,)))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        before = _state()
        model(torch.ones(2, 4), flag=True)
        after = _state()
    assert len(recorder.recordings) == 1
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before, after, strict=True))


class Wrapper(nn.Module):
    def __init__(self, inner, scale=1.0):
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, x, mask=None, flag=False):
        y = self.inner(x, flag=flag) * self.scale
        return y if mask is None else y * mask


def _calls():
    """Models built and called as tests do: keyword inputs, a module argument, float64 by default, autocast."""
    Net()(torch.randn(2, 4), flag=True)
    Wrapper(Net(dim=4), scale=2.0)(torch.randn(2, 4), mask=torch.ones(2, 4), flag=True)
    torch.set_default_dtype(torch.float64)
    try:
        Net(dim=3)(torch.randn(5, 3))
    finally:
        torch.set_default_dtype(torch.float32)
    model = Wrapper(Net(), scale=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 4))


def test_every_recording_is_a_command_or_a_factory_that_parses_and_runs(recorder):
    import ast

    _calls()
    recorder.uninstall()
    recordings = list(recorder.recordings.values())
    assert len(recordings) == 4 and all(r.problem is None for r in recordings), recordings
    factories = [r.factory for r in recordings if r.target is None]
    assert len(factories) == 4 and None not in factories  # a bool input, a module argument, a default dtype, autocast
    for source in factories:
        ast.parse(source)
        namespace: dict = {}
        before = torch.get_default_dtype(), torch.is_autocast_enabled("cpu")
        try:
            exec(compile(source, "factory.py", "exec"), namespace)
            model, args, *kwargs = namespace["make"]()
            model(*args, **(kwargs[0] if kwargs else {}))
        finally:
            torch.set_default_dtype(before[0])
            torch.set_autocast_enabled("cpu", before[1])
    float64 = next(f for f in factories if "float64" in f)
    assert "torch.set_default_dtype(torch.float64)" in float64
    autocast = next(f for f in factories if "autocast" in f)
    assert "torch.set_autocast_dtype('cpu', torch.bfloat16)" in autocast


def test_the_rebuild_builds_and_runs_under_the_default_dtype_and_autocast_of_the_test(recorder, tmp_path):
    from graphlint.capture.isolation import preserved_global_state
    from graphlint.errors import MetaCannotRun

    _calls()
    recorder.uninstall()
    by_configuration = {r.configuration: r for r in recorder.recordings.values()}
    float64 = by_configuration["dim=3 [default dtype float64]"]
    path = tmp_path / "float64.pt"
    path.write_bytes(float64.data)
    with preserved_global_state():
        made = recorded.rebuild(str(path))
        assert made.model.fc.weight.dtype == torch.float64 and made.args[0].dtype == torch.float64
        assert made.model(*made.args).dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32
    autocast = next(r for r in recorder.recordings.values() if "autocast" in (r.factory or ""))
    path = tmp_path / "autocast.pt"
    path.write_bytes(autocast.data)
    with preserved_global_state():
        made = recorded.rebuild(str(path))
        assert made.model(*made.args).dtype == torch.bfloat16
        with torch.device("meta"), pytest.raises(MetaCannotRun):  # meta tensors ignore CPU autocast
            recorded.rebuild(str(path))
    assert not torch.is_autocast_enabled("cpu")


class Sampler(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())

    def forward(self, z):
        return self.net(z)

    def sample(self, n):
        return self.net(torch.randn(n, 4))


def test_a_model_driven_by_forward_or_its_own_method_is_named_with_the_method(recorder):
    Sampler().sample(2)
    Sampler().forward(torch.randn(1, 4))
    notes = sorted(r.problem for r in recorder.recordings.values() if r.cls.endswith(".Sampler"))
    assert len(notes) == 2 and "through .forward(), not by calling it" in notes[0], notes
    assert "through its own method sample()" in notes[1]
    # The Sequential they called (built at one line, alike) is recorded as before: its code is still linted.
    assert sum(r.cls == "torch.nn.modules.container.Sequential" for r in recorder.recordings.values()) == 1


def test_a_call_that_raised_is_not_the_recorded_run(recorder):
    model = Net()
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        model(torch.ones(2, 5))
    assert recorder.recordings == {}
    model(torch.ones(3, 4))
    (recording,) = recorder.recordings.values()
    assert recording.target.endswith("--input 'float32[3,4]'"), recording.target


def test_under_pytest_the_hint_names_the_plugins_debug_option():
    from types import SimpleNamespace

    from graphlint.pytest_plugin import _rename
    from graphlint.results import TargetError, TargetResult

    message = "internal error in graphlint while capturing (X); please report it with the output of --debug"
    result = TargetResult(target="t", errors=[TargetError("t", message)])
    _rename(SimpleNamespace(results=[result], merged=None), {"t": "Model built at test_m.py:3"})
    assert result.errors[0].message.endswith("with the output of --graphlint-debug")
    assert result.errors[0].target == "Model built at test_m.py:3"


class SizedAtInit(nn.Module):
    """Runs a layer once in its constructor to learn a size, as CNNs often do."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3)
        self.size = self.conv(torch.zeros(1, 1, 8)).numel()
        self.head = nn.Linear(self.size, 1)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))

    def generate(self, x):
        return self.forward(x)


def test_a_layer_run_in_a_constructor_or_a_model_also_called_gets_no_note(recorder):
    model = SizedAtInit()
    model.generate(torch.zeros(2, 1, 8))  # a note at first (its layers are torch's own, not recorded)...
    assert "own method generate()" in next(iter(recorder.recordings.values())).problem
    model(torch.zeros(2, 1, 8))  # ...void once the model is called
    model.generate(torch.zeros(2, 1, 8))
    problems = [r.problem for r in recorder.recordings.values() if r.cls.endswith("SizedAtInit")]
    assert problems == [None], problems
