"""`graphlint time --cpu` times each op call of the step on this CPU (graphlint.timing.replay): every distinct call
once, cached per machine, without touching the target's global state; what it cannot time keeps the roofline's
price; ops a recurrent layer's C++ loop issues pay that loop's fixed cost, not a Python call's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from graphlint.memory.measure import Request
from graphlint.timing.calls import call_of
from graphlint.timing.devices import CpuPeaks
from graphlint.timing.measure import record_step
from graphlint.timing.record import OpRecord, OpRecorder
from graphlint.timing.replay import time_calls, timed_records
from graphlint.timing.roofline import op_seconds, price
from conftest import write

MODELS = """
import torch
from torch import nn


def dropout_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.GELU(), nn.Linear(32, 4))
    return model, (torch.randn(8, 16),)


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

LAUNCH = {"forward": 1e-5, "backward": 2e-5, "optimizer": 3e-5}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("replay"), "replay_models.py", MODELS)


def _records(models: Path, factory: str, calls: bool = True, device: str = "auto") -> list[OpRecord]:
    records, _ = record_step(f"{models}:{factory}", models.parent, Request(train_on="cpu", device=device),
                             calls=calls)
    return records


def _cpu(native: dict | None = None, per_phase: dict | None = None) -> CpuPeaks:
    return CpuPeaks("test cpu", 1, {"float32": [(1e3, 1e9), (1e9, 1e9)]}, [(1e3, 1e9), (1e9, 1e9)], dict(LAUNCH),
                    1e-7, native=native or {}, per_phase=per_phase or {})


def test_each_distinct_call_is_timed_once_then_read_from_the_cache(models, tmp_path):
    records = _records(models, "dropout_mlp")
    calls = [r.call for r in records if r.call is not None]
    assert calls and all(r.call is not None for r in records if r.kind != "view")
    distinct = {call.key for call in calls}
    assert len(distinct) < len(calls)  # the two Linear layers' transposes, AdamW's per-parameter ops...
    first = time_calls(calls, 1, tmp_path)
    assert first.measured == len(distinct) and first.failed == 0 and first.skipped == 0
    assert set(first.seconds) == distinct and all(s > 0 for s in first.seconds.values())
    again = time_calls(calls, 1, tmp_path)
    assert again.measured == 0 and again.seconds == first.seconds and again.floor == first.floor


def test_timing_the_calls_leaves_torchs_global_state_as_it_was(models, tmp_path):
    # the dropout's Bernoulli draw, made again, would consume torch's global generator
    calls = [r.call for r in _records(models, "dropout_mlp") if r.call is not None]
    assert any("bernoulli" in call.key for call in calls)
    torch.manual_seed(1234)
    threads = torch.get_num_threads()
    before = torch.random.get_rng_state()
    time_calls(calls, 1, tmp_path)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.get_num_threads() == threads
    assert torch.is_grad_enabled()
    assert (torch.tensor([1e-39]) * 1.0).item() != 0.0  # denormals are not flushed, as before


def test_a_timed_call_prices_its_op_instead_of_the_roofline(models, tmp_path):
    x = torch.empty(256, 256, device="meta")
    record = OpRecord("aten.exp.default", 0, 256 * 256 * 4, 256 * 256 * 4, "float32", "forward", False, None, None,
                      "memory", call=call_of(torch.ops.aten.exp.default, (x,), {}))
    cpu = _cpu()
    assert op_seconds(record, cpu)[0] == pytest.approx(2 * 256 * 256 * 4 / 1e9 + LAUNCH["forward"])
    assert op_seconds(dataclasses.replace(record, timed=5e-3), cpu)[0] == pytest.approx(5e-3 + LAUNCH["forward"])
    # a step's records get their call's time less the cheapest call's (the fixed cost counts that one)
    records = _records(models, "dropout_mlp")
    timed, times = timed_records(records, 1, tmp_path)
    assert len(timed) == len(records)
    for before, after in zip(records, timed, strict=True):
        if before.call is None:
            assert after is before
        else:
            assert after.timed == pytest.approx(max(times.seconds[before.call.key] - times.floor, 0.0))
    assert price(timed, cpu, "m").seconds != pytest.approx(price(records, cpu, "m").seconds)


def test_a_call_the_cpu_refuses_keeps_the_roofline_and_is_said(tmp_path):
    q = torch.empty(1, 2, 4, 8, device="meta")
    # a CUDA-only kernel: no CPU implementation to time
    refused = call_of(torch.ops.aten._scaled_dot_product_efficient_attention.default, (q, q, q, None, False), {})
    kept = call_of(torch.ops.aten.exp.default, (q,), {})
    times = time_calls([refused, kept], 1, tmp_path)
    assert times.failed == 1 and set(times.seconds) == {kept.key}
    assert any("could not be made again" in note for note in times.notes())
    assert time_calls([refused], 1, tmp_path).failed == 1  # the refusal is cached too


