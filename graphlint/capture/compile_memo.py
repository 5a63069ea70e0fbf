"""The torch.compile analysis kept across runs: a target whose model, inputs and traced code did not change is
not compiled again, though its file changed elsewhere (an edit of the training loop, a comment, the factory's
print) and the capture ran again.

    <cache dir>/v2/compile-<graphlint's code>/<key>.json    the analyses stored under one key, newest first

The key covers what is known before compiling: what an analysis means (`ANALYSIS_VERSION`), torch's and Python's
versions, the device, every module of the model (its class, its own plain values by value, tensors by shape, dtype
and which tensor they are, its children), the plain class attributes of the model's own classes, each call the
analysis makes (its label, its tensors by shape, stride, dtype and attributes such as mark_dynamic's marks, other
values by value), dynamo's settings and the hooks registered on every module. On the CPU (a capture that needed
real values) tensors are also keyed by their values: after a break on a tensor's value, the path taken depends on
them.
Under one key, a stored analysis is used only when, now as then:

- the source lines of every function dynamo traced or the analysis ran (torch's own excepted: torch's version is
  in the key) are the same, at the same line numbers, so findings stay at their lines;
- every global name those functions read has the same value, and so has every global they read through a module
  (`settings.VERBOSE`, `F.gelu`, torch's modules included, and modules they import inside themselves): plain data
  by value, functions by where they are defined, their source lines, defaults, closures and dynamo's trace rules
  (allow_in_graph), classes by name and attributes, modules by name, objects by their attributes and class.

A value graphlint cannot fingerprint (an object without attributes whose text shows only an address) is kept by
its type alone; a change to it is not seen (use --no-cache). Reading or writing the memo never fails a run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import linecache
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

from graphlint.capture.compile_regions import TORCH_MARKS, is_torch_or_builtin
from graphlint.libraries import module_file

# Analyses kept per key: code or a setting edited back and forth hits either version.
_VARIANTS = 4
_DEPTH = 6
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# What an analysis means, in the key: bumped whenever the same model and code would be analysed differently, so
# that no analysis made before is reused (2: the analysis runs with torch.distributions' argument validation off,
# as plain torch.compile does; before, its checks showed as graph breaks).
ANALYSIS_VERSION = 2


class CompileMemo:
    """The analyses of one graphlint version, in `folder`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def key(self, model: torch.nn.Module, calls: list[tuple[str, tuple, dict]], device: str) -> str | None:
        """The key for compiling `model` on `calls` on `device`; None when the model cannot be fingerprinted."""
        try:
            fingerprint = _Fingerprint()
            named = list(model.named_modules())
            for _, module in named:  # each module's state is listed once, under its path
                fingerprint.number(module)
            modules = [[path, _qualified(type(module)), fingerprint.state(module)] for path, module in named]
            classes = sorted({kind for module in model.modules() for kind in type(module).__mro__
                              if not is_torch_or_builtin(kind)}, key=_qualified)
            attributes = [[_qualified(kind), fingerprint.namespace(vars(kind))] for kind in classes]
            inputs = [[label, fingerprint.value(args), fingerprint.value(kwargs)] for label, args, kwargs in calls]
            # Dynamo's settings as the target left them (`config.automatic_dynamic_shapes = False` in its file).
            settings = fingerprint.value(_dynamo_config().get_config_copy())
            # Hooks on every module (`register_module_forward_hook(loud)` in its file), by function, not handle id.
            hooks = [[name, fingerprint.value(list(value.values()))] for name, value in
                     sorted(vars(torch.nn.modules.module).items()) if name.startswith("_global_") and isinstance(value, dict)]
            fields = [ANALYSIS_VERSION, torch.__version__, sys.version, device, modules, attributes, inputs, settings,
                      hooks]
            return hashlib.sha256(json.dumps(fields, default=repr).encode()).hexdigest()[:32]
        except Exception:  # graphlint's own failure to fingerprint: compile as without the memo
            return None

    def load(self, key: str) -> dict | None:
        """The stored analysis for `key` whose traced code and globals are unchanged, as the data `store` was
        given (graphlint.capture.compile makes it an analysis again), or None."""
        try:
            variants = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
            for variant in variants:
                if _unchanged(variant["code"], variant["globals"]):
                    return variant["analysis"]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no entry, or a corrupt one: a miss
        except Exception:  # noqa: BLE001 - graphlint's own failure to check an entry (an odd module): a miss
            logging.getLogger(__name__).debug("compile memo not read", exc_info=True)
        return None

    def store(self, key: str, analysis, traced: list[types.CodeType]) -> None:
        """Keep `analysis`, made by compiling the functions of `traced`, under `key`."""
        if not traced:
            return  # this torch did not say what it traced (every compilation traces the forward at least)
        try:
            code, names = _read_by(traced)
            variant = {"code": code, "globals": names, "analysis": _analysis_to(analysis)}
            path = self.folder / f"{key}.json"
            try:
                variants = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                variants = []
            others = [v for v in variants if isinstance(v, dict) and (v.get("code"), v.get("globals")) != (code, names)]
            variants = [variant] + others[:_VARIANTS - 1]
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(variants, stream)
            os.replace(temporary, path)  # readers never see half a file
        except Exception:  # noqa: BLE001 - a memo that cannot be written is only a slower next run
            logging.getLogger(__name__).debug("compile memo not written", exc_info=True)


