"""The result cache, parallel targets with -j, --timeout, and progress on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

import pytest

from conftest import WITHOUT_COMPILE, run_graphlint, write
from test_cli import ATTENTION, CLEAN

# Runs graphlint with `import torch` made impossible: only a run the cache answers in full can succeed.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from graphlint.cli import main; sys.exit(main(sys.argv[1:]))"


def run_without_torch(*args: str, cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


# One project's run of commands: each checks what its comment says; together they start torch as few times as
# those checks need (a run the cache answers in full imports none).
def test_the_cache_answers_unchanged_runs_and_later_settings_without_torch_and_ignores_corrupt_entries(project_dir):
    write(project_dir, "model.py", ATTENTION)
    pyproject = (project_dir / "pyproject.toml").read_text(encoding="utf-8")
    first = run_graphlint("check", "model.py:make", "--format", "json", cwd=project_dir)
    # A second run with nothing changed is answered from the cache, in full, without torch; the cache ignores itself.
    second = run_without_torch("check", "model.py:make", "--format", "json", cwd=project_dir)
    assert second.returncode == first.returncode == 1, second.stderr
    assert second.stdout == first.stdout
    assert (project_dir / ".graphlint_cache" / ".gitignore").read_text().strip().endswith("*")
    # Settings applied after the capture (severity, per-file-ignores and fail-on, a baseline) come from the cache.
    settings = '[project]\nname = "p"\nversion = "0"\n\n[tool.graphlint]\n'
    write(project_dir, "pyproject.toml", settings + '[tool.graphlint.severity]\nGL101 = "note"\nGL301 = "note"\n')
    as_note = run_without_torch("check", "model.py:make", cwd=project_dir)
    assert as_note.returncode == 0 and "GL101" in as_note.stdout, as_note.stderr
    ignores = 'per-file-ignores = { "model.py" = ["GL101", "GL301"] }\n'
    write(project_dir, "pyproject.toml", settings + 'fail-on = "error"\n' + ignores)
    ignored = run_without_torch("check", "model.py:make", cwd=project_dir)
    assert ignored.returncode == 0 and "GL101" not in ignored.stdout, ignored.stderr
    write(project_dir, "pyproject.toml", settings)
    run_graphlint("check", "model.py:make", "--write-baseline", "baseline.json", cwd=project_dir)
    baselined = run_without_torch("check", "model.py:make", "--baseline", "baseline.json", cwd=project_dir)
    assert baselined.returncode == 0 and "GL101" not in baselined.stdout, baselined.stderr
    # Corrupt entries are ignored: the target is captured again, with the first run's report.
    write(project_dir, "pyproject.toml", pyproject)
    for entry in (project_dir / ".graphlint_cache").rglob("*.json"):
        entry.write_text("{ this is not json")
    damaged = run_graphlint("check", "model.py:make", "--format", "json", cwd=project_dir)
    assert (damaged.returncode, damaged.stdout) == (first.returncode, first.stdout)
    assert "Traceback" not in damaged.stderr
    # So is a cache folder that cannot be made: the same report.
    write(project_dir, "not-a-folder", "a file where the cache folder should be\n")
    unwritable = run_graphlint("check", "model.py:make", "--format", "json", "--cache-dir", "not-a-folder",
                               cwd=project_dir)
    assert (unwritable.returncode, unwritable.stdout) == (first.returncode, first.stdout)


HAND_WRITTEN = "torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v"
FUSED = "torch.nn.functional.scaled_dot_product_attention(q, k, v)"


def _install(site, name: str, version: str, attention: str, direct_url: str | None = None) -> None:
    """A distribution as pip leaves it in site-packages: the package and its .dist-info metadata."""
    for old in site.glob(f"{name}-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    write(site, f"{name}/__init__.py", ATTENTION.replace("def make():", "def unused():").replace(HAND_WRITTEN, attention))
    info = site / f"{name}-{version}.dist-info"
    write(info, "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    write(info, "top_level.txt", f"{name}\n")
    write(info, "RECORD", "")
    if direct_url is not None:
        write(info, "direct_url.json", direct_url)


def _run_with_site(site, *args, cwd, torch: bool = True):
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "graphlint"] if torch else [sys.executable, "-c", WITHOUT_TORCH]
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


CHECK = ("check", *WITHOUT_COMPILE, "model.py:make")  # the library's attention is what these runs are about


def test_upgrading_an_installed_library_lints_again(project_dir, tmp_path_factory):
    site = tmp_path_factory.mktemp("env") / "site-packages"
    _install(site, "attnlib", "1.0", HAND_WRITTEN)
    write(project_dir, "model.py", "import torch\nfrom attnlib import Attention\n\n\n"
                                   "def make():\n    return Attention(), (torch.randn(2, 8, 16),)\n")
    first = _run_with_site(site, *CHECK, cwd=project_dir)
    assert first.returncode == 1 and "GL101" in first.stdout, first.stderr
    assert _run_with_site(site, *CHECK, cwd=project_dir, torch=False).returncode == 1  # cached
    _install(site, "attnlib", "2.0", FUSED)
    assert _run_with_site(site, *CHECK, cwd=project_dir, torch=False).returncode == 2  # a miss
    assert _run_with_site(site, *CHECK, cwd=project_dir).returncode == 0


def test_a_library_installed_from_a_local_path_is_tracked_by_content(project_dir, tmp_path_factory):
    site = tmp_path_factory.mktemp("env") / "site-packages"
    from_path = '{"url": "file:///src/attnlib", "dir_info": {}}'
    _install(site, "attnlib", "1.0", HAND_WRITTEN, from_path)
    write(project_dir, "model.py", "import torch\nfrom attnlib import Attention\n\n\n"
                                   "def make():\n    return Attention(), (torch.randn(2, 8, 16),)\n")
    assert _run_with_site(site, *CHECK, cwd=project_dir).returncode == 1
    assert _run_with_site(site, *CHECK, cwd=project_dir, torch=False).returncode == 1  # cached
    _install(site, "attnlib", "1.0", FUSED, from_path)  # reinstalled from the edited source: same version
    assert _run_with_site(site, *CHECK, cwd=project_dir, torch=False).returncode == 2  # a miss
    assert _run_with_site(site, *CHECK, cwd=project_dir).returncode == 0


def test_the_cache_folder_moves_with_an_option_or_the_environment_no_cache_captures_and_progress_is_on_terminals(
        project_dir, tmp_path):
    write(project_dir, "model.py", CLEAN)
    moved = tmp_path / "moved"
    # --cache-dir moves the cache out of the project; piped, the run shows no progress.
    piped = run_graphlint("check", "model.py:make", "--cache-dir", str(moved), cwd=project_dir)
    assert piped.returncode == 0 and piped.stderr == ""
    assert list(moved.rglob("targets/*.json"))
    # $GRAPHLINT_CACHE_DIR moves it too: the same folder answers in full, without torch.
    by_env = {"GRAPHLINT_CACHE_DIR": str(moved)}
    assert run_without_torch("check", "model.py:make", cwd=project_dir, env=by_env).returncode == 0
    assert not (project_dir / ".graphlint_cache").exists()
    # --no-cache always captures: without torch it cannot, and says so in one line.
    without = run_without_torch("check", "model.py:make", "--no-cache", cwd=project_dir, env=by_env)
    assert without.returncode == 2
    assert without.stderr.startswith("graphlint: error: cannot import torch") and "Traceback" not in without.stderr
    # Progress is shown on a terminal (and not when piped: the first run).
    controller, terminal = pty.openpty()
    try:
        on_terminal = subprocess.run([sys.executable, "-m", "graphlint", "check", "model.py:make", "--no-cache"],
                                     cwd=project_dir, stdout=subprocess.PIPE, stderr=terminal, timeout=300)
        os.close(terminal)
        shown = os.read(controller, 65536).decode()
    finally:
        os.close(controller)
    assert on_terminal.returncode == 0
    assert "capturing model.py:make" in shown and "model.py:make: captured on meta in" in shown


# A forward that never returns, in Python; it sleeps between its ops so that it does not take a core from the
# other targets and the tests running beside it while the bound runs out.
HANGS = '''
import time

import torch
from torch import nn


class Hangs(nn.Module):
    def forward(self, x):
        while True:
            x = x + 0
            time.sleep(0.05)


def make():
    return Hangs(), (torch.randn(2),)
'''

CRASHES = '''
import os


def make():
    os.abort()
'''


def test_parallel_targets_keep_their_order_and_survive_a_hang_and_a_crash(project_dir):
    write(project_dir, "good.py", ATTENTION)
    write(project_dir, "clean.py", CLEAN)
    write(project_dir, "hangs.py", HANGS)
    write(project_dir, "crashes.py", CRASHES)
    targets = ["hangs.py:make", "good.py:make", "crashes.py:make", "clean.py:make"]
    # 12 s is three times what a good target takes here under CI's load.
    result = run_graphlint("check", *targets, "-j", "2", "--timeout", "12", "--no-cache", "--format", "json",
                           cwd=project_dir)
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert [f["rule"] for f in report["findings"]] == ["GL301", "GL101"]  # the forward's print, the attention
    assert {f["location"]["path"] for f in report["findings"]} == {"good.py"}
    errors = {e["target"]: e["message"] for e in report["errors"]}
    assert list(errors) == ["hangs.py:make", "crashes.py:make"]
    assert errors["hangs.py:make"].startswith("did not finish within 12 s (--timeout) during the forward")
    assert errors["crashes.py:make"].startswith("its process aborted (SIGABRT")
    assert "during the factory" in errors["crashes.py:make"]
    assert report["summary"]["targets"] == 4 and report["summary"]["failed_targets"] == 2


def test_runs_given_one_warm_parent_start_every_child_from_it(tmp_path, monkeypatch):
    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.session import Options, check
    from graphlint.run import scheduler
    from graphlint.run.parent import WarmParent

    parent = WarmParent()  # the language server keeps one for its whole life
    monkeypatch.setattr(scheduler, "WarmParent", lambda: pytest.fail("a run made a warm parent of its own"))
    for name in ("first", "second"):
        path = write(tmp_path / name, "model.py", ATTENTION)
        project = Project(root=path.parent, first_party_folders=[path.parent])
        report = check([f"{path}:make"], project, Config(), Options(), parent=parent)
        assert [f.rule_id for f in report.findings] == ["GL301", "GL101"]  # the forward's print, the attention


def _session(folder, **options):
    from graphlint.project import Project
    from graphlint.session import Options, Session

    events = []
    project = Project(root=folder, first_party_folders=[folder])
    session = Session(["model.py:make"], project, options=Options(progress=lambda target, event, **_: events.append(
        event), **options), base=folder)
    return session, events


def test_a_newer_lint_of_a_target_being_linted_supersedes_it_and_only_the_newer_result_is_delivered(tmp_path):
    hang = "import pathlib, time\npathlib.Path(__file__).with_name('hanging').touch()\ntime.sleep(600)\n"
    path = write(tmp_path, "model.py", hang + ATTENTION)
    session, events = _session(tmp_path, timeout=60)  # a lint left running would be delivered, as a failure
    session.lint(["model.py:make"])
    assert events == ["started"] and session.linting
    deadline = time.monotonic() + 120
    while not (tmp_path / "hanging").exists() and time.monotonic() < deadline:  # its child is in the import
        time.sleep(0.05)
    path.write_text(ATTENTION, encoding="utf-8")  # the user fixed the file and saved it
    session.lint(["model.py:make"])  # opening the file again leaves the running lint alone
    assert events == ["started"]
    session.lint(["model.py:make"], supersede=True)
    delivered = []
    while session.linting:
        delivered += session.runner.finished()
    [(by, target, result)] = delivered
    assert by is session and target == "model.py:make"
    assert not result.errors and [f.rule_id for f in result.findings] == ["GL301", "GL101"]
    assert events == ["started", "started", "done"]


def test_a_cache_hit_is_delivered_as_it_was_and_not_written_back(tmp_path):
    write(tmp_path, "model.py", ATTENTION)
    session, events = _session(tmp_path, cache=tmp_path / "cache")
    [linted] = session.results(["model.py:make"])
    [entry] = (tmp_path / "cache").rglob("targets/*.json")
    written = entry.stat().st_mtime_ns
    again, events = _session(tmp_path, cache=tmp_path / "cache")
    assert list(again.stream(["model.py:make"])) == [("model.py:make", linted)]
    assert events == ["cached"] and entry.stat().st_mtime_ns == written


def test_the_rules_tags_not_their_ids_say_whether_vary_and_the_memory_budget_are_in_a_key(tmp_path):
    from graphlint.cache import ResultCache
    from graphlint.project import Project
    from graphlint.tags import BUDGET_TAG, COMPILE_TAG

    cache, project = ResultCache(tmp_path / "cache"), Project(root=tmp_path)

    def key(rules, vary=("batch",), budget=None, tags=()):
        return cache.key("model.py:make", tmp_path, project, "meta", rules, vary, budget, tags)

    # A plugin's torch.compile rule (no GL3 in its ID) keeps results apart by --vary; a rule without the tag does not.
    assert key(("GLX301",), ("batch",), tags={COMPILE_TAG}) != key(("GLX301",), ("batch", "seq"), tags={COMPILE_TAG})
    assert key(("GL301",), ("batch",)) == key(("GL301",), ("batch", "seq"))
    assert key(("GLX401",), budget=1 << 30, tags={BUDGET_TAG}) != key(("GLX401",), budget=2 << 30, tags={BUDGET_TAG})
    assert key(("GL401",), budget=1 << 30) == key(("GL401",), budget=2 << 30)


PARENT_MODULES = """
import sys
from pathlib import Path

