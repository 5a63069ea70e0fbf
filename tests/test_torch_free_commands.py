"""Commands that list, explain or refuse, and answers the result cache already holds, never import torch: each
runs the real command in a fresh process that says, as it exits, whether torch was imported. The built-in
rules' metadata is read from their source for that (graphlint.catalog), and equals the imported rules'."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import run_graphlint, write
from graphlint import catalog
from graphlint.cli import _parser
from graphlint.cli_reference import _subcommands
from graphlint.engine import listed_rules, load_rules
from graphlint.results import RuleInfo
from graphlint.target import TargetSpec, refused_before_import

pytestmark = [pytest.mark.cli, pytest.mark.command]  # CI runs these against the installed wheel too

# `python -m graphlint ARGS`, with one more line on stderr as the process exits: whether torch was imported.
WATCHED = ("import atexit, runpy, sys; "
           "atexit.register(lambda: sys.stderr.write(f\"\\ntorch imported: {'torch' in sys.modules}\\n\")); "
           "runpy.run_module('graphlint', run_name='__main__', alter_sys=True)")

MODEL = '''
import os

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


def make():
    with open(os.path.join(HERE, "calls.txt"), "a") as calls:  # one line per factory call
        calls.write("made\\n")
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)), (torch.randn(4, 8),)
'''


def run_watched(*args: str, cwd, env: dict | None = None) -> tuple[subprocess.CompletedProcess, bool]:
    """The command's result, its stderr without the added line, and whether it imported torch."""
    result = subprocess.run([sys.executable, "-c", WATCHED, *args], cwd=cwd, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})
    stderr, _, told = result.stderr.rstrip("\n").rpartition("\n")
    assert told in ("torch imported: True", "torch imported: False"), result.stderr
    result.stderr = stderr.rstrip("\n") + "\n" if stderr.strip() else ""
    return result, told == "torch imported: True"


@pytest.fixture
def model(project_dir):
    write(project_dir, "model.py", MODEL)
    return project_dir


def made(folder) -> int:
    path = folder / "calls.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("args", [["rules"], ["rules", "--format", "markdown"], ["rule", "GL101"], ["rule", "gl302"]])
def test_listing_and_explaining_rules_imports_no_torch(project_dir, args):
    result, torch_imported = run_watched(*args, cwd=project_dir)
    assert result.returncode == 0, result.stderr
    assert not torch_imported
    if args == ["rules"]:
        assert [line.split()[0] for line in result.stdout.splitlines()] == [rule.id for rule in load_rules()]
    else:
        assert "GL" in result.stdout and not result.stderr


# A plugin's rule module as docs/plugins.md asks: torch and the capture imported in `check`, not at the top.
LAZY_PLUGIN = '''
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule


class EveryLinear(Rule):
    id = "GLZ001"
    name = "every-linear"
    severity = Severity.WARNING
    tags = ("style",)
    summary = "A linear layer ran."
    what = "Every linear layer."
    why = "A test of listing."
    example = "nn.Linear(8, 8)"
    instead = "nothing"
    bad_examples = (Example(title="a linear layer", source="""
        import torch
        from torch import nn


        def make():
            return nn.Linear(8, 8), (torch.randn(2, 8),)  # expect: GLZ001
    """),)
    good_examples = (Example(title="no linear layer", source="""
        import torch
        from torch import nn


        def make():
            return nn.ReLU(), (torch.randn(2, 8),)
    """),)

    def check(self, capture):
        from graphlint.capture.contract import facts

        for node in capture.ops:
            if facts(node).op == "linear":
                yield Problem(message="A linear layer.", node=node)
'''


def test_a_plugin_that_imports_torch_in_check_only_is_listed_without_torch(tmp_path, project_dir):
    from test_rule_plugins import install

    site = install(tmp_path, "graphlint-lazy-rules", {"lazy_rules": LAZY_PLUGIN}, {"lazy": "lazy_rules"})
    paths = os.pathsep.join([str(site), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])
    result, torch_imported = run_watched("rules", cwd=project_dir, env={"PYTHONPATH": paths})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].endswith("A linear layer ran.  (plugin: graphlint-lazy-rules 0.1)")
    assert not torch_imported


def test_an_unknown_rule_is_one_line_without_torch(project_dir):
    result, torch_imported = run_watched("rule", "GL999", cwd=project_dir)
    assert result.returncode == 2 and not torch_imported
    [line] = result.stderr.splitlines()
    assert line.startswith("graphlint: error: no rule 'GL999'; the rules are GL101, ")


@pytest.mark.parametrize("command", [[], *([name] for name in _subcommands(_parser()))])
def test_every_help_imports_no_torch(project_dir, command):
    result, torch_imported = run_watched(*command, "--help", cwd=project_dir)
    assert result.returncode == 0 and result.stdout.startswith("usage: graphlint"), result.stderr
    assert not torch_imported


