"""Models recorded while a test session runs (the `pytest --graphlint` plugin), and rebuilt as targets.

While installed, `ModelRecorder` sees every `nn.Module` construction (its class, its arguments and the line
that built it) and every call. The first outermost call of each distinct model, one per class, construction
site and configuration (its constructor's arguments, up to `max_configurations` per class and site), is
recorded: the constructor's arguments and the call's inputs, copied and detached on their devices, saved with
`torch.save` right away, so that what the test does afterwards (in-place changes, more calls, other devices)
cannot alter them. Each recording becomes the target `graphlint.recorded:rebuild --init path=FILE`,
whose child process calls the class again with the recorded arguments on the capture device (meta where
possible) and runs the recorded inputs: the model's own construction is seen, as for any target. Each recording
carries digests of what its lint can depend on (`Recording.model`, `Recording.values`), so that the plugin lints
one model built by many tests once.

Constructor arguments or inputs that `torch.save` cannot write (a lambda, a class defined inside a test) stay in
`IN_MEMORY`, which children forked from the recording process inherit.

A module passed to the constructor that the session saw built is saved as its own constructor call
(`Rebuild`) and built again too; a tuple subclass with its own `__new__` is kept as its items (`TupleOf`) and
made again without calling it. torch's defaults when the model was built and called (default dtype, autocast)
are saved with it and set again by the rebuild and by a written factory.

Recording never changes the test: everything it does runs in a guard whose failure becomes the model's note;
user objects are described by their plain kinds and a guarded repr; a call inside torch.jit.trace is recorded
with the tracer paused; calls traced by dynamo, fx or inside torch.func are left alone (under dynamo the
`__call__` wrapper steps aside entirely); torch's and Python's global state is read, never set. A call that
raises is not the recorded run. A model the test drives through `.forward()` or its own method is named in a
note (graphlint sees inputs only at a call).

Limits: a model is rebuilt from its constructor, so changes a test makes after construction (a replaced layer,
`.half()`) are not seen; a model built by `copy.deepcopy` or unpickling has no constructor call and is not
linted; a recording that only memory holds cannot leave a pytest-xdist worker or reach a spawned child.
"""

from __future__ import annotations

import copy
import io
import re
import sys
from pathlib import Path
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from graphlint.errors import MetaCannotRun, call_user_code, one_line
from graphlint.files import is_installed_file


@dataclass
class Recording:
    """One distinct model of the session: where it was built, and its saved constructor call and inputs."""

    cls: str  # module.qualname of its class
    site: tuple[str, int] | None  # the file and line that built it; None when no constructor call was seen
    data: bytes | None = None  # the torch.save'd {"cls", "args", "kwargs", "inputs"}
    kept: tuple | None = None  # (cls, args, kwargs, inputs) when torch.save could not write them
    problem: str | None = None  # why it cannot be linted, or saved, when it cannot
    target: str | None = None  # the target text that builds it with literal --init and --input, when one can
    factory: str | None = None  # else the source of a factory that builds it, when its arguments can be written
    configuration: str = ""  # its constructor's arguments, as text: what tells it from the others of its site
    # What the lint of it can depend on, as digests: `model` of its class, constructor call, torch's defaults and
    # its inputs' kinds, dtypes and shapes (what a capture on the meta device sees); `values` of all that with the
    # inputs' values too (what a capture on the CPU can see). None where a value has no digest: linted alone.
    model: str | None = None
    values: str | None = None