@contextlib.contextmanager
def traced_code_recorded(into: list[types.CodeType]):
    """Every code object dynamo traces while this is open, inlined functions included, appended to `into`."""
    from torch import _guards

    if not hasattr(_guards, "TracingContext"):  # an older torch: nothing recorded, so nothing is kept
        yield
        return
    contexts = []
    original = _guards.TracingContext.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        contexts.append(self)

    _guards.TracingContext.__init__ = init
    try:
        yield
    finally:
        _guards.TracingContext.__init__ = original
        seen = {id(code) for code in into}
        for context in contexts:
            for code in getattr(context, "traced_code", ()):
                if id(code) not in seen:
                    seen.add(id(code))
                    into.append(code)


class _Unreadable(Exception):
    """Code whose source graphlint cannot read again: its analysis is not kept."""


# -- what the traced code read ------------------------------------------------------------------------------


def _read_by(traced: list[types.CodeType]) -> tuple[list, list]:
    """The source regions of the traced code outside torch, and the fingerprints of the globals it names."""
    regions, names = {}, {}
    spaces = _module_spaces()
    for code in traced:
        file = os.path.abspath(code.co_filename)
        if file.startswith(_TORCH_DIR) or code.co_filename.startswith(("<eval_with_key>", "<frozen ")):
            continue  # torch's and Python's versions are in the key; a GraphModule's code is in its state
        if code.co_qualname.startswith("__create_fn__.<locals>."):
            continue  # a dataclass's generated method (an output class's __init__): made from its fields
        if not os.path.isfile(file):
            raise _Unreadable(f"{code.co_qualname} has no source file ({code.co_filename})")
        first, last = _lines_of(code)
        regions[(file, first, last)] = None
        space = spaces.get(file)
        if space is None:
            continue
        read = _names_of(code)
        modules, done = [(file, space)], set()
        package = space.get("__package__") or ""
        for name in read:  # `from settings import VERBOSE` (or `from .settings ...`) inside the traced function
            imported = sys.modules.get(name) or sys.modules.get(f"{package}.{name}")
            inner = getattr(imported, "__file__", None)
            if isinstance(inner, str) and os.path.abspath(inner) in spaces and os.path.abspath(inner) != file:
                modules.append((os.path.abspath(inner), spaces[os.path.abspath(inner)]))
        while modules:  # `settings.VERBOSE`, `pkg.settings.VERBOSE`: a global of a module the code names
            where, space = modules.pop()
            done.add(where)
            for name in sorted(read & space.keys()):
                names.setdefault((where, name), None)
                held = space[name]
                inner = os.path.abspath(held.__file__) if isinstance(held, types.ModuleType) and \
                    isinstance(getattr(held, "__file__", None), str) else None
                if inner in spaces and inner not in done:
                    modules.append((inner, spaces[inner]))
    code = [[file, first, last, _region_digest(file, first, last)] for file, first, last in sorted(regions)]
    values = [[file, name, _global_fingerprint(spaces, file, name)] for file, name in sorted(names)]
    return code, values


def _unchanged(code: list, names: list) -> bool:
    if any(_region_digest(file, first, last) != digest for file, first, last, digest in code):
        return False
    spaces = _module_spaces()
    return all(_global_fingerprint(spaces, file, name) == value for file, name, value in names)


def _global_fingerprint(spaces: dict, file: str, name: str):
    space = spaces.get(file)
    if space is None or name not in space:
        return None
    try:
        return json.loads(json.dumps(_Fingerprint().value(space[name]), default=repr))
    except Exception:  # noqa: BLE001 - graphlint's own failure: a value never equal to another, so a miss
        return ["unreadable", os.urandom(8).hex()]


