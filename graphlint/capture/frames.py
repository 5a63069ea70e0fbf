"""The user's call stack at the moment an op runs, without torch's, the standard library's or graphlint's frames.

A `Frame` keeps the position of the instruction that was running (Python 3.11+ `co_positions`): for a frame
that called `torch.matmul`, that is the span of the `torch.matmul(...)` expression itself, which the locate step
turns into an exact libcst span.
"""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import types
from importlib.util import find_spec
from typing import NamedTuple

from graphlint.files import is_hidden_file


class Frame(NamedTuple):
    """One frame of user or library code. `col`/`end_col` are UTF-8 byte offsets in their lines (what CPython
    records); they are None where Python does not record positions (3.10)."""

    file: str
    line: int
    function: str
    col: int | None = None
    end_line: int | None = None
    end_col: int | None = None


_HAS_POSITIONS = sys.version_info >= (3, 11)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch_spec.origin)) + os.sep if (torch_spec := find_spec("torch")) else "\0"
# Torch code whose calls are not a helper's: module forwards (read through the module stack), the autograd
# machinery, the grad-mode decorators and the function-mode plumbing.
_TORCH_HIDDEN_CALLERS = tuple(_TORCH_DIR + os.path.join(*part.split("/")) for part in (
    "nn/modules/", "autograd/", "utils/_contextlib.py", "overrides.py", "_tensor.py", "utils/checkpoint.py",
    "utils/_device.py", "_ops.py", "_prims", "_refs", "_decomp", "_meta_registrations.py", "fx/",
))


class StackRecorder:
    """Reads user frames from the live interpreter stack, stopping at a boundary frame (graphlint's own caller
    of the model), with per-code-object caches so that each op costs a short walk.

    The caches are keyed by the code object's identity: code objects compare equal across files (equality
    ignores `co_filename`), so two files holding the same function at the same lines must not share an entry.
    Each entry keeps its code object alive, so that an identity is never reused while it is cached."""

    def __init__(self) -> None:
        self._files: dict[int, tuple[types.CodeType, str | None]] = {}  # absolute file name, None when hidden
        self._positions: dict[int, tuple[types.CodeType, list]] = {}
        self._helpers: dict[int, tuple[types.CodeType, bool]] = {}  # whether the code is a torch helper's
        self.boundary: types.FrameType | None = None

    def _file_of(self, code: types.CodeType) -> str | None:
        entry = self._files.get(id(code))
        if entry is None:
            name = code.co_filename
            entry = self._files[id(code)] = (code, None if is_hidden_file(name) else os.path.abspath(name))
        return entry[1]

    def frame_of(self, f: types.FrameType) -> Frame:
        code = f.f_code
        file = self._file_of(code) or os.path.abspath(code.co_filename)
        line = f.f_lineno
        if _HAS_POSITIONS:
            entry = self._positions.get(id(code))
            if entry is None:
                entry = self._positions[id(code)] = (code, list(code.co_positions()))
            positions = entry[1]
            index = f.f_lasti // 2
            if 0 <= index < len(positions):
                start, end, col, end_col = positions[index]
                if start is not None and col is not None and end is not None and end_col is not None:
                    return Frame(file, start, code.co_name, col, end, end_col)
        return Frame(file, line or code.co_firstlineno, code.co_name)

    def torch_helper(self, caller: types.FrameType | None) -> tuple[Frame, Frame] | None:
        """When an op was called by torch's own Python code other than a module's forward (a helper the user
        called, such as `torch.nn.utils.rnn.pad_packed_sequence`): the outermost torch frame (the helper the
        user called) and the innermost (the line that made the call); None otherwise."""
        if caller is None or not self._is_helper_code(caller.f_code):
            return None
        inner = outer = caller
        frame = caller.f_back
        while frame is not None and frame is not self.boundary and self._is_helper_code(frame.f_code):
            outer, frame = frame, frame.f_back
        return self._plain(outer), self._plain(inner)

    def _is_helper_code(self, code: types.CodeType) -> bool:
        entry = self._helpers.get(id(code))
        if entry is None:
            name = code.co_filename
            helper = name.startswith(_TORCH_DIR) and not name.startswith(_TORCH_HIDDEN_CALLERS)
            entry = self._helpers[id(code)] = (code, helper)
        return entry[1]

    @staticmethod
    def _plain(frame: types.FrameType) -> Frame:
        """The frame with its function's qualified name (`Normal.__init__`)."""
        code = frame.f_code
        return Frame(os.path.abspath(code.co_filename), frame.f_lineno, getattr(code, "co_qualname", None) or
                     _method_name(frame))

    def decorator_of(self, function, names: tuple[str, ...]) -> Frame | None:
        """The line of the decorator that mentions one of `names` on a user function (the first decorator's
        line when none does), as a frame of that function; None for a function in a hidden file."""
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is None or self._file_of(code) is None:
            return None
        file = code.co_filename
        line = code.co_firstlineno  # with decorators, the first decorator's line
        for number in range(line, line + 20):
            text = linecache.getline(file, number).strip()
            if not text.startswith("@"):
                break  # the `def` line, or a file that cannot be read
            if any(name in text for name in names):
                line = number
                break
        return Frame(self._file_of(code), line, code.co_name)

    def user_stack(self, start: types.FrameType | None) -> tuple[Frame, ...]:
        """The visible frames from `start` out to the boundary (excluded), outermost first."""
        frames = []
        f = start
        boundary = self.boundary
        while f is not None and f is not boundary:
            if self._file_of(f.f_code) is not None:
                frames.append(self.frame_of(f))
            f = f.f_back
        frames.reverse()
        return tuple(frames)


def _method_name(frame: types.FrameType) -> str:
    """`Class.method` for a method's frame, found through `self` (Python 3.10 has no `co_qualname`)."""
    code = frame.f_code
    owner = frame.f_locals.get("self") if code.co_argcount else None
    for cls in type(owner).__mro__ if owner is not None else ():
        if getattr(cls.__dict__.get(code.co_name), "__code__", None) is code:
            return f"{cls.__name__}.{code.co_name}"
    return code.co_name


def format_stack(frames: tuple[Frame, ...]) -> str:
    """The frames in the `File "...", line N, in fn` form that torch.fx uses for `Node.stack_trace`."""
    return "".join(f'  File "{f.file}", line {f.line}, in {f.function}\n' for f in frames)
