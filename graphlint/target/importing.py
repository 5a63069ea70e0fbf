"""Importing a target's module as pytest's prepend import mode would (see the package's docstring), and the one-line
errors of an import that fails; `load_factory` fetches the factory from it."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from graphlint.errors import PRIVATE_MODULE_PREFIX, TargetFailure, one_line, raised_at, raised_where
from graphlint.files import display_path
from graphlint.libraries import module_file
from graphlint.target.builder import Builder
from graphlint.target.built import describe_value
from graphlint.target.spec import TargetSpec


@dataclass(frozen=True)
class LoadedTarget:
    spec: TargetSpec
    factory: Callable[[], Any]
    import_switches: tuple = ()  # `DebugSwitch`es the module's import turned on


# Per imported module: the debugging switches its import turned on (a module is imported once per process).
_IMPORT_SWITCHES: dict[str, tuple] = {}


def load_factory(spec: TargetSpec, pythonpath: tuple[Path, ...] | list[Path] = (),
                 watch: Callable[[], contextlib.AbstractContextManager] | None = None) -> LoadedTarget:
    """Import the target's module (inside `importable(spec, pythonpath)`) and fetch the factory; `pythonpath`
    only shapes the one-line error of an import that fails. `watch`, when given, is entered around the import,
    and the `switches` of what it yields are kept as the debugging switches the import turned on (the capture
    passes graphlint.capture.debug.watched_import: this layer below it knows nothing of torch's switches)."""
    key = str(spec.file) if spec.file is not None else spec.module
    with watch() if watch is not None else contextlib.nullcontext() as watching:
        module = (_import_file(spec, tuple(pythonpath)) if spec.file is not None
                  else _import_module(spec, tuple(pythonpath)))
    if watching is not None:
        _IMPORT_SWITCHES.setdefault(key, tuple(watching.switches))
    found = getattr(module, spec.name, None)
    if found is None:
        raise TargetFailure(_missing(spec))
    if not callable(found):
        raise TargetFailure(f"{_where(spec)}: {spec.name!r} is {describe_value(found)}, not a function; "
                            "make it a function that returns (model, args), or a model class")
    return LoadedTarget(spec, Builder(spec, found), _IMPORT_SWITCHES.get(key, ()))


def refused_before_import(spec: TargetSpec) -> str | None:
    """The failure `load_factory` would report that a file target's source shows without importing it (and
    torch with it): the file does not exist or is no .py file, or NAME appears nowhere in it and nothing in it
    could bind a name it does not spell (a star import, a module `__getattr__`, writes to the module's namespace
    through `globals()`, `setattr`, `exec`, `sys.modules`...). None when only the import can tell, and for a
    module target (finding its file imports its packages)."""
    path = spec.file
    if path is None:
        return None
    if not path.exists():
        return f"file {display_path(str(path))} does not exist; check the path before ':'"
    if path.suffix != ".py":
        return f"{display_path(str(path))} is not a .py file"
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError):
        return None  # the import says what is wrong with it
    if spec.name in _spelled(tree) or _SPELLED_DYNAMICALLY & _spelled(tree):
        return None
    return _missing(spec)


# Names through which a module can bind a name its source does not spell.
_SPELLED_DYNAMICALLY = frozenset({"*", "__getattr__", "__dict__", "globals", "locals", "vars", "setattr", "exec",
                                  "eval", "__import__", "sys.modules"})