@pytest.mark.parametrize("args", [
    [],
    ["lint"],
    ["check", "--format", "nope", "model.py:make"],
    ["check", "--jobs", "0", "model.py:make"],
    ["check", "--unsafe-fixes", "model.py:make"],
    ["check", "--memory-budget", "lots", "model.py:make"],
    ["check"],  # no TARGET and no [tool.graphlint] targets
    ["graph", "--depth", "0", "model.py:make"],
    ["memory", "--optimizer", "lion", "model.py:make"],
    ["memory", "--batch", "0", "model.py:make"],
    ["memory", "--ddp", "2", "--fsdp", "2", "model.py:make"],
    ["memory", "--ddp", "2", "--bucket-cap-mb", "-1", "model.py:make"],
    # an output that cannot be written is said before any target runs (a lint can take minutes)
    ["check", "--output", "no/such/folder/out.sarif", "--format", "sarif", "model.py:make"],
    ["check", "--report", "json=no/such/folder/out.json", "model.py:make"],
    ["check", "--write-baseline", "no/such/folder/baseline.json", "model.py:make"],
    ["graph", "--output", ".", "model.py:make"],  # a folder
    ["time", "--cpu", "--output", "model.py/out.json", "model.py:make"],  # under a file
])
def test_usage_errors_import_no_torch(model, args):
    result, torch_imported = run_watched(*args, cwd=model)
    assert result.returncode == 2, result.stderr
    assert not torch_imported and "Traceback" not in result.stderr
    assert made(model) == 0


@pytest.mark.parametrize("command", ["check", "graph", "memory"])
@pytest.mark.parametrize("target, message", [
    ("missing.py:make", "file missing.py does not exist; check the path before ':'"),
    ("model.py:mkae", "model.py has no 'mkae'; define a function mkae() that returns (model, args), or name a model "
                      "class"),
    ("./pyproject.toml:make", "pyproject.toml is not a .py file"),
])
def test_a_missing_file_or_name_is_refused_in_one_line_without_torch(model, command, target, message):
    result, torch_imported = run_watched(command, target, cwd=model)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"graphlint: error: {target}: {message}"]
    assert not torch_imported


def test_a_name_only_the_import_can_tell_is_imported_and_said_as_before(model):
    """A star import or a module __getattr__ can bind any name: the import decides, with the message of before;
    a name bound through globals() is found."""
    write(model, "starred.py", "from model import *\n")
    write(model, "lazy.py", "def __getattr__(name):\n    raise AttributeError(name)\n")
    write(model, "made.py", "import model\n\nglobals()['ma' + 'ke'] = model.make\n")
    for target in ("starred.py:mkae", "lazy.py:make"):
        result, torch_imported = run_watched("check", target, cwd=model)
        where = target.partition(":")[0]
        name = target.partition(":")[2]
        assert result.returncode == 2 and torch_imported, result.stderr
        assert result.stderr.splitlines() == [f"graphlint: error: {target}: {where} has no {name!r}; define a "
                                              f"function {name}() that returns (model, args), or name a model class"]
    found = run_graphlint("check", "made.py:make", "--select", "GL1", cwd=model)
    assert found.returncode == 0, found.stderr
    assert made(model) > 0


@pytest.mark.parametrize("source, name, refused", [
    ("def make():\n    pass\n", "make", False),
    ("def make():\n    pass\n", "build", True),
    ("from layers import *\n", "build", False),
    ("def __getattr__(name):\n    return None\n", "build", False),
    ("import sys\nsetattr(sys.modules[__name__], 'bu' + 'ild', print)\n", "build", False),
    ("exec('build = print')\n", "build", False),
    ("FACTORIES = {'build': print}\n", "build", False),  # spelled in a string: the import decides
    ("if True:\n    from layers import build\n", "build", False),
    ("def build(:\n", "build", False),  # the import says where the syntax error is
])
def test_a_name_is_refused_statically_only_when_nothing_could_bind_it(tmp_path, source, name, refused):
    write(tmp_path, "model.py", source)
    message = refused_before_import(TargetSpec.parse(f"model.py:{name}", tmp_path))
    assert (message is not None) == refused


def test_a_cached_check_imports_no_torch(model):
    first = run_graphlint("check", "model.py:make", "--format", "json", "--ignore", "GL3", cwd=model)
    second, torch_imported = run_watched("check", "model.py:make", "--format", "json", "--ignore", "GL3", cwd=model)
    assert second.returncode == first.returncode == 0, second.stderr
    assert second.stdout == first.stdout and not torch_imported


@pytest.mark.parametrize("options", [[], ["--format", "json", "--optimizer", "sgd", "--batch", "8", "--train-on", "cpu",
                                          "--autocast", "bf16", "--device-memory", "1GiB"]])
def test_a_second_identical_memory_is_answered_from_the_cache_without_torch(model, options):
    first = run_graphlint("memory", "model.py:make", *options, cwd=model)
    assert first.returncode == 0, first.stderr
    calls = made(model)
    assert calls > 0
    second, torch_imported = run_watched("memory", "model.py:make", *options, cwd=model)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout and made(model) == calls
    assert not torch_imported