def _module_spaces() -> dict[str, dict]:
    """Each imported module's file and globals (torch's too: `F.gelu = my_gelu` in a model file is a global of
    torch.nn.functional that the traced code reads)."""
    spaces = {}
    for module in list(sys.modules.values()):
        file = module_file(module)  # never runs a lazily loaded module's code
        if isinstance(file, str):
            spaces.setdefault(os.path.abspath(file), object.__getattribute__(module, "__dict__"))
    return spaces


def _lines_of(code: types.CodeType) -> tuple[int, int]:
    """The first and last source line of a function, its decorators and nested functions included."""
    last = code.co_firstlineno
    stack = [code]
    while stack:
        current = stack.pop()
        last = max([last] + [line for _, _, line in current.co_lines() if line is not None])
        stack.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return code.co_firstlineno, last


def _names_of(code: types.CodeType) -> set[str]:
    names, stack = set(), [code]
    while stack:
        current = stack.pop()
        names.update(current.co_names)
        stack.extend(const for const in current.co_consts if isinstance(const, types.CodeType))
    return names


def _region_digest(file: str, first: int, last: int) -> str | None:
    linecache.checkcache(file)
    lines = linecache.getlines(file)
    if last > len(lines):
        return None
    return hashlib.sha256("".join(lines[first - 1:last]).encode()).hexdigest()[:24]


# -- fingerprints -------------------------------------------------------------------------------------------


