"""The Python API: lint a model that already exists, from a test or a notebook."""

from __future__ import annotations

import copy
import inspect
import os
from pathlib import Path
from collections.abc import Callable

import torch

from graphlint.capture import Capture, capture_model, inputs_to_meta
from graphlint.capture.build import NeedsRealValues, meta_then_cpu
from graphlint.capture.frames import Frame
from graphlint.capture.isolation import preserved_global_state, seed_everything
from graphlint.engine import load_rules, run_rules
from graphlint.errors import TargetFailure
from graphlint.locate.place import Locator
from graphlint.project import Project
from graphlint.results import Report, RuleInfo, TargetResult
from graphlint.selection import select
from graphlint.session import finish


def lint(model: torch.nn.Module, args=(), kwargs: dict | None = None, loss: Callable | None = None,
         *, device: str = "auto") -> Report:
    """Capture one forward and backward of `model(*args, **kwargs)` and return the findings.

    With `device="auto"` (the default) the capture runs on a copy of the model, so the model, its
    parameters, buffers and `.grad`s are never touched: a meta-device copy (nothing allocated), or, when the
    forward needs real values, a full copy. Only a model that cannot be copied runs as it is, with its
    buffers (BatchNorm statistics) and `.grad`s restored afterwards; `device="model"` always runs it as it
    is. The random state is always restored. An error in the forward propagates as
    `graphlint.errors.TargetFailure`.
    """
    if device not in ("auto", "model"):
        raise ValueError(f"device must be 'auto' or 'model'; got {device!r}")
    if not isinstance(args, (tuple, list)):
        args = (args,)
    project = Project.discover()
    rules = select(project.config, load_rules())  # before the model runs: a wrong selection or a broken plugin says so
    factory = _class_definition(model)
    if factory is not None:
        project.add_first_party(Path(factory.file).parent)
    target = type(model).__name__
    capture = None
    notes = []
    inputs = (tuple(args), dict(kwargs or {}), loss, target, factory)
    if device == "auto":
        def attempt(on: str) -> Capture | None:
            if on == "meta":
                try:
                    return _capture_meta_copy(model, *inputs)
                except (TargetFailure, RuntimeError, TypeError, NotImplementedError, copy.Error) as error:
                    raise NeedsRealValues(f"{type(error).__name__} on the meta device") from error
            try:
                copied = copy.deepcopy(model)
            except (TypeError, RuntimeError, copy.Error, AttributeError):
                notes.append("captured on the model itself: it cannot be copied")
                return None
            with preserved_global_state():
                seed_everything()  # the same draws as a factory target's capture
                return capture_model(copied, *inputs[:3], target=target, factory=factory)

        # The build policy of every target (graphlint.capture.build): a meta copy, else a full copy on CPU.
        capture, _, meta_failure = meta_then_cpu(attempt, "auto", TargetFailure)
        if capture is not None and meta_failure is not None:
            notes.append(f"captured on a full copy of the model: the forward needs real values ({meta_failure})")
    if capture is None:
        capture = _capture_in_place(model, *inputs)
    locator = Locator(project)
    findings, errors = run_rules(rules, capture, locator)
    result = TargetResult(target=capture.target, findings=findings, errors=errors, notes=notes + capture.notes,
                          failures=locator.failures, device=capture.device)
    return finish([result], project, project.config, tuple(RuleInfo.of(r) for r in rules))


def _capture_meta_copy(model, args, kwargs, loss, target, factory) -> Capture:
    """Capture a copy whose parameters and buffers are meta tensors (shapes only)."""
    memo = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = tensor.detach().to("meta")
        memo[id(tensor)] = torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else meta
    copied = copy.deepcopy(model, memo)
    args, kwargs = inputs_to_meta(args, kwargs)
    with preserved_global_state(), torch.device("meta"):
        seed_everything()
        return capture_model(copied, args, kwargs, loss, target=target, device="meta", factory=factory)


def _capture_in_place(model, args, kwargs, loss, target, factory) -> Capture:
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = {name: p.grad for name, p in model.named_parameters()}
    try:
        with preserved_global_state():
            seed_everything()
            return capture_model(model, args, kwargs, loss, target=target, factory=factory)
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])
            for name, parameter in model.named_parameters():
                parameter.grad = grads.get(name)


def _class_definition(model: torch.nn.Module) -> Frame | None:
    """Where the model's class is defined: the place for findings that involve no line of project code."""
    try:
        file = inspect.getsourcefile(type(model))
        _, line = inspect.getsourcelines(type(model))
    except (TypeError, OSError):
        # A class whose module is not in sys.modules (loaded from a path, exec'd): its forward's code says where.
        code = getattr(getattr(type(model), "forward", None), "__code__", None)
        if code is None or code.co_filename.startswith("<") or not os.path.isfile(code.co_filename):
            return None
        return Frame(os.path.abspath(code.co_filename), code.co_firstlineno, type(model).__name__)
    return Frame(os.path.abspath(file), line, type(model).__name__) if file else None
