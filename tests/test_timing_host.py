"""On this machine's CPU, a step's forward pays its own Python: the forward is run again on meta under a probe
(graphlint.timing.record.HostProbe) that times the host side before each op, scaled by the same measure of a
micro-step (CpuPeaks.host_scale). The probe is invisible to the model's code, and its seconds land on the ops
(and lines) they preceded."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

from graphlint.memory.measure import Request
from graphlint.timing.devices import CpuPeaks
from graphlint.timing.measure import record_step
from graphlint.timing.record import HostProbe, _aligned, probe_host
from graphlint.timing.roofline import op_seconds, price
from conftest import write

THREADS = torch.get_num_threads()
SPIN = 0.004  # seconds of plain Python the slow model spends before one op

MODELS = f"""
import time

import torch
from torch import nn


class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)

    def forward(self, x):
        x = self.first(x)
        until = time.perf_counter() + {SPIN}
        while time.perf_counter() < until:
            pass
        return self.second(x)  # the line that pays for the spin


def slow():
    torch.manual_seed(0)
    return Slow(), (torch.randn(4, 8),)


def fast():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), (torch.randn(4, 8),)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def gru():
    torch.manual_seed(0)
    return Tagger(), (torch.randn(2, 6, 8),)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("host"), "host_models.py", MODELS)


def _records(models: Path, factory: str):
    records, _ = record_step(f"{models}:{factory}", models.parent, Request(train_on="cpu"), calls=True)
    return records


def _cpu(host_scale: float) -> CpuPeaks:
    return CpuPeaks("test cpu", 1, {"float32": [(1e3, 1e9), (1e9, 1e9)]}, [(1e3, 1e9), (1e9, 1e9)],
                    {"forward": 1e-5, "backward": 2e-5, "optimizer": 3e-5}, 1e-7,
                    per_phase={"forward": 1e-3, "backward": 0.0, "optimizer": 0.0}, host_scale=host_scale)


def test_the_probe_gives_each_op_the_python_before_it():
    weight = torch.empty(8, 8, device="meta", requires_grad=True)
    x = torch.empty(4, 8, device="meta")

    def forward():
        y = x @ weight
        until = time.perf_counter() + SPIN
        while time.perf_counter() < until:
            pass
        return (y @ weight).sum()

    names, gaps = probe_host(forward)
    assert names == ["aten.mm.default", "aten.mm.default", "aten.sum.default"]
    assert gaps[1] >= SPIN  # the second product waited for the spin
    assert gaps[1] == max(gaps)


def test_a_decomposed_op_is_timed_by_its_parts_without_counting_twice():
    x = torch.empty(4, 8, device="meta")
    probe = HostProbe()
    with probe:
        torch.ops.aten.linear.default(x, torch.empty(8, 8, device="meta"))
    # linear has no FLOP formula and decomposes (as the recorder counts it): its parts are the ops
    assert "aten.linear.default" not in probe.names and probe.names
    assert len(probe.gaps) == len(probe.names)
    assert sum(probe.gaps) < 0.5  # seconds: a few microseconds in all, unless the machine stalls


def test_the_probe_is_invisible_to_the_models_code(capsys):
    calls = []

    def forward():
        calls.append(1)
        print("the model prints")
        import warnings
        warnings.warn("the model warns", UserWarning, stacklevel=1)
        torch.rand(3)
        random.random()
        return torch.empty(2, device="meta").sum()

    torch.manual_seed(7)
    random.seed(7)
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    torch.set_grad_enabled(False)
    try:
        assert probe_host(forward) is not None
        assert not torch.is_grad_enabled()  # the caller's
    finally:
        torch.set_grad_enabled(True)
    assert calls  # it ran
    assert capsys.readouterr() == ("", "")
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state

    def raises():
        torch.rand(3)
        raise RuntimeError("only once")

    assert probe_host(raises) is None
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_the_probes_gaps_are_matched_to_the_steps_ops_by_name():
    # b and c are meta's decomposition (issued from C++ inside one call) where the step ran x, a stand-in's kernel:
    # x takes the first gap (the Python before the call), c's round trip is dropped; e is the probe's alone
    assert _aligned(["a", "b", "c", "d", "e"], [1.0, 2.0, 4.0, 8.0, 16.0], ["a", "x", "d"]) == [1.0, 2.0, 24.0]
    # ops only the probe saw are carried to the next op matched
    assert _aligned(["a", "b", "c"], [1.0, 2.0, 4.0], ["a", "c"]) == [1.0, 6.0]
    # an op only the step ran (an autocast cast, backward's seed) is not probed, unless something was carried to it
    assert _aligned(["a", "b"], [1.0, 2.0], ["a", "cast", "b", "seed"]) == [1.0, None, 2.0, None]
    assert _aligned(["a", "q", "b"], [1.0, 4.0, 2.0], ["a", "x", "y", "b"]) == [1.0, 2.0, 2.0, 2.0]