@dataclass
class ModelRecorder:
    """Records the session's models; `install` patches `nn.Module` construction and calls, `uninstall` undoes it."""

    recordings: dict[tuple, Recording] = field(default_factory=dict)
    max_configurations: int = 4  # distinct constructor arguments recorded per class and construction site
    left_out: dict[tuple, set] = field(default_factory=dict)  # (class, site) -> configurations over the bound
    _configurations: dict[tuple, list] = field(default_factory=dict)
    _configuration_of: Any = field(default_factory=weakref.WeakKeyDictionary)  # module -> its configuration
    _built: Any = field(default_factory=weakref.WeakKeyDictionary)  # module -> (args, kwargs, site), confirmed
    _pending: Any = field(default_factory=weakref.WeakKeyDictionary)  # made by __new__, __init__ not yet run
    _local: threading.local = field(default_factory=threading.local)
    _saved: dict = field(default_factory=dict)
    _torch_classes: set = field(default_factory=set)
    _transformed_classes: set = field(default_factory=set)  # classes seen called inside torch.func, fx or dynamo
    _asked: Any = field(default_factory=weakref.WeakSet)  # modules whose callers were looked at

    def install(self) -> None:
        import torch

        module_class = torch.nn.Module
        self._saved = {name: module_class.__dict__.get(name) for name in ("__new__", "__init__", "__call__")}
        original_init, original_call = module_class.__init__, module_class.__call__
        recorder = self

        def __new__(cls, *args, **kwargs):
            module = object.__new__(cls)
            try:  # the arguments the class was called with, confirmed by __init__ (copies and unpickling skip it)
                caller = sys._getframe(1)
                recorder._pending[module] = (args, kwargs, (caller.f_code.co_filename, caller.f_lineno),
                                             _call_state())
            except Exception:  # a module that cannot be weakly referenced or hashed (its own __hash__) is not recorded
                pass
            return module

        def __init__(self, *args, **kwargs):
            try:
                made = recorder._pending.pop(self, None)
                if made is not None:
                    recorder._built[self] = made
            except Exception:  # the module's own __hash__ or __eq__ raised: not recorded, and the test never knows
                pass
            original_init(self, *args, **kwargs)

        is_compiling = torch.compiler.is_compiling

        def __call__(self, *args, **kwargs):
            if is_compiling():  # dynamo inlines this wrapper: it must see nothing but the call it wraps
                return original_call(self, *args, **kwargs)
            local = recorder._local
            depth = getattr(local, "depth", 0)
            new = recorder._guarded_record(self, args, kwargs, sys._getframe(1)) if depth == 0 else None
            local.depth = depth + 1
            try:
                result = original_call(self, *args, **kwargs)
            except BaseException:
                if new is not None:  # a call that raised is no run of the model: a later call is recorded instead
                    recorder._discard(new)
                raise
            finally:
                local.depth = depth
            return result

        module_class.__new__ = __new__
        module_class.__init__ = __init__
        module_class.__call__ = __call__

    def uninstall(self) -> None:
        import torch

        for name, value in self._saved.items():
            if name == "__new__":
                # Deleting a __new__ set on a class leaves CPython calling object.__new__ with the constructor's
                # arguments, which it refuses: a plain one stays instead.
                torch.nn.Module.__new__ = _plain_new
            else:
                setattr(torch.nn.Module, name, value)
        self._saved = {}

    def _guarded_record(self, module, args: tuple, kwargs: dict, caller) -> tuple | None:
        """Record a call without ever changing the test: graphlint's own failure becomes the model's note at the
        session's end, and a torch.jit trace running the call does not see the recorder's tensor operations.
        The key of the recording this call began, if any."""
        import torch

        self._local.current = self._local.new = None  # per thread: the recording this call makes, and its key
        try:
            if _transformed():  # traced symbolically (fx, dynamo) or inside torch.func: no real inputs to copy
                if type(module) not in self._transformed_classes:  # but a model driving it by a method is named
                    self._transformed_classes.add(type(module))
                    self._driven_by(module, caller)
                return None
        except Exception:
            return None
        tracing = torch._C._get_tracing_state()
        if tracing is not None:
            torch._C._set_tracing_state(None)
        try:
            self._record(_unwrapped(module), args, kwargs, caller)
        except Exception as error:
            self._failed(module, error)
        finally:
            if tracing is not None:
                torch._C._set_tracing_state(tracing)
        return self._local.new

    def _discard(self, key: tuple) -> None:
        """Forget the recording begun at a call that then raised."""
        recording = self.recordings.pop(key, None)
        if recording is not None:
            try:
                self._configurations.get((key[0], key[1]), []).remove(key[2])
            except ValueError:
                pass

    def _driven_by(self, module, caller) -> bool:
        """Whether a method of a model that holds `module` (its `forward` called directly, or its own `sample()`)
        runs above this call: then that model is noted as not recorded (`module` is recorded as before)."""
        try:
            found = _driver(module, caller)
            if found is None:
                return False
            owner, method = found
            cls = type(owner)
            built = self._built.get(owner)
            site = built[2] if built is not None else None
            key = (cls, site, "driven by a method")
            if key not in self.recordings and not any(k[:2] == (cls, site) for k in self.recordings):
                how = ".forward()" if method == "forward" else f"its own method {method}()"
                self.recordings[key] = Recording(
                    f"{cls.__module__}.{cls.__qualname__}", site, configuration="driven by a method",
                    problem=f"the test ran it through {how}, not by calling it (model(...)), so graphlint did not "
                            "see its inputs (the layers it called are linted as models of their own, except inside "
                            "torch.func transforms); call the model, or lint it with a factory "
                            "(graphlint check file.py:FACTORY)")
            return True
        except Exception:
            return False

    def _failed(self, module, error: Exception) -> None:
        """The recording of this model (a new one if none was begun) says why graphlint could not record it."""
        try:
            reason = one_line(error)
        except Exception:  # the exception's own __str__ raised
            reason = type(error).__name__
        problem = f"graphlint could not record it ({reason}); the test ran as it does without graphlint"
        try:
            recording = getattr(self._local, "current", None)
            if recording is None:
                cls = type(module)
                key = (cls, None, "graphlint could not record it")
                if any(k[0] is cls for k in self.recordings):
                    return  # another configuration of the class is recorded: this one is left as a repeat
                recording = self.recordings[key] = Recording(f"{cls.__module__}.{cls.__qualname__}", None)
            recording.data = recording.kept = recording.target = recording.factory = None
            recording.problem = problem
        except Exception:
            pass

    def _record(self, module, args: tuple, kwargs: dict, caller=None) -> None:
        cls = type(module)
        if caller is not None and _new_in(self._asked, module):  # a model whose own method called it gets a note
            self._driven_by(module, caller)
        if cls in self._torch_classes:
            return
        if cls.__module__.split(".")[0] == "torch" and cls.__name__ != "Sequential":
            self._torch_classes.add(cls)  # torch's own layers and losses called by a test are not the project's
            return
        if _from_a_library(cls) and next(module.parameters(), None) is None:
            return  # a library's parameter-free layer (einops' Rearrange) called by a test: nothing to train
        try:
            built = self._built.get(module)
        except TypeError:
            built = None
        site = built[2] if built is not None else None
        configuration = self._configuration(module, built)
        key = (cls, site, configuration)
        if key in self.recordings:
            return
        same_site = self._configurations.setdefault((cls, site), [])
        if len(same_site) >= self.max_configurations:
            self.left_out.setdefault((cls, site), set()).add(configuration)
            return
        same_site.append(configuration)
        self.recordings.pop((cls, site, "driven by a method"), None)  # called after all: the note is void
        recording = self.recordings[key] = Recording(f"{cls.__module__}.{cls.__qualname__}", site,
                                                     configuration=configuration)
        self._local.current, self._local.new = recording, key
        if built is None:
            recording.problem = "it was not built by a constructor call graphlint saw (copy.deepcopy, unpickling)"
            return
        try:
            inputs = _copied((args, kwargs))
        except Exception as error:  # inputs that cannot be copied: say so, and leave the test alone
            recording.problem = f"its inputs cannot be copied ({one_line(error)})"
            return
        # What torch's defaults were when the test built the model and called it: the rebuild sets them again.
        state = {"build": built[3], "call": _call_state(call=True)}
        if not state_differs(state):  # a command line builds and runs under torch's own defaults
            recording.target = _or_none(as_target, cls, built[0], built[1], inputs)
        if recording.target is None:
            recording.factory = _or_none(as_factory, cls, built[0], built[1], inputs, self._constructor_call, state)
        memo: dict[int, Any] = {}
        args, kwargs = (_recipes(built[0], self._constructor_call, memo),
                        _recipes(built[1], self._constructor_call, memo))
        inputs = _recipes(inputs, None, {})
        try:
            recording.data = _saved({"cls": cls, "args": args, "kwargs": kwargs, "inputs": inputs, "state": state})
            recording.model, recording.values = _digests(cls, args, kwargs, inputs, state, recording.data)
        except Exception as error:  # a lambda, a class defined in a test: kept for children forked from here
            recording.kept = (cls, args, kwargs, inputs, state)
            recording.problem = f"its constructor arguments or inputs cannot be saved ({one_line(error)})"

    def _constructor_call(self, module) -> tuple[tuple, dict] | None:
        """The arguments a module seen being built was called with; None for one built elsewhere."""
        try:
            built = self._built.get(module)
        except TypeError:
            return None
        return None if built is None else (built[0], built[1])

    def _configuration(self, module, built) -> str:
        """The module's constructor arguments as text, worked out once per module (it is asked at every call)."""
        if built is None:
            return ""
        try:
            known = self._configuration_of.get(module)
            if known is None:
                known = self._configuration_of[module] = _with_state(configuration_text(built[0], built[1]),
                                                                     built[3])
            return known
        except TypeError:  # a module that cannot be weakly referenced
            return _with_state(configuration_text(built[0], built[1]), built[3])


