"""`graphlint memory`: the peak of one training step, what it is made of, and its command line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graphlint.errors import TargetFailure
from graphlint.memory.estimate import estimate
from graphlint.memory.measure import Request, measure
from graphlint.sizes import format_bytes, parse_bytes
from graphlint.memory.step import run_step
from conftest import WITHOUT_COMPILE, run_graphlint, write


def _estimate(model, *args, optimizer="adamw", loss=None, train_on="cuda"):
    with torch.device("meta"):
        return estimate(run_step(model, args, {}, loss, Request(optimizer=optimizer, train_on=train_on)))


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def test_adam_keeps_two_moments_and_sgd_with_momentum_one():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8))
        x = torch.randn(4, 256)
    size = _param_bytes(model)
    assert _estimate(model, x, optimizer="adamw").optimizer_state_bytes == 2 * size
    assert _estimate(model, x, optimizer="adam").optimizer_state_bytes == 2 * size
    assert _estimate(model, x, optimizer="sgd-momentum").optimizer_state_bytes == size
    assert _estimate(model, x, optimizer="sgd").optimizer_state_bytes == 0
    without = _estimate(model, x, optimizer="none")
    assert without.optimizer_state_bytes == 0 and without.gradient_bytes == size


def test_frozen_parameters_get_no_gradient_and_no_state():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8))
        x = torch.randn(4, 256)
    model[0].requires_grad_(False)
    result = _estimate(model, x)
    assert result.gradient_bytes == _param_bytes(model)
    assert result.optimizer_state_bytes == 2 * _param_bytes(model)


def test_a_model_of_large_weights_and_small_inputs_peaks_in_the_optimizer_step():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
        x = torch.randn(2, 2048)
    result = _estimate(model, x)
    size = _param_bytes(model)
    assert result.peak_phase == "optimizer step"
    # Parameters, gradients, both moments and foreach Adam's square roots of the second moments, all at once.
    assert result.at_peak["parameter"] == size and result.at_peak["gradient"] == size
    assert result.at_peak["optimizer state"] == 2 * size
    assert result.at_peak["temporary"] >= size
    assert result.peak_bytes >= 5 * size


def test_the_cpu_optimizer_loops_over_parameters_and_keeps_one_temporary_at_a_time():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
        x = torch.randn(2, 2048)
    on_cuda, on_cpu = _estimate(model, x), _estimate(model, x, train_on="cpu")
    assert on_cpu.peak_bytes < on_cuda.peak_bytes


def test_a_model_of_large_activations_peaks_in_backward():
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(8)))
        x = torch.randn(8192, 64)
    result = _estimate(model, x, optimizer="sgd")
    assert result.peak_phase == "backward"
    assert result.at_peak["activation"] > result.at_peak["parameter"]
    # Each block keeps its Linear's input and its GELU's input: 2 tensors of 8192×64 float32.
    assert result.activation_bytes >= 8 * 2 * 8192 * 64 * 4


def test_repeated_blocks_fold_into_one_line_with_their_count():
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(6)))
        x = torch.randn(32, 64)
    lines = {line.path: line for line in _estimate(model, x).saved_by_module}
    assert lines["*"].count == 6
    assert "*.0" in lines and "*.1" in lines  # a Linear and a GELU: different classes, not folded
    assert lines["*"].bytes == sum(line.bytes for path, line in lines.items() if path in ("*.0", "*.1"))


class Attention(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(64, 192)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(16)
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            out = scores.softmax(-1) @ v
        return out.transpose(1, 2).reshape(b, t, 64)


def test_fused_attention_keeps_no_scores_on_meta_and_hand_written_attention_does():
    def scores_kept(fused: bool) -> int:
        with torch.device("meta"):
            model = Attention(fused)
            x = torch.randn(2, 256, 64)
            trace = run_step(model, (x,), {}, None, Request(optimizer="sgd"))
        return sum(b.nbytes for b in trace.blocks if b.kind == "activation" and b.shape[-2:] == (256, 256))

    assert scores_kept(fused=False) >= 2 * 4 * 256 * 256 * 4  # the probabilities, at least
    assert scores_kept(fused=True) == 0


def test_sizes_parse_as_people_write_them():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("24G") == 24 * 2**30
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("1.5 TiB") == int(1.5 * 2**40)
    assert parse_bytes("4096") == 4096
    for bad in ("", "GiB", "-3GiB", "12XB", "0"):
        assert parse_bytes(bad) is None
    assert format_bytes(1.5 * 2**30) == "1.5 GiB"


MODEL = """
    import torch
    from torch import nn
    import torch.nn.functional as F


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            return F.gelu(self.fc(x))


    def make():
        model = nn.Sequential(nn.Embedding(100, 64), *(Block() for _ in range(3)), nn.Linear(64, 100))
        return model, (torch.randint(0, 100, (8, 32)),)


    def images():
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10))
        return model, (torch.randn(2, 3, 8, 8),)
