"""The capture session: one forward and one backward of a built model, with every recorder attached.

The recorders (graphlint.capture.forward, .autograd, .modules, .debug) are entered together and left
together; what they patch in torch goes through graphlint.capture.patches, so whatever the model raises,
nothing of graphlint's stays installed in torch.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch

from graphlint.capture.autograd import AutogradGraph, SavedTensorRecorder, run_backward, walk_autograd_graph
from graphlint.capture.contract import Capture, ParameterInfo
from graphlint.capture.debug import DebugSwitchWatch, debug_modes_off
from graphlint.capture.isolation import python_draws, python_states
from graphlint.capture.forward import ForwardRecorder, kept_tensors, recorded_ops, storage_key
from graphlint.capture.frames import Frame, StackRecorder
from graphlint.capture.loss import choose_loss
from graphlint.capture.modules import BuildSiteRecorder, ModuleCallTracker, describe_modules
from graphlint.capture.patches import compiled_code_eager
from graphlint.errors import TargetFailure, call_user_code, one_line, raised_at, raised_by_graphlint
from graphlint.stages import reached


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
    recorder = ForwardRecorder(stacks, tracker, names, saved.count, functools.partial(kept_tensors, model, args, kwargs))
    recorder.add_inputs(args, kwargs)
    stacks.boundary = sys._getframe()  # frames from here outwards (graphlint, the CLI, pytest) are not the user's
    debug = debug or DebugSwitchWatch()
    generators = python_states()
    try:
        reached("forward")
        with compiled_code_eager(), torch.enable_grad(), debug, saved, tracker, recorder:
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
    drawn = python_draws(generators)
    ops = recorded_ops(recorder.graph)
    autograd = AutogradGraph()
    if loss is not None:
        reached("backward")
        weights = frozenset(storage_key(t) for t in (*parameters.values(), *model.buffers()))
        autograd = walk_autograd_graph(loss, saved, names, ops, weights)
        with debug_modes_off(), compiled_code_eager():
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
        python_draws=drawn,
    )


class ForwardFailure(TargetFailure):
    """The forward (or the loss) raised; `failed_op` is the torch call that raised and its user stack."""

    def __init__(self, message: str, failed_op: tuple[str, tuple[Frame, ...]] | None = None) -> None:
        super().__init__(message)
        self.failed_op = failed_op


def model_tensors(model: torch.nn.Module):
    """The model's parameters, then its buffers."""
    yield from model.parameters()
    yield from model.buffers()


def _device_of(model: torch.nn.Module, args: tuple) -> str:
    for tensor in model_tensors(model):
        return tensor.device.type
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"