def _with_state(configuration: str, build: dict) -> str:
    """A configuration with the default dtype the model was built under, when it is not torch's own."""
    words = state_differs({"build": build})
    return f"{configuration} [{', '.join(words)}]" if words else configuration


@dataclass(eq=False)
class Rebuild:
    """A module argument the session saw built, kept as its constructor call: the lint builds it again, so its
    layers are built on the capture device and their findings point at the lines that built them."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(eq=False)
class TupleOf:
    """A tuple subclass with a `__new__` of its own (`Shape(*dims)`), kept as its items and attributes: pickling
    would call that `__new__` with one tuple (`Shape((4, 2))`), so the rebuild makes it as tuple's own `__new__`
    made it, without calling the class."""

    cls: type
    items: tuple = ()
    state: dict = field(default_factory=dict)


def _needs_items(value) -> bool:
    """Whether pickling would rebuild this tuple subclass wrongly: a class of it written in Python defines
    `__new__`, and none says how it pickles (a namedtuple's `__getnewargs__`, a `__reduce__`)."""
    kind = type(value)
    if kind is tuple or not isinstance(value, tuple):
        return False
    own = kind.__mro__[:kind.__mro__.index(tuple)]
    if any(name in vars(base) for base in own for name in ("__getnewargs__", "__getnewargs_ex__", "__reduce__",
                                                            "__reduce_ex__")):
        return False
    return any(isinstance(vars(base).get("__new__"), staticmethod) for base in own)  # C types' __new__ is no staticmethod


def _recipes(value: Any, constructor_call, memo: dict[int, Any]) -> Any:
    """Constructor arguments with each module the session saw built replaced by its `Rebuild`; one module passed
    twice (a shared embedding) is one `Rebuild`, built once. A module built elsewhere stays as it is (and every
    module when `constructor_call` is None: the inputs). A tuple subclass with its own `__new__` becomes a
    `TupleOf`."""
    import torch

    if constructor_call is not None and isinstance(value, torch.nn.Module):
        if id(value) in memo:
            return memo[id(value)]
        call = constructor_call(value)
        if call is None:
            return value
        recipe = memo[id(value)] = Rebuild(type(value))
        recipe.args = _recipes(tuple(call[0]), constructor_call, memo)
        recipe.kwargs = _recipes(dict(call[1]), constructor_call, memo)
        return recipe
    if type(value) in (list, tuple):
        return type(value)(_recipes(v, constructor_call, memo) for v in value)
    if type(value) is dict:
        return {k: _recipes(v, constructor_call, memo) for k, v in value.items()}
    if _needs_items(value):
        return TupleOf(type(value), tuple(_recipes(v, constructor_call, memo) for v in tuple.__iter__(value)),
                       dict(getattr(value, "__dict__", {})))
    return value


def _built(value: Any, memo: dict[int, Any]) -> Any:
    """The arguments with each `Rebuild` built again (once each), and each `TupleOf` made again."""
    if isinstance(value, Rebuild):
        if id(value) not in memo:
            memo[id(value)] = call_user_code(value.cls, *_built(value.args, memo), **_built(value.kwargs, memo))
        return memo[id(value)]
    if isinstance(value, TupleOf):
        made = tuple.__new__(value.cls, _built(value.items, memo))
        if value.state:
            made.__dict__.update(value.state)
        return made
    if type(value) in (list, tuple):
        return type(value)(_built(v, memo) for v in value)
    if type(value) is dict:
        return {k: _built(v, memo) for k, v in value.items()}
    return value


def _digests(cls, args, kwargs, inputs, state: dict, data: bytes) -> tuple[str | None, str]:
    """The recording's `model` and `values` digests (see `Recording`): tensors among the inputs count by kind,
    dtype and shape in the first; constructor tensors by their values in both."""
    import hashlib
    import pickle

    import torch

    def described(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", str(value.dtype), tuple(value.shape), value.layout, value.is_meta, value.is_complex())
        if type(value) in (list, tuple):
            return (type(value).__name__, *map(described, value))
        if type(value) is dict:
            return ("dict", *((key, described(item)) for key, item in value.items()))
        if isinstance(value, TupleOf):
            return ("TupleOf", value.cls, described(value.items), described(value.state))
        return value

    try:
        shapes = pickle.dumps((cls, described(inputs)), protocol=4)
        model = hashlib.sha256(_saved({"args": args, "kwargs": kwargs, "state": state}) + shapes).hexdigest()
    except Exception:  # an input no pickle writes by itself: this model is linted alone
        model = None
    return model, hashlib.sha256(data).hexdigest()


def as_target(cls, args: tuple, kwargs: dict, inputs: tuple) -> str | None:
    """The target text (`/abs/file.py:Class --init ... --input ...`) that builds this model again from the command
    line, or None when the class has no top-level name, or an argument or input is no literal and no tensor."""
    import inspect

    from graphlint.errors import GraphlintError
    from graphlint.target import TargetSpec, target_text

    try:
        file = inspect.getsourcefile(cls)
        bound = inspect.signature(cls).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    if file is None or not cls.__qualname__.isidentifier():
        return None  # defined in a function, or nested in a class
    named = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            named[name] = value
        else:
            return None  # *args or positional-only: no --init spells it
    specs = [_input_spec(value) for value in inputs[0]]
    specs += [f"{key}={_input_spec(value)}" for key, value in inputs[1].items()]
    if None in specs or any(spec.endswith("=None") for spec in specs):
        return None
    text = target_text(f"{file}:{cls.__name__}", specs, named)
    try:  # what cannot be written as a literal reads back as something else
        if not _written_as(TargetSpec.parse(text, Path(file).parent).kwargs, named):
            return None
    except GraphlintError:
        return None
    return text


def as_factory(cls, args: tuple, kwargs: dict, inputs: tuple, constructor_call, state: dict | None = None) -> str | None:
    """The source of a factory module whose `make()` builds this model as the test did and returns it with inputs
    of the recorded shapes, for a model a command line cannot spell: an argument that is a module the session
    saw built is written as its own constructor call (`Wrapper(attn_layers=Decoder(dim=8))`). None when an
    argument is neither that nor a literal, or a class has no importable top-level name."""
    imports: dict[str, set[str]] = {}
    try:
        call = _constructor_source(cls, args, kwargs, constructor_call, imports, depth=0)
        values = [_value_source(value, constructor_call, imports, 1) for value in inputs[0]]
        named = [f"{key!r}: {_value_source(value, constructor_call, imports, 1)}" for key, value in inputs[1].items()]
    except _Unwritable:
        return None
    lines = ['"""A factory graphlint wrote from what a test built and called (pytest --graphlint); edit it freely."""',
             "", "import torch", ""]
    lines += [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(imports.items())]
    arguments = f"({', '.join(values)},)" if values else "()"
    if named:  # keyword inputs: the factory returns (model, args, kwargs)
        arguments += f", {{{', '.join(named)}}}"
    state = state or {}
    body = [f"    {line}" for line in state_source(state, "build")]
    if state_source(state, "call"):  # the model is built first, then torch's defaults are set as at the call
        body += [f"    model = {call}", *[f"    {line}" for line in state_source(state, "call")],
                 f"    return model, {arguments}"]
    else:
        body.append(f"    return {call}, {arguments}")
    lines += ["", "", "def make():", *body, ""]
    return "\n".join(lines)


class _Unwritable(Exception):
    """A value no Python literal or recorded constructor call writes."""


def _constructor_source(cls, args, kwargs, constructor_call, imports, depth: int) -> str:
    module = sys.modules.get(cls.__module__)
    if depth > 4 or not cls.__qualname__.isidentifier() or getattr(module, cls.__qualname__, None) is not cls \
            or cls.__module__ == "__main__":
        raise _Unwritable(cls.__qualname__)  # defined in a function, or not importable by its name
    imports.setdefault(cls.__module__, set()).add(cls.__qualname__)
    words = [_value_source(value, constructor_call, imports, depth + 1) for value in args]
    words += [f"{key}={_value_source(value, constructor_call, imports, depth + 1)}" for key, value in kwargs.items()]
    return f"{cls.__qualname__}({', '.join(words)})"


def _value_source(value, constructor_call, imports, depth: int) -> str:
    import ast

    import torch

    if isinstance(value, torch.nn.Module):
        call = constructor_call(value)
        if call is None:
            raise _Unwritable(type(value).__name__)
        return _constructor_source(type(value), *call, constructor_call, imports, depth)
    if isinstance(value, torch.Tensor):
        spec = _input_spec(value)
        if spec is None:
            raise _Unwritable("tensor")
        shape = tuple(value.shape)
        dtype = f"torch.{str(value.dtype).removeprefix('torch.')}"
        if value.dtype == torch.bool:
            return f"torch.ones({shape}, dtype=torch.bool)"
        if value.is_floating_point():
            return f"torch.randn({shape}, dtype={dtype})"
        if ":" not in spec:  # an empty integer tensor: no range to draw from
            return f"torch.zeros({shape}, dtype={dtype})"
        low, high = spec.rsplit(":", 1)[1].split("..")
        return f"torch.randint({low}, {high}, {shape}, dtype={dtype})"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (torch.nn.Module, torch.Tensor)) for v in value):
        inner = ", ".join(_value_source(v, constructor_call, imports, depth + 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner},)"
    try:  # a literal is written as what reads back equal
        text = repr(value)
        if _written_as(ast.literal_eval(text), value):
            return text
    except Exception:
        pass
    raise _Unwritable(type(value).__name__)


