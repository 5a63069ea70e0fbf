"""How `graphlint time` compares with the real thing, on CPU: its FLOPs against FlopCounterMode's, and its
predicted `--cpu` step time against the measured step.

    python benchmarks/time_accuracy.py                  # both tables (several minutes on 2 cores)
    python benchmarks/time_accuracy.py --only gpt       # the rows whose factory contains "gpt"
    python benchmarks/time_accuracy.py --write-docs     # and put them in docs/time.md

Models: the memory zoo (benchmarks/memory_zoo_models.py, with its optimizers and autocast), the transformers zoo
(benchmarks/transformers_zoo.py, AdamW), benchmarks/models.py's GPT-2 small at batch 1 and 2 (its other models
do not run a real step on this machine) and benchmarks/time_zoo.py's models of classes the others lack (added
after the time model was built). Each row is one target, as `graphlint time --cpu` times it
(built on the meta device, `--train-on cpu`), against the same steady-state step run for real on CPU: the
optimizer's state made by a first step, then zero_grad(set_to_none=True), forward, loss, backward, optimizer step.

- FLOPs: graphlint's count against `FlopCounterMode` over the real step, given the CPU attention kernel under
  torch's own attention formula (graphlint.timing.record.flop_counter_mapping; torch's registry has no entry for
  it and counts 0 for attention on CPU).
- Seconds: the prediction against the median of REPEATS real steps after WARMUP, on one thread (the CPU's peaks
  measured for one thread by graphlint.timing.devices.measure_cpu at the start of the same run, and each op call
  timed by graphlint.timing.replay into a cache folder of this run's own, neither read from the user's cache, so
  that the prediction and the steps are measured under the same load). Beside it, the step priced by the
  roofline alone (no op call timed). On a machine other work shares, wall time counts the time other processes
  take the core; the table gives the thread's own CPU time (time.thread_time) as the measured step, and the
  wall-clock median beside it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import memory_zoo_models  # noqa: E402

from graphlint.capture.loss import choose_loss  # noqa: E402
from graphlint.memory.measure import Request  # noqa: E402
from graphlint.memory.step import make_optimizer  # noqa: E402
from graphlint.target import normalize_factory_result  # noqa: E402
from graphlint.timing.devices import measure_cpu  # noqa: E402
from graphlint.timing.measure import record  # noqa: E402
from graphlint.timing.record import flop_counter_mapping  # noqa: E402
from graphlint.timing.replay import timed_records  # noqa: E402
from graphlint.timing.roofline import price  # noqa: E402

WARMUP, REPEATS = 2, 7
THREADS = 1
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
BEGIN, END = "<!-- time-accuracy:begin -->", "<!-- time-accuracy:end -->"


def cases() -> list[tuple[str, str, str, str | None]]:
    """(file, factory, optimizer, autocast) for every row."""
    rows = [("memory_zoo_models.py", factory, optimizer, autocast)
            for _, factory, optimizer, autocast in memory_zoo_models.ZOO]
    import transformers_zoo

    rows += [("transformers_zoo.py", name, "adamw", None) for name in transformers_zoo.ARCHITECTURES]
    rows += [("models.py", name, "adamw", None) for name in ("gpt2_small_batch1", "gpt2_small")]
    import time_zoo

    rows += [("time_zoo.py", name, "adamw", None) for name in time_zoo.FACTORIES]
    return rows


def real_step(file: str, factory: str, optimizer: str, autocast: str | None) -> tuple[int, float, float]:
    """(FlopCounterMode's FLOPs, median thread seconds, median wall seconds) of the step run for real on CPU."""
    module = __import__(file.removesuffix(".py"))
    torch.manual_seed(0)
    made = normalize_factory_result(getattr(module, factory)())
    model = made.model
    optim = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], None)
    dtype = AUTOCAST.get(autocast)

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False):
            output = model(*made.args, **made.kwargs)
            loss = choose_loss(output, made.loss)
        loss.backward()
        if optim is not None:
            optim.step()

    for _ in range(WARMUP):
        step()
    with FlopCounterMode(display=False, custom_mapping=flop_counter_mapping()) as counter:
        step()
    own, wall = [], []
    for _ in range(REPEATS):
        started, started_own = time.perf_counter(), time.thread_time()
        step()
        wall.append(time.perf_counter() - started)
        own.append(time.thread_time() - started_own)
    return counter.get_total_flops(), statistics.median(own), statistics.median(wall)


