"""Targets: the callables that build a model, and the inputs it runs on.

A target is named `path/to/file.py:NAME` or `package.module:NAME`, and imported the way pytest's default
(prepend) import mode imports a test file: a file inside a package (a folder chain with `__init__.py`) under its
dotted name (`zoo.models`), with the package's root (the folder above the topmost `__init__.py`) first on
`sys.path`, so that relative imports work and the module exists once, under one name; any other file under a
private name, with its own folder first on `sys.path`, so that it can import its siblings. The project's
`pythonpath` folders (graphlint.project) follow, for module targets and for the absolute imports a file makes.

NAME is a factory returning `(model, args)`, or a class (any callable returning an `nn.Module`) together with
input specs (graphlint.inputs) or a model method `example_inputs()`, and keyword arguments for the call. A target
travels between processes, into the result cache and into reports as one text, its canonical spelling on the
command line: `models/net.py:Net --input 'float32[2,3,32,32]' --init depth=2`; so its identity includes its
inputs and arguments.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from graphlint.errors import (PRIVATE_MODULE_PREFIX, TargetFailure, UsageError, call_user_code, one_line, raised_at,
                              raised_where)
from graphlint.files import display_path, is_graphlint_file
from graphlint.inputs import InputSpec, parse_input


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
    """A parsed target text: where the callable is, and the inputs and keyword arguments it is built with."""

    text: str  # as the user wrote it (the canonical spelling for a target with inputs or arguments)
    name: str  # the callable's name
    file: Path | None = None  # for path/to/file.py:NAME
    module: str | None = None  # for package.module:NAME
    search_root: Path = field(default_factory=Path.cwd)  # where module targets are imported from
    inputs: tuple[InputSpec, ...] = ()  # --input specs, positional ones in order
    init: tuple[str, ...] = ()  # --init KEY=VALUE arguments of the call, canonical
    vary: tuple[str, ...] | None = None  # --vary: the dimensions GL302 grows for this target; None: the run's setting

    @classmethod
    def parse(cls, text: str, base: Path) -> TargetSpec:
        """Parse `text`; relative file paths are read from `base` (the working directory, or the folder of the
        pyproject.toml that lists the target)."""
        where_name, inputs, init, vary = _split(text)
        where, sep, name = where_name.rpartition(":")
        if not sep or not where or not name:
            raise UsageError(
                f"target {text!r} has no ':NAME'; write path/to/file.py:NAME or package.module:NAME, "
                "where NAME is a function that returns (model, args), or a model class given --input"
            )
        if not name.isidentifier():
            raise UsageError(f"target {text!r}: {name!r} is not a Python name")
        looks_like_file = where.endswith(".py") or "/" in where or os.sep in where
        extra = {"inputs": tuple(parse_input(spec) for spec in inputs),
                 "init": tuple(_canonical_init(item) for item in init),
                 "vary": None if vary is None else parse_vary(vary, f"target {text!r}: --vary")}
        if looks_like_file:
            return cls(text=text, name=name, file=(base / where).resolve(), search_root=base, **extra)
        if not all(part.isidentifier() for part in where.split(".")):
            raise UsageError(f"target {text!r}: {where!r} is neither a .py file nor a module name")
        return cls(text=text, name=name, module=where, search_root=base, **extra)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments the callable is called with."""
        return dict(parse_init(item) for item in self.init)

    def relocated(self, where: str) -> str:
        """This target's text with `where` (a file or module) in place of its own, inputs and arguments kept."""
        return target_text(f"{where}:{self.name}", [spec.text for spec in self.inputs], self.kwargs, self.vary)


