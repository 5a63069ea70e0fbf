"""The wheel users install holds every module of the source tree (an explicit package list once left one out)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO


def _source_modules() -> set[str]:
    """Where each source module must be inside the wheel: graphlint/ as is, rules/ as graphlint/rules/."""
    wanted = {str(p.relative_to(REPO)).replace(os.sep, "/") for p in (REPO / "graphlint").rglob("*.py")}
    wanted |= {"graphlint/rules/" + str(p.relative_to(REPO / "rules")).replace(os.sep, "/")
               for p in (REPO / "rules").rglob("*.py")}
    return {path for path in wanted if "__pycache__" not in path}


def _built_wheel(folder: Path) -> Path:
    """CI hands over the wheel it built ($GRAPHLINT_WHEEL); otherwise build one from a clean copy of the
    sources, so that a stale build/ folder cannot add modules the tree no longer has."""
    given = os.environ.get("GRAPHLINT_WHEEL")
    if given:
        return Path(given)
    source = folder / "source"
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name if source.exists() else _mkdir(source) / name)
    for name in ("graphlint", "rules"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    str(source), "-w", str(folder / "dist")], check=True, capture_output=True)
    return next((folder / "dist").glob("*.whl"))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.mark.packaging
@pytest.mark.cli
def test_the_wheel_holds_every_module_of_the_source_tree_and_nothing_else(tmp_path):
    with zipfile.ZipFile(_built_wheel(tmp_path)) as wheel:
        shipped = {name for name in wheel.namelist() if name.endswith(".py")}
    expected = _source_modules()
    assert expected - shipped == set(), "modules missing from the wheel"
    assert shipped - expected == set(), "modules in the wheel that the source tree does not have"


@pytest.mark.cli
@pytest.mark.packaging
def test_the_wheel_registers_the_pytest_plugin(tmp_path):
    with zipfile.ZipFile(_built_wheel(tmp_path)) as wheel:
        entry_points = next(wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    section = entry_points.split("[pytest11]", 1)[1].split("\n[", 1)[0]
    assert "graphlint = graphlint.pytest_plugin" in section
