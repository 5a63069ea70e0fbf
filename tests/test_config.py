"""[tool.graphlint] configuration, command-line overrides, and exit codes with --fail-on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import lint_file, run_graphlint, write
from graphlint.config import Config, read_config
from graphlint.engine import load_rules
from graphlint.errors import UsageError
from graphlint.selection import select
from test_several_problems import MESSY


def select_rules(config: Config, rules=None):
    return select(config, load_rules() if rules is None else rules)


def ids(config: Config) -> list[str]:
    return [rule.id for rule in select_rules(config)]


DEFAULT = ["GL101", "GL102", "GL103", "GL104", "GL105", "GL106", "GL107", "GL108", "GL201", "GL202", "GL203", "GL204",
           "GL301", "GL302", "GL401"]  # GL401 reports only under a memory budget


def test_the_default_selection_is_every_rule_but_the_opt_in_ones():
    assert ids(Config()) == DEFAULT


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (Config(select=("GL2",)), ["GL201", "GL202", "GL203", "GL204"]),
        (Config(select=("GL101", "GL20")), ["GL101", "GL201", "GL202", "GL203", "GL204"]),
        (Config(select=("ALL",)), DEFAULT + ["GL402", "GL901"]),
        (Config(distributed="ddp"), DEFAULT + ["GL402"]),  # a target meant for DDP turns on the DDP rule
        (Config(distributed="ddp", ignore=("GL402",)), DEFAULT),
        (Config(extend_select=("GL901",)), DEFAULT + ["GL901"]),
        (Config(ignore=("GL1", "GL203")), ["GL201", "GL202", "GL204", "GL301", "GL302", "GL401"]),
        (Config(ignore=("GL3",)), [rule for rule in DEFAULT if not rule.startswith("GL3")]),  # the compile rules off
        (Config(select=("gl2",), ignore=("GL202",)), ["GL201", "GL203", "GL204"]),
    ],
)
def test_selectors_are_ids_prefixes_or_all(config, expected):
    assert ids(config) == expected


@pytest.mark.parametrize("option", ["select", "extend_select", "ignore"])
def test_a_selector_that_matches_no_rule_is_an_error_naming_it(option):
    with pytest.raises(UsageError, match=r"'GL777' matches no rule; rule IDs are GL101, GL102"):
        select_rules(Config(**{option: ("GL777",)}))


def test_every_key_is_read_from_pyproject(tmp_path):
    pyproject = write(tmp_path, "pyproject.toml", '''
        [tool.graphlint]
        targets = ["m.py:make"]
        device = "cpu"
        select = ["GL1"]
        extend-select = ["GL901"]
        ignore = ["GL102"]
        per-file-ignores = { "legacy/*.py" = ["GL101"] }
        fail-on = "error"

        [tool.graphlint.severity]
        GL101 = "error"
    ''')
    config = read_config(pyproject)
    assert config == Config(targets=("m.py:make",), device="cpu", select=("GL1",), extend_select=("GL901",),
                            ignore=("GL102",), per_file_ignores={"legacy/*.py": ("GL101",)},
                            severity={"GL101": "error"}, fail_on="error", source=pyproject)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('select = "GL1"', "tool.graphlint.select must be a list of strings"),
        ('per-file-ignores = ["x.py"]', "tool.graphlint.per-file-ignores must be a table of glob = [rule IDs]"),
        ('per-file-ignores = { "x.py" = "GL101" }', "tool.graphlint.per-file-ignores.'x.py' must be a list of strings"),
        ("severity = { GL101 = \"fatal\" }", "tool.graphlint.severity.GL101 must be one of note, warning, error"),
        ('fail-on = "sometimes"', "tool.graphlint.fail-on must be one of note, warning, error, never"),
        ('fail_on = "error"', "unknown key tool.graphlint.fail_on; the keys graphlint reads are targets, device"),
    ],
)
def test_wrong_types_and_unknown_keys_name_the_key_and_what_is_allowed(tmp_path, table, message):
    pyproject = write(tmp_path, "pyproject.toml", f"[tool.graphlint]\n{table}\n")
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_config(pyproject)


@pytest.mark.parametrize(("table", "message"), [
    ('targets = [{ "a\\nb" = "" }]',
     "tool.graphlint.targets[0]: unknown key 'a\\nb'; a target table has model, inputs, kwargs and vary"),
    ('severity = { "a\\nb" = "" }', "tool.graphlint.severity.'a\\nb' must be one of note, warning, error; got ''"),
    ('"a\\nb" = 1', "unknown key tool.graphlint.'a\\nb'; the keys graphlint reads are"),
])
def test_a_key_that_holds_a_line_break_is_named_as_python_writes_it_and_the_error_stays_one_line(tmp_path, table,
                                                                                                message):
    pyproject = write(tmp_path, "pyproject.toml", f"[tool.graphlint]\n{table}\n")
    with pytest.raises(UsageError) as raised:
        read_config(pyproject)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_per_file_ignores_drop_a_rule_for_matching_files(tmp_path):
    path = write(tmp_path, "messy.py", MESSY.code)
    report = lint_file(path, per_file_ignores={"mess*.py": ("GL101", "GL2")})
    assert {f.rule_id for f in report.findings} == {"GL102"}


def test_severity_overrides_change_findings_and_the_sarif_rule_level(tmp_path):
    from graphlint.report.sarif import render_sarif

    report = lint_file(write(tmp_path, "messy.py", MESSY.code), severity={"GL203": "error", "GL101": "note"})
    levels = {f.rule_id: f.severity.value for f in report.findings}
    assert levels["GL203"] == "error" and levels["GL101"] == "note"
    rules = {r["id"]: r for r in json.loads(render_sarif(report))["runs"][0]["tool"]["driver"]["rules"]}
    assert rules["GL203"]["defaultConfiguration"]["level"] == "error"


NOTE_ONLY = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def make():
    return Net(), (torch.randn(2, 4),)
'''


def test_fail_on_decides_the_exit_code_for_a_note(project_dir):
    write(project_dir, "net.py", NOTE_ONLY)
    # One capture: the runs after the first answer from the result cache, since fail-on is policy, not capture.
    for fail_on, exit_code in [(None, 0), ("note", 1), ("warning", 0), ("error", 0), ("never", 0)]:
        args = ["check", "net.py:make"] + (["--fail-on", fail_on] if fail_on else [])
        result = run_graphlint(*args, cwd=project_dir)
        assert result.returncode == exit_code, (fail_on, result.stderr)
        assert "GL203" in result.stdout  # reported either way


def test_the_command_line_overrides_the_configuration(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.graphlint]\ntargets = ["messy.py:make"]\nselect = ["GL101"]\n'
                                      'fail-on = "never"\n')
    write(tmp_path, "messy.py", MESSY.code)
    from_config = run_graphlint("check", "--format", "json", cwd=tmp_path)
    assert from_config.returncode == 0
    assert {f["rule"] for f in json.loads(from_config.stdout)["findings"]} == {"GL101"}
    overridden = run_graphlint("check", "--format", "json", "--select", "GL2", "--ignore", "GL203",
                               "--fail-on", "error", cwd=tmp_path)
    assert overridden.returncode == 1
    assert {f["rule"] for f in json.loads(overridden.stdout)["findings"]} == {"GL201", "GL202"}


# ruff's selection semantics, on a fixed set of rules so that new rules do not change the expectations.
_FAKE_RULES = tuple(
    SimpleNamespace(id=rule_id, default_enabled=rule_id != "GL901")
    for rule_id in ("GL101", "GL102", "GL201", "GL202", "GL901")
)


def _resolved(config: Config) -> list[str]:
    return [rule.id for rule in select_rules(config, _FAKE_RULES)]


@pytest.mark.parametrize(
    ("file", "command_line", "expected"),
    [
        # The command line's select starts the resolution: the file's ignore is dropped.
        ({"ignore": ("GL101",)}, {"select": ("GL101",)}, ["GL101"]),
        ({"select": ("GL2",), "extend_select": ("GL901",)}, {"select": ("GL1",)}, ["GL101", "GL102"]),
        # Without a select of its own, the command line adjusts what the file chose.
        ({"select": ("GL1",)}, {"extend_select": ("GL201",)}, ["GL101", "GL102", "GL201"]),
        ({"ignore": ("GL101",)}, {"extend_select": ("GL101",)}, ["GL101", "GL102", "GL201", "GL202"]),
        ({"select": ("ALL",), "ignore": ("GL2",)}, {"ignore": ("GL101",)}, ["GL102", "GL901"]),
        # Within one layer the more specific selector wins; at equal specificity the ignore does.
        ({"select": ("GL1",), "ignore": ("GL101",)}, None, ["GL102"]),
        ({"select": ("GL201",), "ignore": ("ALL",)}, None, ["GL201"]),
        ({"select": ("GL2",), "ignore": ("GL2",)}, None, []),
        (None, {"select": ("GL1", "GL901"), "ignore": ("GL10",)}, ["GL901"]),
    ],
)
def test_selection_follows_ruffs_layers(file, command_line, expected):
    config = Config(**(file or {}))
    if command_line is not None:
        config = config.overridden(**command_line)
    assert _resolved(config) == expected


def test_a_command_line_select_runs_a_rule_the_pyproject_ignores(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.graphlint]\ntargets = ["messy.py:make"]\nignore = ["GL101"]\n')
    write(tmp_path, "messy.py", MESSY.code)
    ignored = run_graphlint("check", "--format", "json", cwd=tmp_path)
    assert "GL101" not in {f["rule"] for f in json.loads(ignored.stdout)["findings"]}
    selected = run_graphlint("check", "--format", "json", "--select", "GL101", cwd=tmp_path)
    assert {f["rule"] for f in json.loads(selected.stdout)["findings"]} == {"GL101"}