def test_calls_past_the_budget_are_priced_by_the_roofline(models, tmp_path):
    records = _records(models, "dropout_mlp")
    calls = [r.call for r in records if r.call is not None]
    timed, times = timed_records(records, 1, tmp_path, budget=0.0)
    assert times.seconds == {} and times.skipped == len({c.key for c in calls})
    assert any("not timed" in note for note in times.notes())
    assert all(r.timed is None for r in timed)


def test_the_recorder_keeps_calls_only_when_asked(models):
    assert all(r.call is None for r in _records(models, "dropout_mlp", calls=False))


# on meta the step runs the layer's stand-in; on the CPU itself (a model meta cannot run) torch's own loop
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_recurrent_layers_steps_pay_the_native_loops_fixed_cost(models, device):
    records = _records(models, "gru", device=device)
    native = [r for r in records if r.native]
    # the loop's ops forward, and their gradients backward
    assert {r.phase for r in native} == {"forward", "backward"}
    # the head's Linear (a product of the 3-d output) is called from Python, and so is its gradient run
    for phase in ("forward", "backward"):
        assert any(r.kind == "matmul" and not r.native for r in records if r.phase == phase)
    assert not any(r.native for r in _records(models, "dropout_mlp"))
    cpu = _cpu(native={"forward": 2e-6, "backward": 3e-6})
    for phase in ("forward", "backward"):
        step = next(r for r in native if r.kind != "view" and r.phase == phase)
        roofline = op_seconds(dataclasses.replace(step, native=False), cpu)[0]
        assert op_seconds(step, cpu)[0] == pytest.approx(roofline - LAUNCH[phase] + cpu.native[phase])
    # a view inside the loop moves nothing and pays a view's cost, not an op's
    view = next(r for r in native if r.kind == "view")
    assert op_seconds(view, cpu)[0] == cpu.view


def test_each_phase_pays_its_fixed_cost_once_per_step(models):
    records = _records(models, "dropout_mlp", calls=False)
    plain = price(records, _cpu(), "m")
    once = {"forward": 0.0, "backward": 4e-5, "optimizer": 5e-5}
    step = price(records, _cpu(per_phase=once), "m")
    for phase, seconds in once.items():
        assert step.phases[phase] == pytest.approx(plain.phases[phase] + seconds)
    assert step.overhead_seconds == pytest.approx(plain.overhead_seconds + 9e-5)
    assert step.unplaced_seconds == pytest.approx(plain.unplaced_seconds + 9e-5)


def test_a_cache_entry_of_another_shape_is_timed_again(models, tmp_path):
    calls = [r.call for r in _records(models, "dropout_mlp") if r.call is not None]
    first = time_calls(calls, 1, tmp_path)
    [cache] = list(tmp_path.iterdir())
    data = json.loads(cache.read_text())
    spoiled = next(key for key in data if key.startswith("aten."))
    cache.write_text(json.dumps({**data, spoiled: "fast", "floor": -1}))
    again = time_calls(calls, 1, tmp_path)
    assert again.measured == 1 and set(again.seconds) == set(first.seconds)
    assert again.floor > 0 and isinstance(again.seconds[spoiled], float)


def test_the_loops_zero_grad_is_priced_per_parameter_the_optimizer_updates(models):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    with OpRecorder() as recorder:
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    assert recorder.parameters == 4
    records = _records(models, "dropout_mlp", calls=False)
    cpu = dataclasses.replace(_cpu(), zero_grad=2e-6)
    plain, dropped = price(records, cpu, "m"), price(records, cpu, "m", parameters=4)
    assert dropped.phases["optimizer"] == pytest.approx(plain.phases["optimizer"] + 8e-6)
    assert dropped.phases["forward"] == plain.phases["forward"]
    assert dropped.seconds == pytest.approx(plain.seconds + 8e-6)


def test_a_call_whose_tensors_would_pass_the_cap_is_not_made(tmp_path):
    # a product of small arguments whose output would take 2 GiB: priced by the roofline, never allocated
    small = torch.empty(4, 4, device="meta")
    huge = call_of(torch.ops.aten.exp.default, (small,), {}, written=2 << 30)
    times = time_calls([huge], 1, tmp_path)
    assert times.skipped == 1 and times.seconds == {} and times.measured == 0


