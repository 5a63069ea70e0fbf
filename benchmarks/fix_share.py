"""The share of GL101 and GL201 findings that get a proven fix, on the held-out model modules.

    .venv/bin/python benchmarks/fix_share.py                       # every module under benchmarks/heldout/
    .venv/bin/python benchmarks/fix_share.py --only fairseq_mha --only yolov5_detect
    .venv/bin/python benchmarks/fix_share.py --json rows.json      # also write the rows and totals as JSON
    .venv/bin/python benchmarks/fix_share.py --graphlint /path/to/venv/bin/graphlint

`benchmarks/heldout/` holds one self-contained module per public repository's style (fairseq, OpenNMT-py,
whisper, stable-diffusion's ldm, SAM, GPT-NeoX, ...), none of them used by graphlint's tests; each has a
`make_model()` factory and module constants `STYLE`, `REPOSITORY` and, for modules whose attention is already
fused, `FUSED = True` (a GL101 there is a false alarm). docs/heldout-fixes.md has the figures and the judgment
of every finding.

What it measures, per module: the GL101 and GL201 findings of `graphlint check --format json` (with their
`fix` and `no_fix`), then which of those fixes `graphlint check --diff` proves on the model (the proof
`--fix` runs: same outputs and gradients in float64, the finding gone) and, for the others, the reason it
prints (`fix not applied: ...`). A finding counts as "proven" when its fix is offered, declared safe, and the
diff run does not refuse it; "proven, unsafe" when the fix is declared unsafe (applied only with
--unsafe-fixes: it stops calling a module whose hooks would stop firing, say) and its proof passed all the
same; "unsafe, differs" when it is declared unsafe and its model runs but computes something else somewhere
(a fully masked row); every other finding is left with its reason: the JSON `no_fix`, or the proof's
refusal. The share is (proven + proven, unsafe) / found, for GL101 and GL201 separately, with the safe part
given beside it.

Robust and deterministic by construction: each module is copied alone into a fresh temporary folder with an
empty pyproject.toml (so no project configuration, cache or virtual environment of a checkout takes part),
linted with only GL101 and GL201 selected, with PYTHONHASHSEED=0, modules in name order, findings in line
order. Nothing is read from the checkout but the modules and the graphlint executable (by default the one
beside this Python, `--graphlint` to name another). A module whose `--diff` run reports a number of applied
fixes other than the findings counted as proven is marked as an error (the messages this script reads changed
shape). Exit code 0 unless a module could not be linted or was so marked (1); a module that times out
(`--timeout`, per graphlint run) is such an error and the others are still measured.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RULES = ("GL101", "GL201")
HERE = Path(__file__).resolve().parent
_REFUSED = re.compile(r"^graphlint: (?P<path>.+?):(?P<line>\d+): (?P<rule>GL\d+) fix not applied"
                      r"(?P<never>, even with --unsafe-fixes)?: (?P<reason>.*?)"
                      r"(?: \(--unsafe-fixes applies it\))?$")
_NOTE = re.compile(r"^graphlint: (?P<path>.+?):(?P<line>\d+): (?P<rule>GL\d+) fix (?P<note>proven .*)$")
_APPLIED = re.compile(r"^graphlint: (?P<count>\d+) fix(?:es)? would be applied$")


def module_facts(path: Path) -> dict:
    """STYLE, REPOSITORY and FUSED from the module's top-level assignments, read without importing it."""
    facts = {"STYLE": path.stem, "REPOSITORY": "?", "FUSED": False}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in facts:
                try:
                    facts[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return facts


def _run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GRAPHLINT_")}
    env["PYTHONHASHSEED"] = "0"
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def measure(path: Path, graphlint: str, timeout: float) -> dict:
    try:
        return _measure(path, graphlint, timeout)
    except subprocess.TimeoutExpired as error:
        facts = module_facts(path)
        return {"module": path.stem, "style": facts["STYLE"], "repository": facts["REPOSITORY"],
                "fused": bool(facts["FUSED"]), "findings": [], "error": f"timed out after {error.timeout} s",
                "seconds": error.timeout}


def _measure(path: Path, graphlint: str, timeout: float) -> dict:
    facts = module_facts(path)
    row = {"module": path.stem, "style": facts["STYLE"], "repository": facts["REPOSITORY"],
           "fused": bool(facts["FUSED"]), "findings": [], "error": None, "seconds": 0.0}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fix_share_") as scratch:
        root = Path(scratch)
        shutil.copyfile(path, root / path.name)
        (root / "pyproject.toml").write_text("", encoding="utf-8")
        target = f"{path.name}:make_model"
        select = ",".join(RULES)
        check = _run([graphlint, "check", "--format", "json", "--fail-on", "never", "--select", select, target],
                     root, timeout)
        try:
            report = json.loads(check.stdout)
        except json.JSONDecodeError:
            row["error"] = f"check exited {check.returncode}: {(check.stderr.strip().splitlines() or ['?'])[-1]}"
            return row
        if report.get("errors"):
            row["error"] = "; ".join(error["message"] for error in report["errors"])
        diff = _run([graphlint, "check", "--diff", "--select", select, target], root, timeout)
        refused, notes, applied, never = {}, {}, None, set()
        for line in diff.stderr.splitlines():
            match = _REFUSED.match(line.strip())
            if match:
                refused[(match["rule"], Path(match["path"]).name, int(match["line"]))] = match["reason"]
                if match["never"]:  # the model does not run, or computes otherwise: never written
                    never.add((match["rule"], Path(match["path"]).name, int(match["line"])))
            match = _NOTE.match(line.strip())
            if match:
                notes[(match["rule"], Path(match["path"]).name, int(match["line"]))] = match["note"]
            match = _APPLIED.match(line.strip())
            if match:
                applied = int(match["count"])
        if applied is None and row["error"] is None:
            row["error"] = f"--diff exited {diff.returncode}: {(diff.stderr.strip().splitlines() or ['?'])[-1]}"
        for finding in report["findings"]:
            if finding["rule"] not in RULES:
                continue
            where = finding["location"]
            key = (finding["rule"], Path(where["path"]).name, where["line"])
            fix = finding.get("fix")
            if fix is None:
                status, reason = "no fix", finding.get("no_fix") or "(no fix offered, no reason given)"
            elif fix.get("applicability") == "unsafe":
                reason = refused.get(key, "declared unsafe")
                status = ("proven, unsafe" if "; proven on the model" in reason else
                          "not proven" if key in never and " differs by up to " not in reason else
                          "unsafe, differs")
            elif fix.get("applicability") != "safe":
                status, reason = "no fix", f"fix is {fix.get('applicability')}"
            elif key in refused:
                status, reason = "not proven", refused[key]
            else:
                status, reason = "proven", notes.get(key, "")
            row["findings"].append({"rule": finding["rule"], "line": where["line"], "path": where["path"],
                                    "occurrences": finding.get("occurrences", 1), "status": status,
                                    "reason": reason, "fix": fix["message"] if fix else None})
        row["findings"].sort(key=lambda f: (f["line"], f["rule"]))
        row["applied"] = applied
        proven = sum(1 for f in row["findings"] if f["status"] == "proven")
        if applied is not None and applied != proven and row["error"] is None:
            # The diff run's own count disagrees with the findings counted as proven: its messages changed shape.
            row["error"] = f"--diff applied {applied} fixes where {proven} findings were counted as proven"
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _count(rows: list[dict], rule: str, status: str | None = None) -> int:
    return sum(1 for row in rows for f in row["findings"] if f["rule"] == rule and (status is None or f["status"] == status))


def totals(rows: list[dict]) -> dict:
    out = {}
    for rule in RULES:
        found = _count(rows, rule)
        proven = _count(rows, rule, "proven")
        unsafe = _count(rows, rule, "proven, unsafe")
        out[rule] = {"found": found, "proven": proven + unsafe, "proven_safe": proven, "proven_unsafe": unsafe,
                     "unsafe_differs": _count(rows, rule, "unsafe, differs"),
                     "share": round((proven + unsafe) / found, 3) if found else None}
    out["gl101_on_fused_modules"] = sum(1 for row in rows if row["fused"] for f in row["findings"] if f["rule"] == "GL101")
    out["failed_modules"] = [row["module"] for row in rows if row["error"]]
    return out


def table(rows: list[dict]) -> str:
    lines = ["| module | style (repository) | GL101 | GL201 | proven (safe) | proven (unsafe) | not fixed: reason |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        found = {rule: sum(1 for f in row["findings"] if f["rule"] == rule) for rule in RULES}
        proven = sum(1 for f in row["findings"] if f["status"] == "proven")
        unsafe = sum(1 for f in row["findings"] if f["status"] == "proven, unsafe")
        rest = [f"{f['rule']} :{f['line']} ({f['status']}): {f['reason']}" for f in row["findings"]
                if f["status"] != "proven" or f["reason"]]
        if row["error"]:
            rest.insert(0, f"ERROR: {row['error']}")
        if row["fused"]:
            rest.insert(0, "already fused: a GL101 here is a false alarm")
        reasons = "<br>".join(text.replace("|", "\\|") for text in rest) or "-"
        lines.append(f"| {row['module']} | {row['style']} ({row['repository']}) | {found['GL101']} | {found['GL201']} "
                     f"| {proven} | {unsafe} | {reasons} |")
    summary = totals(rows)
    lines.append("")
    for rule in RULES:
        t = summary[rule]
        share = f"{100 * t['share']:.0f}%" if t["share"] is not None else "n/a"
        lines.append(f"{rule}: {t['found']} found, {t['proven']} proven ({share}): {t['proven_safe']} safe, "
                     f"{t['proven_unsafe']} unsafe; {t['unsafe_differs']} more with an unsafe fix that differs")
    lines.append(f"GL101 on modules whose attention is already fused: {summary['gl101_on_fused_modules']}")
    if summary["failed_modules"]:
        lines.append(f"modules that could not be linted: {', '.join(summary['failed_modules'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphlint", default=str(Path(sys.executable).parent / "graphlint"),
                        help="the graphlint executable (default: the one beside this Python)")
    parser.add_argument("--modules", type=Path, default=HERE / "heldout", help="folder of the held-out modules")
    parser.add_argument("--only", action="append", default=[], help="measure only this module (repeatable)")
    parser.add_argument("--json", type=Path, help="write the rows and totals to this file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per graphlint run")
    args = parser.parse_args(argv)
    if shutil.which(args.graphlint) is None:
        parser.error(f"no graphlint command at {args.graphlint}; name one with --graphlint")
    paths = sorted(p for p in args.modules.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    rows = []
    for path in paths:
        row = measure(path, args.graphlint, args.timeout)
        rows.append(row)
        print(f"{row['module']}: {len(row['findings'])} findings, {row['seconds']} s"
              + (f" (error: {row['error']})" if row["error"] else ""), file=sys.stderr)
    print(table(rows))
    if args.json:
        version = _run([args.graphlint, "--version"], HERE, 60).stdout.strip()
        steady = [{key: value for key, value in row.items() if key != "seconds"} for row in rows]  # same file twice
        args.json.write_text(json.dumps({"graphlint": version, "rows": steady, "totals": totals(rows)}, indent=1) + "\n",
                             encoding="utf-8")
    return 1 if any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
