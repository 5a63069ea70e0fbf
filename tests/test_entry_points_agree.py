"""The same model gives the same findings at the same lines whichever way it is linted: as a factory target, as
a class target with --init and --input, through `graphlint.lint()`, and through `pytest --graphlint` running a
test that builds it. Checked over every rule example whose factory builds one class from literal arguments on
inputs an --input spec can spell (the others cannot be written as a class target)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import textwrap

import pytest

from conftest import write
from graphlint.config import Config
from graphlint.engine import load_rules
from graphlint.project import Project
from graphlint.session import check
from graphlint.target import target_text

pytest_plugins = ("pytester",)

# Rules whose findings read the compile analysis or a configuration the other entry points do not share (GL402
# reports only for a target meant for DDP, which graphlint.lint() is not told).
_OTHER_INPUTS = {"GL301", "GL302", "GL402", "GL901"}
# Rules that report some findings at the line that built a module (`nn.ReLU(inplace=True)`, an unused layer):
# graphlint.lint() gets a model built before it was called, whose construction lines nobody recorded, and
# reports those findings where the module is called or its class is defined (the README's Python API part
# says so).
_AT_CONSTRUCTION = {"GL105", "GL201", "GL203"}


def _spec(call: ast.expr) -> str | None:
    """An --input spec for `torch.randn(2, 8)`, `torch.rand(...)`, `torch.randint(0, 10, (2, 8))`."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch" and not call.keywords):
        return None
    try:
        values = [ast.literal_eval(a) for a in call.args]
    except ValueError:
        return None
    if call.func.attr in ("randn", "rand") and values and all(isinstance(v, int) for v in values):
        return f"float32[{','.join(map(str, values))}]" + (":0..1" if call.func.attr == "rand" else "")
    if call.func.attr == "randint" and len(values) == 3 and isinstance(values[2], tuple):
        return f"int64[{','.join(map(str, values[2]))}]:{values[0]}..{values[1]}"
    return None


def _as_class_target(code: str) -> tuple[str, dict, list[str]] | None:
    """(class name, keyword arguments, input specs) when `make()` is `return Cls(literals), (inputs...)`."""
    tree = ast.parse(code)
    make = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make"), None)
    if make is None or len(make.body) != 1 or not isinstance(make.body[0], ast.Return):
        return None
    value = make.body[0].value
    if not (isinstance(value, ast.Tuple) and len(value.elts) == 2 and isinstance(value.elts[0], ast.Call)
            and isinstance(value.elts[0].func, ast.Name) and isinstance(value.elts[1], ast.Tuple)):
        return None
    build = value.elts[0]
    if build.args:
        return None
    try:
        kwargs = {k.arg: ast.literal_eval(k.value) for k in build.keywords}
    except ValueError:
        return None
    specs = [_spec(e) for e in value.elts[1].elts]
    if not specs or None in specs:
        return None
    return build.func.id, kwargs, specs


CASES = []
for _rule in load_rules():
    for _index, _example in enumerate(_rule.bad_examples + _rule.good_examples):
        _class = _as_class_target(_example.code)
        if _class is not None and _rule.id not in _OTHER_INPUTS:
            CASES.append((f"{_rule.id}_{_index}", _example.code, _class))


def _seen(report, path) -> list[tuple[str, int]]:
    return sorted((f.rule_id, f.location.line) for f in report.findings
                  if os.path.samefile(f.location.path, path) and f.rule_id not in _OTHER_INPUTS)


def test_the_examples_that_can_be_class_targets_are_many():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_factory_class_target_and_the_api_agree(case, tmp_path, monkeypatch):
    name, code, (cls, kwargs, specs) = case
    path = write(tmp_path, f"{name}.py", code)
    write(tmp_path, "pyproject.toml", '[project]\nname = "examples"\nversion = "0"\n')
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    config = Config(select=tuple(r.id for r in load_rules() if r.id not in _OTHER_INPUTS))

    factory = _seen(check([f"{path}:make"], project, config), path)
    as_class = _seen(check([target_text(f"{path}:{cls}", specs, kwargs)], project, config), path)

    import graphlint

    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location(f"entry_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, args = module.make()
    through_api = _seen(graphlint.lint(model, args), path)

    assert as_class == factory, f"class target {as_class} != factory {factory}"
    assert {rule for rule, _ in through_api} == {rule for rule, _ in factory}
    assert [f for f in through_api if f[0] not in _AT_CONSTRUCTION] == [f for f in factory if f[0] not in _AT_CONSTRUCTION]


@pytest.mark.cli
def test_pytest_graphlint_agrees_with_the_factories(pytester):
    """One pytest run over tests that build every example: each file's findings are the factory's."""
    names = []
    for name, code, _ in CASES:
        pytester.makepyfile(**{name: code})
        names.append(name)
    tests = "\n".join(textwrap.dedent(f"""
        def test_{name}():
            import {name}
            model, args = {name}.make()
            model(*args)
        """) for name in names)
    pytester.makepyfile(test_examples=tests)
    select = ",".join(r.id for r in load_rules() if r.id not in _OTHER_INPUTS)
    pytester.makepyprojecttoml(f'[project]\nname = "examples"\nversion = "0"\n\n[tool.graphlint]\nselect = '
                               f'{json.dumps(select.split(","))}\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--graphlint",
                                           "--graphlint-no-fail", "--graphlint-output", "out.json",
                                           "--graphlint-format", "json", timeout=900)
    document = json.loads((pytester.path / "out.json").read_text(encoding="utf-8"))
    plugin = sorted((f["location"]["path"], f["rule"], f["location"]["line"]) for f in document["findings"]
                    if f["rule"] not in _OTHER_INPUTS)
    project = Project(root=pytester.path, first_party_folders=[pytester.path])
    config = Config(select=tuple(select.split(",")))
    report = check([f"{pytester.path / name}.py:make" for name in names], project, config)
    factories = sorted((os.path.relpath(f.location.path, pytester.path), f.rule_id, f.location.line)
                       for f in report.findings if f.rule_id not in _OTHER_INPUTS)
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert factories and plugin == factories
