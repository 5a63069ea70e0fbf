"""Errors that end as one clear line for the user (exit code 2), never as a traceback."""

from __future__ import annotations

import os
import re
import traceback

from graphlint.files import (display_path, is_graphlint_file, is_hidden_file, is_installed_file,
                             is_torch_or_standard_library_file)


class GraphlintError(Exception):
    """A problem the user can fix; its message is the whole line shown to them."""


class UsageError(GraphlintError):
    """Bad command line or configuration."""


class TargetFailure(GraphlintError):
    """A target that cannot be linted: it does not load, its factory raises, its forward raises..."""


def single_line(text: str) -> str:
    """Text made one line, for messages that quote user input (a key, a path, an exception's message)."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) if "\n" in text or "\r" in text else text


# A target file outside any package is imported under a private module name (graphlint.target), which Python's
# own messages then name (`_graphlint_target_model_0123456789.GPT() got multiple values for ...`); the user knows
# that module by its file's stem.
PRIVATE_MODULE_PREFIX = "_graphlint_target_"
_PRIVATE_MODULE = re.compile(rf"\b{PRIVATE_MODULE_PREFIX}(\w+?)_[0-9a-f]{{10}}\b")


def one_line(error: BaseException) -> str:
    """An exception as `Type: first line of its message`."""
    lines = _PRIVATE_MODULE.sub(r"\1", str(error)).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def raised_at(error: BaseException) -> str:
    """` (at file:line)` for the innermost frame of user code in an exception's traceback; when that frame is in
    an installed library, ` (at project_file:line, in library_file:line)`: the project's own call is the line to
    change."""
    frames = _user_frames(error)
    if not frames:
        return ""
    (path, line), project = frames[-1], _project_frame(frames)
    if project is not None and project != frames[-1]:
        return f" (at {display_path(project[0])}:{project[1]}, in {display_path(path)}:{line})"
    return f" (at {display_path(path)}:{line})"


def raised_where(error: BaseException) -> tuple[str, int] | None:
    """(absolute file, line) of the innermost frame of the project's code in an exception's traceback (of any
    user code, libraries included, when the project's own is not in it); for a syntax error, the line that
    does not parse."""
    frames = _user_frames(error)
    return (_project_frame(frames) or frames[-1]) if frames else None


def _user_frames(error: BaseException) -> list[tuple[str, int]]:
    """(absolute file, line) of every frame of user code (the project's and libraries') in the traceback,
    outermost first."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return [(os.path.abspath(error.filename), error.lineno)]
    frames = [(os.path.abspath(f.filename), f.lineno) for f in traceback.extract_tb(error.__traceback__)
              if not is_hidden_file(os.path.abspath(f.filename))]
    if not frames or frames[-1][1] is None:
        return []
    return [(path, line) for path, line in frames if line is not None]


def _project_frame(frames: list[tuple[str, int]]) -> tuple[str, int] | None:
    return next((frame for frame in reversed(frames) if not is_installed_file(frame[0])), None)


def failure_where(error: GraphlintError) -> tuple[str | None, int | None]:
    """(file, line) where a target's failure happened, when the exception it was raised from shows it."""
    cause = error.__cause__
    where = raised_where(cause) if cause is not None else None
    return where if where is not None else (None, None)


class MetaCannotRun(Exception):
    """Raised by a factory built on the meta device when the model must run on real tensors to be what the test ran
    (CPU autocast, which meta tensors ignore): the capture builds it again on CPU, with this message as the note."""


def call_user_code(function, /, *args, **kwargs):
    """Run the user's code, or a torch op the user called, from inside graphlint's own code (the recorder,
    the module-construction wrapper): an exception raised in there is the user's, not graphlint's."""
    return function(*args, **kwargs)


def raised_by_graphlint(error: BaseException) -> bool:
    """Whether graphlint's own code raised `error` rather than the user's (or a library they called): the
    innermost frame outside torch and the standard library is graphlint's, and not one of its calls into the
    user's code."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    for code in reversed(frames):
        path = os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename
        if is_torch_or_standard_library_file(path):
            continue
        return is_graphlint_file(path) and code is not call_user_code.__code__
    return False

