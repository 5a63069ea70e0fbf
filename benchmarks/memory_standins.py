"""The meta device's stand-ins against PyTorch's CPU memory profiler, one row per model of
benchmarks/memory_standin_models.py (autocast in the forward, nn.MultiheadAttention, the CPU's fused attention
and its layouts, fused attention under a checkpoint).

    python benchmarks/memory_standins.py                       # this tree's graphlint
    PYTHONPATH=/path/to/other/checkout python benchmarks/memory_standins.py   # another's, for a before/after

Each row: the estimate as `graphlint memory FACTORY --train-on cpu` makes it (built on meta; a step that fails
there runs on CPU, and the row says so), the profiler's peak of the same step run for real on CPU (as
benchmarks/memory_accuracy.py measures it; under torch.autocast("cpu") for the --autocast row), and the error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_accuracy  # noqa: E402
import memory_standin_models  # noqa: E402

import graphlint  # noqa: E402
from graphlint.memory.measure import Request, measure  # noqa: E402

# (table name, factory, --autocast)
ROWS = [
    ("residual MLP, forward under torch.autocast(\"cpu\", bf16)", "autocast_with", None),
    ("the same, @torch.autocast on a method", "autocast_decorator", None),
    ("the same, torch.amp.autocast", "autocast_amp", None),
    ("ViT of nn.TransformerEncoderLayer, no dropout", "encoder_vit", None),
    ("the same ViT frozen in eval (fast path on CPU), head trained", "frozen_encoder", None),
    ("3 × nn.MultiheadAttention, need_weights=False", "mha_without_weights", None),
    ("3 × nn.MultiheadAttention, need_weights=True", "mha_with_weights", None),
    ("decoder, queries concatenated heads first (Phi, GPT-NeoX)", "decoder_concatenated_queries", None),
    ("GPT-NeoX (transformers), rotary on a quarter of each head", "hf_gpt_neox", None),
    ("Phi (transformers), rotary on half of each head", "hf_phi", None),
    ("the decoder, SDPA under non-reentrant checkpoint", "decoder_checkpointed_attention", None),
    ("the checkpointed decoder with --autocast bf16", "decoder_checkpointed_attention", "bf16"),
]


def row(name: str, factory: str, autocast: str | None) -> str:
    request = Request(optimizer="adamw", train_on="cpu", autocast=autocast)
    try:
        result = measure(f"{memory_standin_models.__file__}:{factory}", HERE, request)
    except Exception as error:  # a failure is a row of the table
        return f"| {name} | failed: {str(error).splitlines()[0][:90]} | | |"
    real = memory_accuracy.profiled(factory, "adamw", None, torch.bfloat16 if autocast else None,
                                    module=memory_standin_models)
    where = "" if result.device == "meta" else f" (on {result.device})"
    return (f"| {name} | {result.peak_bytes / 2**20:.2f} MiB{where} | {real / 2**20:.2f} MiB | "
            f"{(result.peak_bytes - real) / real:+.2%} |")


def main() -> None:
    print(f"graphlint from {Path(graphlint.__file__).parent.parent}", file=sys.stderr)
    print("| model | estimate | profiler | error |\n|---|---:|---:|---:|")
    for name, factory, autocast in ROWS:
        print(row(name, factory, autocast), flush=True)
    print(f"\n{memory_accuracy._measured()} (`python benchmarks/memory_standins.py`).")


if __name__ == "__main__":
    main()
