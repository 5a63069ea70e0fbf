"""The shortcut of the torch.compile analysis: the model's repeated blocks (instances of a module class defined
outside torch that are alike: the same attributes, parameter shapes and inputs) marked as dynamo's nested
compile regions, so that dynamo traces a block once and stamps out the others (torch's `nested_compile_region`
reuse), instead of tracing every op of every instance. Blocks that differ (a `layer_idx`) are compiled as
usual: dynamo's own reuse check lets a block whose attribute differs reuse another's trace.

It runs on a copy of the model made after the eager calls, and its result stands only where it can only equal
what compiling the whole model shows: no graph break, no failing call, no recompile-limit hit, no module state
that changed across the calls (a stamped-out block's guards on its own attributes are checked when it is
traced, not on later calls), and no recompile but a one-off size or stride change of an input on a grown call
(a guard failing once, which no rule reports). Anything else is analysed again by compiling the whole,
untouched model, as without the shortcut. `GRAPHLINT_COMPILE_WHOLE_MODEL=1` forces that path (tests and
benchmarks compare the two).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import types

import torch

WHOLE_MODEL_ENV = "GRAPHLINT_COMPILE_WHOLE_MODEL"
# What torch.compile itself sets on the module it compiles.
TORCH_MARKS = frozenset({"_is_torch_compile", "_compiled_call_impl"})
# A guard on an input's size or stride: dynamic shapes absorb it on the next size (GL302 reports only repeats).
_SIZE_GUARD = re.compile(r"^tensor '[^']+' (size|stride) mismatch at index \d+")


def shortcut_model(model: torch.nn.Module, device: str, call: tuple[tuple, dict]):
    """A copy of the model to analyse with its alike blocks as compile regions, and their groups (`same_blocks`);
    None where the shortcut does not apply: forced off, off meta (a copy on the CPU costs its weights, and a forward
    that needs real values breaks the graph anyway), no repeated block, or a model that cannot be copied.
    `call` (args, kwargs), the first call, runs once on another copy to see what each block gets."""
    if not shortcut_applies(device):
        return None
    try:
        probe = copy.deepcopy(model)
        groups = same_blocks(probe, repeated_blocks(probe), call)
        return (copy.deepcopy(model), groups) if groups else None
    except Exception:  # a model deepcopy refuses, a probe that fails: whole-model compilation, as without it
        return None


def shortcut_applies(device: str) -> bool:
    return not os.environ.get(WHOLE_MODEL_ENV) and device == "meta" and hasattr(torch.compiler, "nested_compile_region")


# Fewer alike blocks than this compile whole sooner than through nested regions, whose copy of the model and
# region machinery cost more than the blocks' traces they save (torch 2.13 on the 2-core machine, 2026-11-29, a
# LayerNorm-attention-MLP block: 2 blocks 0.42 s whole against 0.53 s, 6 about even, 12 1.51 s against 1.25 s).
SHORTCUT_FROM_BLOCKS = 6


def has_alike_blocks(model: torch.nn.Module) -> bool:
    """Whether SHORTCUT_FROM_BLOCKS blocks of one class are alike in state (no copy, no call): where all differ,
    such as a transformers Llama's layers by `layer_idx`, the shortcut stops here at no cost."""
    try:
        return any(len(group) >= SHORTCUT_FROM_BLOCKS for group in _alike(model, repeated_blocks(model), {}))
    except Exception:  # a module graphlint cannot read: whole-model compilation, as without the shortcut
        return False


def repeated_blocks(model: torch.nn.Module) -> list[str]:
    """The paths of the outermost instances of every module class, defined outside torch, that has two or more
    instances in the model and its own `forward`."""
    counts: dict[type, int] = {}
    for module in model.modules():
        counts[type(module)] = counts.get(type(module), 0) + 1
    paths: list[str] = []
    for path, module in model.named_modules():
        kind = type(module)
        if not path or counts[kind] < 2 or kind.__module__.split(".")[0] == "torch" or "forward" in vars(module):
            continue
        if not isinstance(getattr(kind, "forward", None), types.FunctionType):
            continue
        if any(path.startswith(outer + ".") for outer in paths):
            continue  # inside a marked block: its region covers it
        paths.append(path)
    return paths


