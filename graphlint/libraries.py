"""The installed libraries a capture ran, so that the result cache notices when one is upgraded.

After a capture, every module then loaded is traced to the distribution that installed it
(`importlib.metadata`, no imports). The cache keeps each distribution's version and answers again only while
every one of them is still installed at that version. Distributions installed from a local path (editable or
not) can change without a new version: their imported files are tracked by content, like the project's own.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import sys

# graphlint's own code is covered by its code digest in the cache key.
_OWN_DISTRIBUTIONS = frozenset({"torch-graphlint"})


def loaded_modules() -> list[tuple[str, object]]:
    """(name, `__file__`) of every module loaded now: one walk of `sys.modules`, which a forked child pays for in
    copied pages (every module it touches), shared by whoever needs it."""
    return [(name, getattr(module, "__file__", None)) for name, module in list(sys.modules.items())]


def loaded_libraries(modules: list[tuple[str, object]] | None = None) -> tuple[dict[str, str], tuple[str, ...]]:
    """(version by distribution name for every installed distribution with a module loaded now, the files of
    the loaded modules that come from distributions installed from a local path); `modules`, `loaded_modules()`
    when the caller has it already."""
    owners = _owners()
    files_by_top: dict[str, list[str]] = {}
    for name, path in loaded_modules() if modules is None else modules:
        if isinstance(path, str) and os.path.isabs(path):
            files_by_top.setdefault(name.partition(".")[0], []).append(path)
        else:
            files_by_top.setdefault(name.partition(".")[0], [])
    versions: dict[str, str] = {}
    local_files: set[str] = set()
    for top, files in files_by_top.items():
        for distribution_name in owners.get(top, ()):
            if distribution_name.lower() in _OWN_DISTRIBUTIONS or distribution_name in versions:
                continue
            distribution = _current(distribution_name)
            if distribution is None:
                continue
            versions[distribution_name], local = _version_and_source(distribution)
            if local:
                local_files.update(f for f in files if os.path.isfile(f))
    return dict(sorted(versions.items())), tuple(sorted(local_files))


@functools.cache
def read_once() -> None:
    """Read the metadata of the distributions loaded now, once per process: a warm parent's children start with it
    read. Once is enough: walking `sys.modules` again after a fork writes to every module's page (reference
    counts), about 10 ms of copied pages in a test worker that makes a warm parent for each lint."""
    loaded_libraries()


@functools.lru_cache(maxsize=1)
def _owners() -> dict[str, list[str]]:
    """Top-level module name → the distributions that install it; read once per process (about 0.07 s)."""
    return importlib.metadata.packages_distributions()


def _current(name: str):
    """The installed distribution of that name, looked up again when the folder found before is gone (an upgrade or
    an uninstall while a language server or a notebook lives on)."""
    distribution = _distribution(name)
    folder = getattr(distribution, "_path", None)
    if folder is not None and not os.path.isdir(folder):
        _distribution.cache_clear()
        distribution = _distribution(name)
    return distribution


@functools.cache
def _distribution(name: str):
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# What each distribution's metadata said, by its metadata file's identity: parsing a METADATA file costs about
# 0.4 ms (every lint, in the warm parent and in each child, read some twenty of them), a stat of it microseconds.
_READ: dict[str, tuple[tuple[int, int, int], str, bool]] = {}


def _version_and_source(distribution) -> tuple[str, bool]:
    """(its version, whether it was installed from a local path), read again whenever its METADATA file changed (an
    install in place; an upgrade has a folder of its own, which `_current` finds)."""
    folder = getattr(distribution, "_path", None)  # importlib.metadata's PathDistribution; other finders: no memo
    try:
        status = os.stat(os.path.join(folder, "METADATA")) if folder is not None else None
    except (OSError, TypeError):
        status = None
    identity = (status.st_ino, status.st_size, status.st_mtime_ns) if status is not None else None
    known = _READ.get(str(folder)) if identity is not None else None
    if known is not None and known[0] == identity:
        return known[1], known[2]
    read = distribution.version, _installed_from_a_local_path(distribution)
    if identity is not None:
        _READ[str(folder)] = (identity, *read)
    return read


def _installed_from_a_local_path(distribution) -> bool:
    """pip records `file://` sources (`pip install ./lib`, `pip install -e ./lib`) in direct_url.json."""
    try:
        recorded = json.loads(distribution.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return str(recorded.get("url", "")).startswith("file:")


def installed_version(name: str) -> str | None:
    """The version of the distribution installed now, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
