"""Targets: the zero-argument factories that build a model and its inputs.

A target is named `path/to/file.py:NAME` or `package.module:NAME`. The file's folder is put on `sys.path`
while the target is imported and captured, so a target file can import its siblings (as under pytest).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from graphlint.errors import TargetFailure, UsageError, one_line, raised_at
from graphlint.files import display_path


@dataclass
class Target:
    """What a factory may return: the model, its positional and keyword inputs, optionally the loss (a callable
    on the model's output) for the backward pass, and `calls`: more inputs the model will really be called with,
    as `(args, kwargs)` pairs (or `(args,)`), which the torch.compile analysis (GL302) runs after the first."""

    model: Any
    args: tuple = ()
    kwargs: dict | None = None
    loss: Callable | None = None
    calls: list = field(default_factory=list)


@dataclass(frozen=True)
class TargetSpec:
    """A parsed target string."""

    text: str  # as the user wrote it
    name: str  # the callable's name
    file: Path | None = None  # for path/to/file.py:NAME
    module: str | None = None  # for package.module:NAME
    search_root: Path = field(default_factory=Path.cwd)  # where module targets are imported from

    @classmethod
    def parse(cls, text: str, base: Path) -> TargetSpec:
        """Parse `text`; relative file paths are read from `base` (the working directory, or the folder of the
        pyproject.toml that lists the target)."""
        where, sep, name = text.rpartition(":")
        if not sep or not where or not name:
            raise UsageError(
                f"target {text!r} has no ':NAME'; write path/to/file.py:NAME or package.module:NAME, "
                "where NAME is a function that returns (model, args)"
            )
        if not name.isidentifier():
            raise UsageError(f"target {text!r}: {name!r} is not a Python name")
        looks_like_file = where.endswith(".py") or "/" in where or os.sep in where
        if looks_like_file:
            return cls(text=text, name=name, file=(base / where).resolve(), search_root=base)
        if not all(part.isidentifier() for part in where.split(".")):
            raise UsageError(f"target {text!r}: {where!r} is neither a .py file nor a module name")
        return cls(text=text, name=name, module=where, search_root=base)

    @property
    def import_folder(self) -> Path:
        return self.file.parent if self.file is not None else self.search_root


@dataclass(frozen=True)
class LoadedTarget:
    spec: TargetSpec
    factory: Callable[[], Any]
    import_switches: tuple = ()  # `DebugSwitch`es the module's import turned on


# Per imported module: the debugging switches its import turned on (a module is imported once per process).
_IMPORT_SWITCHES: dict[str, tuple] = {}


def load_factory(spec: TargetSpec) -> LoadedTarget:
    """Import the target's module (its folder is already on sys.path) and fetch the factory."""
    from graphlint.capture.debug import watched_import  # imports torch: only a capture loads a factory

    key = str(spec.file) if spec.file is not None else spec.module
    with watched_import() as watch:
        module = _import_file(spec.file) if spec.file is not None else _import_module(spec.module)
    _IMPORT_SWITCHES.setdefault(key, tuple(watch.switches))
    factory = getattr(module, spec.name, None)
    if factory is None:
        raise TargetFailure(f"{_where(spec)} has no {spec.name!r}; define a function {spec.name}() that returns (model, args)")
    if not callable(factory):
        raise TargetFailure(f"{_where(spec)}: {spec.name!r} is {_describe(factory)}, not a function; "
                            "make it a function that returns (model, args)")
    return LoadedTarget(spec, factory, _IMPORT_SWITCHES[key])


def _where(spec: TargetSpec) -> str:
    return display_path(str(spec.file)) if spec.file is not None else f"module {spec.module!r}"


def _import_file(path: Path):
    if not path.exists():
        raise TargetFailure(f"file {display_path(str(path))} does not exist; check the path before ':'")
    if path.suffix != ".py":
        raise TargetFailure(f"{display_path(str(path))} is not a .py file")
    # A private module name: the file's own stem could shadow a standard-library or installed module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_graphlint_target_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[name]
        raise TargetFailure(_import_error(display_path(str(path)), error)) from error
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except BaseException as error:
        raise TargetFailure(_import_error(f"module {name!r}", error)) from error


def _import_error(what: str, error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        return f"cannot import {what}: syntax error at {display_path(error.filename or '?')}:{error.lineno}: {error.msg}"
    if isinstance(error, ModuleNotFoundError):
        return f"cannot import {what}: {error}; install it in this environment or fix the import"
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        raise error
    return f"importing {what} raised {one_line(error)}{raised_at(error)}"


def normalize_factory_result(result: Any) -> Target:
    """Accept `(model, args)`, `(model, args, kwargs)` or a `Target`; anything else is a clear error."""
    import torch  # here, not at the top: parsing target names must not need torch
    if isinstance(result, Target):
        made = result
    elif isinstance(result, tuple) and len(result) in (2, 3):
        made = Target(*result)
    else:
        raise TargetFailure(
            f"the factory returned {_describe(result)}; return (model, args), (model, args, kwargs) "
            "or graphlint.Target(model, args, kwargs, loss)"
        )
    if not isinstance(made.model, torch.nn.Module):
        raise TargetFailure(f"the factory's model is {_describe(made.model)}, not a torch.nn.Module")
    if isinstance(made.args, list):
        made.args = tuple(made.args)
    if not isinstance(made.args, tuple):
        hint = " (write (x,) for a single input)" if isinstance(made.args, torch.Tensor) else ""
        raise TargetFailure(f"the factory's args is {_describe(made.args)}, not a tuple{hint}")
    if made.kwargs is None:
        made.kwargs = {}
    if not isinstance(made.kwargs, dict):
        raise TargetFailure(f"the factory's kwargs is {_describe(made.kwargs)}, not a dict")
    if made.loss is not None and not callable(made.loss):
        raise TargetFailure(f"the target's loss is {_describe(made.loss)}, not a callable on the model's output")
    if not isinstance(made.calls, (list, tuple)):
        raise TargetFailure(f"the target's calls is {_describe(made.calls)}, not a list of (args, kwargs) pairs")
    made.calls = [_call(call, index) for index, call in enumerate(made.calls)]
    return made


def _call(call: Any, index: int) -> tuple[tuple, dict]:
    """One entry of `Target.calls` as (args, kwargs), or a clear error."""
    if isinstance(call, list):
        call = tuple(call)
    if isinstance(call, tuple) and len(call) in (1, 2) and isinstance(call[0], (tuple, list)) \
            and (len(call) == 1 or isinstance(call[1], dict)):
        return tuple(call[0]), dict(call[1]) if len(call) == 2 else {}
    raise TargetFailure(f"the target's calls[{index}] is {_describe(call)}; write each call as (args, kwargs) "
                        "or (args,), with args a tuple and kwargs a dict")


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