def same_blocks(model: torch.nn.Module, paths: list[str], call: tuple[tuple, dict]) -> list[list[str]]:
    """`paths` in groups of two or more alike blocks: instances of one class with the same state (every plain
    attribute of them and their submodules, every parameter's and buffer's shape) and the same inputs on `call`
    (tensors' shapes, other values by value). Dynamo's reuse check alone would stamp out a block whose own
    attributes differ (a `layer_idx`); only alike blocks can be traced once for all."""
    seen: dict[str, list] = {path: [] for path in paths}
    handles = [model.get_submodule(path).register_forward_pre_hook(
        lambda module, args, kwargs, path=path: seen[path].append(_fingerprint((args, kwargs), 0, ids=False)),
        with_kwargs=True) for path in paths]
    try:
        with torch.no_grad():
            model(*call[0], **call[1])
    finally:
        for handle in handles:
            handle.remove()
    return [group for group in _alike(model, paths, seen) if len(group) >= 2]


def _alike(model: torch.nn.Module, paths: list[str], seen: dict[str, list]) -> list[list[str]]:
    """`paths` grouped by class, state and what each was seen to get (`seen`, when known)."""
    groups: dict[tuple, list[str]] = {}
    for path in paths:
        module = model.get_submodule(path)
        key = (type(module), tuple(_fingerprint(vars(inner), 0, ids=False) for _, inner in module.named_modules()),
               repr(seen.get(path)))
        groups.setdefault(key, []).append(path)
    return list(groups.values())


@contextlib.contextmanager
def compile_regions(model: torch.nn.Module, groups: list[list[str]]):
    """Each block's `forward` as a nested compile region for the time of the analysis, bound to the instance.
    Dynamo keeps one reuse cache per code object: each group gets a copy of the class's code that differs only
    in an unused constant, so a block is only ever stamped out from one alike to it."""
    marked = []
    try:
        for number, group in enumerate(groups):
            function = type(model.get_submodule(group[0])).forward
            code = function.__code__.replace(co_consts=(*function.__code__.co_consts, f"graphlint group {number}"))
            for path in group:
                module = model.get_submodule(path)
                copied = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                                            function.__closure__)
                copied.__kwdefaults__ = function.__kwdefaults__
                copied.__dict__.update(function.__dict__)
                module.forward = types.MethodType(torch.compiler.nested_compile_region(copied), module)
                marked.append(module)
        yield
    finally:
        for module in marked:
            vars(module).pop("forward", None)


def is_torch_or_builtin(kind: type) -> bool:
    """Whether a class is torch's or Python's own (not the user's or a library's, whose attributes may change)."""
    return kind.__module__.split(".")[0] in ("torch", "builtins")


def module_state(model: torch.nn.Module) -> list:
    """What of every module's own state a guard may read: plain values by value, tensors by identity and shape,
    other objects by identity (a list's length and items too), the parameter, buffer and child slots."""
    return [(path, tuple((key, _fingerprint(value)) for key, value in vars(module).items() if key not in TORCH_MARKS))
            for path, module in model.named_modules()]


