"""How close `graphlint memory` comes to PyTorch's own memory profiler, on CPU, for small real models.

    python benchmarks/memory_accuracy.py              # print the table
    python benchmarks/memory_accuracy.py --write-docs # and put it in docs/memory.md
    python benchmarks/memory_accuracy.py --torchinfo  # also torchinfo's estimate (pip install torchinfo)

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
from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category, MemoryProfileTimeline

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
TORCHINFO_BEGIN, TORCHINFO_END = "<!-- memory-torchinfo:begin -->", "<!-- memory-torchinfo:end -->"


def estimated(factory: str, optimizer: str, train_on: str, autocast: str | None = None,
              module=memory_models, release_output: bool = False) -> int:
    """The peak `graphlint memory benchmarks/memory_models.py:FACTORY --optimizer OPTIMIZER --train-on TRAIN_ON`
    (and `--autocast AUTOCAST`, `--release-output`) reports; `module`: the file of the factory."""
    request = Request(optimizer=optimizer, train_on=train_on, autocast=autocast, release_output=release_output)
    return measure(f"{module.__file__}:{factory}", HERE, request).peak_bytes


def profiled(factory: str, optimizer: str, foreach: bool | None, autocast: torch.dtype | None = None,
             category: str | None = None, module=memory_models, release_output: bool = False) -> int:
    """The peak of the same step run on CPU, as PyTorch's memory profiler records it; with `autocast`, the
    forward and loss under torch.autocast("cpu", dtype=autocast); with `category` (a profiler category name such
    as "ACTIVATION"), the largest that category alone reaches; with `release_output`, the loop of a loss
    function that returns only the loss (the output is dropped before backward, as Hugging Face's Trainer
    does)."""
    torch.manual_seed(0)
    made = normalize_factory_result(getattr(module, factory)())
    model = made.model
    optim = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], foreach)

    def forward_and_loss():
        with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
            output = model(*made.args, **made.kwargs)
            return output, choose_loss(output, made.loss)

    def step():
        if release_output:
            loss = forward_and_loss()[1]
        else:
            output, loss = forward_and_loss()
        loss.backward()
        if optim is not None:
            optim.step()

    step()  # the first step creates the optimizer's state
    model.zero_grad(set_to_none=True)
    with profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model.zero_grad(set_to_none=True)
        step()
    timeline = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = timeline._coalesce_timeline("cpu")
    if category is None:
        return max(sum(at) for at in sizes)
    return max(at[_CATEGORY_TO_INDEX[Category[category]] + 1] for at in sizes)  # the profiler's own column


def torchinfo_sizes(factory: str) -> tuple[int, int]:
    """torchinfo's "Forward/backward pass size" and its "Estimated Total Size" for the model on its inputs, in
    bytes: what a user of `torchinfo.summary` is told (it counts no gradients and no optimizer state)."""
    import torchinfo

    torch.manual_seed(0)
    made = normalize_factory_result(getattr(memory_models, factory)())
    stats = torchinfo.summary(made.model, input_data=list(made.args), verbose=0, device="cpu", **made.kwargs)
    return stats.total_output_bytes, stats.total_input + stats.total_output_bytes + stats.total_param_bytes


def torchinfo_table() -> str:
    """For each model's AdamW step: the profiler's peak and activations, graphlint's estimate, torchinfo's."""
    rows = ["| model | profiler peak | graphlint | error | torchinfo total | error | profiler activations | "
            "torchinfo pass size |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    mib = 2**20
    for name, factory, optimizer in CASES:
        if optimizer != "adamw":
            continue
        real, guess = profiled(factory, optimizer, None), estimated(factory, optimizer, "cpu")
        activations = profiled(factory, optimizer, None, category="ACTIVATION")
        pass_size, total = torchinfo_sizes(factory)
        rows.append(f"| {name} | {real / mib:.2f} MiB | {guess / mib:.2f} MiB | {(guess - real) / real:+.1%} | "
                    f"{total / mib:.2f} MiB | {(total - real) / real:+.1%} | {activations / mib:.2f} MiB | "
                    f"{pass_size / mib:.2f} MiB |")
    return "\n".join(rows) + f"\n\n{_measured()} (`python benchmarks/memory_accuracy.py --torchinfo`).\n"


def _measured() -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"Measured {when} on {platform.machine()} CPU, {platform.system()}, torch {torch.__version__}"


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
    return "\n".join(rows) + f"\n\n{_measured()} (`python benchmarks/memory_accuracy.py`).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="replace the table(s) in docs/memory.md")
    parser.add_argument("--torchinfo", action="store_true", help="only the comparison with torchinfo's estimate")
    args = parser.parse_args()
    begin, end, text = (TORCHINFO_BEGIN, TORCHINFO_END, torchinfo_table()) if args.torchinfo else (BEGIN, END, table())
    print(text)
    if args.write_docs:
        docs = HERE.parent / "docs" / "memory.md"
        page = docs.read_text(encoding="utf-8")
        page = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{text}{end}", page, flags=re.S)
        docs.write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