class _Fingerprint:
    """Values as JSON-able data that is equal across runs when the values are: tensors and objects met twice
    by their first meeting's number (which tensor a module holds is what a guard on identity compares)."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}
        self._kept: list = []  # the objects numbered, alive while numbered

    def number(self, value) -> None:
        """Give `value` the next number: met again, it is written as that number."""
        self._seen[id(value)] = len(self._kept)
        self._kept.append(value)

    def state(self, module: torch.nn.Module, depth: int = 0) -> list:
        return self.namespace({k: v for k, v in vars(module).items() if k not in TORCH_MARKS}, depth)

    def namespace(self, space, depth: int = 0) -> list:
        # A stored hash (transformers' `_original_object_hash`) differs in every process: str hashes are salted.
        # Only private names: a setting such as `self.use_hashing` is the user's and keyed.
        return [[str(name), self.value(value, depth)] for name, value in space.items()
                if not (isinstance(name, str) and (name.startswith("__") and name.endswith("__") or
                                                   name.startswith("_") and "hash" in name))]

    def value(self, value, depth: int = 0):
        if isinstance(value, (bool, int, str, type(None))):
            return value
        if isinstance(value, (float, complex, bytes)):
            return repr(value)
        if isinstance(value, (torch.dtype, torch.device, torch.Size)):
            return ["torch", str(value)]
        if isinstance(value, enum.Enum):  # its value too: `self.kind.value == "slow"` reads it
            return ["enum", _qualified(type(value)), value.name, self.value(value.value, depth + 1)]
        if isinstance(value, type) and is_torch_or_builtin(value):
            return ["class", _qualified(value)]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            return ["builtin", getattr(value, "__module__", None) or "", getattr(value, "__qualname__", repr(value))]
        if isinstance(value, logging.Logger):
            return ["logger", value.name]
        known = self._seen.get(id(value))
        if known is not None:
            return ["again", known]
        if isinstance(value, (torch.Tensor, torch.nn.Module, dict, list, set, frozenset, tuple)) or \
                hasattr(value, "__dict__"):
            self.number(value)
        if isinstance(value, type):  # a class of yours or a library's: its attributes (`Config.scale`) too
            if depth >= _DEPTH:
                return ["class", _qualified(value), "deep"]
            bases = [self.value(base, depth + 1) for base in value.__mro__[1:] if not is_torch_or_builtin(base)]
            return ["class", _qualified(value), self.namespace(vars(value), depth + 1), bases]
        if isinstance(value, torch.Tensor):  # its attributes too: dynamo's marks (`mark_dynamic`) are kept there
            return ["tensor", list(value.shape), list(value.stride()) if value.layout == torch.strided else [],
                    str(value.dtype), value.device.type, value.requires_grad, type(value).__name__, _values(value),
                    self.namespace(vars(value), depth + 1) if depth < _DEPTH else "deep"]
        if isinstance(value, torch.nn.Module):  # one outside the model (a global `ACT = nn.GELU()`): its state
            return ["nn.Module", _qualified(type(value)), self.state(value, depth + 1) if depth < _DEPTH else "deep"]
        if depth >= _DEPTH:
            return ["deep", _qualified(type(value))]
        if isinstance(value, (list, tuple)):
            return [type(value).__name__, [self.value(item, depth + 1) for item in value]]
        if isinstance(value, dict):
            return [type(value).__name__, [[repr(key), self.value(item, depth + 1)] for key, item in value.items()]]
        if isinstance(value, (set, frozenset)):  # each item on its own: their order, so any `again`, varies by run
            return [type(value).__name__, sorted(json.dumps(_Fingerprint().value(item, depth + 1), default=repr)
                                                 for item in value)]
        if isinstance(value, functools.partial):
            return ["partial", self.value(value.func, depth + 1), self.value(value.args, depth + 1),
                    self.value(value.keywords, depth + 1)]
        if isinstance(value, (staticmethod, classmethod)):  # the function, defaults included
            return [type(value).__name__, self.value(value.__func__, depth + 1)]
        if isinstance(value, types.MethodType):
            return ["method", self.value(value.__func__, depth + 1), self.value(value.__self__, depth + 1)]
        if isinstance(value, types.FunctionType):
            return self._function(value, depth)
        # Slots read only where the text would show an address (a Path's lazily filled slots would differ by use).
        slots = _slots(value) if type(value).__repr__ is object.__repr__ else {}
        if dataclasses.is_dataclass(value) or hasattr(value, "__dict__") or slots:
            attributes = {**slots, **(vars(value) if hasattr(value, "__dict__") else {})}
            # Its class's attributes too: `OPTIONS.verbose` reads `Options.verbose` when the instance has none.
            kind = self.value(type(value), depth + 1) if not is_torch_or_builtin(type(value)) else None
            return ["object", _qualified(type(value)), self.namespace(attributes, depth + 1), kind]
        text = repr(value)
        return ["repr", _qualified(type(value)), "" if " at 0x" in text else text]

    def _function(self, function: types.FunctionType, depth: int):
        code = function.__code__
        file = os.path.abspath(code.co_filename)
        first, last = _lines_of(code)
        body = "torch" if file.startswith(_TORCH_DIR) else _region_digest(file, first, last)
        cells = [self.value(cell.cell_contents, depth + 1) if _filled(cell) else None
                 for cell in function.__closure__ or ()]
        wrapped = getattr(function, "__wrapped__", None)
        return ["function", function.__module__ or "", function.__qualname__, file, first, body,
                self.value(function.__defaults__, depth + 1), cells,
                self.value(wrapped, depth + 1) if wrapped is not None else None,
                [] if body == "torch" else _dynamo_marks(function)]  # torch's own: its version is in the key


def _values(tensor: torch.Tensor) -> str | None:
    """A digest of a host tensor's values (a capture on the CPU runs on real values, and which path the code
    takes after a break on a tensor's value depends on them); None on meta, where there are none."""
    if tensor.device.type != "cpu":
        return None
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise TypeError(f"no digest of a {tensor.layout} tensor's values")
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:24]


def _dynamo_config():
    import torch._dynamo  # noqa: F401 - its config module is loaded with it

    return torch._dynamo.config


def _dynamo_marks(function) -> list[str]:
    """The lists of dynamo's trace rules that name `function` by its id (`allow_in_graph(helper)` as a statement
    leaves the function as it was)."""
    from torch._dynamo import trace_rules

    return [name for name in ("_allowed_callable_ids", "_disallowed_callable_ids", "_nonstrict_trace_callable_ids")
            if id(function) in getattr(trace_rules, name, ())]


def _slots(value) -> dict:
    """The attributes an object keeps in its classes' __slots__ (it may have no __dict__ to show them)."""
    found = {}
    for kind in type(value).__mro__:
        names = vars(kind).get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                found.setdefault(name, getattr(value, name))
    return found


def _filled(cell) -> bool:
    """Whether a closure cell holds a value yet (a name bound later in the enclosing function does not)."""
    try:
        return cell.cell_contents is not cell
    except ValueError:
        return False


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


# -- the analysis as JSON ---------------------------------------------------------------------------------


def _analysis_to(analysis) -> dict:
    """The analysis's fields as JSON-able data (graphlint.capture.compile reads them back)."""
    data = dataclasses.asdict(analysis)
    data.pop("shortcut", None)
    data.pop("reused", None)
    return data
