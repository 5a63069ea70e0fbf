"""`graphlint memory --fsdp N` and `--ddp N`: the step of one rank, made with torch's own fully_shard on a fake
process group (FSDP2) or with DDP's own bucket assignment, checked against the model's sizes in-process and
against real gloo runs with the profiler on every rank (benchmarks/memory_distributed.py writes the table)."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import REPO, run_graphlint, write
from graphlint.errors import TargetFailure
from graphlint.memory.distributed import Distribution, blocks_to_shard, ddp_buckets
from graphlint.memory.measure import Request, measure
from graphlint.target import target_text

sys.path.insert(0, str(REPO / "benchmarks"))

import distributed_runs  # noqa: E402
import memory_distributed  # noqa: E402
import torch_trackers  # noqa: E402

BENCH = REPO / "benchmarks"
GPT = f"{memory_distributed.__file__}:gpt2"
TOLERANCE = 0.05


def _estimate(target=GPT, distribution=None, **request):
    return measure(target, BENCH, Request(train_on="cpu", distribution=distribution, **request))


def _parameter_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_fsdp_shards_parameters_gradients_and_optimizer_state_over_the_ranks():
    whole = _parameter_bytes(memory_distributed.GPT())
    counters = 4 * len(list(memory_distributed.GPT().parameters()))  # AdamW's step, a float32 per parameter
    single = _estimate()
    for world in (2, 4):
        rank = _estimate(distribution=Distribution("fsdp", world))
        # each rank keeps a padded 1/N of every parameter, its gradient and AdamW's two moments
        assert whole / world <= rank.parameter_bytes <= whole / world * 1.01
        assert rank.optimizer_state_bytes == 2 * rank.parameter_bytes + counters
        assert rank.gradient_bytes == rank.parameter_bytes
        assert rank.peak_bytes < single.peak_bytes
        assert rank.distributed["sharded_modules"] == [f"blocks.{i}" for i in range(4)] + ["(root)"]
        assert rank.distributed["at_peak_by_role"]  # every byte at the peak has a role
        assert sum(rank.distributed["at_peak_by_role"].values()) == rank.peak_bytes


def test_keeping_the_parameters_unsharded_after_forward_costs_memory_in_backward():
    resharded = _estimate(distribution=Distribution("fsdp", 4))
    kept = _estimate(distribution=Distribution("fsdp", 4, reshard_after_forward=False))
    unsharded = kept.distributed["at_peak_by_role"].get("unsharded parameter", 0)
    assert kept.peak_bytes > resharded.peak_bytes
    assert unsharded > resharded.distributed["at_peak_by_role"].get("unsharded parameter", 0)


def test_fully_shards_default_keeps_the_roots_parameters_unsharded_into_backward_as_torchs_tracker_sees():
    # fully_shard reshards the root after forward only when reshard_after_forward is passed; left out, the root's
    # gathered parameters stay from forward into backward. With bf16 parameters the peak is at the loss, where
    # they count. torch's own FSDPMemTracker, on the same step under a fake process group, is the reference.
    default = _estimate(distribution=Distribution("fsdp", 2, mixed_precision="bf16"))
    passed = _estimate(distribution=Distribution("fsdp", 2, mixed_precision="bf16", reshard_after_forward=True))
    status, tracked = torch_trackers.tracker_peak("gpt2", "fsdp", 2, False, True)
    assert status == "ok", tracked
    assert default.peak_bytes == pytest.approx(tracked, rel=0.002)
    assert passed.peak_bytes < default.peak_bytes
    assert default.distributed["at_peak_by_role"]["unsharded parameter"] > 0


def test_checkpointed_blocks_lower_a_ranks_peak_as_on_one_device():
    plain = _estimate(distribution=Distribution("fsdp", 2))
    checkpointed = _estimate(target_text(GPT, kwargs={"checkpoint": True}), distribution=Distribution("fsdp", 2))
    assert checkpointed.activation_bytes < plain.activation_bytes / 2
    assert checkpointed.peak_bytes < plain.peak_bytes


def test_ddp_adds_its_buckets_to_the_whole_models_step():
    single = _estimate()
    rank = _estimate(distribution=Distribution("ddp", 4))
    trainable = _parameter_bytes(memory_distributed.GPT())
    assert rank.distributed["bucket_bytes"] == trainable
    assert rank.peak_bytes == single.peak_bytes + trainable  # buckets live through the step, beside .grad
    model = memory_distributed.GPT()
    small = ddp_buckets(list(model.parameters()), 0.25)
    assert len(small) > len(ddp_buckets(list(model.parameters()), 25)) and sum(small) == trainable


def test_a_wrap_policy_naming_no_module_class_is_the_targets_error():
    model = memory_distributed.GPT()
    assert blocks_to_shard(model, ("GPTBlock",)) == [f"blocks.{i}" for i in range(4)]
    with pytest.raises(TargetFailure, match="--fsdp-wrap names DecoderLayer, which is the class of no module"):
        _estimate(distribution=Distribution("fsdp", 2, wrap=("DecoderLayer",)))


def test_the_estimate_leaves_no_process_group_and_no_patch_behind():
    import torch.distributed as dist

    resize = torch.UntypedStorage.resize_
    made = memory_distributed.gpt2()
    labels = made.loss.__closure__[0].cell_contents
    _estimate(distribution=Distribution("fsdp", 2))
    assert not dist.is_initialized()
    assert torch.UntypedStorage.resize_ is resize
    assert memory_distributed.gpt2().loss.__closure__[0].cell_contents.device.type == labels.device.type == "cpu"


@pytest.mark.distributed
@pytest.mark.parametrize("factory, strategy, checkpoint", [("gpt2", "fsdp", True), ("lstm", "ddp", False)])
def test_a_ranks_estimate_is_within_5_percent_of_every_real_gloo_rank(factory, strategy, checkpoint):
    estimate = memory_distributed.estimated(factory, strategy, 2, checkpoint, False)
    ranks = distributed_runs.run_ranks(2, memory_distributed.truth, factory, strategy, checkpoint, False)
    for status, peak in ranks:
        assert status == "ok", peak
        assert abs(estimate - peak) <= TOLERANCE * peak, (estimate, peak)


@pytest.mark.cli
def test_bad_distributed_options_are_one_line_and_exit_2(tmp_path):
    write(tmp_path, "net.py", """
        import torch
        from torch import nn


        def make():
            return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), (torch.randn(4, 8),)
    """)
    for args, says in ((["--fsdp", "0"], "--fsdp takes the number of ranks"),
                       (["--fsdp", "2", "--ddp", "2"], "pass one of them"),
                       (["--fsdp", "2", "--fsdp-wrap", "Block"], "--fsdp-wrap names Block")):
        done = run_graphlint("memory", "net.py:make", *args, cwd=tmp_path)
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


def test_ddp_says_when_parameters_get_no_gradient_as_gl402_does(tmp_path):
    path = write(tmp_path, "net.py", """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(8, 8)
                self.aux = nn.Linear(8, 3)

            def forward(self, x):
                return self.body(x)


        def make():
            return Net(), (torch.randn(4, 8),)
    """)
    result = measure(f"{path}:make", tmp_path, Request(distribution=Distribution("ddp", 2)))
    assert result.distributed["parameters_without_gradient"] == 2  # aux.weight and aux.bias
    assert any("GL402" in note and "second step" in note for note in result.notes)
    whole = measure(f"{path}:make", tmp_path, Request(distribution=Distribution("ddp", 2, bucket_cap_mb=25)))
    assert whole.distributed["bucket_bytes"] == 4 * (8 * 8 + 8 + 8 * 3 + 3)  # DDP buckets every trainable one


def _blocks(trace):
    """A trace as plain data: every block's fields and role, in order."""
    return trace.events, trace.phase_starts, [
        (b.nbytes, b.made, b.freed, b.phase, b.module, b.op, b.dtype, b.shape, b.kind, b.saved_by,
         trace.roles.get(id(b), "")) for b in trace.blocks]


