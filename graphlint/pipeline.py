"""The pipeline for one target, top to bottom: target → capture → rules → locate.

`graphlint.run` calls it for the targets the cache cannot answer, in this process or, with `-j N` or
`--timeout`, one worker process per target. A target that fails becomes one error line in its result, never
an exception, and the other targets go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from collections.abc import Callable, Iterator

from graphlint.capture import Capture, capture_target
from graphlint.config import Config
from graphlint.engine import run_rules
from graphlint.errors import GraphlintError, TargetTimeout, one_line
from graphlint.libraries import loaded_libraries
from graphlint.locate.place import Locator
from graphlint.results import TargetError, TargetResult
from graphlint.target import TargetSpec, load_factory


def lint_target(text: str, base: Path, locator: Locator, rules: tuple, device: str, debug: bool = False,
                timeout: float | None = None) -> TargetResult:
    try:
        with time_limit(timeout):
            result, capture = capture_one(text, base, locator, device, debug)
            if capture is not None:
                result.findings, errors = run_rules(rules, capture, locator, debug)
                result.errors.extend(errors)
    except TargetTimeout:
        return _failed(text, _timed_out(timeout))
    return result


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise TargetTimeout in this thread after `seconds`, with SIGALRM: it interrupts Python code (a forward
    that loops), not a call stuck inside C, which only -j's worker processes can stop. A no-op without
    SIGALRM (Windows) or outside the main thread."""
    usable = seconds and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TargetTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _timed_out(seconds: float | None) -> str:
    return (f"did not finish within {seconds:g} s (--timeout); its forward may never return, "
            "or raise --timeout (0 for no limit)")


def capture_one(text: str, base: Path, locator: Locator, device: str, debug: bool = False,
                vary_inputs=None) -> tuple[TargetResult, Capture | None]:
    """Load and capture one target; a failure is an error in the result (and no capture), never an exception."""
    result = TargetResult(target=text)
    try:
        spec = TargetSpec.parse(text, base)
        if spec.file is not None:
            locator.project.add_first_party(spec.file.parent)
        # The target's folder stays importable through the capture: forwards may import lazily.
        # The user's prints go to stderr so that stdout carries only graphlint's report.
        with _importable(spec.import_folder), contextlib.redirect_stdout(sys.stderr):
            capture = capture_target(load_factory(spec), device, vary_inputs)
    except GraphlintError as error:
        result.errors.append(TargetError(text, str(error)))
        return result, None
    except Exception as error:  # a bug in graphlint: still one line, and the other targets go on
        if debug:
            traceback.print_exc()
        result.errors.append(TargetError(text, f"internal error in graphlint while capturing ({one_line(error)}); "
                                               "please report it with the output of --debug"))
        return result, None
    project = locator.project
    result.device = capture.device
    result.notes = list(capture.notes)
    result.files = tuple(sorted(f for f in capture.source_files if project.is_first_party(f)))
    # Modules' real source files only: torch registers modules with made-up relative names (`_ops.py`).
    imported = {m.__file__ for m in list(sys.modules.values())
                if isinstance(getattr(m, "__file__", None), str) and os.path.isabs(m.__file__)
                and os.path.isfile(m.__file__)}
    extra = {str(spec.file)} if spec.file is not None else set()
    result.libraries, local_library_files = loaded_libraries()
    result.inputs = tuple(sorted({f for f in imported if project.is_first_party(f)} | set(result.files) | extra
                                 | set(local_library_files)))
    return result, capture


@contextlib.contextmanager
def _importable(folder: Path):
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path[:] = saved


def lint_in_processes(
    targets: list[str], base: Path, project, config: Config, rules: tuple[str, ...], jobs: int,
    timeout: float | None, debug: bool = False, progress: Callable | None = None,
) -> Iterator[tuple[str, TargetResult]]:
    """Each target in its own worker process, at most `jobs` at a time; results as they finish."""
    from graphlint.worker import request

    waiting = list(targets)
    running: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="graphlint-") as scratch:
        folder = Path(scratch)
        while waiting or running:
            while waiting and len(running) < max(jobs, 1):
                text = waiting.pop(0)
                number = len(targets) - len(waiting)
                request_file, result_file = folder / f"{number}.request.json", folder / f"{number}.result.json"
                request_file.write_text(json.dumps(request(text, base, project, config, rules, debug)), encoding="utf-8")
                process = subprocess.Popen([sys.executable, "-m", "graphlint.worker", str(request_file), str(result_file)],
                                           stdout=sys.stderr)
                running[text] = (process, time.monotonic(), result_file)
                if progress:
                    progress(text, "started")
            for text, (process, started, result_file) in list(running.items()):
                elapsed = time.monotonic() - started
                if process.poll() is None and timeout is not None and elapsed > timeout:
                    process.kill()
                    process.wait()
                    del running[text]
                    yield text, _failed(text, _timed_out(timeout))
                elif process.poll() is not None:
                    del running[text]
                    yield text, _read_result(text, process.returncode, result_file)
            time.sleep(0.02)


def _read_result(text: str, returncode: int, path: Path) -> TargetResult:
    from graphlint.cache import result_from_dict

    try:
        return result_from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        return _failed(text, f"the capture process crashed ({how}) before reporting; run this target alone "
                             "with --debug to see why")


def _failed(text: str, message: str) -> TargetResult:
    return TargetResult(target=text, errors=[TargetError(text, message)])