def _written_as(read, value) -> bool:
    """Whether text read back as `read` is `value`: equal, and of the same types all through (a tuple subclass
    such as `Shape(4, 2)` reads back as a plain tuple, equal to it, and is not written by it)."""
    if type(read) is not type(value):
        return False
    if type(value) in (list, tuple):
        return len(read) == len(value) and all(_written_as(a, b) for a, b in zip(read, value, strict=True))
    if type(value) is dict:
        return read.keys() == value.keys() and all(_written_as(read[key], value[key]) for key in value)
    return read == value


def _input_spec(value) -> str | None:
    """A tensor's --input spec (integers with the range of their values), or None for anything else."""
    import torch

    if not isinstance(value, torch.Tensor) or value.is_complex():
        return None
    shape = ",".join(str(size) for size in value.shape)
    dtype = str(value.dtype).removeprefix("torch.")
    if value.dtype == torch.bool or value.is_floating_point() or value.numel() == 0 or value.is_meta:
        return f"{dtype}[{shape}]"
    return f"{dtype}[{shape}]:{int(value.min())}..{int(value.max()) + 1}"


def configuration_text(args: tuple, kwargs: dict) -> str:
    """Constructor arguments as short text that equal arguments share: tensors by dtype and shape, modules by
    class, other values by repr without memory addresses."""
    words = [_described(value) for value in tuple.__iter__(args)]
    words += [f"{key}={_described(value)}" for key, value in dict.items(kwargs)]
    return ", ".join(words)