"""


def test_the_largest_batch_that_fits_is_the_largest_whose_step_fits(tmp_path):
    path = write(tmp_path, "net.py", MODEL)
    budget = measure(f"{path}:make", tmp_path, Request(batch=40)).peak_bytes
    found = measure(f"{path}:make", tmp_path, Request(device_memory=budget))
    assert found.largest_batch == 40
    assert measure(f"{path}:make", tmp_path, Request(batch=41)).peak_bytes > budget


BRANCHY = """
import torch
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x) if x.sum() > 0 else -self.a(x)


def make():
    return Branchy(), (torch.randn(2, 8),)
"""


def test_the_step_follows_the_build_policy_of_the_capture(tmp_path):
    # Meta cannot branch on a value: on its own the step runs on CPU and says why; forced onto meta, the
    # failure is the target's, said as the capture says it, never graphlint's internal error.
    path = write(tmp_path, "branchy.py", BRANCHY)
    result = measure(f"{path}:make", tmp_path, Request())
    assert result.peak_bytes > 0
    assert result.notes and result.notes[0].startswith("measured on CPU because the step failed on the meta device")
    with pytest.raises(TargetFailure, match=r"cannot measure on the meta device: .*; use --device auto"):
        measure(f"{path}:make", tmp_path, Request(device="meta"))


def test_batch_and_seq_resize_the_inputs(tmp_path):
    path = write(tmp_path, "net.py", MODEL)
    small = measure(f"{path}:make", tmp_path, Request())
    longer = measure(f"{path}:make", tmp_path, Request(batch=16, seq=64))
    assert (small.batch, small.seq, longer.batch, longer.seq) == (8, 32, 16, 64)
    assert longer.activation_bytes == pytest.approx(4 * small.activation_bytes, rel=0.01)


def test_memory_reports_name_the_target_its_peak_the_breakdown_the_loop_assumed_and_whether_it_fits(tmp_path):
    path = write(tmp_path, "net.py", MODEL)
    # The JSON report names the target, the optimizer, the peak and its breakdown, and says the loop keeps the output.
    held = run_graphlint("memory", f"{path}:make", "--format", "json", "--optimizer", "sgd-momentum", cwd=tmp_path)
    assert held.returncode == 0, held.stderr
    [one] = json.loads(held.stdout)
    assert one["target"] == f"{path}:make"
    assert one["optimizer"] == "sgd-momentum"
    assert one["peak_bytes"] == sum(one["at_peak"].values())
    assert one["optimizer_state_bytes"] == one["parameter_bytes"] == one["gradient_bytes"]
    modules = {line["module"]: line for line in one["activations_by_module"]}
    assert modules["*"]["count"] == 3  # the three Blocks of the Sequential, not its Embedding or its Linear
    assert "0" in modules and "4" in modules
    # --release-output: the report says which loop it assumed, and the peak is no higher.
    released = run_graphlint("memory", f"{path}:make", "--format", "json", "--optimizer", "sgd-momentum",
                             "--release-output", cwd=tmp_path)
    assert released.returncode == 0, released.stderr
    [held], [released] = json.loads(held.stdout), json.loads(released.stdout)
    assert held["output_held"] is True and released["output_held"] is False
    assert released["peak_bytes"] <= held["peak_bytes"]
    # The text says the loop it assumed, where the peak falls and whether it fits (exit 1 when it does not).
    text = run_graphlint("memory", f"{path}:make", "--release-output", "--device-memory", "1KiB", cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    assert "keeps only the loss" in text.stdout
    assert "peak" in text.stdout and "does not fit in 1 KiB" in text.stdout
    assert "the largest batch that fits: 0" in text.stdout


@pytest.mark.parametrize("options, message", [
    (["--optimizer", "lion"], "unknown optimizer 'lion'"),
    (["--batch", "many"], "--batch must be a whole number"),
    (["--device-memory", "lots"], "is not a size"),
])
def test_bad_memory_options_are_one_line_and_exit_2(tmp_path, options, message):
    path = write(tmp_path, "net.py", MODEL)
    result = run_graphlint("memory", f"{path}:make", *options, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_seq_on_a_model_of_images_is_one_line_and_exit_2(tmp_path):
    path = write(tmp_path, "net.py", MODEL)
    result = run_graphlint("memory", f"{path}:images", "--seq", "128", cwd=tmp_path)
    assert result.returncode == 2
    assert "--seq does not apply" in result.stderr and len(result.stderr.strip().splitlines()) == 1


BUDGET_MODEL = """
    import torch
    from torch import nn


    def make():
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)))
        return model, (torch.randn(1024, 64),)
