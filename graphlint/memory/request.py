"""What `graphlint memory` and `graphlint time` ask of a training step, as one typed value that goes unchanged
from the command line through the session and the child's job (graphlint.run.wire) to the step
(graphlint.memory.measure, graphlint.memory.step). Plain data, frozen, without torch: a spawned child receives
it pickled, and the result cache keys a job by its fields."""

from __future__ import annotations

from dataclasses import dataclass

from graphlint.memory.choices import DDP_BUCKET_MB


@dataclass(frozen=True)
class Distribution:
    """How the step is distributed: `kind` "fsdp" or "ddp" over `world` ranks, and the strategy's options."""

    kind: str
    world: int
    wrap: tuple[str, ...] = ()  # FSDP: module class names to shard one by one (default: the repeated blocks)
    # None: fully_shard's own default, which differs from True: every block reshards after forward but the root
    # keeps its parameters unsharded into backward (FSDP2 does so only when the argument is left out).
    reshard_after_forward: bool | None = None
    mixed_precision: str | None = None  # FSDP: "bf16" parameters (and fp32 gradient reduction)
    bucket_cap_mb: float = DDP_BUCKET_MB  # DDP


@dataclass(frozen=True)
class Request:
    """What to measure: the optimizer, the device the step is meant for and the one it runs on, and input sizes to
    use instead of the factory's."""

    optimizer: str = "adamw"
    train_on: str = "cuda"  # the device the step is meant for (graphlint.memory.choices.TRAIN_DEVICES)
    autocast: str | None = None  # "bf16" or "fp16": the forward and loss under autocast to that dtype
    release_output: bool = False  # the loop drops the model's output once the loss is made (only the loss is held)
    device: str = "auto"  # where the step runs (graphlint.memory.choices.STEP_DEVICES)
    batch: int | None = None
    seq: int | None = None
    device_memory: int | None = None  # bytes: say whether the step fits, and the largest batch that does
    distribution: Distribution | None = None  # the step of one rank of N under FSDP or DDP; None: one device
