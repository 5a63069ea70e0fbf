"""What a performance finding costs per training step on a named GPU (`graphlint check --gpu NAME`) or on this
machine's CPU (`--cpu`), graphlint.costs: the time of the ops at its lines, what its fix saves, in text, JSON and
SARIF; nothing of it without a device."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import run_graphlint, validate_sarif, write
from graphlint.costs import PricedOp, StepLines, finding_lines, with_costs
from graphlint.policy import _merge_across_targets
from graphlint.results import Cost, Finding, Location, Related, Severity

# A hand-written SiLU early in the file (small), then attention written out (large): by line the SiLU comes first,
# by cost the attention.
MODEL = '''
import math
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.gate = nn.Linear(dim, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.gate(x)
        x = x + h * torch.sigmoid(h)
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        probs = torch.softmax(scores, dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


def make():
    return Net(), (torch.randn(4, 256, 64),)
'''

# No performance finding: a parameter the forward never uses (GL203, not a priced rule).
CLEAN = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        return self.used(x)


def make():
    return Net(), (torch.randn(2, 8),)
'''


def _check(folder, *args: str):
    return run_graphlint("check", "model.py:make", "--ignore", "GL3", "--no-cache", *args, cwd=folder)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("costs")
    (folder / "pyproject.toml").write_text("[project]\nname = 'costs'\n", encoding="utf-8")
    write(folder, "model.py", MODEL)
    return folder


@pytest.fixture(scope="module")
def priced_json(model_dir):
    done = _check(model_dir, "--gpu", "H100", "--format", "json")
    assert done.returncode == 1, done.stderr
    return json.loads(done.stdout)


@pytest.mark.cli
def test_unfused_attention_on_an_h100_carries_its_time_and_its_fix_saving_in_json(priced_json):
    attention = next(f for f in priced_json["findings"] if f["rule"] == "GL101")
    cost = attention["cost"]
    assert cost["device"] == "NVIDIA H100 SXM5 80GB" and cost["batch"] == 4
    assert 0 < cost["fix_saves"] < cost["time_per_step"] < cost["step_seconds"]


@pytest.mark.cli
def test_priced_findings_keep_everything_else_of_the_unpriced_run(model_dir, priced_json):
    plain = _check(model_dir, "--format", "json")
    assert plain.returncode == 1, plain.stderr
    assert "cost" not in plain.stdout
    for finding in priced_json["findings"]:
        finding.pop("cost", None)
    assert priced_json == json.loads(plain.stdout)


@pytest.mark.cli
def test_sarif_carries_the_cost_as_properties_and_stays_valid(model_dir):
    done = _check(model_dir, "--gpu", "h100", "--format", "sarif")
    log = json.loads(done.stdout)
    validate_sarif(log)
    attention = next(r for r in log["runs"][0]["results"] if r["ruleId"] == "GL101")
    properties = attention["properties"]
    assert 0 < properties["fixSaves"] < properties["timePerStep"] < properties["stepSeconds"]
    assert properties["costDevice"] == "NVIDIA H100 SXM5 80GB"


@pytest.mark.cli
def test_sort_cost_puts_the_costliest_finding_first_and_text_says_the_cost(model_dir):
    by_line = _check(model_dir, "--gpu", "h100")
    by_cost = _check(model_dir, "--gpu", "h100", "--sort", "cost")
    rules = [[line.split()[1] for line in done.stdout.splitlines() if ": GL" in line] for done in (by_line, by_cost)]
    assert rules == [["GL107", "GL101"], ["GL101", "GL107"]]
    attention = next(line for line in by_cost.stdout.splitlines() if " GL101 " in line)
    assert "per step on NVIDIA H100 SXM5 80GB at batch 4; the fix saves about " in attention


@pytest.mark.cli
def test_a_model_without_performance_findings_carries_no_cost(tmp_path):
    write(tmp_path, "model.py", CLEAN)
    done = _check(tmp_path, "--gpu", "h100", "--format", "json", "--extend-select", "GL203")
    findings = json.loads(done.stdout)["findings"]
    assert [f["rule"] for f in findings] == ["GL203"]
    assert "cost" not in findings[0]


@pytest.mark.cli
def test_the_result_cache_answers_another_gpu_anew(model_dir, tmp_path):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    answers = {}
    for gpu in ("h100", "l4", None):
        done = run_graphlint("check", "model.py:make", "--ignore", "GL3", "--format", "json", *cache,
                             *(["--gpu", gpu] if gpu else []), cwd=model_dir)
        answers[gpu] = next(f for f in json.loads(done.stdout)["findings"] if f["rule"] == "GL101").get("cost")
    assert answers["h100"]["device"] == "NVIDIA H100 SXM5 80GB"
    assert answers["l4"]["device"] == "NVIDIA L4 24GB"
    assert answers[None] is None


@pytest.mark.cli
def test_findings_priced_on_this_cpu_carry_its_name_and_are_cached_apart_from_a_gpus(model_dir, tmp_path):
    from graphlint.timing.devices import cpu_label

    cache = ["--cache-dir", str(tmp_path / "cache")]
    # One thread: with more, a busy machine's waiting threads would leave the answer out of the result cache,
    # which the sorted run below reads (test_cache_and_jobs checks that such an answer is not kept).
    one_thread = {"OMP_NUM_THREADS": "1"}
    answers = {}
    for device in (("--gpu", "h100"), ("--cpu",)):
        done = run_graphlint("check", "model.py:make", "--ignore", "GL3", "--format", "json", *cache, *device,
                             cwd=model_dir, env=one_thread)
        assert done.returncode == 1, done.stderr
        answers[device[0]] = {f["rule"]: f["cost"] for f in json.loads(done.stdout)["findings"]}
    on_cpu = answers["--cpu"]
    assert set(on_cpu) == {"GL101", "GL107"}
    for cost in on_cpu.values():
        assert cost["device"] == cpu_label() and cost["batch"] == 4
        # the saving's sign is this CPU's measurement (the fused kernel against the chain, both timed in this run):
        # test_fused_attention_on_the_cpu_* checks it with stand-in times; here, that there is one and it fits
        assert cost["fix_saves"] is not None and cost["fix_saves"] <= cost["time_per_step"] < cost["step_seconds"]
    assert on_cpu["GL101"]["step_seconds"] != answers["--gpu"]["GL101"]["step_seconds"]
    sorted_text = run_graphlint("check", "model.py:make", "--ignore", "GL3", "--cpu", "--sort", "cost", *cache,
                                cwd=model_dir, env=one_thread)
    costly = max(on_cpu, key=lambda rule: on_cpu[rule]["time_per_step"])
    first = next(line for line in sorted_text.stdout.splitlines() if ": GL" in line)
    assert f" {costly} " in first and f"per step on {cpu_label()} at batch 4" in first


@pytest.mark.cli
@pytest.mark.parametrize("args, said", [
    (("--sort", "cost"), "--sort cost orders the findings"),
    (("--gpu", "tpu9"), "unknown GPU 'tpu9'"),
    (("--gpu", "h100", "--cpu"), "--gpu and --cpu are two devices to price the findings on; pass one of them"),
])
def test_bad_cost_options_are_one_line_and_exit_2(model_dir, args, said):
    done = _check(model_dir, *args)
    assert done.returncode == 2
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- the saving models, on priced ops by hand ------------------------------------------------------------------

def _finding(rule: str, line: int, occurrences: int = 1, related: tuple[int, ...] = ()) -> Finding:
    at = Location("/m.py", line, 1, line, 10)
    return Finding(rule, "name", Severity.WARNING, "message", at, occurrences=occurrences,
                   related=tuple(Related(Location("/m.py", r, 1, r, 5), "step") for r in related))


def _step(lines: dict[int, list[PricedOp]]) -> StepLines:
    return StepLines("GPU", 1.0, 8, {("/m.py", line): ops for line, ops in lines.items()})


def _op(name: str, kind: str, seconds: float, phase: str = "forward") -> PricedOp:
    return PricedOp(f"aten.{name}.default", kind, phase, seconds)


def test_fused_attention_saves_the_chains_elementwise_ops_but_keeps_products_and_copies():
    step = _step({10: [_op("bmm", "matmul", 0.1), _op("div", "memory", 0.02)],
                  11: [_op("_softmax", "memory", 0.03), _op("_softmax_backward_data", "memory", 0.04, "backward")],
                  12: [_op("bmm", "matmul", 0.1), _op("clone", "memory", 0.05)]})
    [priced] = with_costs([_finding("GL101", 11, related=(10, 12))], step)
    assert priced.cost.seconds == pytest.approx(0.34)
    assert priced.cost.saves == pytest.approx(0.09)


def test_a_fused_activation_saves_all_but_the_largest_pass_of_each_phase():
    step = _step({5: [_op("sigmoid", "memory", 0.01), _op("mul", "memory", 0.03),
                      _op("mul", "memory", 0.02, "backward"), _op("sigmoid_backward", "memory", 0.02, "backward")]})
    [priced] = with_costs([_finding("GL107", 5)], step)
    assert priced.cost.saves == pytest.approx(0.01 + 0.02)


def test_a_hoisted_cast_saves_all_but_one_of_its_occurrences():
    step = _step({7: [_op("_to_copy", "memory", 0.01)] * 4 + [_op("mm", "matmul", 0.5)]})
    [priced] = with_costs([_finding("GL102", 7, occurrences=4)], step)
    assert priced.cost.saves == pytest.approx(0.03)
    assert priced.cost.seconds == pytest.approx(0.54)


def test_a_rule_without_a_model_has_a_time_but_no_saving_and_other_rules_no_cost():
    step = _step({3: [_op("mm", "matmul", 0.2)]})
    sync, unused = with_costs([_finding("GL103", 3), _finding("GL203", 3)], step)
    assert sync.cost.seconds == pytest.approx(0.2) and sync.cost.saves is None
    assert unused.cost is None


def test_only_pattern_rules_count_their_related_lines():
    assert finding_lines(_finding("GL101", 4, related=(2, 3))) == {("/m.py", 2), ("/m.py", 3), ("/m.py", 4)}
    assert finding_lines(_finding("GL105", 4, related=(6,))) == {("/m.py", 4)}


def test_a_finding_two_targets_share_carries_the_cost_of_the_target_where_it_costs_most():
    def found(target: str, seconds: float | None) -> Finding:
        cost = None if seconds is None else Cost(seconds, seconds / 2, 10 * seconds, "NVIDIA H100 SXM5 80GB", 8)
        return Finding("GL101", "unfused-attention", Severity.WARNING, "m", Location("model.py", 3, 5, 3, 9),
                       targets=(target,), cost=cost)

    [merged] = _merge_across_targets([found("small", 0.001), found("large", 0.004), found("medium", 0.002)])
    assert merged.targets == ("small", "large", "medium") and merged.cost.seconds == 0.004
    [merged] = _merge_across_targets([found("unpriced", None), found("small", 0.001)])
    assert merged.cost.seconds == 0.001


# -- on this CPU, the fix's own call is asked of torch -------------------------------------------------------------

def _cpu_step(lines: dict[int, list[PricedOp]], issued: float = 1e-6) -> StepLines:
    from graphlint.timing.devices import CpuPeaks

    cpu = CpuPeaks("this CPU", 1, launch={"forward": 1e-5, "backward": 2e-5, "optimizer": 3e-6},
                   native={"forward": issued, "backward": issued})
    return StepLines("this CPU", 1.0, 8, {("/m.py", line): ops for line, ops in lines.items()}, cpu)


def test_torch_is_asked_whether_the_norms_library_call_is_one_kernel_on_the_cpu():
    from torch.utils._python_dispatch import TorchDispatchMode

    from graphlint.costs import _one_cpu_kernel

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if torch.Tag.pointwise in func.tags or "norm" in func.__name__ or "mean" in func.__name__:
                self.kernels.append(func)
            return func(*args, **(kwargs or {}))

    for call in ("rms_norm", "layer_norm"):
        x, weight = torch.ones(2, 4), torch.ones(4)
        with Seen() as seen:
            getattr(torch.nn.functional, call)(x, (4,), weight)
        assert _one_cpu_kernel(call) == (len(seen.kernels) == 1), (call, seen.kernels)


def test_a_norm_whose_library_call_decomposes_on_the_cpu_saves_only_the_python_between_its_ops(monkeypatch):
    import graphlint.costs as costs

    monkeypatch.setitem(costs._one_kernel, "rms_norm", False)
    ops = [PricedOp("aten.pow.Tensor_Scalar", "memory", "forward", 0.010, 0.004),
           PricedOp("aten.rsqrt.default", "memory", "forward", 0.010, 0.003),
           PricedOp("aten.mul.Tensor", "memory", "backward", 0.010, 0.002)]
    finding = dataclasses.replace(_finding("GL106", 5), message="RMSNorm written out by hand in the block")
    [priced] = with_costs([finding], _cpu_step({5: ops}, issued=0.001))
    assert priced.cost.saves == pytest.approx((0.004 - 0.001) + (0.003 - 0.001))  # the kernels stay
    # on a GPU, and for a norm whose call is one kernel, the fused model holds
    [on_gpu] = with_costs([finding], _step({5: ops}))
    assert on_gpu.cost.saves == pytest.approx(0.010)
    monkeypatch.setitem(costs._one_kernel, "rms_norm", True)
    [one] = with_costs([finding], _cpu_step({5: ops}, issued=0.001))
    assert one.cost.saves == pytest.approx(0.010)


def test_fused_attention_on_the_cpu_is_timed_at_the_chains_sizes_once_per_occurrence(monkeypatch):
    import graphlint.costs as costs

    asked = []

    def timed(cpu, heads, length, keys, width, causal):
        asked.append((heads, length, keys, width, causal))
        return 0.05

    monkeypatch.setattr(costs, "_flash_attention_seconds", timed)
    product = PricedOp("aten.bmm.default", "matmul", "forward", 0.1, 0.0, ((8, 12, 4), (8, 4, 12)))
    ops = [product, PricedOp("aten.masked_fill.Scalar", "memory", "forward", 0.02),
           PricedOp("aten._softmax.default", "memory", "forward", 0.03),
           PricedOp("aten.clone.default", "memory", "forward", 0.05)]
    [priced] = with_costs([_finding("GL101", 10, occurrences=2)], _cpu_step({10: ops}))
    assert asked == [(8, 12, 12, 4, True)]
    assert priced.cost.saves == pytest.approx(0.1 + 0.02 + 0.03 - 2 * 0.05)  # copies stay
    # baddbmm's added input comes first; a 2-d product on the chain's lines (a Linear's) is not the scores'
    asked.clear()
    linear = PricedOp("aten.mm.default", "matmul", "forward", 0.01, 0.0, ((32, 64), (64, 32)))
    biased = PricedOp("aten.baddbmm.default", "matmul", "forward", 0.1, 0.0, ((8, 1, 12), (8, 12, 4), (8, 4, 12)))
    with_costs([_finding("GL101", 10)], _cpu_step({10: [linear, biased, *ops[1:]]}))
    assert asked == [(8, 12, 12, 4, True)]
    # slower fused: a negative saving, said as such
    monkeypatch.setattr(costs, "_flash_attention_seconds", lambda *a: 0.2)
    [slower] = with_costs([_finding("GL101", 10, occurrences=2)], _cpu_step({10: ops}))
    assert slower.cost.saves == pytest.approx(0.15 - 0.4)
    from graphlint.report.text import cost_sentence

    assert "would cost about 250 ms more" in cost_sentence(slower.cost)
    # with dropout the CPU's fused call is a composite of the chain's own kernels: only its Python goes
    dropped = [*ops, PricedOp("aten.bernoulli_.float", "memory", "forward", 0.01, 0.004)]
    [composite] = with_costs([_finding("GL101", 10, occurrences=2)], _cpu_step({10: dropped}, issued=0.001))
    assert composite.cost.saves == pytest.approx(0.004 - 0.001)


def test_the_flash_kernel_is_timed_as_the_steps_calls_are(tmp_path, monkeypatch):
    from graphlint.costs import _flash_attention_seconds
    from graphlint.timing.devices import CpuPeaks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu = CpuPeaks("this CPU", 1, launch={"forward": 1e-5, "backward": 2e-5, "optimizer": 3e-6})
    torch.manual_seed(3)
    before = torch.get_rng_state()
    small, large = _flash_attention_seconds(cpu, 2, 16, 16, 8, True), _flash_attention_seconds(cpu, 8, 128, 128, 32, False)
    assert 3e-5 < small < large  # its two launches at least; more heads and tokens cost more
    assert torch.equal(torch.get_rng_state(), before)
    assert len(list((tmp_path / "graphlint" / "op-times").iterdir())) == 1  # in the replay's own cache
