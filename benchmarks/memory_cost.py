"""What `graphlint memory` costs against a plain `graphlint check` of the same target, whole processes, in one run.

    python benchmarks/memory_cost.py             # 3 repeats
    python benchmarks/memory_cost.py --repeat 5
    python benchmarks/memory_cost.py --scale     # the Llama-2-70B shape over 64 FSDP2 ranks, with --device-memory

For each target the two commands are interleaved (check, memory, check, memory, ...) so that drift in the
machine's speed hits both alike; the medians of wall time and of peak resident memory (from wait4) are printed
with the ratio memory/check. Both run without the result cache. The Llama-7B shape (benchmarks/models.py:llama_7b,
6.7B parameters) is measured by `memory` at sequence 4096 (`--seq 4096`), on the meta device like the check.

`--scale` times the command of docs/memory.md's distributed example, the Llama-2-70B shape
(benchmarks/memory_distributed.py:llama2_70b) as one rank of FSDP2 over 64 ranks with bfloat16 parameters: its
peak alone, and with `--device-memory 80GiB` (the peak and the largest batch), against `check --no-cache` of the
same target as it runs by default and without the torch.compile analysis (`--ignore GL301,GL302`, the check as it
was before those rules were on by default); the four commands one after the other, each round, the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = [
    ("GPT-2-small shape", f"{HERE / 'models.py'}:gpt2_small", []),
    ("Llama-7B shape, sequence 4096", f"{HERE / 'models.py'}:llama_7b", ["--seq", "4096"]),
]
SCALE = f"{HERE / 'memory_distributed.py'}:llama2_70b"
SCALE_MEMORY = ["--fsdp", "64", "--mixed-precision", "bf16"]


def run(command: list[str], cwd: str) -> tuple[float, float, float]:
    """Wall seconds, peak resident MiB and CPU seconds (its own and its children's) of one whole process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed")
    return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", action="store_true", help="the Llama-2-70B shape over 64 FSDP2 ranks")
    args = parser.parse_args()
    python = [sys.executable, "-m", "graphlint"]
    if args.scale:
        scale(python, args.repeat)
        return
    print("| target | check | memory | memory/check | check RSS | memory RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:  # no pyproject.toml above: no configuration, no cache reuse
        for name, target, options in TARGETS:
            checks, memories = [], []
            for _ in range(args.repeat):
                checks.append(run([*python, "check", "--no-cache", target], folder))
                memories.append(run([*python, "memory", "--no-cache", target, *options], folder))
            check_s, memory_s = (statistics.median(s for s, _, _ in runs) for runs in (checks, memories))
            check_m, memory_m = (statistics.median(m for _, m, _ in runs) for runs in (checks, memories))
            print(f"| {name} | {check_s:.2f} s | {memory_s:.2f} s | {memory_s / check_s:.2f} | {check_m:.0f} MiB | "
                  f"{memory_m:.0f} MiB |")


def scale(python: list[str], repeat: int) -> None:
    commands = {
        "check --no-cache": [*python, "check", "--no-cache", SCALE],
        "check --no-cache --ignore GL301,GL302": [*python, "check", "--no-cache", "--ignore", "GL301,GL302", SCALE],
        "memory (peak)": [*python, "memory", "--no-cache", SCALE, *SCALE_MEMORY],
        "memory --device-memory 80GiB": [*python, "memory", "--no-cache", SCALE, *SCALE_MEMORY, "--device-memory",
                                         "80GiB"],
    }
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(repeat):
            for name, command in commands.items():
                runs[name].append(run(command, folder))
                print(f"round {round_ + 1}: {name} {runs[name][-1][0]:.1f} s (load average "
                      f"{os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    # Wall time is what a user waits; CPU time (the command's processes, children included) is less swayed by
    # other work on a shared machine.
    wall = {name: statistics.median(s for s, _, _ in values) for name, values in runs.items()}
    cpu = {name: statistics.median(c for _, _, c in values) for name, values in runs.items()}
    first, second = list(commands)[:2]
    print(f"| command | wall (median of {repeat}) | / {first} | / {second} | CPU | / {first} | / {second} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in commands:
        print(f"| {name} | {wall[name]:.1f} s | {wall[name] / wall[first]:.2f} | {wall[name] / wall[second]:.2f} | "
              f"{cpu[name]:.1f} s | {cpu[name] / cpu[first]:.2f} | {cpu[name] / cpu[second]:.2f} |")

if __name__ == "__main__":
    main()
