"""GL101 fixes on model files written after real repositories' attention code: what `--fix` writes, checked by an
independent float64 oracle.

    .venv/bin/python benchmarks/real_fix_share.py                    # every module under benchmarks/real_fixes/
    .venv/bin/python benchmarks/real_fix_share.py --only llama_model --json rows.json
    .venv/bin/python benchmarks/real_fix_share.py --modules benchmarks/heldout   # the held-out set, same counts

`benchmarks/real_fixes/` holds one module per public repository file (nanoGPT, minGPT, vit-pytorch,
stable-diffusion, guided-diffusion, LLaMA, Swin, ...), each written for this set after the file named in its
docstring and its `REPOSITORY`/`PATH`/`COMMIT` constants, keeping that file's spelling of attention (modules,
masks, scaling, head splitting, what is returned); each has a `make_model()` factory returning the model and its
inputs. docs/heldout-fixes.md has the figures.

Per module, in a fresh temporary folder with an empty pyproject.toml (as benchmarks/fix_share.py does, whose
`measure` gives each GL101 finding's status: proven safe, proven unsafe, unsafe and different, not proven, or no
fix, with graphlint's reason):

1. the real `graphlint check --fix --select GL101` on a copy of the module; the finding counts as applied when
   every inserted text of its fix (the JSON `fix.edits`) is in the written file;
2. the oracle, in plain PyTorch and without graphlint: for every finding with a fix, the module with that fix's
   edits alone applied by this script, and separately the file `--fix` wrote, each against the original module:
   both built by `make_model()` (the fixed one loaded with the original's state dict), in float64, in train mode
   with every dropout's `p` set to 0 and in eval mode; outputs (every tensor returned) and the gradients of every
   parameter and floating input under a randomly weighted sum of the outputs, and when the inputs include a boolean
   tensor (a mask) once more in eval mode with its first row all False (a fully masked row). "same" when every
   gap is within 1e-6 of the reference's largest magnitude among the outputs (or among the gradients); models
   that compute part of their attention in float32, as an upcast softmax does, differ by about 1e-7 from a
   float64 rewrite; else "differs" with the largest gap; "fails"
   when the fixed module does not build or run. A model whose original does not run in float64 (part of it
   computes in float32 against float64 parameters) is compared in float32 within 1e-4, and the row says so.

Totals: of the findings the oracle confirms "same", how many `--fix` applied, and for each one not applied the
reason graphlint gives. Exit code 1 when a module could not be measured or a written file differs by the oracle.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fix_share import _run, measure  # noqa: E402  (the sibling benchmark: same runs, same parsing)

TOLERANCE = 1e-6


def apply_edits(source: str, edits: list[dict]) -> str:
    """The source with the fix's edits (1-based lines and columns, end exclusive) applied, last first."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(line: int, column: int) -> int:
        return starts[line - 1] + column - 1 if line - 1 < len(starts) else len(source)

    out = source
    for edit in sorted(edits, key=lambda e: (e["line"], e["column"]), reverse=True):
        begin, end = offset(edit["line"], edit["column"]), offset(edit["end_line"], edit["end_column"])
        out = out[:begin] + edit["text"] + out[end:]
    return out


_LOADED = 0


def _load(path: Path):
    global _LOADED
    _LOADED += 1
    spec = importlib.util.spec_from_file_location(f"_oracle_module_{_LOADED}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _run_model(module, state, train: bool, dtype: torch.dtype, edge: bool = False):
    torch.manual_seed(0)
    model, inputs = module.make_model()
    if edge:  # a fully masked row: every boolean input's first row all False
        inputs = tuple(x.clone().index_fill_(0, torch.tensor([0]), False)
                       if isinstance(x, torch.Tensor) and x.dtype == torch.bool else x for x in inputs)
    if state is not None:
        model.load_state_dict(state)
    model = model.to(dtype)
    for sub in model.modules():
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd):
            sub.p = 0.0
    model.train(train)
    inputs = tuple(x.detach().to(dtype).requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)
    outputs = [t for t in _tensors(model(*inputs)) if t.is_floating_point()]
    generator = torch.Generator().manual_seed(1)
    loss = sum((t.double() * torch.randn(t.shape, generator=generator, dtype=torch.float64)).sum()
               for t in outputs if t.requires_grad)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named] + floats, allow_unused=True) if torch.is_tensor(loss) else []
    return model, [t.detach() for t in outputs], [g for g in grads]


