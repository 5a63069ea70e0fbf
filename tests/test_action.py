"""The GitHub Action (action.yml): valid metadata, nothing zizmor ranks medium or high, and its shell steps,
run with bash as the runner runs them, write the job summary and exit with graphlint's exit code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write

yaml = pytest.importorskip("yaml", reason="PyYAML reads action.yml")

ACTION = REPO / "action.yml"
WARNINGS = 12  # more warnings than GitHub shows as annotations

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.sigmoid(self.proj(x))
{logs}
        return {total}


def make():
    return Net(), (torch.randn(3, 8),)
'''.format(
    logs="\n".join(f"        é{i} = torch.log(torch.softmax(h * {i + 1}, dim=-1))  # « n°{i} »" for i in range(WARNINGS)),
    total=" + ".join(f"é{i}.sum()" for i in range(WARNINGS)),
)


def _tool(name: str) -> str | None:
    """A command installed beside this Python (the test extra), or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def test_the_action_metadata_is_valid():
    tool = _tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    done = subprocess.run([tool, "--builtin-schema", "vendor.github-actions", str(ACTION)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _zizmor(path: Path) -> list[dict]:
    tool = _tool("zizmor")
    if tool is None:
        pytest.skip("zizmor is not installed (pip install -e '.[test]')")
    done = subprocess.run([tool, "--offline", "--format", "json", "--min-severity", "medium", str(path)],
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def test_zizmor_finds_nothing_of_medium_or_high_severity():
    assert [finding["ident"] for finding in _zizmor(ACTION)] == []


def test_zizmor_would_catch_an_input_in_a_script_and_an_unpinned_action(tmp_path):
    # The check above can fail: the same audit on the two mistakes the action must not make.
    steps = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    steps["runs"]["steps"] = [{"shell": "bash", "run": "graphlint check ${{ inputs.targets }}"},
                              {"uses": "reviewdog/action-setup@v1"}]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "action.yml").write_text(yaml.safe_dump(steps), encoding="utf-8")
    assert {"template-injection", "unpinned-uses"} <= {f["ident"] for f in _zizmor(tmp_path / "bad" / "action.yml")}


def test_inputs_reach_scripts_only_through_env_and_every_action_is_pinned_by_commit():
    for step in yaml.safe_load(ACTION.read_text(encoding="utf-8"))["runs"]["steps"]:
        assert "${{" not in step.get("run", "")
        if "uses" in step:
            assert re.fullmatch(r"[\w./-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


class _Expressions:
    """The few `${{ }}` expressions action.yml uses, evaluated as the runner would for these inputs."""

    def __init__(self, inputs: dict, workspace: Path) -> None:
        self.inputs, self.workspace, self.outputs = inputs, workspace, {}

    def value(self, name: str) -> str:
        kind, _, rest = name.partition(".")
        if kind == "inputs":
            return self.inputs[rest]
        if kind == "steps":
            step, _, output = rest.partition(".outputs.")
            return self.outputs.get(step, {}).get(output, "")
        assert name == "github.workspace", f"action.yml uses ${{{{ {name} }}}}, which this test does not know"
        return str(self.workspace)

    def text(self, template: str) -> str:
        return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: self.value(m.group(1)), template)

    def condition(self, template: str) -> bool:
        expression = template.strip().removeprefix("${{").removesuffix("}}")
        expression = expression.replace("!cancelled()", "True").replace("&&", " and ").replace("||", " or ")
        expression = re.sub(r"\b(inputs|steps)\.[\w.-]+", lambda m: repr(self.value(m.group())), expression)
        return bool(eval(expression, {}))  # only literals and comparisons are left


def run_action(checkout: Path, **given: str) -> tuple[int, dict]:
    """Run the action's shell steps in order, as the runner does (bash -e -o pipefail, fake GITHUB_* files),
    skipping the steps that use other actions; (the last step's exit code, what the job saw)."""
    action = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    inputs.update(given)
    inputs["github-token"] = "not-a-token"
    expressions = _Expressions(inputs, checkout)
    runner = checkout.parent / "runner"
    runner.mkdir(exist_ok=True)
    summary = runner / "summary.md"
    summary.write_text("")
    env = {**os.environ, "GITHUB_WORKSPACE": str(checkout), "GITHUB_STEP_SUMMARY": str(summary),
           "RUNNER_TEMP": str(runner), "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "org/models",
           "GITHUB_SHA": "0123abc", "GITHUB_ACTIONS": "true", "PYTHONWARNINGS": "ignore"}
    seen = {"stdout": "", "steps": []}
    code, failed = 0, False
    for step in action["runs"]["steps"]:
        # After a failed step, only steps whose condition has a status function (!cancelled()) still run.
        if failed and not re.search(r"cancelled\(\)|always\(\)|failure\(\)", step.get("if", "")):
            continue
        if "uses" in step or ("if" in step and not expressions.condition(step["if"])):
            continue
        output = runner / f"output-{len(seen['steps'])}"
        output.write_text("")
        step_env = {**env, "GITHUB_OUTPUT": str(output),
                    **{key: expressions.text(str(value)) for key, value in step.get("env", {}).items()}}
        folder = checkout / expressions.text(step.get("working-directory", "."))
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                              cwd=folder, env=step_env, capture_output=True, text=True, timeout=600)
        seen["stdout"] += done.stdout
        seen["steps"].append((step.get("name"), done.returncode, done.stderr))
        if "id" in step:
            expressions.outputs[step["id"]] = dict(line.split("=", 1) for line in output.read_text().splitlines())
        code, failed = done.returncode, failed or done.returncode != 0
    seen["summary"] = summary.read_text(encoding="utf-8")
    seen["outputs"] = expressions.outputs
    return code, seen


@pytest.fixture
def checkout(tmp_path):
    """A repository checkout whose model project lives one folder down, in models/."""
    write(tmp_path / "repo" / "models", "pyproject.toml", '[tool.graphlint]\ntargets = ["net.py:make"]\n')
    write(tmp_path / "repo" / "models", "net.py", MODEL)
    return tmp_path / "repo"


def test_the_action_annotates_summarises_every_finding_and_exits_with_graphlints_code(checkout):
    code, seen = run_action(checkout, python=sys.executable, **{"working-directory": "models", "upload-sarif": "true"})
    assert code == 1 and seen["outputs"]["run"]["exit-code"] == "1", seen["steps"]
    # Annotations: paths from the repository root, GitHub's limit said out loud.
    assert seen["stdout"].count("::warning file=models/net.py,") == 10
    assert "2 warnings are only in this step's log" in seen["stdout"]
    # The summary lists every finding, each linked to its line at the commit.
    lines = (checkout / "models" / "net.py").read_text(encoding="utf-8").splitlines()
    flagged = [number for number, line in enumerate(lines, start=1) if "torch.log(" in line]
    assert len(flagged) == WARNINGS
    for number in flagged:
        assert f"(https://github.com/org/models/blob/0123abc/models/net.py#L{number})" in seen["summary"]
    rows = [line for line in seen["summary"].splitlines() if line.startswith("| warning |")]
    assert len(rows) == WARNINGS
    # The SARIF of the same run, for code scanning, names files from the repository root too.
    sarif = json.loads(Path(seen["outputs"]["run"]["sarif-file"]).read_text(encoding="utf-8"))
    assert len(sarif["runs"][0]["results"]) == WARNINGS
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["runs"][0]["results"]} \
        == {"models/net.py"}


