"""Rules from other distributions, found as pytest finds plugins: through the `graphlint.rules` entry-point group.

Each entry point names a module (every `Rule` subclass defined in it) or one `Rule` subclass (`module:Class`);
graphlint.engine imports them beside the built-in rules. This module only reads the installed metadata and the
plugins' files, never imports them, so that the result cache can tell a changed plugin on its path without torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

GROUP = "graphlint.rules"


def entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The group's entry points in the environment graphlint runs in, in a stable order."""
    found = importlib.metadata.entry_points(group=GROUP)
    return tuple(sorted(found, key=lambda entry: (distribution(entry), entry.name, entry.value)))


def distribution(entry: importlib.metadata.EntryPoint) -> str:
    """The distribution that declares the entry point, with its version: `graphlint-extra-rules 0.1`."""
    dist = entry.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"


def described(entry: importlib.metadata.EntryPoint) -> str:
    """How an error names a plugin: its entry point and its distribution."""
    return f"entry point '{entry.name} = {entry.value}' of {distribution(entry)}"


def digest() -> str:
    """What identifies the installed plugins' code: each entry point, its distribution's version, and the content
    of every Python file of the package it names (found without importing it). Empty when there is none."""
    entries = entry_points()
    if not entries:
        return ""
    hashed = hashlib.sha256()
    for entry in entries:
        hashed.update(f"{described(entry)}\n".encode())
        for path in _source_files(entry.value.partition(":")[0].strip().partition(".")[0]):
            hashed.update(path.encode())
            hashed.update(_read(path))
    return hashed.hexdigest()


def _source_files(top: str) -> list[str]:
    """The Python files of a top-level module or package; finding a top-level spec imports nothing."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(str(path) for folder in spec.submodule_search_locations for path in Path(folder).rglob("*.py"))
    return [spec.origin] if spec.origin and spec.origin.endswith(".py") else []


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""
