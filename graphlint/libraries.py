"""The installed libraries a capture ran, so that the result cache notices when one is upgraded.

After a capture, every module then loaded is traced to the distribution that installed it
(`importlib.metadata`, no imports). The cache keeps each distribution's version and answers again only while
every one of them is still installed at that version. Distributions installed from a local path (editable or
not) can change without a new version: their imported files are tracked by content, like the project's own.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import re
import sys

# graphlint's own code is covered by its code digest in the cache key.
_OWN_DISTRIBUTIONS = frozenset({"torch-graphlint"})


def _normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them (Torch_Graphlint, torch.graphlint: torch-graphlint)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def loaded_modules() -> list[tuple[str, object]]:
    """(name, `__file__`) of every module loaded now: one walk of `sys.modules`, which a forked child pays for in
    copied pages (every module it touches); a child reads its parent's part from `note_fork` instead."""
    return [(name, module_file(module)) for name, module in list(sys.modules.items())]


def module_file(module: object) -> object:
    """A loaded module's `__file__`, read from its own dict first, so that a lazily loaded module (importlib's
    LazyLoader runs its code at the first attribute read) is not run by graphlint; None where it cannot be read."""
    try:
        file = object.__getattribute__(module, "__dict__").get("__file__")
    except Exception:  # no __dict__ (an object that is no module)
        file = None
    if file is None:
        try:
            file = getattr(module, "__file__", None)
        except Exception:  # a module-like object whose attributes raise: nothing to track
            file = None
    return file


@dataclasses.dataclass(frozen=True)
class _Fork:
    """What a warm parent had loaded when it forked the child this process is: read in the parent, where walking
    `sys.modules` copies nothing, so that the child walks only the modules it imported itself (in a test worker,
    its walks of some 3,000 modules were more than half of a small lint's page faults)."""

    newest: tuple[str, object]  # sys.modules' last entry then: a dict keeps insertion order, so later ones follow it
    count: int
    files: str  # every module's absolute file, NUL-separated: one object, whose reading copies only its own pages
    libraries: dict[str, str]
    local_files: tuple[str, ...]


_fork: _Fork | None = None
# The parent's last walk: (count, newest entry) when it was made, the files and their top-level names. Walking
# sys.modules after a fork writes to pages the child shared (each write a page fault even once the child is gone),
# so the parent walks again only when modules were added or removed since.
_walked: tuple[tuple[int, tuple[str, object]], str, dict[str, list[str]]] | None = None


def note_fork() -> None:
    """In a warm parent, just before it forks a child: what the child inherits of loaded modules and libraries
    (the libraries' versions read again each time: one may have been upgraded in place since)."""
    global _fork, _walked
    mark = newest()
    if mark is None:
        return
    if _walked is None or _walked[0][0] != len(sys.modules) or _walked[0][1][0] != mark[0] \
            or _walked[0][1][1] is not mark[1]:
        modules = loaded_modules()
        _walked = ((len(modules), mark), "\0".join(_files(modules)), _by_top(modules))
    (count, _), files, by_top = _walked
    _fork = _Fork(mark, count, files, *_libraries(by_top))


def newest() -> tuple[str, object] | None:
    """A mark of what is loaded now (sys.modules' last entry), for `imported_since`."""
    for name in reversed(sys.modules):
        return name, sys.modules.get(name)
    return None


def imported_since(mark: tuple[str, object] | None, before: int) -> list[tuple[str, object]] | None:
    """(name, `__file__`) of the modules added to sys.modules after `mark`, when `before` modules were loaded, read
    from its end without touching the others; None when that cannot be told so (the mark is gone or was put back,
    some modules were removed in between, or another thread imports meanwhile): then only a walk of all of them can
    say. A module replaced in place (`sys.modules[name] = other` for a name already there) keeps its position and
    is not noticed: the result then depends on the file of the module it replaced."""
    if mark is None:
        return None
    added = []
    try:
        # Names and modules first, their files after: reading an attribute can import (a lazily loaded module), and
        # the dict must not change while it is walked.
        for name, module in reversed(sys.modules.items()):
            if name == mark[0]:
                if module is not mark[1] or len(sys.modules) - len(added) != before:
                    return None
                return [(name, module_file(module)) for name, module in reversed(added)]
            added.append((name, module))
    except RuntimeError:  # the dict changed size during the walk (an import in another thread)
        return None
    return None


