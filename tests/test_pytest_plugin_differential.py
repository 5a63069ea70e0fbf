"""`pytest --graphlint` is invisible to the tests it watches: a project's suite of varied models and tests
(tests/data/differential) runs with and without the plugin, and every test's outcome, its message and what it
printed are the same; the factories the plugin writes parse and build models that run."""

from __future__ import annotations

import ast
import re
import runpy
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

pytest_plugins = ("pytester",)

SUITE = Path(__file__).resolve().parent / "data" / "differential"


def _project(pytester) -> Path:
    shutil.copy(SUITE / "zoo.py", pytester.path / "zoo.py")
    (pytester.path / "tests").mkdir()
    for suite in sorted(SUITE.glob("suite_*.py")):
        shutil.copy(suite, pytester.path / "tests" / suite.name.replace("suite_", "test_"))
    pytester.makepyprojecttoml(textwrap.dedent("""
        [project]
        name = "zoo"
        version = "0"
        [tool.pytest.ini_options]
        pythonpath = ["."]
        asyncio_default_fixture_loop_scope = "function"
        [tool.graphlint]
        ignore = ["GL3"]  # the torch.compile analysis adds time and nothing the tests could see
    """))
    return pytester.path


def _outcomes(report: Path) -> dict[str, tuple]:
    """Each test's outcome, the message pytest gave it, and what it printed (JUnit XML, all output logged)."""
    cases = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome, message = kind, element.get("message", "")
        streams = tuple((case.findtext(stream) or "") for stream in ("system-out", "system-err"))
        cases[f"{case.get('classname')}::{case.get('name')}"] = (outcome, message, *streams)
    return cases


def _summary(result) -> str:
    """The session's last line (counts of outcomes and warnings) without its time."""
    return re.sub(r" in [0-9.]+s.*", "", result.stdout.lines[-1].strip("= "))


@pytest.mark.cli
def test_every_test_outcome_and_output_is_the_same_with_the_plugin(pytester, monkeypatch):
    root = _project(pytester)
    common = ("-p", "no:cacheprovider", "-o", "junit_logging=all", "-W", "default")
    plain = pytester.runpytest_subprocess(*common, "--junitxml=plain.xml", timeout=600)
    watched = pytester.runpytest_subprocess(*common, "--junitxml=watched.xml", "--graphlint", "--graphlint-no-fail",
                                            timeout=600)
    before, after = _outcomes(root / "plain.xml"), _outcomes(root / "watched.xml")
    assert len(before) == 22 and {outcome for outcome, *_ in before.values()} == {"passed", "failure", "skipped"}
    differences = {name: (before[name], after.get(name)) for name in before if before[name] != after.get(name)}
    assert not differences and before.keys() == after.keys(), differences
    assert plain.ret == watched.ret == 1 and _summary(plain) == _summary(watched), (_summary(plain), _summary(watched))
    # The plugin did lint what the tests ran: its section is there, and graphlint failed on none of the models.
    section = watched.stdout.str().split("= graphlint =", 1)[1]
    assert "graphlint: error" not in section and "could not record" not in section, section
    assert "GL204" in section and "--debug" not in section, section
    tests = (root / "tests" / "test_behaviour.py").read_text().splitlines()
    for name, fragment, how in (("PerSampleGrads", "model = PerSampleGrads()", "through .forward()"),
                                ("Sampler", "Sampler().sample(", "through its own method sample()")):
        built = next(number for number, line in enumerate(tests, 1) if fragment in line)
        assert f"note: {name} built at tests/test_behaviour.py:{built} was not linted: the test ran it {how}" in section
    assert "mat1 and mat2" not in section  # the call that raised (in pytest.raises) is not the recorded run

    # Every factory the plugin wrote parses, builds its model and runs it on the inputs it returns.
    factories = sorted(root.rglob("factories/*.py"))
    assert len(factories) >= 2, section
    monkeypatch.syspath_prepend(str(root))
    for factory in factories:
        ast.parse(factory.read_text())
        try:  # a factory sets torch's defaults as the test had them (float64), for the lint that calls it
            made = runpy.run_path(str(factory))["make"]()
            model, args, kwargs = (*made, {})[:3]
            model(*args, **kwargs)
        finally:
            torch.set_default_dtype(torch.float32)
            torch.set_autocast_enabled("cpu", False)
