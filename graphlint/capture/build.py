"""The build policy, one for everything that runs a target: on the meta device first (no parameter memory, a cost
independent of tensor sizes), then on CPU when the meta device cannot run it, with the reason kept for a note.

The capture (graphlint.capture.device), the training step's measurement (graphlint.memory.measure) and the
Python API (graphlint.api) each hand `meta_then_cpu` one attempt that raises `NeedsRealValues` where the meta
device cannot run it; the first two build the target with `build`, which says which failures those are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import torch

from graphlint.errors import MetaCannotRun, TargetFailure, call_user_code, one_line, raised_at, raised_by_graphlint
from graphlint.target import Target, normalize_factory_result

T = TypeVar("T")


class NeedsRealValues(Exception):
    """An attempt on the meta device failed; the message says why, for the note after the CPU run. `at_size`: the
    failure said as the target's own, for a run at sizes other than the factory's (the memory search)."""

    def __init__(self, message: str, at_size: str = "") -> None:
        super().__init__(message)
        self.at_size = at_size or message


def meta_then_cpu(attempt: Callable[[str], T], device: str,
                  refused: Callable[[NeedsRealValues], Exception]) -> tuple[T, str, NeedsRealValues | None]:
    """(what `attempt(device)` returned, the device it ran on, why not on meta or None). With `device` "auto":
    on meta, then on CPU when meta cannot run it; on a device chosen by the user, a `NeedsRealValues` becomes
    the exception `refused(failure)` makes (a one-line error that says to choose another device)."""
    if device != "auto":
        try:
            return attempt(device), device, None
        except NeedsRealValues as failure:
            raise refused(failure) from failure
    try:
        return attempt("meta"), "meta", None
    except NeedsRealValues as failure:
        why = failure
    # The CPU run comes after the handler: an exception raised while another is handled is normalized at once,
    # and Python 3.11 then reports `f(x=1, **{"x": 2})` as KeyError: 'x' instead of its TypeError.
    return attempt("cpu"), "cpu", why


def build(factory: Callable, device: str, within: tuple[AbstractContextManager, ...] = ()) -> Target:
    """Call the target's factory with `device` as the default device, inside the `within` context managers (the
    capture's recorders); on meta, tensors the factory pinned elsewhere (loaded data, `device="cpu"`) join the
    model. A failure is `NeedsRealValues` on meta, the target's `TargetFailure` elsewhere; graphlint's own
    errors propagate as they are."""
    try:
        with torch.device(device), contextlib.ExitStack() as stack:
            for manager in within:
                stack.enter_context(manager)
            made = normalize_factory_result(call_user_code(factory))
    except TargetFailure:
        raise
    except MetaCannotRun as error:
        if device == "meta":
            raise NeedsRealValues(str(error)) from error
        raise TargetFailure(str(error)) from error
    except Exception as error:
        if raised_by_graphlint(error):
            raise  # no CPU retry for graphlint's own bug
        if device == "meta":
            raise NeedsRealValues(f"the factory failed on the meta device ({one_line(error)})") from error
        raise TargetFailure(f"the factory raised {one_line(error)}{raised_at(error)}") from error
    if device == "meta":
        move_to_meta(made)
    return made


def move_to_meta(made: Target) -> None:
    """Tensors the factory pinned to another device join the meta model."""
    from graphlint.capture.session import model_tensors

    if any(t.device.type != "meta" for t in model_tensors(made.model)):
        made.model.to("meta")
    made.args, made.kwargs = inputs_to_meta(made.args, made.kwargs)


def inputs_to_meta(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A forward's inputs with every tensor in them (nested in lists, dicts...) moved to the meta device."""
    return (tuple(torch.utils._pytree.tree_map(_to_meta, list(args))),
            torch.utils._pytree.tree_map(_to_meta, kwargs))


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return value.to("meta")
    return value