"""


def test_the_memory_budget_is_read_from_pyproject_as_a_size(tmp_path):
    from graphlint.config import read_config
    from graphlint.errors import UsageError

    assert read_config(write(tmp_path, "pyproject.toml", '[tool.graphlint]\nmemory-budget = "24GiB"\n')) \
        .memory_budget == 24 * 2**30
    with pytest.raises(UsageError, match='memory-budget must be a size like "24GiB"'):
        read_config(write(tmp_path, "pyproject.toml", '[tool.graphlint]\nmemory-budget = "huge"\n'))


def test_gl401_fails_a_step_above_the_budget_in_sarif_and_names_the_savings(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.graphlint]\nmemory-budget = "1MiB"\n')
    write(tmp_path, "net.py", BUDGET_MODEL)
    result = run_graphlint("check", *WITHOUT_COMPILE, "--no-cache", "net.py:make", "--format", "sarif", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [found] = json.loads(result.stdout)["runs"][0]["results"]
    assert found["ruleId"] == "GL401"
    assert found["locations"][0]["physicalLocation"]["region"]["startLine"] == 5  # def make():
    message = found["message"]["text"]
    assert "above the memory budget of 1 MiB" in message
    assert "checkpointing the 4 blocks 0…3" in message and "batch" in message
    # The command line's budget wins over the file's: 64 MiB holds this step.
    roomy = run_graphlint("check", *WITHOUT_COMPILE, "--no-cache", "net.py:make", "--memory-budget", "64MiB", "--format", "json",
                          cwd=tmp_path)
    assert roomy.returncode == 0, roomy.stdout + roomy.stderr


def test_a_budget_that_does_not_parse_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    write(tmp_path, "net.py", BUDGET_MODEL)
    result = run_graphlint("check", "net.py:make", "--memory-budget", "lots", cwd=tmp_path)
    assert result.returncode == 2
    assert "--memory-budget must be a size" in result.stderr and len(result.stderr.strip().splitlines()) == 1


ATTENTION = """
    import math

    import torch
    from torch import nn


    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(128, 384)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 16, 8).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 128)


    def make():
        return Attention(), (torch.randn(8, 2048, 128),)
"""


def test_a_gl101_finding_carries_what_its_fix_saves_in_json_sarif_and_its_message(tmp_path):
    write(tmp_path, "net.py", ATTENTION)
    result = run_graphlint("check", "--no-cache", "net.py:make", "--select", "GL101", "--format", "json",
                           "--report", f"sarif={tmp_path / 'out.sarif'}", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)["findings"]
    # The probabilities (8 × 16 heads × 2048 × 2048 float32, kept by the softmax and by the product with the
    # values, one storage) and the causal mask (2048 × 2048 bool, kept by masked_fill).
    expected = 8 * 16 * 2048 * 2048 * 4 + 2048 * 2048
    assert finding["saves_bytes"] == expected
    assert "The fix keeps 2 GiB less for backward" in finding["message"]
    [sarif] = json.loads((tmp_path / "out.sarif").read_text())["runs"][0]["results"]
    assert sarif["properties"]["savesBytes"] == expected


HAND_WRITTEN = """
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(256))
            self.bias = nn.Parameter(torch.zeros(256))
            self.inp = nn.Linear(256, 256)
            self.fc = nn.Linear(256, 256)

        def forward(self, x):
            x = self.inp(x)  # the norm reads a tensor that requires grad, as inside a model
            mean = x.mean(-1, keepdim=True)
            var = (x - mean).pow(2).mean(-1, keepdim=True)
            x = (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias
            h = self.fc(x)
            return h * torch.sigmoid(h)


    def make():
        return Block(), (torch.randn(64, 1024, 256),)
"""


def test_gl106_and_gl107_findings_carry_the_intermediates_their_fix_does_not_keep(tmp_path):
    write(tmp_path, "net.py", HAND_WRITTEN)
    result = run_graphlint("check", "--no-cache", "net.py:make", "--select", "GL106,GL107", "--format", "json",
                           cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    found = {f["rule"]: f for f in json.loads(result.stdout)["findings"]}
    size = 64 * 1024 * 256 * 4
    # SiLU by hand keeps h and sigmoid(h); F.silu keeps h alone.
    assert found["GL107"]["saves_bytes"] == size
    # LayerNorm by hand keeps x - mean and the normalised x (and per-row statistics); F.layer_norm keeps x.
    assert size <= found["GL106"]["saves_bytes"] <= 1.1 * size


def test_autocast_keeps_the_activations_of_matmuls_in_the_lower_precision():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.LayerNorm(512))
        x = torch.randn(256, 512)
        full = estimate(run_step(model, (x,), {}, None, Request(optimizer="adamw")))
        mixed = estimate(run_step(model, (x,), {}, None, Request(optimizer="adamw", autocast="bf16")))
    assert set(mixed.saved_by_dtype) >= {"bfloat16", "float32"}
    # The GELU's input and output are kept in bfloat16, and so are the bfloat16 copies of x and of the second
    # weight, which the Linears keep for backward (autocast's weight copies are activations, not parameters;
    # the first weight's copy is not kept, since x needs no gradient); only the LayerNorm, which autocast
    # runs in float32, keeps float32 tensors.
    assert mixed.saved_by_dtype["bfloat16"] == 2 * 256 * 2048 * 2 + 2048 * 512 * 2 + 256 * 512 * 2
    assert mixed.saved_by_dtype["float32"] < 0.3 * full.activation_bytes
    assert mixed.parameter_bytes == full.parameter_bytes and mixed.optimizer_state_bytes == full.optimizer_state_bytes


CAST_IN_LOOP = """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(512, 512))

        def forward(self, x):
            for _ in range(4):
                x = x @ self.w.to(torch.bfloat16)
            return x


    def make():
        return Net(), (torch.randn(64, 512, dtype=torch.bfloat16),)