@pytest.mark.parametrize("train_on, bf16", [("cuda", False), ("cpu", False), ("cuda", True)])
def test_the_optimizer_stepping_the_local_shards_allocates_what_stepping_the_dtensors_does(monkeypatch, train_on,
                                                                                           bf16):
    from graphlint.memory import distributed
    from graphlint.memory.measure import _trace
    from graphlint.target import load_factory, TargetSpec

    factory = load_factory(TargetSpec.parse(target_text(GPT, kwargs={"checkpoint": True}), BENCH), ()).factory
    request = Request(train_on=train_on, distribution=Distribution("fsdp", 4, mixed_precision="bf16" if bf16 else None))
    local = _blocks(_trace(factory, "meta", request, {})[0])
    asked = []
    monkeypatch.setattr(distributed, "local_shard", lambda tensor: asked.append(tensor) or tensor)  # the DTensors
    whole = _blocks(_trace(factory, "meta", request, {})[0])
    assert asked and all(type(tensor).__name__ == "DTensor" for tensor in asked)
    assert local == whole
    assert any(block[10] == "sharded optimizer state" for block in local[2])


@pytest.mark.parametrize("distribution", [Distribution("fsdp", 2), Distribution("ddp", 2), None],
                         ids=["fsdp", "ddp", "single"])
def test_the_targets_own_step_reads_the_same_lines_as_the_step_at_batch_4(monkeypatch, distribution):
    from graphlint.memory import measure as measuring
    from graphlint.memory.measure import _linear_peak, _search_trace, _trace
    from graphlint.target import load_factory, TargetSpec

    vit = f"{memory_distributed.__file__}:vit"
    factory = load_factory(TargetSpec.parse(vit, BENCH), ()).factory
    request = Request(train_on="cpu", distribution=distribution)
    own, sizes = _trace(factory, "meta", request, {})
    assert sizes == {"batch": 8}  # images: no sequence
    steps = {b: _search_trace(factory, "meta", request, {"batch": b}) for b in (2, 3, 4)}
    with_own = _linear_peak({2: steps[2], 3: steps[3], sizes["batch"]: own})
    with_4 = _linear_peak(steps)
    assert with_own is not None and with_4 is not None
    assert [with_own(b) for b in range(1, 200)] == [with_4(b) for b in range(1, 200)]
    budget = with_4(37)
    searched = []

    def recorded(factory, device, request, sizes):
        searched.append(sizes["batch"])
        return _search_trace(factory, device, request, sizes)

    monkeypatch.setattr(measuring, "_search_trace", recorded)
    assert _estimate(vit, distribution=distribution, device_memory=budget).largest_batch == 37
    assert searched == [2, 3]  # the target's own step at batch 8 was the third