def _described(value, depth: int = 0) -> str:
    """One value's text; the user's own methods (`__repr__`, and `__len__` or `__iter__` of a container
    subclass) are called only for a value that is none of the plain kinds, and a failure is its type's name."""
    import torch

    kind = type(value)
    try:
        if isinstance(value, torch.Tensor):  # metadata only: a traced or fake tensor has no values to read
            return f"{str(value.dtype).removeprefix('torch.')}[{','.join(str(size) for size in value.shape)}]"
        if isinstance(value, torch.nn.Module):
            return f"{kind.__name__}(...)"
        if kind in (list, tuple) and depth < 3:
            items = list(value)
            inner = ", ".join(_described(item, depth + 1) for item in items[:8]) + (", ..." if len(items) > 8 else "")
            return f"[{inner}]" if kind is list else f"({inner})"
        if kind is dict and depth < 3:
            items = list(value.items())[:8]
            return "{" + ", ".join(f"{key!r}: {_described(item, depth + 1)}" for key, item in items) + "}"
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned no str")
    except Exception:  # a repr (or a length, or an iteration) that fails is the object's own business
        text = getattr(kind, "__qualname__", "object")
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return text if len(text) <= 60 else text[:57] + "..."


# torch's wrappers that call the model they hold with their own inputs: the model is recorded, not the wrapper.
_WRAPPERS = {"OptimizedModule": "_orig_mod", "DataParallel": "module", "DistributedDataParallel": "module"}


