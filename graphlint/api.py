"""The Python API: lint a model that already exists, from a test or a notebook."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Callable

import torch

from graphlint.capture import capture_model
from graphlint.capture.frames import Frame
from graphlint.capture.isolation import preserved_global_state
from graphlint.engine import load_rules, run_rules
from graphlint.locate.place import Locator
from graphlint.project import Project
from graphlint.policy import apply_policy
from graphlint.results import Report, RuleInfo, TargetResult
from graphlint.selection import select


def lint(model: torch.nn.Module, args=(), kwargs: dict | None = None, loss: Callable | None = None) -> Report:
    """Capture one forward and backward of `model(*args, **kwargs)` and return the findings.

    The model runs where it is (its own device and mode). Its parameters' `.grad`s and its buffers (BatchNorm
    statistics) are left as they were; errors in the forward propagate as exceptions.
    """
    if not isinstance(args, (tuple, list)):
        args = (args,)
    project = Project.discover()
    factory = _class_definition(model)
    if factory is not None:
        project.add_first_party(Path(factory.file).parent)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with preserved_global_state():
            capture = capture_model(model, tuple(args), dict(kwargs or {}), loss, target=type(model).__name__,
                                    factory=factory)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    rules = select(project.config, load_rules())
    findings, errors = run_rules(rules, capture, Locator(project))
    result = TargetResult(target=capture.target, findings=findings, errors=errors, notes=list(capture.notes),
                          device=capture.device)
    report = Report(results=[result], project_root=str(project.root), rules=tuple(RuleInfo.of(r) for r in rules),
                    fail_on=project.config.fail_on)
    apply_policy(report, project.config, project)
    return report


def _class_definition(model: torch.nn.Module) -> Frame | None:
    """Where the model's class is defined: the place for findings that involve no line of project code."""
    try:
        file = inspect.getsourcefile(type(model))
        _, line = inspect.getsourcelines(type(model))
    except (TypeError, OSError):
        return None
    return Frame(os.path.abspath(file), line, type(model).__name__) if file else None
