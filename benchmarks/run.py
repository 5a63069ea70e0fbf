"""graphlint against the floor and against torch._dynamo.explain, whole processes, in one run.

    python benchmarks/run.py              # every scenario, 5 repeats
    python benchmarks/run.py --repeat 9 --quick
    python benchmarks/run.py --only many  # the many-targets scenario alone
    python benchmarks/run.py --only server  # the language server alone (benchmarks/server.py)
    python benchmarks/run.py --only fix     # check --diff against check on the shipped example
    python benchmarks/run.py --only floor   # the floor table alone (GPT-2-small and Llama-7B shapes)
    python benchmarks/run.py --only plugin  # a generated test suite, plain and with pytest --graphlint

For each target the commands are interleaved (floor, graphlint, dynamo, floor, graphlint, ...) and repeated,
so that drift in the machine's speed hits all of them alike; the medians of wall time and of peak resident
memory (per process, from wait4) are printed with the ratios graphlint/floor and graphlint/dynamo. A second
table shows graphlint's time as the GPT-2 shape's batch and sequence grow, then a target whose findings point
into a library file of about 6,000 lines against the same target without findings, and the cached re-run.

The many-targets scenario measures whole runs over 12 small targets (each in its own folder with its own
`layers.py`) at -j 1 and -j 2, and over 6 `transformers` models, against one cold target of each kind in the
same run; the small ones also with `--ignore GL3` (the rules before GL301/GL302 were on by default), each against
one cold target checked the same way. Its memory is the peak of the whole process tree's proportional set size
(PSS, sampled every 20 ms): pages a forked child shares with the warm parent count once, split between them, not
once per process.

The fix scenario times `graphlint check --diff` on the shipped example (examples/attention/model.py:make_model,
whose GL101 fix is proven: the original and rewritten models run in float64 and the rewritten one is linted
again) against a plain `graphlint check` of it, in the same run.

The plugin scenario runs a generated suite of 36 small model tests (benchmarks/plugin_suite.py: 4 model classes
each built and trained by 8 tests at lines of their own, and a parametrized test with 4 more configurations: 8
distinct models) with `pytest` and with `pytest --graphlint`, in one process tree each, and prints the ratio.

The server scenario (benchmarks/server.py) times `graphlint server` from opening the GPT-2-small shape to its
first diagnostics, and from saving a change to the new diagnostics, against a cold `graphlint check` of it, with
GL301/GL302 off and on (then to the first and to the complete diagnostics).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from library_file import write_scenario  # noqa: E402  (beside this script)
from many_targets import write_small_targets, write_transformers_targets  # noqa: E402
from plugin_suite import write_suite  # noqa: E402
import server  # noqa: E402

MODELS = HERE / "models.py"
EXAMPLE = HERE.parent / "examples" / "attention" / "model.py"
PYTHON = sys.executable


def measure(command: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of one whole process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # graphlint exits 1 on findings
        raise SystemExit(f"{' '.join(command)} failed with exit status {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def measure_tree(command: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, peak MiB of the summed PSS of the process and all its descendants) of one run."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peak = 0
    while process.poll() is None:
        peak = max(peak, sum(_pss_kib(pid) for pid in _tree(process.pid)))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed with exit status {process.returncode}")
    return wall, peak / 1024


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_tree(commands: dict[str, list[str]], repeat: int) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, command in commands.items():
            samples[name].append(measure_tree(command))
    return {name: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
            for name, runs in samples.items()}


def many_targets(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        small = write_small_targets(Path(folder) / "small")
        hf = write_transformers_targets(Path(folder))

        def check(targets: list[str], jobs: int = 1, *more: str) -> list[str]:
            return [PYTHON, "-m", "graphlint", "check", *targets, "-j", str(jobs), "--no-cache", "--format", "sarif",
                    "--output", os.devnull, *more]

        # GL301/GL302 (on by default since 2026-11-28) compile every target; without them, the rules of before.
        medians = run_tree({"one small target": check(small[:1]), "12 small, -j 1": check(small),
                            "12 small, -j 2": check(small, 2),
                            "one small, GL3 off": check(small[:1], 1, "--ignore", "GL3"),
                            "12 small, -j 1, GL3 off": check(small, 1, "--ignore", "GL3"),
                            "one transformers": check(hf[:1]),
                            "6 transformers, -j 1": check(hf), "6 transformers, -j 2": check(hf, 2)}, repeat)
    print("\nmany targets, each in its own child of a warm parent (peak memory: PSS of the whole process tree)")
    base_small, base_hf = medians["one small target"], medians["one transformers"]
    for label, (wall, memory) in medians.items():
        base = base_hf if "transformers" in label else medians["one small, GL3 off"] if "GL3 off" in label \
            else base_small
        print(f"  {label:<22} {wall:>6.2f} s {memory:>8.0f} MiB   {ratio(wall, base[0])} time, {ratio(memory, base[1])} memory")


def measure_cpu(command: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak MiB of the tree's summed PSS, CPU seconds of every process of the tree) of one run. CPU
    is each process's own user and system time, last sampled every 20 ms (a process that outlives its parent, as
    graphlint's warm parent may, is counted too, which the rusage of waited children would miss)."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak, cpu = 0, {}
    while process.poll() is None:
        tree = _tree(process.pid)
        peak = max(peak, sum(_pss_kib(pid) for pid in tree))
        for pid in tree:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if process.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed with exit status {process.returncode}")
    return wall, peak / 1024, sum(cpu.values())


def plugin_overhead(repeat: int) -> None:
    """The generated suite plain and with --graphlint, interleaved: wall time, peak memory and CPU time, which a
    machine shared with other work changes less than the wall time."""
    with tempfile.TemporaryDirectory() as folder:
        project, tests, models = write_suite(Path(folder))
        pytest = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(project),
                  str(project / "tests")]
        commands = {"plain": pytest, "--graphlint": [*pytest, "--graphlint", "--graphlint-no-fail"]}
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        here = Path.cwd()
        os.chdir(project)  # the plugin finds the project from where pytest starts
        try:
            for _ in range(repeat):
                for name, command in commands.items():
                    samples[name].append(measure_cpu(command))
        finally:
            os.chdir(here)
    medians = {name: tuple(statistics.median(s[i] for s in runs) for i in range(3)) for name, runs in samples.items()}
    print(f"\npytest --graphlint on a generated suite ({tests} tests, {models} distinct models)")
    for label, (wall, memory, cpu) in medians.items():
        print(f"  {label:<12} {wall:>6.2f} s {memory:>8.0f} MiB {cpu:>7.2f} s CPU")
    print(f"  ratio        {ratio(medians['--graphlint'][0], medians['plain'][0])} time, "
          f"{ratio(medians['--graphlint'][2], medians['plain'][2])} CPU")


def fix_proof(repeat: int) -> None:
    target = f"{EXAMPLE}:make_model"
    medians = run({"check": graphlint(target), "check --diff": graphlint(target) + ["--diff"]}, repeat)
    print("\nproving a fix: check --diff on the shipped example against a plain check")
    for label, (wall, memory) in medians.items():
        print(f"  {label:<13} {wall:>6.2f} s {memory:>8.0f} MiB")
    print(f"  ratio         {ratio(medians['check --diff'][0], medians['check'][0])} time")


def floor(target: str) -> list[str]:
    return [PYTHON, str(HERE / "floor.py"), target]


def graphlint(target: str, cache: Path | None = None) -> list[str]:
    command = [PYTHON, "-m", "graphlint", "check", target, "--format", "sarif", "--output", os.devnull]
    return command + (["--cache-dir", str(cache)] if cache else ["--no-cache"])


def dynamo(target: str) -> list[str]:
    return [PYTHON, str(HERE / "dynamo_explain.py"), target]


def run(commands: dict[str, list[str]], repeat: int, env: dict | None = None) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, command in commands.items():
            samples[name].append(measure(command, env))
    return {name: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
            for name, runs in samples.items()}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="skip the 7B target and the size sweep")
    parser.add_argument("--only", choices=("many", "server", "fix", "floor", "plugin"), help="run only this scenario")
    options = parser.parse_args()
    print(f"graphlint benchmark, {date.today()}, {platform.machine()} {platform.processor() or ''} "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, median of {options.repeat}")
    if options.only == "many":
        many_targets(options.repeat)
        return
    if options.only == "server":
        server.measure(options.repeat)
        return
    if options.only == "fix":
        fix_proof(options.repeat)
        return
    if options.only == "plugin":
        plugin_overhead(options.repeat)
        return
    targets = {"gpt2-small (12 x 768, batch 2, seq 128)": "gpt2_small"}
    if not options.quick:
        targets["llama-7b (32 x 4096, batch 1, seq 128)"] = "llama_7b"
    print("\ntarget                                    command      wall s   peak MiB   vs floor (time, mem)   vs dynamo")
    for title, name in targets.items():
        target = f"{MODELS}:{name}"
        commands = {"floor": floor(target), "graphlint": graphlint(target)}
        if name != "llama_7b":  # 27 GB of float32 weights: only the meta device can hold it here
            commands["dynamo"] = dynamo(target)
        medians = run(commands, options.repeat)
        lint_wall, lint_mem = medians["graphlint"]
        floor_wall, floor_mem = medians["floor"]
        for command, (wall, memory) in medians.items():
            versus_floor = f"{ratio(wall, floor_wall)}, {ratio(memory, floor_mem)}" if command == "graphlint" else ""
            versus_dynamo = ratio(lint_wall, medians["dynamo"][0]) if command == "graphlint" and "dynamo" in medians else ""
            print(f"{title:<41} {command:<10} {wall:>8.2f} {memory:>10.0f}   {versus_floor:<22} {versus_dynamo}")
        if "dynamo" not in medians:
            print(f"{title:<41} {'dynamo':<10}  skipped: the float32 weights do not fit in this machine's memory")
    if options.only == "floor":
        return
    if not options.quick:
        print("\ngraphlint on the GPT-2 shape as the input grows (cost should follow ops, not tensor sizes)")
        sizes = {"batch 1, seq 128": "gpt2_small_batch1", "batch 2, seq 128": "gpt2_small",
                 "batch 64, seq 128": "gpt2_small_batch64", "batch 2, seq 2048": "gpt2_small_seq2048"}
        medians = run({label: graphlint(f"{MODELS}:{name}") for label, name in sizes.items()}, options.repeat)
        for label, (wall, memory) in medians.items():
            print(f"  {label:<20} {wall:>6.2f} s {memory:>8.0f} MiB")
    with tempfile.TemporaryDirectory() as folder:
        site, with_findings, without_findings = write_scenario(Path(folder))
        env = {**os.environ, "PYTHONPATH": str(site)}
        medians = run({"findings": graphlint(with_findings), "none": graphlint(without_findings)}, options.repeat, env)
        print("\nfindings inside a 6,000-line library file (8 layers of hand-written attention) against the same "
              "model with fused attention")
        for label, (wall, memory) in medians.items():
            print(f"  {label:<10} {wall:>6.2f} s {memory:>8.0f} MiB")
        print(f"  ratio      {ratio(medians['findings'][0], medians['none'][0])} time")
    with tempfile.TemporaryDirectory() as cache:
        target = f"{MODELS}:gpt2_small"
        measure(graphlint(target, Path(cache)))  # fills the cache
        wall, memory = run({"cached": graphlint(target, Path(cache))}, options.repeat)["cached"]
        print(f"\ngraphlint re-run with nothing changed (result cache): {wall:.2f} s, {memory:.0f} MiB")
    many_targets(options.repeat)
    plugin_overhead(options.repeat)
    fix_proof(options.repeat)
    server.measure(options.repeat)


if __name__ == "__main__":
    main()