def _unwrapped(module):
    cls = type(module)
    while cls.__name__ in _WRAPPERS and cls.__module__.split(".")[0] == "torch":
        inner = getattr(module, _WRAPPERS[cls.__name__], None)
        if inner is None:
            break
        module, cls = inner, type(inner)
    return module


def _new_in(seen, module) -> bool:
    """Whether `module` is not yet in the weak set `seen` (and add it); False for one that cannot be in it."""
    try:
        if module in seen:
            return False
        seen.add(module)
        return True
    except Exception:  # the module's own __hash__ or __eq__
        return False


def _driver(module, frame, limit: int = 64):
    """The outermost model, on the Python stack above a call of `module`, that holds `module` and runs one of its
    methods (a test calling `model.forward(x)` or `model.sample(n)` rather than `model(x)`), with that method's
    name; None when there is none."""
    import torch

    found = None
    while frame is not None and limit > 0:
        code = frame.f_code
        # Not a dunder: a parent's __init__ that runs a layer once to infer a size is no way of driving a model.
        if code.co_argcount and code.co_varnames[0] == "self" and not code.co_name.startswith("__"):
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and owner is not module \
                    and any(held is module for held in torch.nn.Module.modules(owner)):
                found = (owner, code.co_name)
        frame, limit = frame.f_back, limit - 1
    return found