"""


def test_a_gl102_finding_carries_the_copies_backward_keeps_of_a_cast_made_on_every_pass(tmp_path):
    write(tmp_path, "net.py", CAST_IN_LOOP)
    result = run_graphlint("check", "--no-cache", "net.py:make", "--select", "GL102", "--format", "json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)["findings"]
    # Passes 2 to 4 keep their own bfloat16 copy of w for backward (the first pass's input needs no gradient,
    # so its matmul keeps no copy); converted once before the loop, one copy would be kept.
    assert finding["saves_bytes"] == 2 * 512 * 512 * 2


LABELS_IN_A_CLOSURE = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    import graphlint

    LABELS = torch.randint(0, 4, (8,))


    def make(batch=8):
        labels = torch.randint(0, 4, (batch,))
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        return graphlint.Target(model, (torch.randn(batch, 16),), loss=lambda out: F.cross_entropy(out, labels))


    def global_labels():
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        return graphlint.Target(model, (torch.randn(8, 16),), loss=lambda out: F.cross_entropy(out, LABELS))
"""


def test_labels_a_loss_function_closes_over_grow_with_the_batch_as_the_inputs_do(tmp_path):
    from graphlint.target import target_text

    path = write(tmp_path, "net.py", LABELS_IN_A_CLOSURE)
    grown = measure(f"{path}:make", tmp_path, Request(batch=32))
    built = measure(target_text(f"{path}:make", kwargs={"batch": 32}), tmp_path, Request())
    assert grown.batch == built.batch == 32 and grown.peak_bytes == built.peak_bytes
    budget = measure(target_text(f"{path}:make", kwargs={"batch": 40}), tmp_path, Request()).peak_bytes
    assert measure(f"{path}:make", tmp_path, Request(device_memory=budget)).largest_batch == 40


def test_the_closure_keeps_its_own_labels_after_the_step():
    from graphlint.memory.measure import _closure_resized

    labels = torch.arange(8)

    def loss(out):
        return F.cross_entropy(out, labels)

    with _closure_resized(loss, {"batch": 8}, {"batch": 20}):
        assert loss.__closure__[0].cell_contents.shape == (20,)
        assert loss.__closure__[0].cell_contents[8:16].tolist() == list(range(8))
    assert loss.__closure__[0].cell_contents is labels


@pytest.mark.cli
def test_labels_held_where_the_batch_search_cannot_grow_them_are_the_targets_error(tmp_path):
    write(tmp_path, "net.py", LABELS_IN_A_CLOSURE)
    # The batch search grows labels the loss closes over (`make`), in the same run as the one it cannot grow.
    grows = run_graphlint("memory", "net.py:make", "net.py:global_labels", "--device-memory", "64MiB", "--format",
                          "json", cwd=tmp_path)
    [measured] = json.loads(grows.stdout)
    assert measured["target"] == "net.py:make" and measured["largest_batch"] > 8
    for fails in (grows, run_graphlint("memory", "net.py:global_labels", "--batch", "32", cwd=tmp_path)):
        assert fails.returncode == 2, fails.stderr
        assert "internal error" not in fails.stderr and "Traceback" not in fails.stderr
        assert "Expected input batch_size" in fails.stderr and "labels kept elsewhere" in fails.stderr
        assert "pass them among the factory's inputs" in fails.stderr
        assert len(fails.stderr.strip().splitlines()) == 1