@pytest.mark.parametrize("args, expected", [("--fail-on never", 0), ("--select GL999", 2)],
                         ids=["clean", "usage-error"])
def test_the_action_exits_with_graphlints_exit_code(checkout, args, expected):
    code, seen = run_action(checkout, python=sys.executable, args=args, annotations="false",
                            **{"working-directory": "models"})
    assert code == expected and seen["outputs"]["run"]["exit-code"] == str(expected), seen["steps"]
    assert seen["summary"].startswith("## graphlint")


def test_the_action_says_when_graphlint_is_not_installed(checkout, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    code, seen = run_action(checkout, python=str(bare / "bin" / "python"))
    assert code == 2
    assert "::error title=graphlint::graphlint is not installed" in seen["stdout"]


def test_the_readme_pins_every_action_by_commit_as_the_action_does():
    # The README shows the action's step; docs/ci.md the whole workflow, and the same steps without the action.
    readme = "\n".join((REPO / name).read_text(encoding="utf-8") for name in ("README.md", "docs/ci.md"))
    used = re.findall(r"uses: ([\w./-]+)@(\S+)(?: # (v[\d.]+))?", readme)
    pinned = {name: sha for name, sha, _ in re.findall(r"uses: ([\w./-]+)@([0-9a-f]{40}) # (v[\d.]+)",
                                                       ACTION.read_text(encoding="utf-8"))}
    others = [(name, sha, version) for name, sha, version in used if name != "torch-graphlint/torch-graphlint"]
    assert {name for name, _, _ in others} == {"actions/checkout", "actions/setup-python", "actions/cache",
                                               "github/codeql-action/upload-sarif"}
    for name, sha, version in others:
        assert re.fullmatch(r"[0-9a-f]{40}", sha) and version, f"{name}@{sha} is not pinned by commit"
        assert sha == pinned.get(name, sha), f"README and action.yml pin different commits of {name}"
    assert "upload-sarif@" in readme and all(v.startswith("v4.") for n, _, v in others if n.endswith("upload-sarif"))


def test_the_documented_workflows_restore_graphlints_cache_before_the_action():
    from graphlint.cache import DEFAULT_FOLDER

    for name in ("README.md", "docs/ci.md"):
        [block] = [b for b in re.findall(r"```yaml\n(.*?)```", (REPO / name).read_text(encoding="utf-8"), re.S)
                   if "uses: torch-graphlint/torch-graphlint@" in b]
        cache = block.find("uses: actions/cache@")
        assert 0 <= cache < block.index("uses: torch-graphlint/torch-graphlint@"), name
        assert f"path: {DEFAULT_FOLDER}\n" in block[cache:], name  # the folder graphlint check writes by default