from graphlint.config import Config
from graphlint.project import Project
from graphlint.session import check

folder = Path(sys.argv[1])
project = Project(root=folder, first_party_folders=[folder])
report = check([f"{folder / name}:make" for name in ("first.py", "second.py")], project, Config(ignore=("GL3",)))
print([f.rule_id for f in report.findings])
print(sorted(name for name in ("graphlint.locate.spans", "libcst.metadata", "first", "second") if name in sys.modules))
"""


def test_what_a_child_imported_of_graphlint_and_of_libraries_the_parent_imports_once_for_the_next(tmp_path):
    # Locating the first child's finding imported graphlint's span finder (0.07 s over libcst's 0.2 s), which the
    # parent's `import libcst` left out: every later child imported it again. The project's own module stays out.
    for name in ("first.py", "second.py"):
        write(tmp_path, name, ATTENTION)
    done = subprocess.run([sys.executable, "-c", PARENT_MODULES, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    findings, modules = done.stdout.splitlines()[-2:]
    assert findings == "['GL101', 'GL101']"
    assert modules == "['graphlint.locate.spans', 'libcst.metadata']"  # libcst's own import brings its metadata


def test_only_graphlints_modules_and_installed_libraries_are_preloaded(tmp_path, monkeypatch):
    import importlib

    from graphlint.run.child import _preloadable

    write(tmp_path, "project_module.py", "VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("project_module")
    import graphlint.locate.lines  # noqa: F401
    import libcst.metadata  # noqa: F401

    names = {"project_module", "graphlint.locate.lines", "libcst.metadata", "libcst", "_thread", "sys"}
    try:
        # a library's submodule stays out: the target's forward may have imported it under the capture's state
        assert _preloadable(names) == ["graphlint.locate.lines", "libcst"]
    finally:
        sys.modules.pop("project_module")


ARGUMENTS_AT_IMPORT = '''
import argparse

print("argslib says hello")  # at import, as some libraries do
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1.0)
OPTIONS = parser.parse_args()  # a child's argv is its target's; the parent's is graphlint's command line
'''


@pytest.mark.cli
def test_a_library_that_prints_and_parses_arguments_at_import_is_preloaded_without_harm(project_dir):
    # The first child imports the library; the warm parent imports it again before the second child: what it
    # prints must stay out of the report on stdout, and its argparse exit must not end the run.
    write(project_dir / "env" / "site-packages" / "argslib", "__init__.py", ARGUMENTS_AT_IMPORT)
    write(project_dir, "first.py", "import argslib\n" + ATTENTION)
    write(project_dir, "second.py", ATTENTION)
    done = run_graphlint("check", "first.py:make", "second.py:make", "-j", "1", "--no-cache", "--ignore", "GL3",
                         "--format", "json", cwd=project_dir,
                         env={"PYTHONPATH": str(project_dir / "env" / "site-packages")})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert sorted(f["rule"] for f in report["findings"]) == ["GL101", "GL101"]


def test_an_answer_measured_while_the_threads_waited_for_cores_is_not_kept(tmp_path):
    from graphlint.results import TargetResult
    from graphlint.timing.devices import WAITING

    write(tmp_path, "model.py", CLEAN)
    session, _ = _session(tmp_path, cache=tmp_path / "cache")
    spoiled = TargetResult("model.py:make", notes=[f"3 op call(s) were not timed: this CPU's 2 threads {WAITING}"])
    session._store("model.py:make", spoiled)
    assert not list((tmp_path / "cache").rglob("targets/*.json"))  # the next run measures again
    session._store("model.py:make", TargetResult("model.py:make", notes=["the step ran on the CPU"]))
    assert len(list((tmp_path / "cache").rglob("targets/*.json"))) == 1
