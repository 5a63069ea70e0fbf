"""What a fix is predicted to save (graphlint.costs, the `fix_saves` of `graphlint check --gpu`) against what it saves
for real, on this CPU.

    python benchmarks/fix_savings.py            # the table (a few minutes on 2 cores)

The models: every BAD example of the rules whose fix saving is modelled and that offer a fix (GL101, GL106, GL107,
GL204), each with its `fixed` source (the source after every fix, as the rule examples' tests prove it), and the
memory zoo's GPT against the same model with fused attention (GL101 on a model of a real size). For each:

- predicted: the finding's `fix_saves` on this CPU (its peaks measured for one thread, as `graphlint time --device
  cpu` prices a step: the findings of `graphlint check`, their lines priced from the step's ops), summed over the
  findings of that rule; and beside it the difference of the two predicted steps (original minus fixed);
- measured: in each of ROUNDS rounds, the median thread CPU time of REPEATS real training steps (AdamW, on one
  thread) of the original minus that of the fixed model, after WARMUP steps, original and fixed interleaved; the
  saving is the median round's, and it has a sign only when at least AGREE of the rounds agree on it (else it is
  within the noise: on these millisecond steps two copies of one model differ by a few percent).

Only the sign is claimed: the examples are small. Ratios only.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from graphlint.capture.loss import choose_loss  # noqa: E402
from graphlint.config import Config  # noqa: E402
from graphlint.costs import step_lines, with_costs  # noqa: E402
from graphlint.engine import load_rules  # noqa: E402
from graphlint.memory.measure import Request  # noqa: E402
from graphlint.memory.step import make_optimizer  # noqa: E402
from graphlint.project import Project  # noqa: E402
from graphlint.session import Options, check  # noqa: E402
from graphlint.target import normalize_factory_result  # noqa: E402
from graphlint.timing.devices import cpu_label, cpu_peaks  # noqa: E402
from graphlint.timing.measure import time_step  # noqa: E402

RULES = ("GL101", "GL106", "GL107", "GL204")
WARMUP, ROUNDS, REPEATS = 3, 21, 5
AGREE = 0.8  # the share of rounds whose saving has one sign for the measurement to have a sign
THREADS = 1


def cases() -> list[tuple[str, str, str, str]]:
    """(name, rule, original source, fixed source)."""
    found = []
    for rule in load_rules():
        if rule.id not in RULES:
            continue
        for number, example in enumerate(rule.bad_examples, start=1):
            if example.fixed_code:
                found.append((f"{rule.id} example {number}", rule.id, example.code, example.fixed_code))
    # one model of a real size: the memory zoo's GPT (4 layers, 128 wide, batch 8, 127 tokens), hand-written causal
    # attention against the same model with scaled_dot_product_attention(is_causal=True), the call GL101's fix writes
    zoo = (REPO / "benchmarks" / "memory_zoo_models.py").read_text(encoding="utf-8")
    found.append(("GL101, the memory zoo's GPT", "GL101", zoo + "\n\nmake = gpt\n",
                  zoo + "\n\nmake = gpt_fused_attention\n"))
    return found


def _model(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    made = normalize_factory_result(module.make())
    optimizer = make_optimizer("adamw", [p for p in made.model.parameters() if p.requires_grad], None)

    def step():
        made.model.zero_grad(set_to_none=True)
        loss = choose_loss(made.model(*made.args, **made.kwargs), made.loss)
        loss.backward()
        if optimizer is not None:
            optimizer.step()

    return step


def measured_saving(original: Path, fixed: Path) -> tuple[float, float, list[float]]:
    """(median thread seconds of the original's step, of the fixed one's, and each round's saving: the median of
    the original's REPEATS steps less the fixed one's), rounds interleaved."""
    steps = {"original": _model(original), "fixed": _model(fixed)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(WARMUP):
            step()
    rounds = []
    for _ in range(ROUNDS):
        medians = {}
        for name, step in steps.items():
            own = []
            for _ in range(REPEATS):
                started = time.thread_time()
                step()
                own.append(time.thread_time() - started)
            times[name] += own
            medians[name] = statistics.median(own)
        rounds.append(medians["original"] - medians["fixed"])
    return statistics.median(times["original"]), statistics.median(times["fixed"]), rounds


def predicted_saving(folder: Path, rule: str, peaks) -> tuple[float, float, float]:
    """(the findings' fix_saves summed, the predicted original step, the predicted fixed step) on this CPU."""
    project = Project.discover(folder)
    report = check(["original.py:make"], project, Config(select=(rule,)), Options(cache=None), folder)
    request = Request(train_on="cpu")
    step, records = time_step("original.py:make", folder, request, peaks, project.pythonpath)
    fixed, _ = time_step("fixed.py:make", folder, Request(train_on="cpu"), peaks, project.pythonpath)
    priced = with_costs([f for f in report.findings if f.rule_id == rule], step_lines(records, peaks, step))
    return sum(f.cost.saves or 0.0 for f in priced), step.seconds, fixed.seconds


def main() -> None:
    torch.set_num_threads(THREADS)
    peaks = cpu_peaks(THREADS)
    rows = []
    for name, rule, original, fixed in cases():
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            (folder / "pyproject.toml").write_text("[project]\nname = 'fixes'\n", encoding="utf-8")
            (folder / "original.py").write_text(original, encoding="utf-8")
            (folder / "fixed.py").write_text(fixed, encoding="utf-8")
            saves, before, after = predicted_saving(folder, rule, peaks)
            real_before, real_after, rounds = measured_saving(folder / "original.py", folder / "fixed.py")
        rows.append((name, saves, before - after, real_before, real_after, rounds))
        print(f"{name}: predicted {saves * 1e6:.1f} µs, measured {(real_before - real_after) * 1e6:.1f} µs",
              file=sys.stderr)
    print("| model | predicted saving (finding) | predicted (step - fixed step) | measured step | measured fixed "
          "| measured saving | measured share | rounds faster fixed | sign |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    right = unclear = 0
    for name, saves, difference, before, after, rounds in rows:
        saving = statistics.median(rounds)
        faster = sum(1 for r in rounds if r > 0)
        if max(faster, len(rounds) - faster) < AGREE * len(rounds):  # the rounds do not agree on a sign
            verdict = "within the noise"
            unclear += 1
        else:
            verdict = "right" if (saves > 0) == (faster > len(rounds) / 2) else "WRONG"
            right += verdict == "right"
        print(f"| {name} | {saves * 1e6:.1f} µs | {difference * 1e6:.1f} µs | {before * 1e3:.3f} ms | "
              f"{after * 1e3:.3f} ms | {saving * 1e6:.1f} µs | {saving / before:+.1%} | {faster} of {len(rounds)} | "
              f"{verdict} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{right} of {len(rows) - unclear} signs right; {unclear} measured savings within the noise (fewer than "
          f"{AGREE:.0%} of the rounds agree on their sign). Measured {datetime.date.today()} on {cpu_label()}, "
          f"{THREADS} thread, torch {torch.__version__}, load average {load}, {ROUNDS} rounds of {REPEATS} steps "
          f"each (`python benchmarks/fix_savings.py`).")


if __name__ == "__main__":
    main()
