"""The project being linted: its root, its `[tool.graphlint]` configuration, and which code is its own.

The root is the folder of the nearest `pyproject.toml` above the working directory, else the working
directory. Code under the root (and under the folder of any target file) is first-party, except installed
packages, even when a virtual environment lives inside the project.
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
