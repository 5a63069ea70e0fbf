"""How close `graphlint memory` comes to PyTorch's own memory profiler, on CPU, for small real models.

    python benchmarks/memory_accuracy.py              # print the table
    python benchmarks/memory_accuracy.py --write-docs # and put it in docs/memory.md

For each model (benchmarks/memory_models.py) and optimizer: the estimate, made as `graphlint memory` makes it
(built on the meta device, the step run under graphlint's tracker, `--train-on cpu`), against the peak that
`torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)` records for the same step
run for real on CPU: the largest sum over the profiler's categories (parameter, optimizer state, input,
activation, gradient, temporary, autograd detail, unknown) at one timestamp, the sum that
`export_memory_timeline` plots. Both steps are the steady-state step: the optimizer has state from a first
step, then zero_grad(set_to_none=True), forward, loss, backward, step, the output and loss held to the end,
with torch's default optimizer implementation on CPU; the last rows use foreach=True on both sides, the
implementation torch picks on CUDA and the one the default estimate models.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import re
import sys
from pathlib import Path

import torch
from torch.profiler import profile
from torch.profiler._memory_profiler import MemoryProfileTimeline

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_models  # noqa: E402

from graphlint.capture.loss import choose_loss  # noqa: E402
from graphlint.memory.measure import Request, measure  # noqa: E402
from graphlint.memory.step import make_optimizer  # noqa: E402
from graphlint.target import normalize_factory_result  # noqa: E402

# (table name, factory name in memory_models, optimizer)
CASES = [
    ("MLP", "mlp", "adamw"),
    ("MLP", "mlp", "sgd-momentum"),
    ("CNN with batch norm", "cnn", "adamw"),
    ("CNN with batch norm", "cnn", "sgd"),
    ("ViT", "vit", "adamw"),
    ("GPT-2 (transformers)", "gpt2", "adamw"),
    ("GPT-2 (transformers)", "gpt2", "none"),
    ("Llama (transformers)", "llama", "adamw"),
]
# The estimate for CUDA (--train-on cuda, the default) differs from CPU's in the optimizer's implementation, which
# CPU can run too (foreach=True), and in fused attention with dropout, which CPU cannot: these rows check the first.
FOREACH_CASES = [("MLP", "mlp", "adamw"), ("ViT", "vit", "adamw"), ("Llama (transformers)", "llama", "adamw")]
# --autocast emulates CUDA's autocast policy; CPU's differs (layer norm and softmax, for two), so only a model
# whose ops both policies treat alike (linear layers, GELU, cross-entropy) checks it on CPU.
AUTOCAST_CASES = [("MLP", "mlp", "adamw")]
BEGIN, END = "<!-- memory-accuracy:begin -->", "<!-- memory-accuracy:end -->"


def estimated(factory: str, optimizer: str, train_on: str, autocast: str | None = None) -> int:
    """The peak `graphlint memory benchmarks/memory_models.py:FACTORY --optimizer OPTIMIZER --train-on TRAIN_ON`
    (and `--autocast AUTOCAST`) reports."""
    request = Request(optimizer=optimizer, train_on=train_on, autocast=autocast)
    return measure(f"{HERE / 'memory_models.py'}:{factory}", HERE, request).peak_bytes


def profiled(factory: str, optimizer: str, foreach: bool | None, autocast: torch.dtype | None = None) -> int:
    """The peak of the same step run on CPU, as PyTorch's memory profiler records it; with `autocast`, the
    forward and loss under torch.autocast("cpu", dtype=autocast)."""
    torch.manual_seed(0)
    made = normalize_factory_result(getattr(memory_models, factory)())
    model = made.model
    optim = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], foreach)

    def step():
        with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
            output = model(*made.args, **made.kwargs)
            loss = choose_loss(output, made.loss)
        loss.backward()
        if optim is not None:
            optim.step()

    step()  # the first step creates the optimizer's state
    model.zero_grad(set_to_none=True)
    with profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model.zero_grad(set_to_none=True)
        step()
    times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(at) for at in sizes)


def table() -> str:
    rows = ["| model | optimizer | estimate | profiler | error |", "|---|---|---:|---:|---:|"]
    for name, factory, optimizer in CASES:
        guess, real = estimated(factory, optimizer, "cpu"), profiled(factory, optimizer, None)
        rows.append(f"| {name} | {optimizer} | {guess / 2**20:.2f} MiB | {real / 2**20:.2f} MiB | "
                    f"{(guess - real) / real:+.2%} |")
    for name, factory, optimizer in FOREACH_CASES:
        guess, real = estimated(factory, optimizer, "cuda"), profiled(factory, optimizer, True)
        rows.append(f"| {name} | {optimizer}, foreach (as on CUDA) | {guess / 2**20:.2f} MiB | {real / 2**20:.2f} MiB | "
                    f"{(guess - real) / real:+.2%} |")
    for name, factory, optimizer in AUTOCAST_CASES:
        guess, real = estimated(factory, optimizer, "cpu", "bf16"), profiled(factory, optimizer, None, torch.bfloat16)
        rows.append(f"| {name} | {optimizer}, autocast bf16 | {guess / 2**20:.2f} MiB | {real / 2**20:.2f} MiB | "
                    f"{(guess - real) / real:+.2%} |")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.machine()} CPU, {platform.system()}, torch {torch.__version__}"
    return "\n".join(rows) + f"\n\nMeasured {when} on {machine} (`python benchmarks/memory_accuracy.py`).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="replace the table in docs/memory.md")
    args = parser.parse_args()
    text = table()
    print(text)
    if args.write_docs:
        docs = HERE.parent / "docs" / "memory.md"
        page = docs.read_text(encoding="utf-8")
        page = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}{END}", page, flags=re.S)
        docs.write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