def _spelled(tree: ast.Module) -> set[str]:
    """Every name the source spells: identifiers, attributes, imported names, and the words of its strings."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            if isinstance(node.value, ast.Name) and node.value.id == "sys" and node.attr == "modules":
                names.add("sys.modules")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "modules" for a in node.names):
            names.add("sys.modules")
        elif isinstance(node, ast.alias):
            names.update([node.name, *node.name.split("."), *([node.asname] if node.asname else [])])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(re.findall(r"\w+", node.value))
    return names


def _missing(spec: TargetSpec) -> str:
    return (f"{_where(spec)} has no {spec.name!r}; define a function {spec.name}() that returns (model, args), or "
            "name a model class")


def package_of(file: Path) -> tuple[Path, str] | None:
    """(the package root, the module's dotted name) of a file inside a package, as pytest's prepend mode finds
    them: the root is the first folder above the topmost `__init__.py`. None for a file in a plain folder or a
    namespace package, and for a folder whose name is no Python name (`my-models/`)."""
    folder = file.parent
    if not (folder / "__init__.py").is_file():
        return None
    parts = [] if file.stem == "__init__" else [file.stem]
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    if not all(part.isidentifier() for part in parts):
        return None
    return folder, ".".join(parts)


def search_path(spec: TargetSpec, pythonpath: tuple[Path, ...] | list[Path] = ()) -> tuple[list[Path], list[Path]]:
    """(the folders put first on sys.path, in order; those put last) to import the target. A packaged file's own
    folder goes last, so that `x_transformers/x_transformers.py` cannot hide its package, yet a sibling imported
    by its bare name (`import layers`) is still found as before."""
    if spec.file is None:
        return [*pythonpath, spec.search_root], []
    package = package_of(spec.file)
    if package is None:
        return [spec.file.parent, *pythonpath], []
    return [package[0], *pythonpath], [spec.file.parent]


def add_target_folders(project, spec: TargetSpec) -> None:
    """A target file's folder is first-party, and so is its whole package (siblings of a subpackage's file)."""
    project.add_first_party(spec.file.parent)
    package = package_of(spec.file)
    if package is not None:
        project.add_first_party(package[0] / package[1].partition(".")[0])


@contextlib.contextmanager
def importable(spec: TargetSpec, pythonpath: tuple[Path, ...] | list[Path] = ()) -> Iterator[None]:
    """The target's import folders on sys.path (`search_path`) while the block runs; sys.path as it was after."""
    first, last = search_path(spec, pythonpath)
    saved = list(sys.path)
    sys.path[:0] = list(dict.fromkeys(str(folder) for folder in first))
    sys.path.extend(str(folder) for folder in last if str(folder) not in sys.path)
    try:
        yield
    finally:
        sys.path[:] = saved


def _where(spec: TargetSpec) -> str:
    return display_path(str(spec.file)) if spec.file is not None else f"module {spec.module!r}"


def _import_file(spec: TargetSpec, pythonpath: tuple[Path, ...]):
    path = spec.file
    if not path.exists() or path.suffix != ".py":
        raise TargetFailure(refused_before_import(spec))
    package = package_of(path)
    if package is not None:
        return _import_packaged(spec, package[0], package[1], pythonpath)
    # A private module name: the file's own stem could shadow a standard-library or installed module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"{PRIVATE_MODULE_PREFIX}{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[name]
        raise TargetFailure(_import_error(display_path(str(path)), error, spec, pythonpath)) from error
    return module


def _import_packaged(spec: TargetSpec, root: Path, name: str, pythonpath: tuple[Path, ...]):
    """The file imported under its package's dotted name, and checked to be this file: an installed copy of the
    package (a second checkout of the same repository) imported earlier is forgotten first."""
    top = name.partition(".")[0]
    _forget_other_copies(top, root / top)
    what = f"{display_path(str(spec.file))} (as {name})"
    try:
        module = importlib.import_module(name)
    except BaseException as error:
        raise TargetFailure(_import_error(what, error, spec, pythonpath)) from error
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or Path(file).resolve() != spec.file.resolve():
        raise TargetFailure(f"{what}: Python imported {name} from {display_path(str(file))}, not from this file; "
                            f"a module or an import hook of the environment shadows package {top} of "
                            f"{display_path(str(root))}: uninstall that copy, or name the target as {name}:{spec.name}")
    return module


def _forget_other_copies(top: str, own: Path) -> None:
    """Forget package `top` and its modules where they were imported from elsewhere than `own` (an installed copy,
    or the original of a proof's copy, imported earlier in this process), so that the project's own is imported.
    graphlint, torch and the standard library stay as loaded: a second copy of them in one process breaks both."""
    if top in ("graphlint", "torch") or top in sys.stdlib_module_names:
        return
    for loaded in [name for name in sys.modules if name == top or name.startswith(top + ".")]:
        file = module_file(sys.modules[loaded])
        if isinstance(file, str) and not _is_below(Path(file), own) and Path(file) != own.with_suffix(".py"):
            del sys.modules[loaded]


