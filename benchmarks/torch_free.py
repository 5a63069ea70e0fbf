"""What commands that list, explain, refuse or answer from the cache cost, against `graphlint --version` run by the
same interpreter: each command as a whole process, interleaved, medians.

    python benchmarks/torch_free.py --repeat 5 [--python OTHER/.venv/bin/python ...]

Each `--python` is an environment with graphlint installed (another checkout's, to compare with it); the default
is this one's. The model is examples/attention/model.py:make_model, measured once per environment first so that
`memory` is answered from a result cache of its own.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "attention"
COMMANDS = {
    "--version": ["--version"],
    "rules": ["rules"],
    "rule GL101": ["rule", "GL101"],
    "check of a missing file": ["check", "missing.py:make_model"],
    "check of a missing name": ["check", "model.py:make_mdoel"],
    "memory, cached": ["memory", "model.py:make_model"],
}


def timed(python: str, args: list[str], cache: str) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-m", "graphlint", *args, *(["--cache-dir", cache] if args[0] in ("check", "memory")
                                                       else [])],
                   cwd=EXAMPLE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", action="append", default=[], help="an environment's python (default: this one)")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory() as folder:
        caches = {python: str(Path(folder) / str(n)) for n, python in enumerate(pythons)}
        for python in pythons:  # the estimate the cached runs are answered with
            timed(python, COMMANDS["memory, cached"], caches[python])
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeat):
            for name, command in COMMANDS.items():
                for python in pythons:
                    times.setdefault((python, name), []).append(timed(python, command, caches[python]))
    for python in pythons:
        print(python)
        floor = statistics.median(times[(python, "--version")])
        for name in COMMANDS:
            median = statistics.median(times[(python, name)])
            print(f"  {name:<26} {median:6.2f} s  {median / floor:5.2f}x --version")
    return 0


if __name__ == "__main__":
    sys.exit(main())
