"""The kernel audit: each aten call of a model's step replayed on CPU under the profiler and on meta under
graphlint's kernel models. It passes where graphlint models what the CPU kernels allocate and keep, and fails
naming the op where a model is taken away (the difference is then really there, in the CPU kernel)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import memory_zoo_models  # noqa: E402

from graphlint.memory import kernels  # noqa: E402
from graphlint.memory.audit import audit  # noqa: E402
from graphlint.memory.registry import KERNEL_MEMORY  # noqa: E402
from graphlint.target import normalize_factory_result  # noqa: E402


def _zoo(name):
    torch.manual_seed(0)
    made = normalize_factory_result(getattr(memory_zoo_models, name)())
    return made.model, made.args, made.kwargs, made.loss


class Head(nn.Module):
    """An LM head whose loss is a plain sum: sum()'s backward gives mm a stride-0 gradient, which the CPU's BLAS
    call copies into a contiguous buffer of the logits' size."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 4000, bias=False)

    def forward(self, ids):
        return self.head(self.embed(ids))


def _head():
    return Head(), (torch.randint(0, 1000, (8, 64)),), {}, lambda out: out.sum()


@pytest.mark.parametrize("name", ["conv1d_audio", "resnet", "lstm_tagger", "gru_tagger", "mlp_mse"])
def test_the_audit_passes_where_graphlint_models_the_cpu_kernels(name):
    assert audit(*_zoo(name)) == []


def test_the_audit_passes_on_a_stride_0_gradient_into_a_matrix_product():
    assert audit(*_head()) == []


def test_the_audit_names_the_matrix_product_without_its_copy_model(monkeypatch):
    for op in kernels._BLAS:  # the products' entries of the registry, removed for this test
        monkeypatch.delitem(KERNEL_MEMORY, op)
    findings = audit(*_head())
    assert findings  # the two products of the head's backward (the weight's and the input's gradients)
    for finding in findings:
        assert finding.op == "mm.default" and finding.what == "allocates"
        assert finding.cpu_bytes >= 8 * 64 * 4000 * 4  # the logits' size: the copy of the expanded gradient
        assert finding.meta_bytes == 0


def test_the_audit_names_the_convolutions_without_their_measured_scratch(monkeypatch):
    for op in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default):
        monkeypatch.delitem(KERNEL_MEMORY, op)
    ops = {finding.op for finding in audit(*_zoo("conv1d_audio"))}
    assert "convolution.default" in ops or "convolution_backward.default" in ops


def test_the_audit_names_the_lstm_without_its_workspace(monkeypatch):
    class NoWorkspace(kernels.CpuKernelMemory):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr("graphlint.memory.audit.CpuKernelMemory", NoWorkspace)
    findings = audit(*_zoo("lstm_tagger"))
    assert any(f.op == "mkldnn_rnn_layer.default" and f.what == "returns" for f in findings), findings


def test_the_estimate_of_a_sum_loss_into_an_lm_head_counts_the_copy():
    from graphlint.memory.estimate import estimate
    from graphlint.memory.request import Request
    from graphlint.memory.step import run_step

    model, args, _, loss = _head()
    with torch.device("meta"):
        meta_model = Head()
    with_copy = estimate(run_step(meta_model, (args[0].to("meta"),), {}, loss,
                                  Request(optimizer="none", train_on="cpu"))).peak_bytes
    without = estimate(run_step(meta_model, (args[0].to("meta"),), {}, loss,
                                Request(optimizer="none", train_on="cuda"))).peak_bytes
    logits = 8 * 64 * 4000 * 4
    assert with_copy - without >= 0.9 * logits  # the CPU kernel's copy of the expanded gradient is in the CPU step


def _from_source(source: str, factory: str):
    namespace: dict = {}
    exec(compile(textwrap.dedent(source), "<model>", "exec"), namespace)
    made = normalize_factory_result(namespace[factory]())
    return made.model, made.args, made.kwargs, made.loss


def test_the_audit_passes_on_the_models_of_the_memory_and_checkpointing_tests():
    import test_checkpointing
    import test_memory

    torch.manual_seed(0)
    # the audit runs the step at the model's own size on CPU: test_memory.ATTENTION's 2 GiB of scores are left out
    models = [(test_memory.MODEL, "make"), (test_memory.ATTENTION_OVER_BUDGET, "make")]
    models += [(test_checkpointing.MODEL, name) for name in test_checkpointing.MODES]
    models += [(test_checkpointing.NO_INPUT_GRAD, name) for name in ("non_reentrant_frozen", "reentrant_trained")]
    for source, factory in models:
        assert audit(*_from_source(source, factory)) == [], factory