def _or_none(write, *args):
    """A command or factory text, or None where the user's objects (their `__repr__`, `__eq__`) do not allow one:
    the model is still linted from its saved recording."""
    try:
        return write(*args)
    except Exception:
        return None


def _transformed() -> bool:
    """Whether a call runs under a tracer whose inputs are no plain tensors: dynamo (torch.compile, export), fx's
    symbolic trace, or a torch.func transform (vmap, grad): the model is recorded at a plain call, if any."""
    import torch

    if torch.compiler.is_compiling():
        return True
    fx = sys.modules.get("torch.fx._symbolic_trace")
    if fx is not None and getattr(fx, "_is_fx_tracing_flag", False):
        return True
    return torch._C._functorch.peek_interpreter_stack() is not None


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _call_state(call: bool = False) -> dict:
    """torch's process-wide defaults that decide what a constructor or a forward makes: the default dtype and
    device, and during a call (`call`) the grad mode and autocast; read, never changed."""
    import torch

    state: dict = {"dtype": torch.get_default_dtype()}
    device = torch.get_default_device()
    if device.type != "cpu":
        state["device"] = str(device)
    if call:
        state["grad"] = ("inference_mode" if torch.is_inference_mode_enabled()
                         else "enabled" if torch.is_grad_enabled() else "no_grad")
        state["autocast"] = {kind: torch.get_autocast_dtype(kind) for kind in _AUTOCAST_DEVICES
                             if torch.is_autocast_enabled(kind)}
    return state


