"""Shared helpers: write model files, lint them in-process, or run the real command in a subprocess."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The test workers share the machine's cores (pytest -n auto): each torch gets one intra-op thread, in this process
# and in every command it starts, instead of each worker's threads waiting on the others' (the in-process part ran
# 15% sooner on two cores). A test that needs more threads sets them; a count the caller exported stands.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# pytester's fixture removes at teardown every module imported during its test; torch._dynamo registers a native
# operator library on import, so a second import after that removal fails: import it once, before any snapshot.
import torch
import torch._dynamo  # noqa: F401

from graphlint.config import Config
from graphlint.session import check
from graphlint.project import Project

REPO = Path(__file__).resolve().parent.parent
SARIF_SCHEMA = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"

# Categories of tests that take seconds to minutes each; `pytest -m "not slow"` leaves them all out.
SLOW_CATEGORIES = ("proof", "transformers", "server", "packaging", "compile", "command", "distributed")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    """Every test of a slow category is also `slow`, so that the fast loop needs one marker expression; a test
    that starts the real command in a fresh process is `command`, since each pays for a new interpreter and torch."""
    unlisted = sorted({str(item.path) for item in items if item.get_closest_marker("cli")
                       and not _CLI_MARK.search(_source_of(item.path))})
    if unlisted:  # .ci/run's wheel part collects only the files whose text marks a test `cli`
        raise pytest.UsageError(f"{', '.join(unlisted)}: mark command-line tests with pytest.mark.cli in the test "
                                "file itself, so that CI's wheel part collects the file")
    for item in items:
        if _starts_the_command(item):
            item.add_marker(pytest.mark.command)
        if any(item.get_closest_marker(category) for category in SLOW_CATEGORIES):
            item.add_marker(pytest.mark.slow)


_CLI_MARK = re.compile(r"pytest\.mark\.cli\b")  # what .ci/run greps for


@functools.cache
def _source_of(path) -> str:
    return Path(path).read_text(encoding="utf-8")


# How a test starts the command (or pytest, or the action's shell steps) in a fresh process, as its source spells it.
_STARTS_A_PROCESS = ("run_graphlint(", "subprocess.run(", "runpytest_subprocess(", "run_action(", "run_without_torch(",
                     "_run_with_site(")


@pytest.fixture(autouse=True)
def _distribution_checks_as_before():
    """A torch.compile in a test's own process switches torch.distributions' argument checks off for the whole
    process (dynamo's first compile does it); later tests in that worker would see torch without them."""
    import torch

    before = torch.distributions.Distribution._validate_args
    yield
    torch.distributions.Distribution.set_default_validate_args(before)


def _starts_the_command(item) -> bool:
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return any(spelling in source for spelling in _STARTS_A_PROCESS)


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    return path


def _selected(settings: dict) -> dict:
    """The in-process helpers leave the torch.compile rules (on by default) out unless a test selects rules
    itself or extends the selection with one of them: they cost a dynamo run per target, and their own tests
    select them (`select=("GL3",)`); a test that turns on one rule of another kind does not pay for them."""
    extended = settings.get("extend_select", ())
    if "select" in settings or any(code.startswith("GL3") or "GL3".startswith(code) for code in extended):
        return settings
    return {**settings, "ignore": (*settings.get("ignore", ()), "GL3")}


def lint_file(path: Path, name: str = "make", device: str = "auto", **settings):
    """Lint one target file in-process, with its folder as the project root; `settings` are Config fields."""
    project = Project(root=path.parent, first_party_folders=[path.parent])
    return check([f"{path}:{name}"], project, Config(device=device, **_selected(settings)))


def check_targets(folder: Path, targets: list[str], **settings):
    """Lint several target files of one folder in one run, in-process, with the folder as the project root."""
    project = Project(root=folder, first_party_folders=[folder])
    return check([str(folder / target) for target in targets], project, Config(**_selected(settings)))


def fix_plan(report, folder: Path, unsafe: bool = False, parent=None):
    """What `--fix` (`--unsafe-fixes` when `unsafe`) does with a report of files in `folder`, the project root,
    proving each fix as the session does; `parent()` gives the warm parent (default: a new one)."""
    project = Project(root=folder, first_party_folders=[folder])
    return proving_session(project, folder, parent() if parent is not None else None).fixes(report, unsafe)


def proving_session(project: Project, folder: Path, parent=None):
    """A session of `project` that runs fixes' proofs, in children of `parent` (default: a new warm parent)."""
    from graphlint.session import Runner, Session

    return Session([], project, Config(), base=folder, runner=Runner(parent))


def prove_fix(report, folder: Path, finding):
    """The proof's verdict on one finding's fix, whatever its declared applicability (`--fix` never proves an
    unsafe one): what the fix computes on the factory's inputs and the edge cases."""
    from graphlint.fix.prove import prove

    project = Project(root=folder, first_party_folders=[folder])
    [result] = [r for r in report.results if r.target in finding.targets]
    return prove(result, [finding], project, folder, report.all_findings, proving_session(project, folder))


def backward_in_plain_pytorch(path: Path, name: str = "make"):
    """Build the target and run forward and backward with nothing of graphlint's; returns the model, so a test
    can check that a model really has the problem a rule reports (PyTorch raises, or a .grad stays None)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, args = getattr(module, name)()
    model(*args).float().sum().backward()
    return model


def findings_of(report, rule_id: str):
    return [f for f in report.findings if f.rule_id == rule_id]


def line_of(path: Path, fragment: str) -> int:
    """The 1-based number of the first line of `path` that contains `fragment`."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if fragment in line:
            return number
    raise AssertionError(f"{fragment!r} not in {path}")


# What a command test that is not about the torch.compile rules (on by default) adds to `check`: they cost a dynamo
# trace per target, a third of a small target's command, and are left out as the in-process helpers leave them
# (`_selected`). Their own tests, the shipped example's and the tests of whole reports keep the defaults.
WITHOUT_COMPILE = ("--ignore", "GL3")


def run_graphlint(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "graphlint", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )


def validate_sarif(log: dict) -> None:
    """Validate against the official SARIF 2.1.0 schema (kept under tests/data)."""
    import jsonschema

    schema = json.loads(SARIF_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    """An empty project folder with a pyproject.toml, so that it is its own project root."""
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    return tmp_path


# The attention fix tests' shared pieces: a model file in its own project, the rewritten forward's text, and the
# original and rewritten models compared in plain PyTorch, with nothing of graphlint's.
def model_file(folder: Path, source: str, header: str = "", name: str = "model.py") -> Path:
    write(folder, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    return write(folder, name, header + textwrap.dedent(source).lstrip("\n"))


def forward_text(text: str, name: str = "forward") -> str:
    """The method `name` of a rewritten file, from its `def` to the next blank pair of lines."""
    return f"\n    def {name}" + text.split(f"\n    def {name}", 1)[1].split("\n\n\n", 1)[0] + "\n"


def outputs_and_gradients(path: Path, dtype=torch.float64):
    """The model's first output and its parameters' and inputs' gradients, built and run in `dtype`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, args = module.make()
    model = model.to(dtype).eval()
    args = [a.to(dtype).requires_grad_() if a.is_floating_point() else a for a in args]
    out = model(*args)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    inputs = {f"input {i}": a.grad for i, a in enumerate(args) if a.is_floating_point()}
    return out.detach(), {**{n: p.grad for n, p in model.named_parameters()}, **inputs}


def assert_same_in_plain_pytorch(original: Path, rewritten: Path) -> None:
    """Output and gradients agree in float64; in float32 where the original cannot run in float64 (q and k
    upcast with `.float()` meet a float64 mask). An upcast the model writes still runs in float32, hence 1e-6."""
    try:
        before, dtype, tolerance = outputs_and_gradients(original), torch.float64, 1e-6
    except RuntimeError:
        before, dtype, tolerance = outputs_and_gradients(original, torch.float32), torch.float32, 1e-5
    after = outputs_and_gradients(rewritten, dtype)
    assert torch.allclose(before[0], after[0], atol=tolerance)
    assert before[1].keys() == after[1].keys()
    assert all(torch.allclose(before[1][n], after[1][n], atol=tolerance) for n in before[1])


def safe_gl101_fix(folder: Path, path: Path) -> str:
    """The model file's one GL101 finding gets a safe fix that the proof applies; the fixed text."""
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == "safe", finding.no_fix
    plan = fix_plan(report, folder)
    assert plan.refused == [] and plan.applied == [finding]
    return plan.texts[str(path)]
