"""The target as text: `path/to/file.py:NAME` or `package.module:NAME` with its `--input`, `--init` and `--vary`
options, parsed (`TargetSpec`) and written back in one canonical spelling (`target_text`)."""

from __future__ import annotations

import ast
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphlint.errors import UsageError
from graphlint.inputs import InputSpec, parse_input


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
