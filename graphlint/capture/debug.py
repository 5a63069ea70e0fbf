"""Torch's debugging switches that a target turns on: anomaly detection and the autograd profilers.

While a `DebugSwitchWatch` is active (the target's import, its factory and its forward), it wraps the entry
points that switch them on and records the user stack of each call that turned one on. A switch already on when
the watch starts was turned on before graphlint could see it; its line is not known. The wrappers are removed
when the watch ends, so graphlint's own backward runs with what it chooses (`debug_modes_off`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass

import torch
import torch.autograd.profiler
import torch.profiler

from graphlint.capture.frames import Frame, StackRecorder
from graphlint.capture.patches import Patches
from graphlint.errors import call_user_code

ANOMALY = "anomaly detection"
PROFILER = "the autograd profiler"
NVTX = "emit_nvtx"




@dataclass(frozen=True)
class DebugSwitch:
    """A debugging mode of torch's that the target's code switched on before or during the forward."""

    kind: str  # ANOMALY, PROFILER or NVTX
    switched_on_at: tuple[Frame, ...] = ()  # the user stack that switched it on; () when it was on already


def _profilers() -> list[tuple[type, str]]:
    """The context managers whose entry turns a profiler on, with the kind each one is."""
    return [(torch.autograd.profiler.profile, PROFILER), (torch.profiler.profile, PROFILER),
            (torch.autograd.profiler.emit_nvtx, NVTX)]


class DebugSwitchWatch:
    """Records the `DebugSwitch`es turned on while active; it can be entered several times (factory, then forward)
    and keeps what each entry saw in `switches`."""

    def __init__(self, switches: tuple[DebugSwitch, ...] = ()) -> None:
        self.switches: list[DebugSwitch] = list(switches)  # those seen earlier, at the target's import
        self._stacks = StackRecorder()
        self._patches = Patches()

    def _seen(self, kind: str) -> bool:
        return any(switch.kind == kind for switch in self.switches)

    def _record(self, kind: str, caller) -> None:
        stack = self._stacks.user_stack(caller)
        if stack and stack[-1].end_line != stack[-1].line:
            # A `with` statement's position covers its whole body: keep only its first line.
            stack = (*stack[:-1], Frame(stack[-1].file, stack[-1].line, stack[-1].function))
        self.switches.append(DebugSwitch(kind, stack))

    def __enter__(self) -> DebugSwitchWatch:
        self._stacks.boundary = sys._getframe(1)  # graphlint's frame that runs the target's code
        if torch.is_anomaly_enabled() and not self._seen(ANOMALY):
            self.switches.append(DebugSwitch(ANOMALY))
        if torch.autograd.profiler._is_profiler_enabled and not self._seen(PROFILER):
            self.switches.append(DebugSwitch(PROFILER))
        set_anomaly = torch.set_anomaly_enabled

        def watched_set_anomaly(enabled, *args, **kwargs):
            if enabled and not torch.is_anomaly_enabled():
                self._record(ANOMALY, sys._getframe(1))
            return call_user_code(set_anomaly, enabled, *args, **kwargs)

        self._patches.replace(torch, "set_anomaly_enabled", watched_set_anomaly)
        for cls, kind in _profilers():
            self._patches.replace(cls, "__enter__", self._watched_enter(cls.__enter__, kind))
        return self

    def _watched_enter(self, enter, kind: str):
        @functools.wraps(enter)
        def watched_enter(profiler, *args, **kwargs):
            self._record(kind, sys._getframe(1))
            return call_user_code(enter, profiler, *args, **kwargs)

        return watched_enter

    def __exit__(self, *exc) -> None:
        self._patches.restore()


@contextlib.contextmanager
def watched_import():
    """Watch a target's import; anomaly detection is then set back as it was, so that an import cannot leave
    it on for graphlint's later work or the next target (the capture's watch starts from what this one saw)."""
    anomaly = torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
    try:
        with DebugSwitchWatch() as watch:
            yield watch
    finally:
        torch.set_anomaly_enabled(*anomaly)


@contextlib.contextmanager
def debug_modes_off():
    """Anomaly detection off for graphlint's own backward: its checks read values, which meta tensors lack."""
    with torch.autograd.set_detect_anomaly(False):
        yield
