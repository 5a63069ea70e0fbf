"""A class named as a target, built: called with its `--init` arguments, run on inputs made from its `--input`
specs (graphlint.inputs) or from its `example_inputs()`."""

from __future__ import annotations

import inspect
import os
import re
from typing import Any
from collections.abc import Callable

from graphlint.errors import TargetFailure, call_user_code, one_line, raised_at
from graphlint.files import is_graphlint_file
from graphlint.inputs import InputSpec
from graphlint.target.built import Target, describe_value
from graphlint.target.spec import TargetSpec


class Builder:
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
                raise TargetFailure(f"{self.spec.name} returned {describe_value(made)}, not a torch.nn.Module, so --input "
                                    "does not apply; give --input only for a callable that returns the model")
            return made  # a factory's (model, args): checked by normalize_factory_result
        if self.spec.inputs:
            args = tuple(_built(spec) for spec in self.spec.inputs if spec.keyword is None)
            return Target(made, args, {spec.keyword: _built(spec) for spec in self.spec.inputs if spec.keyword})
        example = getattr(made, "example_inputs", None)
        if not callable(example):
            what = (f"{self.spec.name} is a model class" if inspect.isclass(self.build)
                    else f"{self.spec.name}() returned {describe_value(made)}")
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
