"""Capture: build the model, run one forward and one backward, and keep what both graphs showed.

`capture_target` builds a target on the meta device first (no parameter memory, cost independent of tensor
sizes) and rebuilds it on CPU when the forward needs real values. `capture_model` does the work for a model
that already exists. The resulting `Capture` is read-only data for the rules.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import torch
from torch import fx

from graphlint.capture.autograd import AutogradGraph, SavedTensorRecorder, run_backward, walk_autograd_graph
from graphlint.capture.debug import DebugSwitch, DebugSwitchWatch, debug_modes_off
from graphlint.capture.forward import ForwardRecorder, recorded_ops, storage_key
from graphlint.capture.frames import Frame, StackRecorder
from graphlint.capture.isolation import preserved_global_state
from graphlint.capture.loss import choose_loss
from graphlint.capture.modules import BuildSiteRecorder, ModuleCallTracker, ModuleInfo, describe_modules
from graphlint.errors import TargetFailure, call_user_code, one_line, raised_at, raised_by_graphlint
from graphlint.files import display_path
from graphlint.stages import reached
from graphlint.target import LoadedTarget, Target, normalize_factory_result

if TYPE_CHECKING:
    from graphlint.capture.compile import CompileAnalysis


@dataclass(frozen=True)
class ParameterInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    built_at: tuple[Frame, ...] = ()  # the user stack that registered it; () when unknown

    @property
    def module_path(self) -> str:
        return self.name.rpartition(".")[0]


@dataclass
class Capture:
    """Everything one capture saw. Rules read it and never run the model again."""

    target: str
    device: str
    forward: fx.Graph  # see graphlint.capture.forward for what each node's meta holds
    autograd: AutogradGraph
    parameters: dict[str, ParameterInfo]
    modules: dict[str, ModuleInfo]  # by qualified path; "" is the model itself
    factory: Frame | None = None  # the target factory's definition, the last resort for locations
    notes: list[str] = field(default_factory=list)
    # Debugging modes (anomaly detection, profilers) the target's code switched on before or during the forward.
    debug_switches: tuple[DebugSwitch, ...] = ()
    # What compiling the model with torch.compile showed (graphlint.capture.compile); None when not asked for.
    compiled: CompileAnalysis | None = None

    @functools.cached_property
    def ops(self) -> list[fx.Node]:
        """The recorded calls in execution order (computed once; every rule reads them)."""
        return recorded_ops(self.forward)

    @property
    def source_files(self) -> set[str]:
        """Every source file (user or library) that ran an op or built a module or parameter."""
        files = {frame.file for node in self.forward.nodes for frame in node.meta.get("stack") or ()}
        files |= {frame.file for info in self.modules.values() for frame in info.built_at}
        files |= {frame.file for info in self.parameters.values() for frame in info.built_at}
        if self.factory is not None:
            files.add(self.factory.file)
        return files


def capture_model(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    loss_fn: Callable | None = None,
    *,
    target: str = "model",
    device: str | None = None,
    build_sites: BuildSiteRecorder | None = None,
    factory: Frame | None = None,
    debug: DebugSwitchWatch | None = None,
) -> Capture:
    """Run one forward (recording the forward graph and saved tensors) and one backward on `model`.
    `debug` is the watch that already saw the factory run, if any."""
    modules = describe_modules(model, build_sites)
    parameters = dict(model.named_parameters())
    names = {id(t): name for name, t in model.named_buffers()}
    names.update({id(p): name for name, p in parameters.items()})
    stacks = StackRecorder()
    saved = SavedTensorRecorder()
    tracker = ModuleCallTracker(modules)
    recorder = ForwardRecorder(stacks, tracker, names, saved.count)
    recorder.add_inputs(args, kwargs)
    stacks.boundary = sys._getframe()  # frames from here outwards (graphlint, the CLI, pytest) are not the user's
    debug = debug or DebugSwitchWatch()
    try:
        reached("forward")
        with torch.enable_grad(), debug, saved, tracker, recorder:
            output = call_user_code(model, *args, **kwargs)
            recorder.phase = "loss"
            loss = choose_loss(output, loss_fn)
            recorder.add_output(output)
            recorder.mark_loss(loss)
    except TargetFailure:
        raise
    except Exception as error:
        if raised_by_graphlint(error):
            raise  # graphlint's own bug: reported as one, never as the user's forward failing
        raise ForwardFailure(f"the forward raised {one_line(error)}{raised_at(error)}", recorder.failed_op) from error
    ops = recorded_ops(recorder.graph)
    autograd = AutogradGraph()
    if loss is not None:
        reached("backward")
        weights = frozenset(storage_key(t) for t in (*parameters.values(), *model.buffers()))
        autograd = walk_autograd_graph(loss, saved, names, ops, weights)
        with debug_modes_off():
            autograd.backward = run_backward(loss, parameters, autograd)
    saved.release()
    notes = []
    if loss is None:
        notes.append("the output has no floating-point tensor that requires grad, so no backward pass was captured")
    elif autograd.backward.error:
        notes.append(f"backward raised {autograd.backward.error}; rules ran on what was captured")
    return Capture(
        target=target,
        device=device or _device_of(model, args),
        forward=recorder.graph,
        autograd=autograd,
        parameters={
            name: ParameterInfo(name, tuple(p.shape), p.dtype, p.requires_grad,
                                build_sites.built_at(p) if build_sites else ())
            for name, p in parameters.items()
        },
        modules={info.path: info for info in modules.values()},
        factory=factory,
        notes=notes,
        debug_switches=tuple(debug.switches),
    )


def capture_target(loaded: LoadedTarget, device: str = "auto", vary_inputs: Callable | None = None,
                   after: Callable[[Target, str], Any] | None = None) -> Capture:
    """Build the target and capture it; with `auto`, on meta first and on CPU when meta cannot run it.
    `vary_inputs` rewrites the factory's (args, kwargs) before the forward (the graph report's --vary).
    `after(target, device)`, when given, runs once the capture has succeeded (the recorders have exited), on the
    same model and device; what it returns becomes `Capture.compiled`."""
    if device != "auto":
        try:
            return _capture_on(loaded, device, vary_inputs, after)
        except _NeedsRealValues as meta_failure:
            raise TargetFailure(f"cannot capture on the meta device: {meta_failure}; "
                                "use --device auto (the default) or --device cpu") from meta_failure
    try:
        return _capture_on(loaded, "meta", vary_inputs, after)
    except _NeedsRealValues as meta_failure:
        capture = _capture_on(loaded, "cpu", vary_inputs, after)
        capture.notes.insert(0, f"captured on CPU because {meta_failure}")
        return capture


class ForwardFailure(TargetFailure):
    """The forward (or the loss) raised; `failed_op` is the torch call that raised and its user stack."""

    def __init__(self, message: str, failed_op: tuple[str, tuple[Frame, ...]] | None = None) -> None:
        super().__init__(message)
        self.failed_op = failed_op


class _NeedsRealValues(Exception):
    """The meta-device attempt failed; its message says why, for the note shown after the CPU rebuild."""


_REAL_VALUE_OPS = {
    "bool": "a Python branch on a tensor value",
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "nonzero": "nonzero()",
    "masked_select": "masked_select()",
    "unique": "unique()",
    "cpu": ".cpu()",
    "int": "int() of a tensor",
    "float": "float() of a tensor",
    "index": "a tensor used as a Python index",
}


def _capture_on(loaded: LoadedTarget, device: str, vary_inputs: Callable | None = None,
                after: Callable[[Target, str], Any] | None = None) -> Capture:
    if device == "cuda" and not torch.cuda.is_available():
        raise TargetFailure("--device cuda was asked for but CUDA is not available here; use --device cpu or meta")
    with preserved_global_state():
        if device != "meta":
            torch.manual_seed(0)  # the same inputs and dropout masks on every run
        stacks = StackRecorder()
        build_sites = BuildSiteRecorder(stacks)
        stacks.boundary = sys._getframe()
        reached("factory")
        debug = DebugSwitchWatch(loaded.import_switches)
        try:
            with torch.device(device), build_sites, debug:
                made = normalize_factory_result(call_user_code(loaded.factory))
        except TargetFailure:
            raise
        except Exception as error:
            if raised_by_graphlint(error):
                raise  # no CPU retry for graphlint's own bug
            if device == "meta":
                raise _NeedsRealValues(f"the factory failed on the meta device ({one_line(error)})") from error
            raise TargetFailure(f"the factory raised {one_line(error)}{raised_at(error)}") from error
        if device == "meta":
            _move_to_meta(made)
        if vary_inputs is not None:
            made.args, made.kwargs = vary_inputs(made.args, made.kwargs)
        try:
            with torch.device(device):
                capture = capture_model(
                    made.model, made.args, made.kwargs, made.loss,
                    target=loaded.spec.text, device=device, build_sites=build_sites, factory=_definition(loaded),
                    debug=debug,
                )
        except ForwardFailure as failure:
            if device != "meta":
                raise
            raise _NeedsRealValues(_why_meta_failed(failure)) from failure
        if after is not None:
            capture.compiled = after(made, device)
        return capture


def _why_meta_failed(failure: ForwardFailure) -> str:
    if failure.failed_op is not None and failure.failed_op[0] in _REAL_VALUE_OPS:
        op, stack = failure.failed_op
        where = f" at {display_path(stack[-1].file)}:{stack[-1].line}" if stack else ""
        return f"the forward needs real values ({_REAL_VALUE_OPS[op]}{where})"
    return f"the forward failed on the meta device ({failure})"


def _move_to_meta(made: Target) -> None:
    """Tensors the factory pinned to another device (loaded data, `device="cpu"`) join the meta model."""
    model = made.model
    if any(t.device.type != "meta" for t in _model_tensors(model)):
        model.to("meta")
    made.args, made.kwargs = inputs_to_meta(made.args, made.kwargs)


def inputs_to_meta(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A forward's inputs with every tensor in them (nested in lists, dicts...) moved to the meta device."""
    return (tuple(torch.utils._pytree.tree_map(_to_meta, list(args))),
            torch.utils._pytree.tree_map(_to_meta, kwargs))


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return value.to("meta")
    return value


def _definition(loaded: LoadedTarget) -> Frame:
    """The factory's `def` line: where a finding goes when no frame of the project's own code is involved."""
    try:
        code = inspect.unwrap(loaded.factory).__code__
        return Frame(os.path.abspath(code.co_filename), code.co_firstlineno, code.co_name)
    except AttributeError:  # a callable object or a builtin: point at the target file
        return Frame(str(loaded.spec.file or loaded.spec.search_root), 1, loaded.spec.name)


def _model_tensors(model: torch.nn.Module):
    yield from model.parameters()
    yield from model.buffers()


def _device_of(model: torch.nn.Module, args: tuple) -> str:
    for tensor in _model_tensors(model):
        return tensor.device.type
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"