ATTENTION_OVER_BUDGET = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 4, 8)).permute(2, 0, 3, 1, 4)
        return (q @ k.transpose(-2, -1) * 8 ** -0.5).softmax(dim=-1) @ v


def make():
    return Attention(), (torch.randn(4, 256, 32),)
"""


def test_gl401_lists_what_fixing_the_other_findings_would_keep_less(tmp_path):
    from conftest import lint_file

    path = write(tmp_path, "attn.py", ATTENTION_OVER_BUDGET)
    report = lint_file(path, memory_budget=2**20)
    [attention] = [f for f in report.findings if f.rule_id == "GL101"]
    [budget] = [f for f in report.findings if f.rule_id == "GL401"]
    assert attention.saves_bytes > 0
    # the same bytes the GL101 finding carries, named in the budget's list of savings
    assert f"fixing GL101 (1 finding) would keep about {format_bytes(attention.saves_bytes)} less" in budget.message
    alone = lint_file(path, memory_budget=2**20, select=("GL401",))
    assert "fixing GL101" not in alone.findings[0].message  # a rule left out saves nothing the report shows


BATCH_SHAPED = """
    import torch
    from torch import nn
    import torch.nn.functional as F
    import graphlint


    class Contrastive(nn.Module):
        def __init__(self):
            super().__init__()
            self.images, self.texts = nn.Linear(64, 32), nn.Linear(64, 32)

        def forward(self, images, texts):
            return self.images(images) @ self.texts(texts).T  # every image against every text: batch x batch


    def contrastive():
        def loss(logits):
            return F.cross_entropy(logits, torch.arange(logits.shape[0], device=logits.device))

        return graphlint.Target(Contrastive(), (torch.randn(8, 64), torch.randn(8, 64)), loss=loss)


    class OnePairAtLeast(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            if x.shape[0] == 1:  # a batch of one takes another path
                x = torch.cat([x, x])
            return self.fc(x)


    def one_pair_at_least():
        return OnePairAtLeast(), (torch.randn(1, 64),)
"""


def _largest_by_running_each_batch(target, tmp_path, budget):
    fits = [measure(target, tmp_path, Request(batch=b)).peak_bytes <= budget for b in range(1, 400)]
    return fits.index(False)  # the batches that fit come first


def _search_recorded(monkeypatch) -> list[int]:
    """The batches the largest-batch search steps at, in order, as it runs them."""
    from graphlint.memory import measure as measuring

    searched: list[int] = []
    search = measuring._search_trace
    monkeypatch.setattr(measuring, "_search_trace", lambda *args: searched.append(args[3]["batch"]) or search(*args))
    return searched


def test_a_step_whose_memory_is_not_a_line_in_the_batch_is_searched_by_running_it(tmp_path, monkeypatch):
    path = write(tmp_path, "net.py", BATCH_SHAPED)
    target = f"{path}:contrastive"
    budget = measure(target, tmp_path, Request(batch=300)).peak_bytes
    searched = _search_recorded(monkeypatch)
    found = measure(target, tmp_path, Request(device_memory=budget))
    assert "not linear in the batch" in " ".join(found.notes)
    assert searched[:3] == [2, 3, 4] and len(searched) > 3  # the three steps disagree, then each size is run
    assert found.largest_batch == _largest_by_running_each_batch(target, tmp_path, budget) == 300


def test_a_targets_own_step_that_takes_another_path_is_not_one_of_the_three_batches(tmp_path, monkeypatch):
    path = write(tmp_path, "net.py", BATCH_SHAPED)
    target = f"{path}:one_pair_at_least"
    budget = measure(target, tmp_path, Request(batch=200)).peak_bytes
    searched = _search_recorded(monkeypatch)
    found = measure(target, tmp_path, Request(device_memory=budget))
    assert found.batch == 1 and not any("not linear in the batch" in note for note in found.notes)  # no search by runs
    assert searched == [2, 3, 4]  # batch 1's step differs from those at 2 and 3, so batch 4 is the third
    assert found.largest_batch == _largest_by_running_each_batch(target, tmp_path, budget) == 200
