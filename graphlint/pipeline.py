"""The pipeline for one target, top to bottom: target → capture → rules → locate.

The run (graphlint.run) calls it in a child process per target, for `graphlint check` and `graphlint graph`;
tests call it directly.
A target that fails becomes one error line in its result, never an exception, except for the user's code
leaving the process (`SystemExit`, `KeyboardInterrupt`), which the caller decides about.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from graphlint.capture import Capture, capture_target, load_target
from graphlint.capture.isolation import seed_everything, torch_defaults
from graphlint.engine import run_rules
from graphlint.errors import GraphlintError, failure_where, one_line
from graphlint.libraries import module_files_and_libraries
from graphlint.locate.place import Locator
from graphlint.results import TargetError, TargetResult
from graphlint.stages import last as last_stage, reached
from graphlint.tags import BUDGET_TAG, COMPILE_TAG, LONGER_TAG, RECOMPILE_TAG
from graphlint.target import TargetSpec, add_target_folders, importable


def lint_target(text: str, base: Path, locator: Locator, rules: tuple, device: str, debug: bool = False,
                vary: tuple[str, ...] = ("batch",), memory_budget: int | None = None,
                compile_memo: str = "", early: Callable[[TargetResult], None] | None = None,
                cost_gpu: str | None = None, cost_cpu_threads: int | None = None) -> TargetResult:
    """Lint one target; `vary` names the input dimensions (batch, seq) the torch.compile analysis grows,
    `memory_budget` the bytes a training step may peak at (GL401), `compile_memo` the folder where torch.compile
    analyses are kept across runs ("": none). `early(result)`, when given and a rule that needs the torch.compile
    analysis runs, is handed the other rules' result before that analysis starts (see `_early_result`); what
    this returns is the same with or without it. `cost_gpu`, a GPU of graphlint.timing.devices, prices the
    performance findings' time per step on it (graphlint.costs); `cost_cpu_threads`, on this machine's CPU with
    that many threads instead (as `graphlint time --cpu`); neither: findings carry no cost."""
    after = None
    measured = []
    kept_for_longer = []
    captured = []
    if any(COMPILE_TAG in rule.tags for rule in rules):
        from graphlint.capture.compile import analyse_target
        from graphlint.capture.compile_memo import CompileMemo

        # Only recompiles need more than one call (graph breaks show on the first).
        recompiles = any(RECOMPILE_TAG in rule.tags for rule in rules)
        after = functools.partial(analyse_target, vary=vary if recompiles else None,
                                  memo=CompileMemo(compile_memo) if compile_memo else None)
        others = tuple(rule for rule in rules if COMPILE_TAG not in rule.tags)
        if early is not None and others:
            analyse = after

            def after(made, on):
                # Innermost: the memory step has run, the compile analysis has not.
                try:
                    early(_early_result(text, captured[-1], others, locator, debug, measured, made))
                except Exception:  # the complete result still comes; a missing early one costs nothing else
                    if debug:
                        traceback.print_exc()
                return analyse(made, on)
    if memory_budget is not None and any(BUDGET_TAG in rule.tags for rule in rules):
        from graphlint.memory.measure import step_estimate

        compile_after = after

        def after(made, on):
            # The step runs on the captured model once the capture is done, before the compile analysis.
            try:
                measured.append(step_estimate(made, on, memory_budget))
            except Exception as error:  # the capture stands; GL401 cannot judge, and the note says why
                if debug:
                    traceback.print_exc()
                measured.append(f"the training step's memory was not measured: it raised {one_line(error)}")
            return compile_after(made, on) if compile_after is not None else None
    if any(LONGER_TAG in rule.tags for rule in rules):
        before_longer = after

        def after(made, on):
            kept_for_longer.append(made)  # run again below only if some parameter got no gradient
            return before_longer(made, on) if before_longer is not None else None
    result, capture = capture_one(text, base, locator, device, debug, after=after, captured=captured.append)
    if capture is not None and kept_for_longer and _some_without_gradient(capture):
        from graphlint.capture.longer import gradients_at_longer_sequence

        capture.longer_sequence = gradients_at_longer_sequence(kept_for_longer[0])
    if capture is not None and measured:
        if isinstance(measured[0], str):
            result.notes.append(measured[0])
        else:
            capture.memory = measured[0]
    if capture is not None:
        reached("rules")
        failed_before = len(locator.failures)
        result.findings, errors = run_rules(rules, capture, locator, debug)
        result.errors.extend(errors)
        result.failures.extend(locator.failures[failed_before:])
        if cost_gpu is not None or cost_cpu_threads is not None:
            result.findings = _priced(result, text, base, locator, device, cost_gpu, cost_cpu_threads, debug)
    return result


def _priced(result: TargetResult, text: str, base: Path, locator: Locator, device: str, gpu: str | None,
            cpu_threads: int | None, debug: bool) -> list:
    """The findings with their cost on `gpu`, or on this CPU with `cpu_threads` threads: the training step
    `graphlint time` prices (meant for CUDA on a GPU, for the CPU on it), run only when a finding of a priced rule
    is there to cost; a step that fails leaves them without, and a note says why."""
    from graphlint.costs import COSTED, step_lines, with_costs

    if not any(f.rule_id in COSTED for f in result.findings):
        return result.findings
    reached("cost")
    from graphlint.memory.measure import Request
    from graphlint.timing.devices import CpuPeaks, accelerator, cpu_peaks
    from graphlint.timing.measure import time_step

    priced_on = accelerator(gpu) if gpu is not None else cpu_peaks(cpu_threads)
    request = Request(device=device, train_on="cuda" if gpu is not None else "cpu")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            step, records = time_step(text, base, request, priced_on, locator.project.pythonpath)
    except Exception as error:  # the findings stand; only their cost is missing
        if debug:
            traceback.print_exc()
        result.notes.append(f"the findings' cost on {priced_on.label} was not estimated: the training step "
                            f"raised {one_line(error)}")
        return result.findings
    if isinstance(priced_on, CpuPeaks):
        result.notes.extend(priced_on.notes())
    return with_costs(result.findings, step_lines(records, priced_on, step))


def _early_result(text: str, capture: Capture, rules: tuple, locator: Locator, debug: bool, measured: list,
                  made) -> TargetResult:
    """The findings of `rules` (none of which needs the torch.compile analysis) on the capture, with what they read
    besides it (the training step's memory, the step at a longer sequence), as `lint_target` gives them after the
    analysis. Only for showing ahead: the complete result runs every rule again once the analysis is done."""
    result = TargetResult(target=text, device=capture.device, notes=list(capture.notes))
    if measured:
        if isinstance(measured[0], str):
            result.notes.append(measured[0])
        else:
            capture.memory = measured[0]
    if any(LONGER_TAG in rule.tags for rule in rules) and _some_without_gradient(capture):
        from graphlint.capture.longer import gradients_at_longer_sequence

        capture.longer_sequence = gradients_at_longer_sequence(made)
    failed_before = len(locator.failures)
    result.findings, errors = run_rules(rules, capture, locator, debug)
    result.errors.extend(errors)
    result.failures.extend(locator.failures[failed_before:])
    return result


def _some_without_gradient(capture) -> bool:
    """Whether the backward ran and left a trainable parameter without a gradient: the only case where a step at
    a longer sequence has something to tell."""
    backward = capture.autograd.backward
    return backward.ran and backward.error is None and any(
        info.requires_grad and name not in backward.reached for name, info in capture.parameters.items())


def capture_one(text: str, base: Path, locator: Locator, device: str, debug: bool = False,
                vary_inputs=None, after=None, captured=None) -> tuple[TargetResult, Capture | None]:
    """Load and capture one target; a failure is an error in the result (and no capture), never an exception.
    `after` runs on the captured model (the torch.compile analysis), `captured` is told the capture before it;
    see graphlint.capture.capture_target."""
    result = TargetResult(target=text)
    try:
        reached("import")
        torch_defaults()  # before the user's module, which may set its own
        seed_everything()  # a module that draws at import time draws the same on every run
        spec = TargetSpec.parse(text, base)
        if spec.file is not None:
            add_target_folders(locator.project, spec)
        pythonpath = locator.project.pythonpath
        # The target's folders stay importable through the capture: forwards may import lazily.
        # The user's prints go to stderr so that stdout carries only graphlint's report.
        with importable(spec, pythonpath), contextlib.redirect_stdout(sys.stderr):
            capture = capture_target(load_target(spec, pythonpath), device, vary_inputs, after, captured)
    except GraphlintError as error:
        path, line = failure_where(error)
        result.errors.append(TargetError(text, str(error), path, line, last_stage()))
        return result, None
    except Exception as error:  # a bug in graphlint: still one line, and the other targets go on
        if debug:
            traceback.print_exc()
        result.errors.append(TargetError(text, f"internal error in graphlint while capturing ({one_line(error)}); "
                                               "please report it with the output of --debug", stage=last_stage()))
        return result, None
    project = locator.project
    result.device = capture.device
    result.notes = list(capture.notes)
    if capture.compiled is not None:
        result.notes.extend(compile_notes(capture.compiled, project))
    result.files = tuple(sorted(f for f in capture.source_files if project.is_first_party(f)))
    result.inputs, result.libraries = depends_on(project, spec, result.files)
    return result, capture


def depends_on(project, spec: TargetSpec, ran: tuple[str, ...] = ()) -> tuple[tuple[str, ...], dict[str, str]]:
    """What a target's result depends on, once this process has run it, for the result cache: the files (the
    project's files it ran or imported, the target's file, those of libraries installed from a local path) and
    the installed distributions it loaded, with their versions."""
    # The project's files are found by their names first and only those are looked up on disk: a target's process
    # has thousands of modules, and a stat of each cost about 20 ms a target.
    files, libraries, local_library_files = module_files_and_libraries()
    own = {file for file in project.first_party_files(files) if os.path.isfile(file)}
    extra = {str(spec.file)} if spec.file is not None else set()
    inputs = tuple(sorted(own | set(ran) | extra | set(local_library_files)))
    return inputs, libraries


def compile_notes(compiled, project) -> list[str]:
    """What the torch.compile analysis could not say at the user's lines: why it did not run, calls that failed
    under torch.compile, calls left out because the model refuses them uncompiled, and graph breaks whose frames
    are all in libraries (not the user's to fix)."""
    from graphlint.files import display_path

    if compiled.unavailable:
        return [f"GL301/GL302 did not run: {compiled.unavailable}"]
    notes = [f"torch.compile analysis: the call with {call}" for call in compiled.calls if "(failed under" in call]
    refused: dict[str, list[str]] = {}
    for call, error in compiled.dropped:
        refused.setdefault(error, []).append(call)
    notes += [f"torch.compile analysis: left out the call{'s' if len(calls) > 1 else ''} with {', '.join(calls)}, "
              f"which the model refuses without torch.compile too ({error})" for error, calls in refused.items()]
    library = {}
    for item in compiled.breaks:
        if item.stack and not any(project.is_first_party(frame.file) for frame in item.stack):
            frame = item.stack[-1]
            library.setdefault(f"{display_path(frame.file)}:{frame.line} ({item.gb_id + ' ' if item.gb_id else ''}"
                               f"{item.gb_type or 'graph break'})", None)
    if library:
        shown = list(library)
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        notes.append(f"torch.compile breaks the graph in library code only, not at a line of this project: "
                     f"{', '.join(shown[:3])}{more}")
    return notes
