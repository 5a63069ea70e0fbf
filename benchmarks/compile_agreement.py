"""Every GL301/GL302 finding on the project's real models, each beside plain torch.compile's own log line for it.

For each set of models (`--set`; all by default) this runs, for every target:

1. `graphlint check --select GL301,GL302 --format json --no-cache` (the real command, one per set);
2. plain torch.compile in a fresh interpreter, the way graphlint's analysis runs the model: built by the same
   factory, one eager call with gradients on, then `torch.compile(model, backend="eager")` (dynamo's breaks and
   recompiles do not depend on the backend) called with gradients on, on the same calls: the factory's inputs
   three times, the batch one and two larger (every tensor whose first dimension is the batch grows by repeating
   its first item), then the target's own `calls`; a call the model refuses without torch.compile is left out,
   as graphlint leaves it out. The log is torch's own, `TORCH_LOGS=graph_breaks,recompiles` on stderr.

A GL301 finding is confirmed when plain torch.compile breaks the graph with the finding's line (or a related
line) in the break's user traceback. A GL302 finding is confirmed when plain torch.compile recompiles at least
twice with a failed guard whose user stack holds the finding's line (a size change that automatic dynamic shapes
absorb recompiles once), or names it when it hits recompile_limit; one that only matches the recompiled
function's `def` line is "misplaced". The table lists every finding with its verdict and the plain log line, and
the breaks and recompiles plain torch.compile shows in the model's code (the target's and its libraries', not
torch's) that graphlint did not report.

    .venv/bin/python benchmarks/compile_agreement.py                      # every set; a Markdown table
    .venv/bin/python benchmarks/compile_agreement.py --set heldout --json out.json
    .venv/bin/python benchmarks/compile_agreement.py path/to/model.py:make_model   # targets of your own

The `transformers`, `diffusers` and `real-repos` sets need those packages (`pip install -c constraints.txt
diffusers`, and the packages benchmarks/real_repo_models.py names).
Exit status 1 when some finding is not confirmed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MARK = "@@agreement "


def _functions(path: Path, names: str | None = None) -> list[str]:
    """The public factories of a module file, read without importing it: the names in its list `names` (a list
    of strings, or of tuples whose second item is the name), else every top-level function not starting with _."""
    tree = ast.parse(path.read_text())
    if names:
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == names for t in node.targets):
                value = ast.literal_eval(node.value)
                return [item[1] if isinstance(item, tuple) else item for item in value]
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


def sets() -> dict[str, list[str]]:
    heldout = sorted(p for p in (HERE / "heldout").glob("*.py") if not p.name.startswith("_"))
    files = sorted(p for p in (HERE / "real_fixes").glob("*.py") if not p.name.startswith("_"))
    zoo = HERE / "memory_zoo_models.py"
    return {
        "heldout": [f"{p.relative_to(REPO)}:make_model" for p in heldout],
        "real-files": [f"{p.relative_to(REPO)}:make_model" for p in files],
        "zoo": [f"{zoo.relative_to(REPO)}:{name}" for name in _functions(zoo, "ZOO")],
        "transformers": [f"benchmarks/transformers_zoo.py:{name}" for name in _functions(HERE / "transformers_zoo.py")],
        "diffusers": [f"benchmarks/diffusers_zoo.py:{name}"
                      for name in _functions(HERE / "diffusers_zoo.py", "ARCHITECTURES")],
        "real-repos": [f"benchmarks/real_repo_models.py:{name}" for name in _functions(HERE / "real_repo_models.py")],
        "benchmarks": ["benchmarks/models.py:gpt2_small"]
                      + [f"benchmarks/memory_models.py:{name}" for name in _functions(HERE / "memory_models.py")],
    }


# ---------------------------------------------------------------------------------------------- plain torch


def _grown(args, kwargs, size: int, extra: int):
    """The inputs with the batch `extra` larger: a tensor whose first dimension is the batch repeats its first
    item; one tensor given twice stays one tensor."""
    import torch
    from torch.utils._pytree import tree_map

    made: dict[int, object] = {}

    def grow(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            if id(value) not in made:
                made[id(value)] = torch.cat([value] + [value[:1]] * extra)
            return made[id(value)]
        return value

    return tuple(tree_map(grow, list(args))), tree_map(grow, kwargs)


def plain(spec: str) -> int:
    """Plain torch.compile on the target, as the module docstring says; its log goes to stderr."""
    import importlib.util

    import torch
    from torch.utils._pytree import tree_leaves

    from graphlint.target import normalize_factory_result  # the factory's (model, args) or Target, as check reads it

    path, factory = spec.rsplit(":", 1)
    file = (REPO / path).resolve()
    sys.path.insert(0, str(file.parent))
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[file.stem] = module
    module_spec.loader.exec_module(module)
    made = normalize_factory_result(getattr(module, factory)())
    model, args, kwargs = made.model, made.args, made.kwargs
    calls = [("the factory's inputs", args, kwargs), ("the same inputs again", args, kwargs),
             ("the same inputs a third time", args, kwargs)]
    leading = next((t for t in tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0), None)
    if leading is not None and leading.shape[0]:
        calls += [(f"batch {leading.shape[0] + extra}", *_grown(args, kwargs, leading.shape[0], extra))
                  for extra in (1, 2)]
    calls += [(f"Target.calls[{index}]", a, k) for index, (a, k) in enumerate(made.calls)]
    kept = calls[:1]
    for label, a, k in calls[1:]:
        try:
            with torch.no_grad():
                model(*a, **k)
            kept.append((label, a, k))
        except Exception as error:  # the model's own refusal of a made-up input
            print(f"{MARK}dropped {label}: {type(error).__name__}", file=sys.stderr, flush=True)
    with torch.enable_grad():
        model(*args, **kwargs)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    for label, a, k in kept:
        print(f"{MARK}call {label}", file=sys.stderr, flush=True)
        try:
            with torch.enable_grad():
                compiled(*a, **k)
        except Exception as error:
            print(f"{MARK}failed {label}: {type(error).__name__}: {str(error).splitlines()[0][:200]}",
                  file=sys.stderr, flush=True)
            break
    return 0


# ------------------------------------------------------------------------------------------------ the log

_PREFIX = re.compile(r"^[VIWED]\d{4} [\d:.]+ +\d+ \S+\] (?:\[[^\]]*\] )*(?:\[__(\w+)\] )?(.*)$")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_AT = re.compile(r"in user code at (.+):(\d+)$")
_FUNCTION = re.compile(r"Recompiling function (\S+) in (.+):(\d+)$")
_LIMIT_FUNCTION = re.compile(r"function: '([^']+)' \((.+):(\d+)\)")


@dataclass
class Event:
    kind: str  # "break", "recompile", "limit"
    call: str
    headline: str
    reason: str = ""
    at: tuple[str, int] | None = None  # a break's "in user code at", a recompile's function
    frames: list[tuple[str, int]] = field(default_factory=list)


def parse(stderr: str) -> tuple[list[Event], list[str], list[str]]:
    """The breaks, recompiles and recompile_limit hits of a plain run's log, each with the call it happened in;
    and the calls it dropped and the one that failed."""
    events: list[Event] = []
    dropped, failed = [], []
    call = ""
    current: Event | None = None
    for raw in stderr.splitlines():
        if raw.startswith(MARK):
            what, _, rest = raw[len(MARK):].partition(" ")
            if what == "call":
                call = rest
            elif what == "dropped":
                dropped.append(rest)
            else:
                failed.append(rest)
            current = None
            continue
        match = _PREFIX.match(raw)
        if not match:
            continue
        line = match.group(2)
        if "Graph break" in line and "in user code at" in line:
            at = _AT.search(line)
            current = Event("break", call, line.strip(), at=(at.group(1), int(at.group(2))) if at else None)
            events.append(current)
        elif line.startswith("Recompiling function"):
            function = _FUNCTION.search(line)
            current = Event("recompile", call, line.strip(),
                            at=(function.group(2), int(function.group(3))) if function else None)
            events.append(current)
        elif "hit config.recompile_limit" in line or "hit config.cache_size_limit" in line:
            current = Event("limit", call, line.strip())
            events.append(current)
        elif current is not None:
            text = line.strip()
            frame = _FRAME.search(text)
            if frame:
                current.frames.append((frame.group(1), int(frame.group(2))))
            elif current.kind == "break" and text.startswith("Explanation:") and not current.reason:
                current.reason = text
            elif current.kind == "recompile" and re.match(r"- \d+/\d+: ", text) and not current.reason:
                current.reason = text[2:].split("  #")[0].strip()
            elif current.kind == "limit":
                function = _LIMIT_FUNCTION.search(text)
                if function:
                    current.at = (function.group(2), int(function.group(3)))
                elif text.startswith("last reason:") and not current.reason:
                    current.reason = text
    return events, dropped, failed


# --------------------------------------------------------------------------------------------- judgement


def _where(location: dict) -> tuple[str, int]:
    path = Path(location["path"])
    return str((REPO / path).resolve() if not path.is_absolute() else path), location["line"]


def judge(finding: dict, events: list[Event]) -> tuple[str, Event | None]:
    """The verdict on one finding and the plain event that decides it."""
    places = {_where(finding["location"])} | {_where(r["location"]) for r in finding.get("related", [])}
    if finding["rule"] == "GL301":
        for event in events:
            if event.kind == "break" and places & ({event.at} | set(event.frames)):
                return "confirmed", event
        return "NOT CONFIRMED", None
    at_guard = [e for e in events if e.kind == "recompile" and places & set(e.frames)]
    limits = [e for e in events if e.kind == "limit" and places & ({e.at} | set(e.frames))]
    if len(at_guard) >= 2:
        return "confirmed", at_guard[-1]
    if limits:
        return "confirmed (recompile_limit)", limits[-1]
    at_def = [e for e in events if e.kind == "recompile" and e.at in places]
    if at_def:
        return "MISPLACED (the function's def line)", at_def[-1]
    if at_guard:
        return "NOT CONFIRMED (one recompile: dynamic shapes settle it)", at_guard[-1]
    return "NOT CONFIRMED", None


def _model_code(file: str) -> bool:
    """A file of the model's own code: neither installed (torch, a library) nor Python's, nor this script (whose
    frames call the compiled model in the plain run)."""
    import sysconfig

    paths = sysconfig.get_paths()
    return not file.startswith((paths["purelib"], paths["platlib"], paths["stdlib"])) and file != __file__


def misses(findings: list[dict], events: list[Event]) -> list[Event]:
    """Plain breaks in the model's code, and recompiles there that do not settle, at lines no finding names."""
    named = set()
    for finding in findings:
        named.add(_where(finding["location"]))
        named.update(_where(r["location"]) for r in finding.get("related", []))
    found = []
    for event in events:
        if event.kind == "break":
            where = [f for f in [event.at, *event.frames] if f and _model_code(f[0])]
        elif event.kind == "recompile":
            where = [f for f in event.frames if _model_code(f[0])]
            if sum(1 for e in events if e.kind == "recompile" and e.frames and e.frames[-1:] == event.frames[-1:]) < 2:
                continue  # once: a size change that dynamic shapes settle
        else:
            continue
        if where and not named & set(where) and all(m.headline != event.headline for m in found):
            found.append(event)
    return found