def oracle(original: Path, fixed: Path) -> tuple[str, str]:
    """("same" | "differs" | "fails", detail): the fixed module against the original, float64, train (p=0) and eval.

    A model that cannot run in float64 (one that computes part of itself in float32 against float64 parameters,
    as guided-diffusion's GroupNorm32 does) is compared in float32, with a tolerance of 1e-4, and the detail says so.
    """
    reference_module = _load(original)
    try:
        fixed_module = _load(fixed)
    except Exception as error:  # the rewritten file does not import
        return "fails", f"does not import: {type(error).__name__}: {error}"
    dtype, tolerance, note = torch.float64, TOLERANCE, ""
    try:
        _run_model(reference_module, None, True, dtype)
    except RuntimeError as error:  # the original itself does not run in float64
        dtype, tolerance = torch.float32, 1e-4
        note = f"; in float32: the original does not run in float64 ({str(error).splitlines()[0]})"
    torch.manual_seed(0)
    edge = any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in reference_module.make_model()[1])
    worst, where = 0.0, ""
    for train, masked in ((True, False), (False, False), (False, True)):
        if masked and not edge:
            continue
        mode = "train (p=0)" if train else "eval, a boolean input's first row all False" if masked else "eval"
        reference, ref_out, ref_grads = _run_model(reference_module, None, train, dtype, masked)
        try:
            _, out, grads = _run_model(fixed_module, reference.state_dict(), train, dtype, masked)
        except Exception as error:
            return "fails", f"{mode}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if len(out) != len(ref_out) or len(grads) != len(ref_grads):
            return "differs", f"{mode}: {len(out)} outputs where the original has {len(ref_out)}"
        pairs = [("output", a, b) for a, b in zip(ref_out, out, strict=True)]
        pairs += [("gradient", a, b) for a, b in zip(ref_grads, grads, strict=True)]
        # One scale per set (all outputs, all gradients): a gradient zero in exact arithmetic (a key bias's, which
        # the softmax cancels) is rounding noise on both sides, not a reference to divide by.
        scales = {kind: max([a.abs().max().item() for k, a, _ in pairs if k == kind and a is not None] + [1e-30])
                  for kind in ("output", "gradient")}
        for kind, a, b in pairs:
            if (a is None) != (b is None):
                return "differs", f"{mode}: a {kind} is None on one side only"
            if a is None:
                continue
            if a.shape != b.shape:
                return "differs", f"{mode}: {kind} shape {tuple(b.shape)} where the original has {tuple(a.shape)}"
            scale = scales[kind]
            gap = (a - b).abs().nan_to_num(nan=float("inf")).max().item() / scale
            if gap > worst:
                worst, where = gap, f"{mode} {kind}"
    if worst > tolerance:
        return "differs", f"largest gap {worst:.2g} (relative, {where}){note}"
    return "same", f"largest gap {worst:.1g}{note}"


def measure_fixes(path: Path, graphlint: str, timeout: float) -> dict:
    row = measure(path, graphlint, timeout)  # findings with status and reason, from --format json and --diff
    row["findings"] = [f for f in row["findings"] if f["rule"] == "GL101"]
    with tempfile.TemporaryDirectory(prefix="real_fix_share_") as scratch:
        root = Path(scratch)
        shutil.copyfile(path, root / path.name)
        (root / "pyproject.toml").write_text("", encoding="utf-8")
        check = _run([graphlint, "check", "--format", "json", "--fail-on", "never", "--select", "GL101",
                      f"{path.name}:make_model"], root, timeout)
        try:
            edits = {f["location"]["line"]: (f.get("fix") or {}).get("edits") for f in json.loads(check.stdout)["findings"]}
        except (json.JSONDecodeError, KeyError):
            edits = {}
        written = root / "written" / path.name
        written.parent.mkdir()
        shutil.copyfile(path, written)
        (written.parent / "pyproject.toml").write_text("", encoding="utf-8")
        done = _run([graphlint, "check", "--fix", "--fail-on", "never", "--select", "GL101", f"{path.name}:make_model"],
                    written.parent, timeout)
        row["fix_run"] = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        source, after = path.read_text(encoding="utf-8"), written.read_text(encoding="utf-8")
        for finding in row["findings"]:
            fix_edits = edits.get(finding["line"])
            texts = [e["text"] for e in fix_edits or [] if e["text"].strip()]
            finding["applied"] = bool(texts) and after != source and all(text in after for text in texts)
            if not fix_edits:
                finding["oracle"], finding["oracle_detail"] = "n/a", "no fix offered"
                continue
            alone = root / "alone" / str(finding["line"]) / path.name
            alone.parent.mkdir(parents=True)
            alone.write_text(apply_edits(source, fix_edits), encoding="utf-8")
            finding["oracle"], finding["oracle_detail"] = oracle(path, alone)
        row["written_oracle"] = oracle(path, written) if after != source else ("unchanged", "")
    return row


