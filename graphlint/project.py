"""The project being linted: its root, its `[tool.graphlint]` configuration, and which code is its own.

The root is the folder of the nearest `pyproject.toml` above the working directory, else the working
directory. Code under the root (and under the folder of any target file) is first-party, except installed
packages, even when a virtual environment lives inside the project. Targets import from the project's
`pythonpath`: the configured folders (graphlint's setting, else pytest's in pyproject.toml, pytest.ini, tox.ini or
setup.cfg), then `src/` when there is one, then the root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from graphlint.config import Config, read_config
from graphlint.files import is_installed_file

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
    pythonpath: list[Path] = field(default_factory=list)  # folders targets import from (graphlint.target)
    _first_party: dict[str, bool] = field(default_factory=dict, repr=False)

    @classmethod
    def discover(cls, start: Path | None = None) -> Project:
        start = (start or Path.cwd()).resolve()
        pyproject = find_pyproject(start)
        if pyproject is None:
            return cls(root=start, first_party_folders=[start], pythonpath=import_folders(start, ini_pythonpath(start)))
        root = pyproject.parent
        config = read_config(pyproject)
        return cls(root=root, config=config, first_party_folders=[root],
                   pythonpath=import_folders(root, ini_pythonpath(root) if config.pythonpath is None
                                             else config.pythonpath))

    def add_pythonpath(self, folders: list[Path]) -> None:
        """Put folders (the command line's --pythonpath) before the configured ones."""
        self.pythonpath = list(dict.fromkeys([*(f.resolve() for f in folders), *self.pythonpath]))

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

    def first_party_files(self, files) -> set[str]:
        """The first-party files among `files`, read first by their folders' prefixes (one `startswith` in C each:
        a target's process has thousands of modules, nearly all torch's and the standard library's)."""
        below = tuple(str(folder) + os.sep for folder in self.first_party_folders)  # as _is_below reads them
        return {file for file in files if file.startswith(below) and self.is_first_party(file)}

    def relative(self, path: str) -> str | None:
        """`path` relative to the root with forward slashes, or None when it is outside the root."""
        try:
            relative = os.path.relpath(path, self.root)
        except ValueError:
            return None
        if relative.startswith(".."):
            return None
        return relative.replace(os.sep, "/")


# pytest's configuration files other than pyproject.toml, and the section each keeps pytest's settings in.
_INI_FILES = (("pytest.ini", "pytest"), (".pytest.ini", "pytest"), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest"))


def ini_pythonpath(root: Path) -> tuple[str, ...]:
    """pytest's `pythonpath` in the root's pytest.ini, .pytest.ini, tox.ini or setup.cfg (absolute), or ()."""
    import configparser

    for name, section in _INI_FILES:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            if not parser.read(root / name, encoding="utf-8") or not parser.has_section(section):
                continue
        except (configparser.Error, UnicodeDecodeError):
            continue  # pytest reports its own configuration's problems
        return tuple(str((root / folder).resolve()) for folder in parser.get(section, "pythonpath", fallback="").split())
    return ()


def import_folders(root: Path, configured: tuple[str, ...] | list[str]) -> list[Path]:
    """The configured folders, then `src/` (a src layout imports its packages from there), then the root."""
    folders = [Path(folder) for folder in configured]
    if (root / "src").is_dir():
        folders.append(root / "src")
    return list(dict.fromkeys([*folders, root]))


def _is_below(file: str, folder: Path) -> bool:
    return file.startswith(str(folder) + os.sep)