def _is_below(file: Path, folder: Path) -> bool:
    try:
        file.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _import_module(spec: TargetSpec, pythonpath: tuple[Path, ...]):
    top = spec.module.partition(".")[0]
    for folder in search_path(spec, pythonpath)[0]:
        if (folder / top).is_dir() or (folder / f"{top}.py").is_file():  # where this project's sys.path finds it
            _forget_other_copies(top, folder / top)
            break
    try:
        return importlib.import_module(spec.module)
    except BaseException as error:
        raise TargetFailure(_import_error(f"module {spec.module!r}", error, spec, pythonpath)) from error


def _import_error(what: str, error: BaseException, spec: TargetSpec, pythonpath: tuple[Path, ...]) -> str:
    if isinstance(error, SyntaxError):
        return f"cannot import {what}: syntax error at {display_path(error.filename or '?')}:{error.lineno}: {error.msg}"
    if isinstance(error, ModuleNotFoundError):
        return (f"cannot import {what}: {error}{_imported_elsewhere(error, spec)}; "
                f"{_where_imports_looked(error.name or '', spec, pythonpath)}")
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error
    if isinstance(error, ImportError) and "no known parent package" in str(error) and spec.file is not None:
        return (f"cannot import {what}: it makes a relative import{raised_at(error)}, but its folder "
                f"{display_path(str(spec.file.parent))} has no __init__.py, so graphlint imports it as a script: "
                "add an __init__.py to make the folder a package")
    return f"importing {what} raised {one_line(error)}{raised_at(error)}"


def _imported_elsewhere(error: ModuleNotFoundError, spec: TargetSpec) -> str:
    """` (imported at file:line)` when the missing import is not in the target's own file: a sibling module
    that the package's `__init__.py` re-exports, which the user would otherwise look for in the wrong file."""
    where = raised_where(error)
    if where is None or (spec.file is not None and Path(where[0]) == spec.file):
        return ""
    return f" (imported at {display_path(where[0])}:{where[1]})"


def _where_imports_looked(missing: str, spec: TargetSpec, pythonpath: tuple[Path, ...]) -> str:
    """What graphlint put on sys.path, and the setting that would find `missing` (in the project if it is there)."""
    first, _ = search_path(spec, pythonpath)
    folders = list(dict.fromkeys(display_path(str(folder)) for folder in first))
    if spec.file is None:
        looked = f"graphlint looked in {', '.join(folders)}"
    else:
        kind = "package root" if package_of(spec.file) is not None else "folder"
        looked = f"graphlint imported it from its {kind} {folders[0]}"
        looked += f" (then {', '.join(folders[1:])})" if folders[1:] else ""
    top = missing.partition(".")[0]
    holder = _folder_holding(top, spec.search_root) if top else None
    if holder is not None:
        return (f"{looked}; {top} is in {holder}: add it with pythonpath = [\"{holder}\"] in "
                f"[tool.graphlint] of pyproject.toml (or --pythonpath {holder})")
    return (f"{looked}; if {top or 'it'} is this project's code, add the folder that holds it with "
            "pythonpath = [\"DIR\"] in [tool.graphlint] of pyproject.toml (or --pythonpath DIR), else install it "
            "in this environment")


_SKIPPED = {"node_modules", "site-packages", "build", "dist", "__pycache__"}


def _folder_holding(name: str, root: Path, depth: int = 3) -> str | None:
    """The folder under `root` (relative, within `depth` levels) that holds package or module `name`."""
    level = [root]
    for _ in range(depth):
        for folder in level:
            if (folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file():
                return os.path.relpath(folder, root).replace(os.sep, "/")
        level = [child for folder in level for child in _subfolders(folder)]
    return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in _SKIPPED)
    except OSError:
        return []