def state_differs(state: dict) -> list[str]:
    """What of a recording's state (`{"build": ..., "call": ...}`) a plain command line would not reproduce, as
    words for a configuration: a default dtype other than float32, autocast at the call."""
    import torch

    build, call = state.get("build", {}), state.get("call", {})
    words = []
    dtype = build.get("dtype", torch.float32)
    if dtype != torch.float32 or call.get("dtype", dtype) != dtype:
        shown = str(dtype).removeprefix("torch.")
        words.append(f"default dtype {shown}" if call.get("dtype", dtype) == dtype
                     else f"default dtype {shown}, {str(call['dtype']).removeprefix('torch.')} at the call")
    words += [f"autocast {kind} {str(value).removeprefix('torch.')}" for kind, value in call.get("autocast", {}).items()]
    return words


def apply_state(state: dict, phase: str) -> None:
    """Set torch's defaults as the test had them when it built the model (`build`) or called it (`call`); the
    capture that calls the factory restores them afterwards (graphlint.capture.isolation)."""
    import torch

    values = state.get(phase, {})
    if "dtype" in values:
        torch.set_default_dtype(values["dtype"])
    for kind, dtype in values.get("autocast", {}).items():
        torch.set_autocast_enabled(kind, True)
        torch.set_autocast_dtype(kind, dtype)


def state_source(state: dict, phase: str) -> list[str]:
    """The lines of a factory's body that set what `apply_state` sets."""
    import torch

    values = state.get(phase, {})
    lines = []
    # The build's dtype when it is not torch's own; the call's when it differs from the build's.
    before = state.get("build", {}).get("dtype", torch.float32) if phase == "call" else torch.float32
    if values.get("dtype", before) != before:
        lines.append(f"torch.set_default_dtype({values['dtype']})  # as the test {'built' if phase == 'build' else 'called'} it")
    for kind, dtype in values.get("autocast", {}).items():
        lines.append(f"torch.set_autocast_enabled({kind!r}, True)  # the test called it under torch.autocast")
        lines.append(f"torch.set_autocast_dtype({kind!r}, {dtype})")
    return lines


def _plain_new(cls, *args, **kwargs):
    return object.__new__(cls)


def _copied(value: Any) -> Any:
    """The inputs as they are now: tensors detached and cloned on their devices, containers rebuilt."""
    import torch

    return torch.utils._pytree.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def _saved(data: dict) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


# Recordings that torch.save could not write, by name: a child forked from the process that recorded them has them.
IN_MEMORY: dict[str, tuple] = {}


def rebuild(path: str):
    """A target's factory: the recorded model built again from its constructor call, with the recorded inputs."""
    import torch

    from graphlint.errors import TargetFailure
    from graphlint.target import Target

    if path.startswith("memory:"):
        if path not in IN_MEMORY:
            raise TargetFailure("the model's constructor arguments or inputs cannot be saved, and on this system "
                                "the lint runs in a new process rather than a fork of the test session")
        cls, args, kwargs, inputs, state = IN_MEMORY[path]
        # Each build gets its own copy: the meta attempt moves a module argument (a bridge network passed to
        # the constructor) to meta in place, and the CPU retry must not get it there.
        try:
            args, kwargs, inputs, state = copy.deepcopy((args, kwargs, inputs, state))
        except Exception:  # an argument that cannot be copied is used as it is, as before
            pass
    else:
        data = torch.load(path, map_location="cpu", weights_only=False)
        cls, args, kwargs, inputs = data["cls"], data["args"], data["kwargs"], data["inputs"]
        state = data.get("state", {})
    if "cpu" in state.get("call", {}).get("autocast", {}) and torch.get_default_device().type == "meta":
        raise MetaCannotRun("the test called it under CPU autocast, which the meta device does not apply")
    apply_state(state, "build")
    memo: dict[int, Any] = {}
    args, kwargs = _built(args, memo), _built(kwargs, memo)
    model = call_user_code(cls, *args, **kwargs)
    apply_state(state, "call")
    inputs = _built(inputs, {})
    return Target(model, tuple(inputs[0]), dict(inputs[1]))


def _from_a_library(cls: type) -> bool:
    """Whether a module class is defined in an installed library's file."""
    return is_installed_file(getattr(sys.modules.get(cls.__module__), "__file__", None) or "")