def table(only: str | None = None) -> tuple[str, str]:
    """The FLOPs table and the seconds table, as markdown."""
    torch.set_num_threads(THREADS)
    device = measure_cpu(THREADS)  # measured now, not read from the cache: peaks and steps under the same load
    flops_rows = ["| model | graphlint | FlopCounterMode | equal |", "|---|---:|---:|---|"]
    time_rows = ["| model | predicted | measured (thread) | ratio | roofline only | measured (wall) |",
                 "|---|---:|---:|---:|---:|---:|"]
    equal, ratios, roofline = [], [], []
    replays = tempfile.mkdtemp(prefix="graphlint-op-times-")  # timed now, as the peaks are, not read from a cache
    for file, factory, optimizer, autocast in cases():
        if only and only not in factory:
            continue
        name = f"{file.removesuffix('.py')}:{factory}" + (f" ({autocast})" if autocast else "")
        started = time.perf_counter()
        try:
            request = Request(optimizer=optimizer, train_on="cpu", autocast=autocast)
            recording = record(f"{HERE / file}:{factory}", HERE, request, calls=True)
            records = recording.records
            timed, _ = timed_records(records, THREADS, Path(replays))
            step = price(timed, device, factory, recording.parameters)
            plain = price(records, device, factory, recording.parameters)
            flops, own, wall = real_step(file, factory, optimizer, autocast)
        except Exception as error:  # a failure is a row, not the end of the benchmark
            message = str(error).splitlines()[0][:90] if str(error) else type(error).__name__
            flops_rows.append(f"| {name} | failed: {message} | | |")
            time_rows.append(f"| {name} | failed | | | | |")
            print(flops_rows[-1], file=sys.stderr, flush=True)
            continue
        same = step.flops == flops
        equal.append(same)
        ratio = step.seconds / own
        ratios.append(ratio)
        roofline.append(plain.seconds / own)
        flops_rows.append(f"| {name} | {step.flops:,} | {flops:,} | {'yes' if same else 'NO'} |")
        time_rows.append(f"| {name} | {step.seconds * 1e3:.2f} ms | {own * 1e3:.2f} ms | {ratio:.2f} | "
                         f"{roofline[-1]:.2f} | {wall * 1e3:.2f} ms |")
        print(time_rows[-1], flops_rows[-1].split("|")[-2], f"({time.perf_counter() - started:.1f} s)",
              file=sys.stderr, flush=True)
    within = sum(1 for r in ratios if 0.75 <= r <= 1.25)
    within_roofline = sum(1 for r in roofline if 0.75 <= r <= 1.25)
    load = os.getloadavg()
    when = (f"Measured {datetime.date.today()} on {device.label}, {THREADS} thread, torch {torch.__version__}, "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores (a machine "
            "other work shares), one run (`python benchmarks/time_accuracy.py`).")
    flops_text = "\n".join(flops_rows) + (f"\n\n{sum(equal)} of {len(equal)} models: graphlint's FLOPs equal "
                                          f"FlopCounterMode's. {when}\n")
    summary = (f"\n\n{len(ratios)} models: {within} within 25% of the measured step ({within / max(len(ratios), 1):.0%});"
               f" median ratio {statistics.median(ratios) if ratios else float('nan'):.2f}, "
               f"{sum(1 for r in ratios if r < 1)} predicted faster than measured; by the roofline alone (no op "
               f"timed on this CPU) {within_roofline} within 25%, median ratio "
               f"{statistics.median(roofline) if roofline else float('nan'):.2f}. {when}\n")
    return flops_text, "\n".join(time_rows) + summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only the rows whose factory contains this")
    parser.add_argument("--write-docs", action="store_true", help="put the tables in docs/time.md")
    args = parser.parse_args()
    flops_text, time_text = table(args.only)
    print(flops_text)
    print(time_text)
    if args.write_docs:
        docs = HERE.parent / "docs" / "time.md"
        text = docs.read_text(encoding="utf-8")
        block = f"{BEGIN}\n{flops_text}\n{time_text}{END}"
        docs.write_text(re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S),
                        encoding="utf-8")
    print(platform.platform(), file=sys.stderr)


if __name__ == "__main__":
    main()