@pytest.mark.parametrize("options", [["--gpu", "H100"], ["--gpu", "L4", "--format", "json", "--batch", "8"]])
def test_a_second_identical_time_is_answered_from_the_cache_without_torch(model, options):
    first = run_graphlint("time", "model.py:make", *options, cwd=model)
    assert first.returncode == 0, first.stderr
    calls = made(model)
    assert calls > 0
    second, torch_imported = run_watched("time", "model.py:make", *options, cwd=model)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout and made(model) == calls
    assert not torch_imported


def test_a_memory_measured_with_other_threads_is_not_answered_from_the_cache(model):
    first = run_graphlint("memory", "model.py:make", "--train-on", "cpu", "--format", "json", cwd=model,
                          env={"OMP_NUM_THREADS": "2"})
    assert first.returncode == 0, first.stderr
    calls = made(model)
    again = run_graphlint("memory", "model.py:make", "--train-on", "cpu", "--format", "json", cwd=model,
                          env={"OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr
    assert made(model) > calls
    assert json.loads(again.stdout)[0]["target"] == "model.py:make"


# In-process: the metadata read from the source is the imported rules'.

def test_every_built_in_rule_is_read_from_its_source_without_importing_it():
    for rule in catalog.builtin_rules():
        assert rule.__module__.startswith("graphlint.rules.")
        assert rule.check is catalog.Rule.check, f"{rule.id} was imported, not read"


def test_the_rules_read_from_source_are_the_imported_rules():
    imported = load_rules()
    listed = listed_rules()
    assert [rule.id for rule in listed] == [rule.id for rule in imported]
    for stand_in, rule in zip(listed, imported, strict=True):
        assert (stand_in.__name__, stand_in.__module__) == (rule.__name__, rule.__module__)
        for attribute in catalog.METADATA:
            assert getattr(stand_in, attribute) == getattr(rule, attribute), (rule.id, attribute)
        assert stand_in.docs_markdown(with_examples=True) == rule.docs_markdown(with_examples=True)
        assert RuleInfo.of(stand_in) == RuleInfo.of(rule)


@pytest.mark.parametrize("body", [
    "    summary = 'A ' + SUFFIX\n",  # a module-level name
    "    summary = describe()\n",  # a call
    "    def help_uri(cls):\n        return 'https://example.org'\n",  # a method that overrides Rule's
])
def test_a_rule_whose_source_is_not_literal_is_imported(body):
    source = f"from graphlint.rule import Rule\n\n\nclass Made(Rule):\n    id = 'GLX001'\n{body}"
    with pytest.raises(catalog.NotLiteral):
        catalog.read_rules(source, "made")


def test_a_match_record_beside_a_rule_is_read_as_no_rule():
    """A rule's typed match (`class NormMatch(Match, Generic[Matched])`) sits in its module without making the
    module one that only an import can tell."""
    source = ("from typing import Generic\n\nfrom graphlint.rule import Match, Matched, Rule\n\n\n"
              "class Found(Match, Generic[Matched]):\n    node: Matched\n\n\n"
              "class Made(Rule):\n    id = 'GLX001'\n")
    assert [rule.__name__ for rule in catalog.read_rules(source, "made")] == ["Made"]


def runtime_torch_names(source: str) -> tuple[set[str], set[str]]:
    """(the names a module imports from torch at its top level, those of them it reads outside annotations)."""
    import ast

    tree = ast.parse(source)
    imported = {alias.asname or alias.name.split(".")[0] for statement in tree.body
                if isinstance(statement, (ast.Import, ast.ImportFrom))
                and (getattr(statement, "module", None) or statement.names[0].name).split(".")[0] == "torch"
                for alias in statement.names}
    annotations = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AnnAssign))
                   for part in ([function.annotation] if isinstance(function, ast.AnnAssign) else
                                [a.annotation for a in (*function.args.posonlyargs, *function.args.args,
                                                        *function.args.kwonlyargs) if a.annotation] + [function.returns])
                   if part is not None for node in ast.walk(part)}
    read = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in imported
            and id(node) not in annotations}
    return imported, read


def test_a_rule_imports_torch_at_its_top_level_only_to_run_it():
    """Names used only in annotations come from torch under TYPE_CHECKING (the rule still runs with torch, which
    the capture imports, but its module says what it needs)."""
    from conftest import REPO

    only_annotations = {}
    for path in sorted((REPO / "rules").rglob("*.py")):
        imported, read = runtime_torch_names(path.read_text(encoding="utf-8"))
        if imported - read:
            only_annotations[str(path.relative_to(REPO))] = sorted(imported - read)
    assert only_annotations == {}
    assert runtime_torch_names("from torch import fx\nimport torch\n\ndef f(n: fx.Node) -> None:\n    torch.ones(1)\n") \
        == ({"fx", "torch"}, {"torch"})