def target_text(target: str, inputs: list[str] | tuple[str, ...] = (), kwargs: dict[str, Any] | None = None,
                vary: tuple[str, ...] | None = None) -> str:
    """The canonical text of a target with input specs, keyword arguments and its own `vary`; the target itself
    when it has none of them, so that factory targets keep their names. A malformed spec is kept as written:
    parsing the text reports it as that target's error, and the other targets are still linted."""
    if not inputs and not kwargs and vary is None:
        return target
    words = [target]
    for spec in inputs:
        try:
            words += ["--input", parse_input(spec).text]
        except UsageError:
            words += ["--input", spec]
    for key, value in (kwargs or {}).items():
        try:
            words += ["--init", f"{key}={_literal(value)}"]
        except UsageError:
            words += ["--init", f"{key}={value}"]
    if vary is not None:
        words += ["--vary", ",".join(vary) or "none"]
    return shlex.join(words)


VARY = ("batch", "seq")  # the input dimensions GL302's extra calls grow


def parse_vary(value: str | list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """A vary setting (`"batch,seq"`, `"none"`, or a list of names) as a checked tuple."""
    if isinstance(value, str):
        value = [] if value.strip() == "none" else [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UsageError(f'{where} must be a list of dimension names, like ["batch", "seq"]')
    for kind in value:
        if kind not in VARY:
            raise UsageError(f"{where} entry must be one of {', '.join(VARY)}; got {kind!r}")
    return tuple(value)


def target_vary(text: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """The dimensions GL302 grows for this target: its own --vary, else `default` (a malformed target keeps the
    default: linting it reports what is wrong)."""
    try:
        vary = _split(text)[3]
        return default if vary is None else parse_vary(vary, "--vary")
    except UsageError:
        return default


def parse_init(item: str) -> tuple[str, Any]:
    """`KEY=VALUE` as (key, value): VALUE is a Python literal (2, 0.1, "gelu", [64, 128], {"a": 1}, None), or
    true/false, or else taken as a plain string (`--init act=gelu`)."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise UsageError(f"--init {item!r} is not KEY=VALUE; write it like --init depth=2 or --init act=gelu")
    return key, _value(value.strip())


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return {"true": True, "false": False}.get(text, text)


def _literal(value: Any) -> str:
    """A value as text that `_value` reads back to it."""
    if isinstance(value, str):
        return value if value and _value(value) == value and not any(c.isspace() for c in value) else json.dumps(value)
    try:
        if ast.literal_eval(repr(value)) == value:
            return repr(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    raise UsageError(f"argument value {value!r} cannot be written as a Python literal; give numbers, strings, "
                     "booleans, lists or tables")


def _canonical_init(item: str) -> str:
    key, value = parse_init(item)
    return f"{key}={_literal(value)}"


_OPTIONS = ("--input", "--init", "--vary")


def script_name(text: str) -> str:
    """The file or module part of a target text (what a child's `sys.argv[0]` shows the target's code)."""
    try:
        target = _split(text)[0]
    except UsageError:
        target = text
    return target.rpartition(":")[0] or target


def _split(text: str) -> tuple[str, list[str], list[str], str | None]:
    """(the target, its input specs, its KEY=VALUE arguments, its --vary) from a target text."""
    if not any(f" {option}" in text for option in _OPTIONS):
        return text, [], [], None
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"target {text!r}: {error}; quote specs as on a shell command line") from error
    inputs: list[str] = []
    init: list[str] = []
    vary = None
    rest = words[1:]
    while rest:
        option = rest.pop(0)
        if option not in _OPTIONS or not rest:
            raise UsageError(f"target {text!r}: expected --input SPEC, --init KEY=VALUE or --vary DIMS, got {option!r}")
        if option == "--vary":
            vary = rest.pop(0)
        else:
            (inputs if option == "--input" else init).append(rest.pop(0))
    return words[0], inputs, init, vary


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
        raise TargetFailure(f"{_where(spec)} has no {spec.name!r}; define a function {spec.name}() that returns "
                            "(model, args), or name a model class")
    if not callable(found):
        raise TargetFailure(f"{_where(spec)}: {spec.name!r} is {_describe(found)}, not a function; "
                            "make it a function that returns (model, args), or a model class")
    return LoadedTarget(spec, _Builder(spec, found), _IMPORT_SWITCHES.get(key, ()))


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


class _Builder:
    """A target's factory: calls the named callable with the target's keyword arguments; when that returns the
    model alone (a class, usually), builds its inputs from the specs or the model's `example_inputs()`."""

    def __init__(self, spec: TargetSpec, build: Callable) -> None:
        self.spec = spec
        self.build = build
        # Where findings go when no frame of the project's code is involved: the class's __init__ or the function.
        self.__wrapped__ = _definition_of(build)

    def __call__(self) -> Any:
        kwargs = self.spec.kwargs
        self._check_arguments(kwargs)
        try:
            made = call_user_code(self.build, **kwargs)
        except Exception as error:
            # A literal where the constructor needed an object: `--init attn_layers=Decoder` reaches it as the text
            # "Decoder", `--init config={"n_layer": 2}` for a config dataclass as a dict, never as the object.
            words = {key: value for key, value in kwargs.items() if isinstance(value, (str, dict))
                     and f"'{type(value).__name__}'" in str(error)}
            if not words or not isinstance(error, (AttributeError, TypeError)):
                unset = _unset_objects(self.build, kwargs)
                if not unset:
                    raise
                # A constructor that needs an object it defaults to None (EfficientNet's blocks_args) fails its own way.
                raise TargetFailure(f"{self.spec.name}() raised {one_line(error)}{raised_at(error)}; it was built with "
                                    f"{', '.join(unset)} left at None: if it needs {(them := 'them' if len(unset) > 1 else 'it')}"
                                    f" and no --init literal can give {them}, write a factory function that builds "
                                    f"{self.spec.name}(...) and returns (model, args), and name it as the target"
                                    ) from error
            given = ", ".join(f"{key} as the {'text' if isinstance(value, str) else 'table'} {value!r}"
                              for key, value in words.items())
            raise TargetFailure(f"{self.spec.name}() raised {one_line(error)}{raised_at(error)}; --init gave {given}: "
                                "an argument that must be an object (a module, a config) cannot be written on the "
                                f"command line: write a factory function that builds {self.spec.name}(...) and "
                                "returns (model, args), and name it as the target") from error
        import torch  # only a capture builds a target

        code = getattr(inspect.unwrap(self.build), "__code__", None)
        if isinstance(made, Target) and code is not None and is_graphlint_file(os.path.abspath(code.co_filename)):
            self.__wrapped__ = _definition_of(type(made.model))  # graphlint rebuilt it (a recorded model)
        if not isinstance(made, torch.nn.Module):
            if self.spec.inputs:
                raise TargetFailure(f"{self.spec.name} returned {_describe(made)}, not a torch.nn.Module, so --input "
                                    "does not apply; give --input only for a callable that returns the model")
            return made  # a factory's (model, args): checked by normalize_factory_result
        if self.spec.inputs:
            args = tuple(_built(spec) for spec in self.spec.inputs if spec.keyword is None)
            return Target(made, args, {spec.keyword: _built(spec) for spec in self.spec.inputs if spec.keyword})
        example = getattr(made, "example_inputs", None)
        if not callable(example):
            what = (f"{self.spec.name} is a model class" if inspect.isclass(self.build)
                    else f"{self.spec.name}() returned {_describe(made)}")
            raise TargetFailure(f"{what}, and graphlint has no inputs for it: give "
                                "each forward argument with --input (like --input 'float32[2,3,32,32]'), or define "
                                "a method example_inputs(self) on the model that returns them")
        return Target(made, *_example_inputs(call_user_code(example)))

    def _check_arguments(self, kwargs: dict[str, Any]) -> None:
        """The call's arguments against the callable's signature: one line naming what is missing or unknown."""
        try:
            signature = inspect.signature(self.build)
        except (TypeError, ValueError):
            return  # a builtin or C callable: let the call say
        try:
            signature.bind(**kwargs)
        except TypeError:
            pass
        else:
            return
        parameters = signature.parameters.values()
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
        named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = [key for key in kwargs if key not in named and not takes_any]
        if unknown:
            raise TargetFailure(f"{self.spec.name}() takes no argument {', '.join(unknown)}; it takes "
                                f"{', '.join(named) or 'no keyword arguments'}")
        missing = [p.name for p in parameters if p.default is p.empty and p.name not in kwargs
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            example = " ".join(f"--init {name}=VALUE" for name in missing)
            table = ", ".join(f"{name} = VALUE" for name in missing)
            objects = [p.name for p in parameters if p.name in missing and _takes_an_object(p.annotation)]
            hint = (f"; {', '.join(objects)} {'take objects' if len(objects) > 1 else 'takes an object'} that a literal "
                    "cannot give: write a factory function that builds the model and name it instead" if objects else "")
            raise TargetFailure(f"{self.spec.name}() needs {', '.join(missing)}; give {'them' if len(missing) > 1 else 'it'} "
                                f"with {example}, or kwargs = {{ {table} }} in the [tool.graphlint] target table{hint}")
        raise TargetFailure(f"{self.spec.name}() cannot be called with keyword arguments only "
                            f"({', '.join(p.name for p in parameters if p.kind is p.POSITIONAL_ONLY)} are positional-only); "
                            "wrap it in a factory function")


def _unset_objects(build: Callable, kwargs: dict[str, Any]) -> list[str]:
    """A class's constructor parameters that default to None and were not given: what it may need as objects."""
    if not inspect.isclass(build):
        return []
    try:
        parameters = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.default is None and p.name not in kwargs
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


_LITERAL_TYPES = {"int", "float", "str", "bool", "list", "dict", "tuple", "None", "Optional", "Union", "Sequence",
                  "Literal", "complex", "Any"}


def _takes_an_object(annotation: Any) -> bool:
    """Whether a parameter's annotation names a type that no literal is (a config class, a module)."""
    if annotation is inspect.Parameter.empty:
        return False
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    words = {word for word in re.split(r"[^A-Za-z_]+", text.replace("typing.", "")) if word}
    return bool(words - _LITERAL_TYPES)


def _built(spec: InputSpec) -> Any:
    try:
        return spec.build()
    except (RuntimeError, MemoryError) as error:  # too large for the CPU rebuild, usually
        raise TargetFailure(f"cannot build the input {spec.text} ({one_line(error)}); give a smaller shape") from error


def _definition_of(build: Callable) -> Callable:
    """What stands for the target's definition: the class's own __init__ or forward, else the callable."""
    if inspect.isclass(build):
        own = (build.__dict__.get(name) for name in ("__init__", "forward"))
        return next((f for f in own if f is not None and hasattr(inspect.unwrap(f), "__code__")), build)
    return build


def _example_inputs(value: Any) -> tuple[tuple, dict]:
    """What `example_inputs()` returned as (args, kwargs): a tensor, a tuple or list of positional arguments,
    a dict of keyword arguments, or (args, kwargs)."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)) and isinstance(value[1], dict):
        return tuple(value[0]), dict(value[1])
    if value is None:
        raise TargetFailure("example_inputs() returned None; return the forward's positional arguments (a tensor "
                            "or a tuple), or (args, kwargs)")
    if isinstance(value, dict):
        return (), value
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}


def _where(spec: TargetSpec) -> str:
    return display_path(str(spec.file)) if spec.file is not None else f"module {spec.module!r}"


def _import_file(spec: TargetSpec, pythonpath: tuple[Path, ...]):
    path = spec.file
    if not path.exists():
        raise TargetFailure(f"file {display_path(str(path))} does not exist; check the path before ':'")
    if path.suffix != ".py":
        raise TargetFailure(f"{display_path(str(path))} is not a .py file")
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
        file = getattr(sys.modules[loaded], "__file__", None)
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
            "or graphlint.Target(model, args, kwargs, loss), or the model alone with --input specs or an "
            "example_inputs() method"
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
