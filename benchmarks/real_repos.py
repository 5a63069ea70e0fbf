"""Run real repositories' own test suites with and without `pytest --graphlint`, and print a table.

For each checkout this runs, in the checkout's folder and with the Python that runs this script:

    python -m pytest -q -p no:cacheprovider -n 0 [TESTS]                      (plain)
    python -m pytest -q -p no:cacheprovider -n 0 [TESTS] --graphlint \\
        --graphlint-no-fail --graphlint-output <tmp>/graphlint.json --graphlint-format json

and prints, per repository: its commit, the tests passed/failed in each run, the wall time of each run, the
seconds the plugin added, split into what it added inside the tests (the sum of pytest's `--durations`: the
recording of each model's first call) and after them (the lint when the session ends), the test it slowed
most (the plugin should make no test slower), and the findings (rule, path:line).

Usage:

    .venv/bin/python benchmarks/real_repos.py CHECKOUT[::TESTS] ... [--json FILE] [--repeat N]

`CHECKOUT` is a folder with the repository (a git checkout: its commit is read with `git rev-parse HEAD`);
`::TESTS` optionally gives pytest arguments, comma-separated: test paths inside it, or a selection such as
`-k,not pretrained` (default: pytest's own discovery).
The repository's dependencies must be installed in this Python; the repository itself need not be (pytest's
rootdir-relative imports or its `pythonpath` setting find it). `--repeat N` runs each command N times and
keeps the fastest (the machine may be shared). `--json FILE` also writes the rows as JSON. Example:

    .venv/bin/python benchmarks/real_repos.py /tmp/realrepos/local-attention \\
        /tmp/realrepos/ncps::ncps/tests/test_torch.py
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|xfailed|xpassed)")
_DURATION = re.compile(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)", re.MULTILINE)


def _pytest(checkout: Path, tests: list[str], extra: list[str]) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
               "--durations=0", "--durations-min=0", *tests, *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    counts: dict[str, int] = {}
    for number, word in _SUMMARY.findall(done.stdout.splitlines()[-1] if done.stdout.strip() else ""):
        counts[word.rstrip("s") if word != "errors" else "error"] = int(number)
    durations: dict[str, float] = {}
    for value, _phase, test in _DURATION.findall(done.stdout):
        durations[test] = durations.get(test, 0.0) + float(value)
    return {"returncode": done.returncode, "seconds": seconds, "counts": counts, "durations": durations,
            "tail": "\n".join((done.stdout + done.stderr).splitlines()[-15:])}


def run_repository(spec: str, repeat: int = 1) -> dict:
    folder, _, tests_text = spec.partition("::")
    checkout = Path(folder).resolve()
    tests = [t for t in tests_text.split(",") if t]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                            text=True).stdout.strip() or "?"
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "graphlint.json"
        plain = min((_pytest(checkout, tests, []) for _ in range(repeat)), key=lambda r: r["seconds"])
        linted = min((_pytest(checkout, tests, ["--graphlint", "--graphlint-no-fail", "--graphlint-output",
                                                str(report), "--graphlint-format", "json"])
                      for _ in range(repeat)), key=lambda r: r["seconds"])
        data = json.loads(report.read_text()) if report.exists() else None
    slower = sorted(((linted["durations"][t] - plain["durations"][t], t) for t in plain["durations"]
                     if t in linted["durations"]), reverse=True)
    return {
        "repository": checkout.name, "commit": commit, "tests": tests,
        "plain": {k: plain[k] for k in ("returncode", "seconds", "counts")},
        "graphlint": {k: linted[k] for k in ("returncode", "seconds", "counts")},
        "added_seconds": linted["seconds"] - plain["seconds"],
        # the tests' own time (pytest's --durations, all phases) in each run; what the plugin added outside
        # the tests is its lint when the session ends (and its start-up)
        "tests_seconds": {"plain": sum(plain["durations"].values()), "graphlint": sum(linted["durations"].values())},
        "most_slowed_test": slower[0] if slower else None,
        "report_written": data is not None,
        "targets": data["summary"]["targets"] if data else None,
        "findings": [{"rule": f["rule"], "path": f["location"]["path"], "line": f["location"]["line"],
                      "message": f["message"], "targets": f["targets"]} for f in (data or {}).get("findings", [])],
        "errors": (data or {}).get("errors", []),
        "notes": (data or {}).get("notes", []),
        "internal_failures": (data or {}).get("internal_failures", []),
        "tail": linted["tail"] if data is None or linted["returncode"] not in (0, 1) else "",
    }


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "-"


def print_table(rows: list[dict]) -> None:
    print("| repository | commit | tests (plain) | tests (--graphlint) | plain s | --graphlint s | added s "
          "| in tests s | after tests s | targets | findings |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        findings = ", ".join(f"{f['rule']} {f['path']}:{f['line']}" for f in r["findings"]) or "none"
        in_tests = r["tests_seconds"]["graphlint"] - r["tests_seconds"]["plain"]
        print(f"| {r['repository']} | {r['commit'][:10]} | {_counts(r['plain']['counts'])} "
              f"| {_counts(r['graphlint']['counts'])} | {r['plain']['seconds']:.1f} "
              f"| {r['graphlint']['seconds']:.1f} | {r['added_seconds']:+.1f} | {in_tests:+.1f} "
              f"| {r['added_seconds'] - in_tests:+.1f} | {r['targets']} | {findings} |")
    for r in rows:
        if r["most_slowed_test"]:
            delta, test = r["most_slowed_test"]
            print(f"{r['repository']}: most slowed test {test} ({delta:+.2f} s)")
        for item in r["errors"] + r["internal_failures"]:
            print(f"{r['repository']}: error: {item}")
        for note in r["notes"]:
            print(f"{r['repository']}: note: {note}")
        if r["tail"]:
            print(f"{r['repository']}: no report; the run ended with:\n{r['tail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", metavar="CHECKOUT[::TESTS]")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--repeat", type=int, default=1, help="run each command N times, keep the fastest")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.checkouts:
        rows.append(run_repository(spec, args.repeat))
        row = rows[-1]
        print(f"done: {row['repository']} plain {row['plain']['seconds']:.1f} s, --graphlint "
              f"{row['graphlint']['seconds']:.1f} s", file=sys.stderr, flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
