"""One place to add a kernel's memory: an entry of graphlint.memory.registry's tables is what the step consults
(its scratch on CPU, the note of a step meant for CUDA, a stand-in for a call on meta), and a tracker for tensors
held otherwise is a subclass of the public `Tracker`."""

from __future__ import annotations

import torch
from torch import nn

from graphlint.memory.registry import KERNEL_MEMORY, STAND_INS, KernelMemoryModel, register, stand_in
from graphlint.memory.request import Request
from graphlint.memory.step import Tracker, run_step

GELU = torch.ops.aten.gelu.default
SCRATCH = 12345  # bytes, a size no other block of the step has
CPU, CUDA = Request(optimizer="sgd", train_on="cpu"), Request(optimizer="sgd", train_on="cuda")


def _model_on_meta():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
        return model, (torch.ones(4, 8),)


def _entry_removed(*keys, table=KERNEL_MEMORY):
    for key in keys:
        table.pop(key, None)


def test_a_registered_kernel_scratch_is_a_temporary_of_the_step():
    model, args = _model_on_meta()
    register(GELU)(lambda func, args: SCRATCH)
    try:
        trace = run_step(model, args, {}, None, CPU)
    finally:
        _entry_removed(GELU)
    [block] = [b for b in trace.blocks if b.nbytes == SCRATCH]
    assert block.kind == "temporary" and block.phase == "forward" and block.freed == block.made + 2
    assert not any(b.nbytes == SCRATCH for b in run_step(model, args, {}, None, CPU).blocks)


def test_a_kernels_cuda_workspace_is_said_for_a_step_meant_for_cuda():
    model, args = _model_on_meta()
    KERNEL_MEMORY[GELU] = KernelMemoryModel(cuda="the GELU kernel's own buffer")
    try:
        notes = run_step(model, args, {}, None, CUDA).notes
    finally:
        _entry_removed(GELU)
    assert any("the GELU kernel's own buffer" in note for note in notes), notes


def test_a_registered_stand_in_replaces_the_call_on_meta_for_its_device_only():
    calls = []

    @stand_in(torch.nn.functional.gelu, train_on=("cpu",))
    def doubled(func, train_on, args, kwargs):
        calls.append(train_on)
        return torch.cat([args[0], args[0]], dim=0)[: args[0].shape[0]]

    model, args = _model_on_meta()
    try:
        run_step(model, args, {}, None, CPU)
        run_step(model, args, {}, None, CUDA)
    finally:
        _entry_removed(torch.nn.functional.gelu, table=STAND_INS)
    assert calls == ["cpu"]


def test_a_tracker_subclass_sees_every_tensor_through_the_public_extension_point():
    seen = []

    class Counting(Tracker):
        def track(self, tensor, phase, module, op, made=None):
            block = super().track(tensor, phase, module, op, made)
            if block is not None and phase == "forward":
                seen.append((op, block))
            return block

    model, args = _model_on_meta()
    trace = run_step(model, args, {}, None, CUDA, tracker_class=Counting)
    assert {"addmm.default", "gelu.default"} <= {op for op, _ in seen}
    assert {id(block) for _, block in seen if block.made >= 0} == {id(b) for b in trace.blocks if b.phase == "forward"}