def summary(rows: list[dict]) -> dict:
    findings = [dict(f, module=row["module"]) for row in rows for f in row["findings"]]
    same = [f for f in findings if f["oracle"] == "same"]
    return {"found": len(findings), "with_fix": sum(1 for f in findings if f["oracle"] != "n/a"),
            "oracle_same": len(same), "oracle_same_applied": sum(1 for f in same if f["applied"]),
            "oracle_same_not_applied": [f"{f['module']}:{f['line']} ({f['status']}): {f['reason']}" for f in same
                                        if not f["applied"]],
            "applied_but_oracle_not_same": [f"{f['module']}:{f['line']}: {f['oracle']} {f['oracle_detail']}"
                                            for f in findings if f["applied"] and f["oracle"] != "same"],
            "written_files_not_same": [f"{row['module']}: {' '.join(row['written_oracle'])}" for row in rows
                                       if row["written_oracle"][0] not in ("same", "unchanged")],
            "failed_modules": [row["module"] for row in rows if row["error"]]}


def table(rows: list[dict]) -> str:
    lines = ["| module (repository, path) | line | occ. | graphlint | `--fix` applied | oracle (float64) | reason given |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if not row["findings"]:
            lines.append(f"| {row['module']} | - | - | no GL101 | - | - | {row['error'] or '-'} |")
        for f in row["findings"]:
            reason = (f["reason"] or "-").replace("|", "\\|")
            lines.append(f"| {row['module']} | {f['line']} | {f['occurrences']} | {f['status']} | "
                         f"{'yes' if f['applied'] else 'no'} | {f['oracle']} ({f['oracle_detail']}) | {reason} |")
    total = summary(rows)
    lines += ["", f"GL101 findings: {total['found']}, with a fix: {total['with_fix']}; the oracle confirms "
              f"{total['oracle_same']} equivalent, of which `--fix` applied {total['oracle_same_applied']}"]
    for text in total["oracle_same_not_applied"]:
        lines.append(f"- confirmed equivalent, not applied: {text}")
    for text in total["applied_but_oracle_not_same"]:
        lines.append(f"- APPLIED BUT NOT EQUIVALENT: {text}")
    written = ", ".join(f"{row['module']} {row['written_oracle'][0]}" for row in rows)
    lines.append(f"files `--fix` wrote, against the original by the oracle: {written}")
    if total["failed_modules"]:
        lines.append(f"modules that could not be measured: {', '.join(total['failed_modules'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphlint", default=str(Path(sys.executable).parent / "graphlint"),
                        help="the graphlint executable (default: the one beside this Python)")
    parser.add_argument("--modules", type=Path, default=HERE / "real_fixes", help="folder of the model modules")
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
        started = time.perf_counter()
        rows.append(measure_fixes(path, args.graphlint, args.timeout))
        print(f"{path.stem}: {len(rows[-1]['findings'])} GL101, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "totals": summary(rows)}, indent=1, default=str) + "\n",
                             encoding="utf-8")
    total = summary(rows)
    return 1 if total["failed_modules"] or total["written_files_not_same"] or total["applied_but_oracle_not_same"] else 0


if __name__ == "__main__":
    sys.exit(main())
