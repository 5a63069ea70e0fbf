"""The capture of a factory's target under the build policy (graphlint.capture.build): on the meta device first,
rebuilt on CPU when the forward needs real values, saying why in a note.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from graphlint.capture.build import NeedsRealValues, build, meta_then_cpu
from graphlint.capture.contract import Capture
from graphlint.capture.debug import DebugSwitchWatch, watched_import
from graphlint.capture.frames import Frame, StackRecorder
from graphlint.capture.isolation import preserved_global_state, seed_everything
from graphlint.capture.modules import BuildSiteRecorder
from graphlint.capture.session import ForwardFailure, capture_model
from graphlint.errors import TargetFailure
from graphlint.files import display_path
from graphlint.stages import reached
from graphlint.target import LoadedTarget, Target, TargetSpec, load_factory


def load_target(spec: TargetSpec, pythonpath: tuple[Path, ...] | list[Path] = ()) -> LoadedTarget:
    """The target's factory, with the debugging switches its module's import turned on (GL108 reads them)."""
    return load_factory(spec, pythonpath, watch=watched_import)


def capture_target(loaded: LoadedTarget, device: str = "auto", vary_inputs: Callable | None = None,
                   after: Callable[[Target, str], Any] | None = None,
                   captured: Callable[[Capture], None] | None = None) -> Capture:
    """Build the target and capture it; with `auto`, on meta first and on CPU when meta cannot run it (the build
    policy, graphlint.capture.build). `vary_inputs` rewrites the factory's (args, kwargs) before the forward (the
    graph report's --vary). `after(target, device)`, when given, runs once the capture has succeeded (the
    recorders have exited), on the same model and device; what it returns becomes `Capture.compiled`.
    `captured(capture)`, when given, is told the capture just before `after` runs."""
    capture, _, meta_failure = meta_then_cpu(
        lambda on: _capture_on(loaded, on, vary_inputs, after, captured), device,
        lambda failure: TargetFailure(f"cannot capture on the meta device: {failure}; "
                                      "use --device auto (the default) or --device cpu"))
    if meta_failure is not None:
        capture.notes.insert(0, f"captured on CPU because {meta_failure}")
    return capture


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
                after: Callable[[Target, str], Any] | None = None,
                captured: Callable[[Capture], None] | None = None) -> Capture:
    if device == "cuda" and not torch.cuda.is_available():
        raise TargetFailure("--device cuda was asked for but CUDA is not available here; use --device cpu or meta")
    with preserved_global_state():
        seed_everything()  # the same inputs, dropout masks and Python draws on every run
        stacks = StackRecorder()
        build_sites = BuildSiteRecorder(stacks)
        stacks.boundary = sys._getframe()
        reached("factory")
        debug = DebugSwitchWatch(loaded.import_switches)
        made = build(loaded.factory, device, within=(build_sites, debug))
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
            raise NeedsRealValues(_why_meta_failed(failure)) from failure
        if captured is not None:
            captured(capture)
        if after is not None:
            capture.compiled = after(made, device)
        return capture


def _why_meta_failed(failure: ForwardFailure) -> str:
    if failure.failed_op is not None and failure.failed_op[0] in _REAL_VALUE_OPS:
        op, stack = failure.failed_op
        where = f" at {display_path(stack[-1].file)}:{stack[-1].line}" if stack else ""
        return f"the forward needs real values ({_REAL_VALUE_OPS[op]}{where})"
    return f"the forward failed on the meta device ({failure})"


def _definition(loaded: LoadedTarget) -> Frame:
    """The factory's `def` line: where a finding goes when no frame of the project's own code is involved."""
    try:
        code = inspect.unwrap(loaded.factory).__code__
        return Frame(os.path.abspath(code.co_filename), code.co_firstlineno, code.co_name)
    except AttributeError:  # a callable object or a builtin: point at the target file
        return Frame(str(loaded.spec.file or loaded.spec.search_root), 1, loaded.spec.name)