# ------------------------------------------------------------------------------------------------- runs


def run_plain(spec: str, timeout: int) -> tuple[str, float]:
    env = {**os.environ, "TORCH_LOGS": "graph_breaks,recompiles", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--plain", spec], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout)
        return done.stderr, time.perf_counter() - started
    except subprocess.TimeoutExpired:
        return f"{MARK}failed the plain run took over {timeout} s", time.perf_counter() - started


def run_graphlint(specs: list[str], timeout: int) -> dict:
    command = [str(Path(sys.executable).with_name("graphlint")), "check", *specs, "--select", "GL301,GL302",
               "--format", "json", "--no-cache", "--timeout", str(timeout)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    try:  # exit 2 with a report: some target could not be linted, the others were
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"graphlint check exited {done.returncode}: {done.stderr.strip()[-500:]}") from None


def _short(place: tuple[str, int] | None) -> str:
    if place is None:
        return "?"
    path = Path(place[0])
    try:
        path = path.relative_to(REPO)
    except ValueError:
        path = Path(*path.parts[-2:])
    return f"{path}:{place[1]}"


def _at(event: Event, finding: dict) -> str:
    """The line of the plain event that names the finding's place (else the event's innermost frame)."""
    places = {_where(finding["location"])} | {_where(r["location"]) for r in finding.get("related", [])}
    named = [f for f in [event.at, *event.frames] if f in places]
    return _short(named[0] if named else (event.frames[-1] if event.frames else event.at))


def evaluate(name: str, specs: list[str], timeout: int) -> list[dict]:
    """Both runs of every target: graphlint's findings, errors and notes, and plain torch.compile's events."""
    report = run_graphlint(specs, timeout)
    rows = []
    for spec in specs:
        stderr, seconds = run_plain(spec, timeout)
        events, dropped, failed = parse(stderr)
        rows.append({"set": name, "target": spec,
                     "findings": [f for f in report["findings"] if spec in f["targets"]],
                     "errors": [e["message"] for e in report["errors"] if e["target"] == spec],
                     "notes": [n["message"] for n in report["notes"] if n["target"] == spec],
                     "events": [asdict(e) for e in events], "dropped": dropped, "failed": failed,
                     "plain_seconds": round(seconds, 1)})
        print(f"{spec}: {len(rows[-1]['findings'])} findings, plain {sum(e.kind == 'break' for e in events)} breaks "
              f"{sum(e.kind == 'recompile' for e in events)} recompiles", file=sys.stderr, flush=True)
    return rows


def _events(row: dict) -> list[Event]:
    return [Event(e["kind"], e["call"], e["headline"], e["reason"], tuple(e["at"]) if e["at"] else None,
                  [tuple(f) for f in e["frames"]]) for e in row["events"]]


def judged(row: dict) -> tuple[list[dict], list[Event]]:
    """Each finding of a row with its verdict and the plain event behind it; and the plain events missed."""
    events = _events(row)
    found = []
    for finding in row["findings"]:
        verdict, event = judge(finding, events)
        found.append({"rule": finding["rule"], "location": _short(_where(finding["location"])), "verdict": verdict,
                      "plain": None if event is None else
                      {"headline": event.headline, "reason": event.reason, "call": event.call,
                       "at": _at(event, finding)}})
    return found, misses(row["findings"], events)


def markdown(rows: list[dict]) -> str:
    lines = ["| set | target | rule | graphlint's line | verdict | plain torch.compile's log line |",
             "|---|---|---|---|---|---|"]
    findings, missed = [], []
    for row in rows:
        target = row["target"].split("/")[-1]
        found, not_found = judged(row)
        findings += found
        missed += [(row, event) for event in not_found]
        for f in found:
            plain_line = "" if f["plain"] is None else \
                f"`{f['plain']['headline']}`" + (f" ({f['plain']['reason']})" if f["plain"]["reason"] else "") + \
                f", at {f['plain']['at']}, call: {f['plain']['call']}"
            lines.append(f"| {row['set']} | {target} | {f['rule']} | {f['location']} | {f['verdict']} | "
                         f"{plain_line.replace('|', '/')} |")
    confirmed = sum(f["verdict"].startswith("confirmed") for f in findings)
    quiet = sum(not row["findings"] and not any(e["kind"] == "break" for e in row["events"]) for row in rows)
    lines += ["", f"{len(rows)} targets, {len(findings)} findings, {confirmed} confirmed by plain torch.compile; "
              f"{quiet} targets where neither graphlint nor plain torch.compile sees a graph break."]
    if missed:
        lines += ["", "In the models' own (not installed) code, plain torch.compile shows these that graphlint did not "
                  "report:", ""]
        lines += [f"- {row['target']}: `{e.headline}` at {_short(next((f for f in [*e.frames, e.at] if f), None))} "
                  f"({e.reason}), call: {e.call}" for row, e in missed]
    library = [row for row in rows if any("library code only" in note for note in row["notes"])]
    if library:
        lines += ["", "Breaks in installed library code only (graphlint's note, not a finding; plain torch.compile "
                  "breaks there too):", ""]
        lines += [f"- {row['target']}: " + ", ".join(dict.fromkeys(
            e["headline"].split(" in user code at ")[-1].split("/")[-1] for e in row["events"] if e["kind"] == "break"))
            for row in library]
    trouble = [row for row in rows if row["errors"] or row["failed"]]
    if trouble:
        lines += ["", "Targets a run could not finish:", ""]
        lines += [f"- {row['target']}: graphlint: {'; '.join(row['errors']) or 'ran'}; plain: "
                  f"{'; '.join(row['failed']) or 'ran'}" for row in trouble]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="targets (file.py:factory) to judge instead of the sets")
    parser.add_argument("--set", action="append", choices=sorted(sets()), help="a set of models (repeatable)")
    parser.add_argument("--only", help="only targets whose spec contains this text")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per target and run")
    parser.add_argument("--report", nargs="+", metavar="JSON", help="print the table of earlier runs' --json files")
    parser.add_argument("--plain", metavar="TARGET", help=argparse.SUPPRESS)  # the child of each plain run
    args = parser.parse_args(argv)
    if args.plain:
        return plain(args.plain)
    if args.report:
        rows = [row for path in args.report for row in json.loads(Path(path).read_text())]
        print(markdown(rows))
        return 0 if all(f["verdict"].startswith("confirmed") for row in rows for f in judged(row)[0]) else 1
    rows = evaluate("given", args.targets, args.timeout) if args.targets else []
    for name in args.set or ([] if args.targets else sorted(sets())):
        specs = [s for s in sets()[name] if not args.only or args.only in s]
        if specs:
            rows += evaluate(name, specs, args.timeout)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0 if all(f["verdict"].startswith("confirmed") for row in rows for f in judged(row)[0]) else 1


if __name__ == "__main__":
    sys.exit(main())