def test_the_forward_again_keeps_only_the_device_context_and_gives_the_modes_back():
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import DeviceContext

    from graphlint.memory.step import _forward_only

    class Other(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    seen = []

    class Model(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.ones(2).device.type, torch._C._len_torch_function_stack()))
            return x * 2

    x = torch.ones(2, device="meta")
    with torch.device("meta"), Other():
        before = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
        _forward_only(Model(), (x,), {}, None)
        # made without a device, a tensor lands where the capture puts it; the other mode is off for the run
        assert seen == [("meta", 1)]
        assert isinstance(before[0], DeviceContext)

        class Raises(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("no second call")

        with pytest.raises(RuntimeError):
            _forward_only(Raises(), (x,), {}, None)
        after = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
        assert after == before


def test_a_steps_forward_pays_its_probed_python_at_its_line(models):
    slow, fast = _records(models, "slow"), _records(models, "fast")
    for records in (slow, fast):
        forward = [r for r in records if r.phase == "forward"]
        # every op of the forward is probed but backward's seed, which the probe's forward never makes
        assert forward and all(r.host is not None for r in forward[:-1])
        assert forward[-1].op == "aten.ones_like.default" and forward[-1].host is None
        assert all(r.host is None for r in records if r.phase != "forward")
    spun = max((r for r in slow if r.phase == "forward" and r.host is not None), key=lambda r: r.host)
    assert spun.host >= SPIN  # the first op of the second Linear (its weight's transpose)
    source = Path(spun.file).read_text().splitlines()[spun.line - 1]
    assert "the line that pays for the spin" in source
    cpu = _cpu(host_scale=0.5)
    assert op_seconds(spun, cpu)[0] >= 0.5 * SPIN
    # the probe timed the forward's whole host side: no per-op or once-per-phase fixed cost is added to it
    step = price(slow, cpu, "m")
    assert step.phases["forward"] == pytest.approx(sum(op_seconds(r, cpu)[0] for r in slow if r.phase == "forward"))
    # the two models' forwards differ by their probed seconds, scaled, and by nothing else
    probed = sum(r.host for r in slow if r.host) - sum(r.host for r in fast if r.host)
    assert step.phases["forward"] - price(fast, cpu, "m").phases["forward"] == pytest.approx(0.5 * probed)
    # on a device the probe did not measure (no scale), the forward is priced per op as before
    unscaled = price(slow, _cpu(host_scale=0.0), "m")
    assert unscaled.phases["forward"] < step.phases["forward"]


def test_a_forward_with_a_recurrent_layers_loop_is_priced_per_op(models):
    records = _records(models, "gru")
    assert any(r.native for r in records if r.phase == "forward")
    assert all(r.host is None for r in records)


def test_this_cpus_scale_is_the_micro_steps_cpu_forward_over_its_median_probe_on_one_thread(monkeypatch):
    import graphlint.timing.devices as devices
    import graphlint.timing.record as record

    seen, probes = [], iter([0.5, 0.1, 0.2, 0.3, 9.0])  # each probe's total; one an outlier

    def cpu_forward(run, clock, budget, median=False):
        seen.append(torch.get_num_threads())
        assert run().device.type == "cpu" and median
        return 0.08

    def probe(forward):
        seen.append(torch.get_num_threads())
        assert forward().device.type == "meta"
        return ["aten::addmm"], [next(probes)]

    monkeypatch.setattr(devices, "call_seconds", cpu_forward)
    monkeypatch.setattr(record, "probe_host", probe)
    torch.set_num_threads(2)
    try:
        scale = devices._host_scale()
        assert torch.get_num_threads() == 2  # the caller's count is given back
    finally:
        torch.set_num_threads(THREADS)
    # a second intra-op thread on a loaded machine made the tiny CPU forward 300x slower: Python runs on one
    assert seen == [1] * 6
    assert scale == pytest.approx(0.08 / 0.3)  # the median probe, so that one slow probe moves nothing


def test_this_cpus_scale_is_measured_on_the_micro_step():
    from graphlint.timing.devices import _host_scale

    scale = _host_scale()
    assert 0.0 < scale < float("inf")  # its size is a measurement: docs/time.md gives this machine's (0.44)


def test_the_optimizers_profiler_marker_is_no_op_and_no_recomputation(models):
    # torch.optim's step opens a record_function before its hooks run, still in backward's phase with grad on
    records = _records(models, "fast")
    assert not any(r.op.startswith("profiler.") for r in records)
    assert not any(r.recompute for r in records)  # nothing is checkpointed here


def test_a_slow_forward_is_probed_once(monkeypatch):
    import graphlint.timing.record as record

    calls = []

    def forward():
        calls.append(1)
        until = time.perf_counter() + 0.005
        while time.perf_counter() < until:
            pass
        return torch.empty(2, device="meta").sum()

    assert probe_host(forward) is not None and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(record, "SLOW_PROBE", 0.001)
    names, gaps = probe_host(forward)
    assert len(calls) == 1 and names == ["aten.empty.memory_format", "aten.sum.default"] and gaps[0] >= 0.005
