"""`graphlint time`'s counting core: the ops of one training step, their FLOPs (as FlopCounterMode counts them on
the real model), their bytes, phases and source lines, and what they cost on a device."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from graphlint.capture.loss import choose_loss
from graphlint.memory.measure import Request
from graphlint.memory.step import make_optimizer
from graphlint.target import normalize_factory_result
from graphlint.timing.devices import ACCELERATORS, CpuPeaks, accelerator
from graphlint.timing.measure import record_step
from graphlint.timing.record import OpRecord, OpRecorder, flop_counter_mapping
from graphlint.timing.roofline import op_seconds, price
from conftest import run_graphlint, write

MODELS = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))
    return model, (torch.randn(8, 32),)


def conv():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2),
                          nn.Flatten(), nn.LazyLinear(5))
    model(torch.randn(2, 3, 16, 16))
    return model, (torch.randn(2, 3, 16, 16),)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(2, 16, 32))


def attention():
    torch.manual_seed(0)
    return Attention(), (torch.randn(2, 16, 32),)


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(checkpoint(self.inner, x, use_reentrant=False))


def checkpointed():
    torch.manual_seed(0)
    return Checkpointed(), (torch.randn(8, 32),)


class OneMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32))

    def forward(self, x):
        return x @ self.w
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("timing"), "timing_models.py", MODELS)


def _flop_counter(path: Path, factory: str, autocast: torch.dtype | None = None) -> int:
    """FlopCounterMode's total for the same step run for real on CPU (first a step that makes the optimizer's
    state, as graphlint's step does), with the CPU attention kernel under torch's own attention formula."""
    spec = importlib.util.spec_from_file_location(f"timing_real_{factory}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = normalize_factory_result(getattr(module, factory)())
    optimizer = make_optimizer("adamw", [p for p in made.model.parameters() if p.requires_grad], foreach=False)
    with FlopCounterMode(display=False, custom_mapping=flop_counter_mapping()) as counter:
        with torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False):
            loss = choose_loss(made.model(*made.args, **made.kwargs), made.loss)
        loss.backward()
        optimizer.step()
    return counter.get_total_flops()


def _records(path: Path, factory: str, **request) -> list[OpRecord]:
    records, _ = record_step(f"{path}:{factory}", path.parent, Request(train_on="cpu", **request))
    return records


@pytest.mark.parametrize("factory", ["mlp", "conv", "attention", "checkpointed"])
def test_flops_equal_flop_counter_mode_on_the_real_model(models, factory):
    counted = sum(r.flops for r in _records(models, factory))
    assert counted > 0
    assert counted == _flop_counter(models, factory)


def test_flops_under_autocast_equal_flop_counter_mode_under_cpu_autocast(models):
    records = _records(models, "mlp", autocast="bf16")
    assert {r.dtype for r in records if r.kind == "matmul"} == {"bfloat16"}
    assert sum(r.flops for r in records) == _flop_counter(models, "mlp", torch.bfloat16)


def test_attention_is_one_op_each_way(models):
    records = _records(models, "attention")
    fused = [r for r in records if r.kind == "attention"]
    assert [r.phase for r in fused] == ["forward", "backward"]
    # torch's formulas: two products of (2 batches * 4 heads) x 16 x 16 x 8 forward; five backward (the
    # scores again, and the gradients of the probabilities, the values, the queries and the keys)
    product = 2 * (2 * 4) * 16 * 16 * 8
    assert (fused[0].flops, fused[1].flops) == (2 * product, 5 * product)


@pytest.mark.transformers
def test_flops_of_a_transformers_model_equal_flop_counter_mode(tmp_path):
    path = write(tmp_path, "hf.py", """
        import torch
        import transformers


        def gpt2():
            torch.manual_seed(0)
            config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
            model = transformers.GPT2LMHeadModel(config)
            ids = torch.randint(0, 64, (2, 16))
            return model, (), {"input_ids": ids, "labels": ids}
    """)
    counted = sum(r.flops for r in _records(path, "gpt2"))
    assert counted > 0 and counted == _flop_counter(path, "gpt2")


def test_checkpointed_forward_is_recomputed_in_backward_at_its_line(models):
    records = _records(models, "checkpointed")
    recomputed = [r for r in records if r.recompute]
    forward_products = [r for r in records if r.phase == "forward" and r.kind == "matmul"]
    assert all(r.phase == "backward" for r in recomputed)
    # the block runs again up to the last tensor backward needs (torch stops a recomputation there): its first
    # product and the ReLU, not its second product, nor the head's
    assert [r.flops for r in recomputed if r.flops] == [forward_products[0].flops]
    assert {r.op for r in recomputed if r.kind != "view"} == {"aten.addmm.default", "aten.relu.default"}


def test_phases_split_the_step(models):
    records = _records(models, "mlp")
    phases = [r.phase for r in records]
    # forward, then backward, then the optimizer, each once and in that order
    assert sorted(set(phases), key=phases.index) == ["forward", "backward", "optimizer"]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    forward_flops = sum(r.flops for r in records if r.phase == "forward")
    backward_flops = sum(r.flops for r in records if r.phase == "backward")
    assert backward_flops == 2 * forward_flops - 2 * 8 * 32 * 64  # no gradient for the input itself
    assert all(r.flops == 0 and r.file is None for r in records if r.phase == "optimizer")


def test_backward_ops_are_placed_at_their_forward_line(tmp_path):
    path = write(tmp_path, "lines.py", """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(16, 8))

            def forward(self, x):
                y = x @ self.w
                return y.relu()


        def net():
            return Net(), (torch.randn(4, 16),)
    """)
    records = _records(path, "net")
    products = [r for r in records if r.kind == "matmul"]
    assert {(r.phase, r.line) for r in products} == {("forward", 11), ("backward", 11)}
    assert {r.line for r in records if r.op.startswith("aten.threshold_backward")} == {12}


def test_bytes_of_one_matmul_and_one_add_by_hand():
    a, b = torch.randn(8, 32), torch.randn(32, 64)
    with OpRecorder() as recorder:
        torch.mm(a, b)
        torch.add(a, a)
        a.t()
        c = torch.empty(8, 64)
        c.copy_(torch.mm(a, b))
    mm, add, view, empty, mm2, copy = recorder.records
    assert (mm.flops, mm.read, mm.written, mm.kind) == (2 * 8 * 32 * 64, 4 * (8 * 32 + 32 * 64), 4 * 8 * 64, "matmul")
    assert (add.flops, add.read, add.written, add.kind) == (0, 4 * 8 * 32, 4 * 8 * 32, "memory")  # a read once
    assert (view.read, view.written, view.kind) == (0, 0, "view")
    assert (empty.read, empty.written) == (0, 0)
    assert (copy.read, copy.written) == (4 * 8 * 64, 4 * 8 * 64)  # the destination is written, not read


def test_an_expanded_input_is_read_once():
    x = torch.randn(64, 1)
    with OpRecorder() as recorder:
        torch.add(x.expand(64, 128), 1.0)
    [expand, add] = recorder.records
    assert add.read == 64 * 4 and add.written == 64 * 128 * 4


def test_the_roofline_takes_the_larger_of_compute_and_transfer():
    h100 = accelerator("H100")
    big = OpRecord("aten.mm.default", 2 * 4096**3, 3 * 4096 * 4096 * 2, 0, "bfloat16", "forward", False, None, None,
                   "matmul")
    seconds, memory_bound = op_seconds(big, h100)
    assert not memory_bound
    assert seconds == pytest.approx(big.flops / (989.4e12 * 0.70) + 5e-6)
    add = OpRecord("aten.add.Tensor", 0, 2 << 30, 1 << 30, "float32", "forward", False, None, None, "memory")
    seconds, memory_bound = op_seconds(add, h100)
    assert memory_bound and seconds == pytest.approx((3 << 30) / (3.35e12 * 0.8) + 5e-6)


def test_a_cpu_reads_its_measured_curves_at_the_op_size():
    launch = {"forward": 1e-6, "backward": 2e-6, "optimizer": 3e-6}
    cpu = CpuPeaks("test cpu", 1, {"float32": [(1e3, 1e9), (1e9, 100e9)]}, [(1e3, 10e9), (1e9, 20e9)], launch, 5e-7)
    small = OpRecord("aten.mm.default", 1000, 10, 0, "float32", "forward", False, None, None, "matmul")
    large = OpRecord("aten.mm.default", 10**9, 10, 0, "float32", "backward", False, None, None, "matmul")
    assert op_seconds(small, cpu)[0] == pytest.approx(1000 / 1e9 + 1e-6)
    assert op_seconds(large, cpu)[0] == pytest.approx(10**9 / 100e9 + 2e-6)
    middle = OpRecord("aten.add.Tensor", 0, 10**6, 0, "float32", "optimizer", False, None, None, "memory")
    # 10**6 bytes is half-way between 10**3 and 10**9 in log scale: 15 GB/s
    assert op_seconds(middle, cpu) == (pytest.approx(10**6 / 15e9 + 3e-6), True)
    view = OpRecord("aten.t.default", 0, 0, 0, "float32", "forward", False, None, None, "view")
    assert op_seconds(view, cpu)[0] == 5e-7


def test_a_step_is_priced_per_phase_and_per_line(models):
    records = _records(models, "mlp")
    step = price(records, ACCELERATORS["a100"], "mlp")
    assert step.seconds == pytest.approx(sum(step.phases.values()))
    assert step.flops == sum(r.flops for r in records)
    assert step.seconds == pytest.approx(sum(line.seconds for line in step.lines) + step.unplaced_seconds)
    assert 0 < step.mfu < 1 and step.mfu_peak == 19.5e12
    assert 0 <= step.memory_bound_share <= 1
    assert step.lines == sorted(step.lines, key=lambda line: -line.seconds)


def test_every_accelerator_names_its_source_and_has_the_dtypes():
    for device in ACCELERATORS.values():
        assert device.source and device.bandwidth > 0
        assert {"fp32", "tf32", "bf16", "fp16"} <= set(device.peaks)
    assert accelerator("h100-sxm") is ACCELERATORS["h100"] and accelerator("nope") is None


@pytest.mark.cli
def test_the_command_reports_flops_and_seconds_on_a_named_gpu(models, tmp_path):
    done = run_graphlint("time", f"{models}:attention", "--gpu", "H100", "--format", "json", "--no-cache",
                         cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [step] = report["targets"]
    records, _ = record_step(f"{models}:attention", models.parent, Request())
    assert report["flops"] == step["flops"] == sum(r.flops for r in records) > 0
    assert report["seconds"] == step["seconds"] == pytest.approx(price(records, accelerator("h100")).seconds)
    assert step["device"] == "NVIDIA H100 SXM5 80GB" and "datasheet" in step["device_source"]
    assert sum(phase["seconds"] for phase in step["phases"].values()) == pytest.approx(step["seconds"])
    assert step["lines"][0]["file"] == str(models) and 0 < step["mfu"] < 1
    text = run_graphlint("time", f"{models}:attention", "--gpu", "h100", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "per training step on NVIDIA H100 SXM5 80GB" in text.stdout
    assert "forward" in text.stdout and "backward" in text.stdout and "optimizer" in text.stdout
    assert "implied MFU" in text.stdout and "memory-bound ops take" in text.stdout
    assert "y = F.scaled_dot_product_attention(q" in text.stdout  # a line that takes time, its code cut short


@pytest.mark.cli
def test_the_command_prices_this_cpu_after_measuring_it_once(models, tmp_path):
    cache = tmp_path / "cache"
    # One thread: with more, a busy machine's waiting threads would (rightly) leave nothing cached
    # (test_timing_replay checks that with stand-in waits).
    first = run_graphlint("time", f"{models}:mlp", "--cpu", "--format", "json", "--no-cache",
                          cwd=tmp_path, env={"XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr
    [measured] = list((cache / "graphlint" / "cpu-peaks").iterdir())
    peaks = json.loads(measured.read_text())
    assert set(peaks["matmul"]) == {"float32", "bfloat16", "float16"}
    assert set(peaks["launch"]) == {"forward", "backward", "optimizer"} and all(peaks["launch"].values())
    assert set(peaks["per_phase"]) == {"forward", "backward", "optimizer"}
    assert set(peaks["native"]) == {"forward", "backward"} and all(peaks["native"].values())
    assert peaks["zero_grad"] > 0
    [step] = json.loads(first.stdout)["targets"]
    assert step["train_on"] == "cpu" and step["seconds"] > 0 and "measured on this machine" in step["device_source"]
    assert re.search(r"; \d+ distinct op calls timed on it$", step["device_source"])
    # each op call of the step timed on this CPU, kept for the next run (graphlint.timing.replay)
    [timed] = list((cache / "graphlint" / "op-times").iterdir())
    assert any(key.startswith("aten.addmm.default|") for key in json.loads(timed.read_text()))


@pytest.mark.cli
@pytest.mark.parametrize("options, says", [
    (["--gpu", "H900"], "unknown GPU 'H900'; the known ones are h100, h200, a100, l4, rtx4090, mi300x"),
    ([], "name the device to price the step on: --gpu NAME"),
    (["--gpu", "h100", "--cpu"], "pass one of them"),
    (["--gpu", "h100", "--batch", "0"], "--batch must be a whole number of 1 or more"),
    (["--gpu", "h100", "--optimizer", "lion"], "unknown optimizer 'lion'"),
])
def test_bad_input_is_one_line_and_exit_2(models, tmp_path, options, says):
    done = run_graphlint("time", f"{models}:mlp", *options, cwd=tmp_path)
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1 and not done.stdout


@pytest.mark.cli
def test_a_target_that_fails_is_one_line_and_exit_2(tmp_path):
    write(tmp_path, "broken.py", """
        import torch
        from torch import nn


        def make():
            return nn.Linear(4, 4), (torch.randn(2, 5),)
    """)
    done = run_graphlint("time", "broken.py:make", "--gpu", "a100", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "broken.py:make" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_an_op_that_decomposes_is_counted_by_its_parts_and_keeps_the_earlier_ops(tmp_path):
    # silu_backward has a composite implementation: FlopCounterMode (and the recorder) run its parts
    path = write(tmp_path, "silu.py", """
        import torch
        import torch.nn.functional as F
        from torch import nn


        def silu():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 4))
            return model, (torch.randn(2, 8),)
    """)
    records = _records(path, "silu")
    assert [r.op for r in records if r.phase == "forward" and r.kind == "matmul"] == ["aten.addmm.default"] * 2
    assert "aten.silu_backward.default" not in {r.op for r in records}
    assert sum(r.flops for r in records) == _flop_counter(path, "silu")


@pytest.mark.cli
def test_the_answer_is_cached_under_every_option(models, tmp_path):
    cache = ["--cache-dir", str(tmp_path / "cache"), "--format", "json"]
    first = run_graphlint("time", f"{models}:mlp", "--gpu", "h100", *cache, cwd=tmp_path)
    again = run_graphlint("time", f"{models}:mlp", "--gpu", "h100", *cache, cwd=tmp_path)
    other = run_graphlint("time", f"{models}:mlp", "--gpu", "l4", *cache, cwd=tmp_path)
    bigger = run_graphlint("time", f"{models}:mlp", "--gpu", "h100", "--batch", "64", *cache, cwd=tmp_path)
    assert all(done.returncode == 0 for done in (first, again, other, bigger)), other.stderr
    assert again.stdout == first.stdout
    assert json.loads(other.stdout)["targets"][0]["device"] == "NVIDIA L4 24GB"
    assert json.loads(bigger.stdout)["flops"] == 8 * json.loads(first.stdout)["flops"]


def test_an_lstm_layer_is_priced_by_its_gate_products_counted_by_hand():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(24, 32, batch_first=True)
    x = torch.randn(5, 7, 24, requires_grad=True)  # batch 5, 7 steps
    with OpRecorder() as recorder:
        lstm(x)[0].sum().backward()
    layers = [r for r in recorder.records if r.work_flops]
    # every token (5 x 7) meets both gate matrices, 4 gates x 32 rows of width 24 and 32, one multiply-add each;
    # the backward twice that (the inputs' gradient and the weights')
    forward = 2 * 5 * 7 * (4 * 32 * 24 + 4 * 32 * 32)
    assert [(r.phase, r.flops, r.work_flops, r.kind) for r in layers] == [
        ("forward", 0, forward, "matmul"), ("backward", 0, 2 * forward, "matmul")]
    assert all(r.work_grain == 2 * 5 * 4 * 32 * 32 for r in layers)  # one step's hidden product: the batch's 5 rows
    cpu = CpuPeaks("test cpu", 1, {"float32": [(1e3, 1e9), (1e9, 1e9)]}, [(1e3, 1e12), (1e9, 1e12)],
                   dict.fromkeys(("forward", "backward", "optimizer"), 0.0), 0.0)
    assert op_seconds(layers[0], cpu)[0] == pytest.approx(forward / 1e9)
    assert op_seconds(layers[0], ACCELERATORS["a100"])[0] > 5e-6  # more than its launch


def test_a_cpu_prices_convolutions_and_attention_from_their_own_curves_by_direction():
    flat = [(1e3, 100e9), (1e12, 100e9)]
    cpu = CpuPeaks("test cpu", 1, {"float32": flat, "bfloat16": [(1e3, 200e9), (1e12, 200e9)]}, [(1e3, 1e15)],
                   dict.fromkeys(("forward", "backward", "optimizer"), 0.0), 0.0,
                   conv={"forward": [(1e3, 50e9), (1e12, 50e9)], "backward": [(1e3, 25e9), (1e12, 25e9)]},
                   attention={"forward": [(1e3, 20e9), (1e12, 20e9)], "backward": [(1e3, 10e9), (1e12, 10e9)]})

    def op(name, kind, dtype="float32"):
        return OpRecord(name, 10**9, 8, 0, dtype, "forward", False, None, None, kind)

    assert op_seconds(op("aten.mm.default", "matmul"), cpu)[0] == pytest.approx(1e9 / 100e9)
    assert op_seconds(op("aten.convolution.default", "conv"), cpu)[0] == pytest.approx(1e9 / 50e9)
    assert op_seconds(op("aten.convolution_backward.default", "conv"), cpu)[0] == pytest.approx(1e9 / 25e9)
    # a bfloat16 convolution: the convolutions' curve scaled as bfloat16's products are against float32's
    assert op_seconds(op("aten.convolution.default", "conv", "bfloat16"), cpu)[0] == pytest.approx(1e9 / 100e9)
    backward = op("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "attention")
    assert op_seconds(backward, cpu)[0] == pytest.approx(1e9 / 10e9)
    lstm = OpRecord("aten.mkldnn_rnn_layer_backward.default", 0, 8, 0, "float32", "backward", False, None, None,
                    "matmul", 10**9, 10**6)
    cpu.recurrent["backward"] = [(1e3, 5e9), (1e12, 5e9)]
    assert op_seconds(lstm, cpu)[0] == pytest.approx(1e9 / 5e9)  # its work, at the recurrent layers' rate
