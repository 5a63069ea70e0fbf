"""Rules from another distribution, found through the `graphlint.rules` entry-point group: real packages, installed
by pip into folders of their own, seen by the real command on PYTHONPATH (and only there: this test's own process
never imports them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import WITHOUT_COMPILE, line_of, run_graphlint, write

pytestmark = pytest.mark.cli  # CI runs these against the installed wheel too

# A rule as an outside author writes one, against graphlint's public Rule API only.
LINEAR_WITHOUT_BIAS = '''
    from graphlint.capture.contract import facts
    from graphlint.results import Severity
    from graphlint.rule import Example, Problem, Rule


    class LinearWithoutBias(Rule):
        id = "GLX001"
        name = "linear-without-bias"
        severity = Severity.WARNING
        tags = ("style",)
        summary = "A linear layer has no bias."
        what = "Every linear layer (`nn.Linear(..., bias=False)`, `F.linear` without a bias) that the forward ran."
        why = "This team's models keep a bias on every projection."
        example = "self.proj = nn.Linear(8, 8, bias=False)"
        instead = "self.proj = nn.Linear(8, 8)"
        bad_examples = (Example(title="a projection without bias", source="""
            import torch
            from torch import nn


            def make():
                return nn.Linear(8, 8, bias=False), (torch.randn(2, 8),)  # expect: GLX001
        """),)
        good_examples = (Example(title="a projection with a bias", source="""
            import torch
            from torch import nn


            def make():
                return nn.Linear(8, 8), (torch.randn(2, 8),)
        """),)

        def check(self, capture):
            for node in capture.ops:
                if facts(node).op == "linear" and (len(node.args) < 3 or node.args[2] is None):
                    yield Problem(message="MESSAGE", node=node, at_build_site=True)
'''

MODELS = '''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, bias):
            super().__init__()
            self.inner = nn.Linear(8, 8, bias=bias)
            self.norm = nn.BatchNorm1d(8)  # with the bias: GL105, a built-in finding beside the plugin's
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            return self.out(self.norm(self.inner(x)).relu())


    def without_bias():
        return Net(False), (torch.randn(4, 8),)


    def with_bias():
        return Net(True), (torch.randn(4, 8),)
'''


def install(folder: Path, distribution: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """Write a distribution with these modules and `graphlint.rules` entry points, pip-install it into a folder
    of its own, and return that folder (what PYTHONPATH names)."""
    source = folder / "source"
    names = "".join(f'{name} = "{value}"\n' for name, value in entry_points.items())
    write(source, "pyproject.toml", textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{distribution}"
        version = "0.1"

        [tool.setuptools]
        py-modules = {sorted(modules)!r}

        [project.entry-points."graphlint.rules"]
    ''') + names)
    for name, text in modules.items():
        write(source, f"{name}.py", text)
    site = folder / "site"
    # No build isolation: setuptools is already installed beside torch, and the test needs no network.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    return site


def graphlint_with(site: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    paths = [str(site)] if site is not None else []
    paths += [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return run_graphlint(*args, cwd=cwd, env={"PYTHONPATH": os.pathsep.join(paths)})


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("plugin"), "graphlint-team-rules",
                   {"team_rules": textwrap.dedent(LINEAR_WITHOUT_BIAS).replace("MESSAGE", "This layer has no bias.")},
                   {"team": "team_rules"})


def test_a_plugin_rule_reports_through_the_real_command_and_the_built_in_findings_stay_as_they_were(plugin,
                                                                                                        project_dir):
    model = write(project_dir, "model.py", MODELS)
    flagged = graphlint_with(plugin, "check", *WITHOUT_COMPILE, "model.py:without_bias", "--no-cache", cwd=project_dir)
    assert flagged.returncode == 1, flagged.stderr
    line = line_of(model, "nn.Linear(8, 8, bias=bias)")
    assert [row.split(":", 1)[1] for row in flagged.stdout.splitlines() if ".py:" in row] == [
        f"{line}:22: GLX001 This layer has no bias."], flagged.stdout  # one layer: the other has a bias

    clean = graphlint_with(plugin, "check", *WITHOUT_COMPILE, "model.py:with_bias", "--no-cache", cwd=project_dir)
    assert "GLX001" not in clean.stdout and f"model.py:{line}:22: GL105 " in clean.stdout, clean.stdout
    without_plugin = run_graphlint("check", *WITHOUT_COMPILE, "model.py:with_bias", "--no-cache", cwd=project_dir)
    assert (clean.returncode, clean.stdout, clean.stderr) == (
        without_plugin.returncode, without_plugin.stdout, without_plugin.stderr)  # the built-in rules' output as before


def test_the_rules_commands_and_the_selection_know_a_plugin_rule(plugin, project_dir):
    listing = graphlint_with(plugin, "rules", cwd=project_dir)
    assert listing.returncode == 0, listing.stderr
    [row] = [line for line in listing.stdout.splitlines() if line.startswith("GLX001")]
    assert "linear-without-bias" in row and row.endswith("(plugin: graphlint-team-rules 0.1)")
    built_in = run_graphlint("rules", cwd=project_dir).stdout.splitlines()
    assert [line.split() for line in listing.stdout.splitlines() if not line.startswith("GLX")] == [
        line.split() for line in built_in]  # the built-in rows keep their text; the columns widen for GLX001

    one = graphlint_with(plugin, "rule", "glx001", cwd=project_dir)
    assert one.returncode == 0 and "A linear layer has no bias." in one.stdout

    write(project_dir, "model.py", MODELS)
    selected = graphlint_with(plugin, "check", "model.py:without_bias", "--select", "GLX", "--no-cache", cwd=project_dir)
    assert selected.returncode == 1 and {line.split()[1] for line in selected.stdout.splitlines() if ".py:" in line} == {
        "GLX001"}, selected.stdout
    unknown = run_graphlint("check", "model.py:without_bias", "--select", "GLX001", cwd=project_dir)
    assert unknown.returncode == 2 and "'GLX001' matches no rule" in unknown.stderr


def test_a_cached_result_is_used_until_a_plugin_changes_or_goes(tmp_path, project_dir):
    site = install(tmp_path, "graphlint-team-rules",
                   {"team_rules": textwrap.dedent(LINEAR_WITHOUT_BIAS).replace("MESSAGE", "First wording.")},
                   {"team": "team_rules"})
    write(project_dir, "model.py", MODELS)
    first = graphlint_with(site, "check", *WITHOUT_COMPILE, "model.py:without_bias", cwd=project_dir)
    assert "GLX001 First wording." in first.stdout, first.stderr
    without_torch = ["-c", "import sys; sys.modules['torch'] = None; from graphlint.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "check", *WITHOUT_COMPILE, "model.py:without_bias"]
    cached = subprocess.run([sys.executable, *without_torch], cwd=project_dir, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(site)}, timeout=300)
    assert cached.stdout == first.stdout, cached.stderr  # no capture, no torch: the plugin was only hashed

    module = site / "team_rules.py"
    module.write_text(module.read_text(encoding="utf-8").replace("First wording.", "Second wording."), encoding="utf-8")
    edited = graphlint_with(site, "check", *WITHOUT_COMPILE, "model.py:without_bias", cwd=project_dir)
    assert "GLX001 Second wording." in edited.stdout and "First wording." not in edited.stdout, edited.stdout

    gone = run_graphlint("check", *WITHOUT_COMPILE, "model.py:without_bias", cwd=project_dir)
    assert gone.returncode == 0 and gone.stdout == "No findings in 1 target.\n", gone.stdout  # no stale GLX001


def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path, project_dir):
    site = install(tmp_path, "graphlint-broken-rules", {"broken_rules": "import a_module_nobody_installed\n"},
                   {"broken": "broken_rules"})
    write(project_dir, "model.py", MODELS)
    for args in (("check", "model.py:with_bias", "--no-cache"), ("rules",)):
        result = graphlint_with(site, *args, cwd=project_dir)
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr.splitlines() == [
            "graphlint: error: the rule plugin entry point 'broken = broken_rules' of graphlint-broken-rules 0.1 "
            "cannot be imported: ModuleNotFoundError: No module named 'a_module_nobody_installed'"], result.stderr


def test_a_plugin_rule_that_reuses_a_built_in_id_is_an_error_naming_both(tmp_path, project_dir):
    reused = textwrap.dedent(LINEAR_WITHOUT_BIAS).replace("GLX001", "GL105").replace("MESSAGE", "No bias.")
    site = install(tmp_path, "graphlint-clashing-rules", {"clashing_rules": reused},
                   {"clash": "clashing_rules:LinearWithoutBias"})
    result = graphlint_with(site, "rules", cwd=project_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "graphlint: error: rule clashing_rules.LinearWithoutBias of the entry point "
        "'clash = clashing_rules:LinearWithoutBias' of graphlint-clashing-rules 0.1 uses the ID GL105, which "
        "graphlint's built-in rule graphlint.rules.gl105_bias_before_norm.BiasBeforeNorm (bias-before-norm) has; "
        "a plugin's rules need IDs of their own"], result.stderr
