"""Kernels measured, not assumed: on the meta device the step takes the paths CPU's kernels take (oneDNN's LSTM
with its workspace and scratch, the generic GRU/RNN loop with its whole-sequence input projection), checked op
for op against the real CPU kernels, the workspace against the kernel's own, and the peaks against PyTorch's
CPU memory profiler."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import REPO
from graphlint.run.wire import thread_settings

sys.path.insert(0, str(REPO / "benchmarks"))

import memory_zoo  # noqa: E402

from graphlint.memory.kernels import onednn_lstm_memory  # noqa: E402
from graphlint.memory.modes import StandIns  # noqa: E402


class _Allocations(TorchDispatchMode):
    """The ops a call runs and the bytes of each output, autograd's own detaches left out."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is not torch.ops.aten.detach.default:
            leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.log.append((func.__name__, tuple(t.untyped_storage().nbytes() for t in leaves)))
        return out


RECURRENT = [
    (torch.nn.GRU, {"batch_first": True}),
    (torch.nn.GRU, {"num_layers": 2, "bidirectional": True, "dropout": 0.2}),
    (torch.nn.RNN, {"num_layers": 2}),
    (torch.nn.RNN, {"nonlinearity": "relu", "bidirectional": True, "batch_first": True}),
    (torch.nn.LSTM, {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    (torch.nn.LSTM, {}),
]


@pytest.mark.parametrize("layer, options", RECURRENT, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_recurrent_layer_on_meta_runs_the_forward_ops_of_the_cpu_kernel(layer, options):
    # the forward op for op; backward (whose meta functions copy a bias gradient that the CPU kernel does not,
    # 4·hidden floats) is checked by the peaks against the profiler below
    logs = []
    for device in ("cpu", "meta"):
        torch.manual_seed(0)
        with torch.device(device):
            model, x = layer(8, 16, **options), torch.randn(3, 5, 8, requires_grad=True)
        allocations = _Allocations()
        # the CPU side under a saved-tensor hook too, so that neither side's log has autograd's detaches
        with (StandIns("cpu", below_autocast=False) if device == "meta" else torch.autograd.graph.saved_tensors_hooks(
                lambda t: t, lambda t: t)), allocations:
            model(x)
        logs.append(allocations.log)
    cpu, meta = logs
    if layer is torch.nn.LSTM:  # the workspace: empty from the meta function, sized by CpuKernelMemory
        cpu = [(name, sizes[:3]) if name == "mkldnn_rnn_layer.default" else (name, sizes) for name, sizes in cpu]
        meta = [(name, sizes[:3]) if name == "mkldnn_rnn_layer.default" else (name, sizes) for name, sizes in meta]
    assert cpu == meta


@pytest.mark.parametrize("steps, batch, inputs, hidden", [(37, 5, 24, 40), (64, 12, 100, 96), (200, 4, 32, 64)])
def test_the_lstm_workspace_is_the_size_the_cpu_kernel_gives_it(steps, batch, inputs, hidden):
    out = torch.ops.aten.mkldnn_rnn_layer(
        torch.zeros(steps, batch, inputs), torch.zeros(4 * hidden, inputs), torch.zeros(4 * hidden, hidden),
        torch.zeros(4 * hidden), torch.zeros(4 * hidden), torch.zeros(batch, hidden), torch.zeros(batch, hidden),
        False, [], 2, hidden, 1, True, False, False, True)
    real = out[3].untyped_storage().nbytes()
    assert real > 10 * steps * batch * hidden * 4  # a workspace the meta function does not have
    assert abs(onednn_lstm_memory(inputs, hidden).line("workspace", steps, batch) - real) <= 0.01 * real


@pytest.mark.parametrize("factory, optimizer", [("lstm_tagger", "adamw"), ("bilstm_tagger_2_layers", "adamw"),
                                                ("gru_tagger", "adamw"), ("rnn_tagger", "adam"),
                                                pytest.param("lstm_tagger_bf16", "adamw", marks=pytest.mark.skipif(
                                                    not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                                                    reason="this CPU's oneDNN has no bfloat16"))])
def test_recurrent_taggers_are_within_5_percent_of_the_profiler(factory, optimizer):
    estimate, measured = memory_zoo.row(factory, optimizer, None)
    assert abs(estimate - measured) <= 0.05 * measured, (estimate, measured)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bfloat16")
@pytest.mark.parametrize("steps, batch, inputs, hidden", [(37, 5, 24, 40), (64, 12, 100, 96)])
def test_the_bf16_lstm_workspace_is_the_size_the_cpu_kernel_gives_it(steps, batch, inputs, hidden):
    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.bfloat16)

    out = torch.ops.aten.mkldnn_rnn_layer(
        zeros(steps, batch, inputs), zeros(4 * hidden, inputs), zeros(4 * hidden, hidden), zeros(4 * hidden),
        zeros(4 * hidden), zeros(batch, hidden), zeros(batch, hidden), False, [], 2, hidden, 1, True, False, False,
        True)
    real = out[3].untyped_storage().nbytes()
    fitted = onednn_lstm_memory(inputs, hidden, torch.bfloat16).line("workspace", steps, batch)
    # within 1% or two 4 KiB pages: the kernel rounds its workspace to pages, which the line smooths over
    assert abs(fitted - real) <= max(0.01 * real, 8192), (fitted, real)


BF16_VIT = """
    import torch
    import torch.nn.functional as F

    import graphlint
    import memory_models


    def vit_bf16():
        images = torch.randn(8, 3, 32, 32, dtype=torch.bfloat16)
        labels = torch.randint(0, 10, (8,))
        model = memory_models.ViT().to(torch.bfloat16)
        return graphlint.Target(model, (images,), loss=lambda out: F.cross_entropy(out.float(), labels))
"""


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU's oneDNN has no bfloat16")
def test_bfloat16_matrix_products_keep_onednns_packing_buffers_as_the_profiler_sees(tmp_path):
    # A bf16 ViT peaks in backward inside a weight-gradient product whose oneDNN buffers (0.8 MiB here) no
    # dispatcher-level tracker sees; unmodelled, the estimate was 3.2% under the profiler.
    import types

    import distributed_runs
    import memory_accuracy
    from conftest import write

    path = write(tmp_path, "vit_bf16.py", BF16_VIT)
    module = types.SimpleNamespace(__file__=str(path), vit_bf16=distributed_runs.load_factory(str(path), "vit_bf16"))
    estimate = memory_accuracy.estimated("vit_bf16", "adamw", "cpu", module=module)
    measured = memory_accuracy.profiled("vit_bf16", "adamw", False, module=module)
    assert abs(estimate - measured) <= 0.01 * measured, (estimate, measured)


CORES = thread_settings()["usable"] or os.cpu_count() or 1  # the CPUs this process may run on, on any system


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported() or CORES < 2,
                    reason="needs oneDNN's bfloat16 and two cores")
def test_a_products_buffers_are_measured_per_thread_and_the_thread_count_is_given_back():
    from graphlint.memory.kernels import modeled_scratch, probe_threads

    threads = torch.get_num_threads()
    with torch.device("meta"):
        args = [torch.empty(192, 520, dtype=torch.bfloat16), torch.empty(520, 768, dtype=torch.bfloat16)]
    with probe_threads(1):
        one = modeled_scratch(torch.ops.aten.mm.default, args)
    with probe_threads(2):
        two = modeled_scratch(torch.ops.aten.mm.default, args)
    assert 0 < one < two
    assert torch.get_num_threads() == threads
