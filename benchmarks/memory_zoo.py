"""The held-out zoo: `graphlint memory` against PyTorch's CPU memory profiler on models it was not built with.

    python benchmarks/memory_zoo.py                 # print the table (a few minutes on 2 cores)
    python benchmarks/memory_zoo.py --only lstm     # the rows whose factory contains "lstm"
    python benchmarks/memory_zoo.py --write-docs    # and put it in docs/memory.md and the README
    python benchmarks/memory_zoo.py --audit         # the kernel audit over the zoo and memory_models.py

One row per model of benchmarks/memory_zoo_models.py: the estimate (`--train-on cpu`, built on the meta device
as the command builds it), the profiler's peak of the same steady-state step run for real on CPU (as
benchmarks/memory_accuracy.py measures it), and the error; then the median and the worst error. A model is never
changed to make its row agree.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_accuracy  # noqa: E402
import memory_zoo_models  # noqa: E402

BEGIN, END = "<!-- memory-zoo:begin -->", "<!-- memory-zoo:end -->"
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def row(factory: str, optimizer: str, autocast: str | None) -> tuple[int, int]:
    """(estimate, profiler's peak) in bytes for one zoo model."""
    guess = memory_accuracy.estimated(factory, optimizer, "cpu", autocast, module=memory_zoo_models)
    real = memory_accuracy.profiled(factory, optimizer, None, AUTOCAST.get(autocast), module=memory_zoo_models)
    return guess, real


def table(only: str | None = None) -> str:
    rows = ["| model | optimizer | estimate | profiler | error |", "|---|---|---:|---:|---:|"]
    errors = []
    for name, factory, optimizer, autocast in memory_zoo_models.ZOO:
        if only and only not in factory:
            continue
        started = time.perf_counter()
        try:
            guess, real = row(factory, optimizer, autocast)
        except Exception as error:  # a failure is a row of the table, not the end of the benchmark
            rows.append(f"| {name} | {optimizer} | failed: {str(error).splitlines()[0][:80]} | | |")
            errors.append(float("inf"))
            continue
        error = (guess - real) / real
        errors.append(abs(error))
        extra = f", autocast {autocast}" if autocast else ""
        rows.append(f"| {name} | {optimizer}{extra} | {guess / 2**20:.2f} MiB | {real / 2**20:.2f} MiB | "
                    f"{error:+.2%} |")
        print(rows[-1], f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    within = sum(1 for e in errors if e <= 0.05)
    summary = (f"{len(errors)} models: {within} within 5%, median error {statistics.median(errors):.2%}, worst "
               f"{max(errors):.2%}." if errors else "no rows")
    return "\n".join(rows) + f"\n\n{summary} {memory_accuracy._measured()} (`python benchmarks/memory_zoo.py`).\n"


def audit_all(only: str | None = None) -> int:
    """The kernel audit (graphlint.memory.audit) over every zoo model and the accuracy check's models; the
    number of findings, each printed."""
    import memory_models

    from graphlint.memory.audit import audit
    from graphlint.target import normalize_factory_result

    models = [(memory_zoo_models, factory) for _, factory, _, _ in memory_zoo_models.ZOO]
    models += [(memory_models, f.__name__) for f in memory_models.MODELS.values()]
    total = 0
    for module, factory in models:
        if only and only not in factory:
            continue
        torch.manual_seed(0)
        made = normalize_factory_result(getattr(module, factory)())
        findings = audit(made.model, made.args, made.kwargs, made.loss)
        total += len(findings)
        print(f"{module.__name__}:{factory}: {'passes' if not findings else f'{len(findings)} findings'}", flush=True)
        for finding in findings:
            print(f"    {finding}", flush=True)
    print(f"{total} findings")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only the rows whose factory name contains this")
    parser.add_argument("--write-docs", action="store_true", help="replace the table in docs/memory.md and README.md")
    parser.add_argument("--audit", action="store_true", help="run the kernel audit instead of the table")
    args = parser.parse_args()
    if args.audit:
        sys.exit(1 if audit_all(args.only) else 0)
    text = table(args.only)
    print(text)
    if args.write_docs:
        for page in (HERE.parent / "docs" / "memory.md", HERE.parent / "README.md"):
            content = page.read_text(encoding="utf-8")
            content = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}{END}", content,
                             flags=re.S)
            page.write_text(content, encoding="utf-8")


if __name__ == "__main__":
    main()