def test_threads_waiting_for_cores_are_told_from_threads_at_work(monkeypatch):
    import time

    from graphlint.timing import devices

    seen = []

    def one_thread(run, clock, budget, median=False):  # the product's median on one thread, by its CPU time
        seen.append((clock, torch.get_num_threads()))
        return 5e-6

    def on_the_threads(calls):
        def single_calls(run, count):
            seen.append(("single", torch.get_num_threads()))
            return calls[:count]
        return single_calls

    monkeypatch.setattr(devices, "call_seconds", one_thread)
    threads = torch.get_num_threads()
    # two calls a scheduler slice long, as seen with two busy processes on two cores
    monkeypatch.setattr(devices, "_single_calls", on_the_threads([4e-6] * 18 + [8e-3, 8.1e-3]))
    assert devices.stalled_threads(2) == (8.1e-3, 5e-6)
    assert seen == [(time.thread_time, 1), ("single", 2)] and torch.get_num_threads() == threads
    assert devices.stalled_threads(1) is None
    # one preempted call is not a stall; threads at work are no slower than one
    monkeypatch.setattr(devices, "_single_calls", on_the_threads([4e-6] * 19 + [8e-3]))
    assert devices.stalled_threads(2) is None


def test_calls_are_not_timed_or_cached_while_the_threads_wait_for_cores(models, tmp_path, monkeypatch):
    from graphlint.timing import replay

    calls = [r.call for r in _records(models, "dropout_mlp") if r.call is not None]
    known, new = calls[:1], calls[1:]
    monkeypatch.setattr(replay, "_machine_key", lambda threads: "machine")
    monkeypatch.setattr(replay, "stalled_threads", lambda threads: None)
    time_calls(known, 2, tmp_path)  # a time measured before, when the machine was free: still used
    cache = tmp_path / "machine.json"
    before = cache.read_text()
    monkeypatch.setattr(replay, "stalled_threads", lambda threads: (8e-3, 5e-6))
    times = time_calls(calls, 2, tmp_path)
    distinct_new = {call.key for call in new} - {call.key for call in known}
    assert times.measured == 0 and set(times.seconds) == {known[0].key}
    assert times.stalled == (len(distinct_new), 2, 8e-3, 5e-6)
    assert cache.read_text() == before  # nothing the wait measured is kept
    (note,) = times.notes()
    assert "2 threads were waiting for cores (a 64 x 64 matrix product took 8.0 ms on them, 5 us on one)" in note
    assert f"{len(distinct_new)} op call(s) were not timed" in note and "OMP_NUM_THREADS=1" in note


def test_the_cpus_peaks_are_not_cached_when_measured_while_the_threads_wait(tmp_path, monkeypatch):
    from graphlint.timing import devices

    peaks = CpuPeaks("test cpu", 2, {"float32": [(1e3, 1e9), (1e9, 1e9)]}, [(1e3, 1e9), (1e9, 1e9)], dict(LAUNCH),
                     1e-7, native={}, per_phase={}, zero_grad=0.0, host_scale=0.5)
    measured = []
    monkeypatch.setattr(devices, "measure_cpu", lambda threads, label: measured.append(threads) or peaks)
    checks = iter([None, (8e-3, 5e-6)])  # the threads came to wait while the peaks were measured
    monkeypatch.setattr(devices, "stalled_threads", lambda threads: next(checks))
    stalled = devices.cpu_peaks(2, tmp_path)
    assert stalled.stalled == (8e-3, 5e-6) and list(tmp_path.iterdir()) == []
    (note,) = stalled.notes()
    assert "2 threads were waiting for cores while its peaks were measured" in note and "not cached" in note
    monkeypatch.setattr(devices, "stalled_threads", lambda threads: None)
    assert devices.cpu_peaks(2, tmp_path) == peaks and peaks.notes() == []
    assert devices.cpu_peaks(2, tmp_path) == peaks and measured == [2, 2]  # the third from the cache


def test_calls_timed_while_the_threads_came_to_wait_are_dropped(models, tmp_path, monkeypatch):
    from graphlint.timing import replay

    calls = [r.call for r in _records(models, "dropout_mlp") if r.call is not None]
    checks = iter([None, (8e-3, 5e-6)])  # free before the calls, waiting after them
    monkeypatch.setattr(replay, "stalled_threads", lambda threads: next(checks))
    times = time_calls(calls, 2, tmp_path)
    distinct = {call.key for call in calls}
    assert times.seconds == {} and times.measured == 0 and times.stalled == (len(distinct), 2, 8e-3, 5e-6)
    assert list(tmp_path.iterdir()) == []  # nothing cached
