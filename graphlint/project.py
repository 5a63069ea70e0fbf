"""The project being linted: its root, its `[tool.graphlint]` configuration, and which code is its own.

The root is the folder of the nearest `pyproject.toml` above the working directory, else the working
directory. Code under the root (and under the folder of any target file) is first-party, except installed
packages, even when a virtual environment lives inside the project.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from graphlint.errors import UsageError
from graphlint.files import is_installed_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEVICES = ("auto", "meta", "cpu", "cuda")


@dataclass(frozen=True)
class Config:
    """The `[tool.graphlint]` table, checked."""

    targets: tuple[str, ...] = ()
    device: str = "auto"
    source: Path | None = None  # the pyproject.toml it came from


def _check_targets(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f'{where}: targets must be a list of strings, like targets = ["model.py:make_model"]')
    return tuple(value)


def _check_device(value, where: str) -> str:
    if value not in DEVICES:
        raise UsageError(f"{where}: device must be one of {', '.join(DEVICES)}; got {value!r}")
    return value


_CHECKS = {"targets": _check_targets, "device": _check_device}


def read_config(pyproject: Path) -> Config:
    """Read and check `[tool.graphlint]`; every problem is one UsageError line naming the file and key."""
    try:
        with open(pyproject, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{pyproject}: invalid TOML ({error}); fix the file") from error
    except OSError as error:
        raise UsageError(f"{pyproject}: cannot read it ({error.strerror})") from error
    table = data.get("tool", {}).get("graphlint", {})
    if not isinstance(table, dict):
        raise UsageError(f"{pyproject}: tool.graphlint must be a table ([tool.graphlint])")
    values = {}
    for key, value in table.items():
        check = _CHECKS.get(key)
        if check is None:
            allowed = ", ".join(sorted(_CHECKS))
            raise UsageError(f"{pyproject}: unknown key tool.graphlint.{key}; the keys graphlint reads are {allowed}")
        values[key] = check(value, f"{pyproject}: tool.graphlint.{key}")
    return Config(source=pyproject, **values)


def find_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


@dataclass
class Project:
    """The root and configuration a run works against."""

    root: Path
    config: Config = field(default_factory=Config)
    first_party_folders: list[Path] = field(default_factory=list)
    _first_party: dict[str, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def discover(cls, start: Path | None = None) -> Project:
        start = (start or Path.cwd()).resolve()
        pyproject = find_pyproject(start)
        if pyproject is None:
            return cls(root=start, first_party_folders=[start])
        root = pyproject.parent
        return cls(root=root, config=read_config(pyproject), first_party_folders=[root])

    def add_first_party(self, folder: Path) -> None:
        """Count a target file's folder as the project's own code, wherever it lives."""
        folder = folder.resolve()
        if folder not in self.first_party_folders:
            self.first_party_folders.append(folder)
            self._first_party.clear()

    def is_first_party(self, file: str) -> bool:
        known = self._first_party.get(file)
        if known is None:
            known = self._first_party[file] = not is_installed_file(file) and any(
                _is_below(file, folder) for folder in self.first_party_folders
            )
        return known

    def relative(self, path: str) -> str | None:
        """`path` relative to the root with forward slashes, or None when it is outside the root."""
        try:
            relative = os.path.relpath(path, self.root)
        except ValueError:
            return None
        if relative.startswith(".."):
            return None
        return relative.replace(os.sep, "/")


def _is_below(file: str, folder: Path) -> bool:
    return file.startswith(str(folder) + os.sep)