def _fingerprint(value, depth: int = 0, ids: bool = True):
    """A value as what a guard compares: plain values by value, tensors by shape (and identity with `ids`),
    containers item by item, other objects by identity."""
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value) if ids else 0, tuple(value.shape), value.stride() if not ids else (), value.dtype,
                value.requires_grad)
    if depth < 3 and isinstance(value, (list, tuple)):
        return (type(value).__name__, id(value) if ids else 0,
                tuple(_fingerprint(item, depth + 1, ids) for item in value))
    if depth < 3 and isinstance(value, dict):
        return ("dict", id(value) if ids else 0,
                tuple((str(key), _fingerprint(item, depth + 1, ids)) for key, item in value.items()
                      if not (isinstance(item, torch.nn.Module) and not ids)))
    if depth < 3 and isinstance(value, (set, frozenset)):
        return ("set", id(value) if ids else 0, tuple(sorted(repr(_fingerprint(item, depth + 1, ids)) for item in value)))
    if isinstance(value, torch.nn.Module):
        return ("module", id(value) if ids else type(value).__qualname__)
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return ("function", getattr(value, "__qualname__", ""), id(getattr(value, "__self__", None)) if ids else 0)
    return (type(value).__name__, id(value))


def shortcut_holds(analysis, before: list, after: list, grown: set[str]) -> bool:
    """Whether the shortcut's analysis can only equal whole-model compilation's (see the module's docstring);
    `grown` names the calls with a grown dimension."""
    if analysis.unavailable or analysis.breaks or analysis.limit_hit or before != after:
        return False
    if any("(failed under" in call for call in analysis.calls):
        return False
    subjects: set[str] = set()
    for item in analysis.recompiles:
        if item.call not in grown or item.instance or not _SIZE_GUARD.match(item.guard) or item.subject in subjects:
            return False
        subjects.add(item.subject)
    return True


def _plain_data(value, depth: int = 0) -> bool:
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        return True
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain_data(item, depth + 1) for item in value)
    if depth < 3 and isinstance(value, dict):
        return all(_plain_data(key, depth + 1) and _plain_data(item, depth + 1) for key, item in value.items())
    return False


@contextlib.contextmanager
def globals_kept(model: torch.nn.Module):
    """Plain data in the globals and class attributes of the model's code (a config dict, a counter), and the
    random states, as they were before the shortcut's calls, put back after them: the whole-model compilation
    that may follow must see what it would have seen without the shortcut."""
    import random
    import sys

    classes = {kind for module in model.modules() for kind in type(module).__mro__ if not is_torch_or_builtin(kind)}
    spaces = {id(space): space for kind in classes
              for space in (vars(sys.modules[kind.__module__]) if kind.__module__ in sys.modules else {},)}
    saved = [(space, name, value, copy.deepcopy(value)) for space in spaces.values()
             for name, value in list(space.items()) if not name.startswith("__") and _plain_data(value)]
    attributes = [(kind, name, value, copy.deepcopy(value)) for kind in classes
                  for name, value in list(vars(kind).items()) if not name.startswith("__") and _plain_data(value)]
    states = random.getstate(), torch.get_rng_state()
    kept = _Kept(saved, attributes)
    try:
        yield kept
    finally:
        if not kept.keep:
            for space, name, value, copied in saved:
                space[name] = _refilled(value, copied)
            for kind, name, value, copied in attributes:
                setattr(kind, name, _refilled(value, copied))
            random.setstate(states[0])
            torch.set_rng_state(states[1])


class _Kept:
    """What `globals_kept` saved; `keep` set: the changes stand."""

    def __init__(self, saved: list, attributes: list) -> None:
        self.saved, self.attributes, self.keep = saved, attributes, False

    def changed(self) -> bool:
        now = [space.get(name, _Kept) for space, name, _, _ in self.saved]
        now += [getattr(kind, name, _Kept) for kind, name, _, _ in self.attributes]
        return any(current is not value or current != copied
                   for current, (_, _, value, copied) in zip(now, self.saved + self.attributes, strict=True))


def _refilled(value, copied):
    """The original object with its original contents (code that holds it sees them again)."""
    if isinstance(value, dict):
        value.clear()
        value.update(copy.deepcopy(copied))
    elif isinstance(value, list):
        value[:] = copy.deepcopy(copied)
    elif isinstance(value, set):
        value.clear()
        value.update(copied)
    return value