def module_files_and_libraries() -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """The absolute files of every module loaded now but the program's own (`__main__`), and `loaded_libraries()`:
    in a forked child, its parent's part as `note_fork` read it and the rest from the modules imported since."""
    inherited = _fork
    added = imported_since(inherited.newest, inherited.count) if inherited is not None else None
    if added is None:
        modules = loaded_modules()
        return _files(modules), *loaded_libraries(modules)
    libraries, local_files = loaded_libraries(added)
    return ((inherited.files.split("\0") if inherited.files else []) + _files(added),
            dict(sorted({**inherited.libraries, **libraries}.items())),
            tuple(sorted({*inherited.local_files, *local_files})))


def _files(modules: list[tuple[str, object]]) -> list[str]:
    # Modules' real source files only: torch registers modules with made-up relative names (`_ops.py`). Not the
    # program running graphlint: a venv's bin/graphlint in the project, `__mp_main__` in a spawned child.
    return [file for name, file in modules if name not in ("__main__", "__mp_main__") and isinstance(file, str)
            and os.path.isabs(file)]


def loaded_libraries(modules: list[tuple[str, object]] | None = None) -> tuple[dict[str, str], tuple[str, ...]]:
    """(version by distribution name for every installed distribution with a module loaded now, the files of
    the loaded modules that come from distributions installed from a local path); `modules`, `loaded_modules()`
    when the caller has it already."""
    return _libraries(_by_top(loaded_modules() if modules is None else modules))


def _by_top(modules: list[tuple[str, object]]) -> dict[str, list[str]]:
    """Top-level module name → the absolute files of its loaded modules."""
    files_by_top: dict[str, list[str]] = {}
    for name, path in modules:
        if isinstance(path, str) and os.path.isabs(path):
            files_by_top.setdefault(name.partition(".")[0], []).append(path)
        else:
            files_by_top.setdefault(name.partition(".")[0], [])
    return files_by_top


def _libraries(files_by_top: dict[str, list[str]]) -> tuple[dict[str, str], tuple[str, ...]]:
    owners = _owners()
    versions: dict[str, str] = {}
    local_files: set[str] = set()
    for top, files in files_by_top.items():
        for distribution_name in owners.get(top, ()):
            if _normalized(distribution_name) in _OWN_DISTRIBUTIONS or distribution_name in versions:
                continue
            distribution = _current(distribution_name)
            if distribution is None:
                continue
            versions[distribution_name], local = _version_and_source(distribution)
            if local:
                local_files.update(f for f in files if os.path.isfile(f))
    return dict(sorted(versions.items())), tuple(sorted(local_files))


@functools.lru_cache(maxsize=1)
def _owners() -> dict[str, list[str]]:
    """Top-level module name → the distributions that install it, read once per process: what
    `importlib.metadata.packages_distributions()` says, but each distribution named by its folder, as pip names it
    (`PyYAML-6.0.dist-info`: pyyaml), not by parsing its METADATA (about half of that function's 0.08 s)."""
    owners: dict[str, list[str]] = {}
    for distribution in importlib.metadata.distributions():
        name = getattr(distribution, "_normalized_name", None) or distribution.metadata["Name"]
        for top in _top_level(distribution):
            owners.setdefault(top, []).append(name)
    return owners


def _top_level(distribution) -> set[str]:
    """The top-level names it installs: its top_level.txt, else the Python files its RECORD lists."""
    declared = (distribution.read_text("top_level.txt") or "").split()
    if declared:
        return set(declared)
    return {file.parts[0] if len(file.parts) > 1 else file.with_suffix("").name
            for file in distribution.files or () if file.suffix == ".py"}


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
