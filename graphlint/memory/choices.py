"""What `graphlint memory` can be asked for, as the command checks it before anything imports torch: a request
answered from the result cache never imports it."""

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
DDP_BUCKET_MB = 25  # DistributedDataParallel's bucket_cap_mb default
TRAIN_DEVICES = ("cuda", "cpu")  # where the step is meant to run: torch picks its kernels (optimizer loops, attention)
STEP_DEVICES = ("auto", "meta", "cpu")  # where graphlint runs the step: meta, else CPU when it needs real values
# The categories of PyTorch's memory profiler (torch.profiler._memory_profiler.Category), in its order.
KINDS = ("parameter", "optimizer state", "input", "activation", "gradient", "temporary")
PHASES = ("forward", "loss", "backward", "optimizer step")  # of the step (graphlint.memory.step)
