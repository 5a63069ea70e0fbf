"""The command line.

    graphlint check [TARGET ...]     lint targets (default: [tool.graphlint] targets)
    graphlint graph [TARGET]         report one target's autograd graph (text, JSON, DOT or SVG)
    graphlint memory [TARGET ...]    the peak memory of one training step, and what it is made of
    graphlint time [TARGET ...]      the FLOPs, bytes and seconds of one training step on a named device
    graphlint rules                  list the rules
    graphlint rule GL101             one rule's documentation and examples
    graphlint server                 a Language Server on stdio, for editors (needs the server extra)

`check --fix` applies the fixes graphlint proved on the model, `--diff` shows them, `--unsafe-fixes` adds the
unproven ones (graphlint.fix).

Exit codes of `check`: 0 no findings at or above --fail-on, 1 such findings, 2 usage, configuration or target
errors (each one line on stderr; the other targets are still linted and reported, and the report is still
written).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import graphlint
from graphlint.config import DEVICES, FAIL_ON, memory_budget, split_codes
from graphlint.errors import UsageError, single_line
from graphlint.memory.choices import STEP_DEVICES, TRAIN_DEVICES
from graphlint.project import Project
from graphlint.report import FORMATS, GRAPH_FORMATS, MEMORY_FORMATS
from graphlint.target import parse_init, parse_vary, target_text

if TYPE_CHECKING:
    from graphlint.memory.request import Distribution
    from graphlint.results import Report
    from graphlint.session import Session

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphlint",
        description="A linter for PyTorch models: it builds each target, captures one forward graph and one "
                    "autograd pass, and reports anti-patterns at your source lines.",
    )
    parser.add_argument("--version", action="version", version=f"graphlint {graphlint.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _check_command(commands)
    _graph_command(commands)
    _memory_command(commands)
    _time_command(commands)
    listing = commands.add_parser("rules", help="list the rules", description="List every rule.")
    _output_options(listing, ("text", "markdown"), output=False)
    one = commands.add_parser("rule", help="show one rule's documentation", description="Show a rule's documentation.")
    one.add_argument("rule_id", metavar="RULE", help="a rule ID, such as GL101")
    server = commands.add_parser(
        "server", help="run the Language Server on stdio (for editors)",
        description="A Language Server on stdin and stdout: diagnostics for the [tool.graphlint] targets of the "
                    "project of each opened or saved file, quick fixes and rule documentation. Needs the server "
                    "extra: pip install 'torch-graphlint[server] @ git+https://github.com/torch-graphlint/torch-graphlint' "
                    "(or pip install -e '.[server]' in a checkout).",
    )
    _device_option(server, DEVICES)
    _baseline_option(server)
    _process_options(server, jobs=2)
    return parser


# Every option below is declared once, in one of these helpers, with one help text wherever it appears: a flag
# means the same thing in every command that takes it (tests/test_cli_options.py).

def _check_command(commands) -> None:
    check = commands.add_parser("check", help="lint targets", description="Lint targets and report findings.")
    _targets_argument(check)
    _model_options(check)
    _output_options(check, tuple(FORMATS))
    check.add_argument("--report", action="append", default=[], metavar="FORMAT=FILE", type=_extra_report,
                       help="also write the report in FORMAT to FILE (repeatable), from the same run")
    _device_option(check, DEVICES)
    check.add_argument("--select", metavar="CODES",
                       help="rules to run, comma-separated IDs or prefixes (replaces the configuration's selection)")
    check.add_argument("--extend-select", metavar="CODES", help="rules to run in addition")
    check.add_argument("--ignore", metavar="CODES", help="rules not to run")
    check.add_argument("--fail-on", choices=FAIL_ON, default=None,
                       help="the lowest severity that makes the run fail with exit code 1 (default: warning)")
    check.add_argument("--show-suppressed", action="store_true", help="also report findings that comments suppress")
    _baseline_option(check)
    check.add_argument("--write-baseline", metavar="FILE", type=Path,
                       help="write today's findings to FILE as the baseline, and exit 0")
    _process_options(check, jobs=1)
    check.add_argument("--fix", action="store_true",
                       help="apply the fixes that graphlint proved on the model (same outputs and gradients in "
                            "float64, the finding gone), then report what is left")
    check.add_argument("--diff", action="store_true",
                       help="print the fixes --fix would apply as unified diffs and write nothing (exit 1 when "
                            "there is something to fix)")
    check.add_argument("--unsafe-fixes", action="store_true",
                       help="with --fix or --diff, also apply fixes declared unsafe, proven or unprovable (never one "
                            "whose proof found different results); with rdjson, also suggest them")
    _vary_option(check, metavar="DIMS")
    check.add_argument("--memory-budget", metavar="SIZE",
                       help="GL401: fail when a target's training step peaks above SIZE (24GiB, 80GB); default: "
                            "memory-budget in [tool.graphlint]")
    _ddp_option(check)
    _gpu_option(check)
    check.add_argument("--sort", choices=("location", "cost"), default="location",
                       help="order of the findings: by file and line (default), or by their time per step, most "
                            "first (needs --gpu or --cpu)")


def _graph_command(commands) -> None:
    graph = commands.add_parser("graph", help="report one target's autograd graph",
                                description="Report one capture's autograd graph: node counts by category, fused "
                                            "kernels, AccumulateGrad sinks and saved activation memory.")
    graph.add_argument("target", nargs="?", metavar="TARGET", help="default: the one target in [tool.graphlint]")
    _model_options(graph)
    _output_options(graph, GRAPH_FORMATS)
    _device_option(graph, DEVICES)
    _vary_option(graph, choices=("batch", "seq"))
    graph.add_argument("--depth", type=int, metavar="N", help="picture: one box per module path cut at depth N")
    graph.add_argument("--no-collapse", action="store_true",
                       help="picture: draw every layer, not identical sibling layers once")
    _process_options(graph)


def _memory_command(commands) -> None:
    memory = commands.add_parser(
        "memory", help="the peak memory of one training step",
        description="Run one steady-state training step of each target (zero_grad, forward, loss, backward, "
                    "optimizer step) on the meta device under an allocation tracker, and report its peak memory "
                    "and what it is made of.")
    _targets_argument(memory)
    _model_options(memory)
    _step_options(memory)
    memory.add_argument("--device-memory", metavar="SIZE",
                        help="say whether the step fits in SIZE (80GiB, 24GB) and the largest batch that does")
    memory.add_argument("--fsdp", metavar="N",
                        help="the step of one rank of N under FSDP2 (torch's fully_shard on every repeated block, "
                             "then the root), estimated with a fake process group")
    _ddp_option(memory)
    memory.add_argument("--fsdp-wrap", metavar="CLASSES",
                        help="with --fsdp: the module classes to shard one by one, comma-separated (default: every "
                             "repeated block)")
    memory.add_argument("--reshard-after-forward", choices=("true", "false"), default=None,
                        help="with --fsdp: fully_shard's reshard_after_forward (default: left to fully_shard, which "
                             "reshards every block but the root)")
    memory.add_argument("--mixed-precision", choices=("bf16",), default=None,
                        help="with --fsdp: MixedPrecisionPolicy with bfloat16 parameters and float32 gradient "
                             "reduction")
    memory.add_argument("--bucket-cap-mb", metavar="MB",
                        help="with --ddp: DistributedDataParallel's bucket_cap_mb (default: 25)")
    _output_options(memory, MEMORY_FORMATS)
    _device_option(memory, STEP_DEVICES)
    _process_options(memory, jobs=1)


def _time_command(commands) -> None:
    timing = commands.add_parser(
        "time", help="the time of one training step on a named device",
        description="Run one steady-state training step of each target (as graphlint memory does) under an op "
                    "recorder, and report its FLOPs, bytes and estimated seconds on a GPU of graphlint's table "
                    "(--gpu NAME) or on this machine's CPU (--cpu): a roofline per op plus a launch cost.")
    _targets_argument(timing)
    _model_options(timing)
    _gpu_option(timing)
    _step_options(timing)
    timing.add_argument("--top", type=int, default=10, metavar="N",
                        help="how many source lines to show (default: 10)")
    _output_options(timing, ("text", "json"))
    _device_option(timing, STEP_DEVICES)
    _process_options(timing, jobs=1)


def _targets_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "targets", nargs="*", metavar="TARGET",
        help="path/to/file.py:NAME or package.module:NAME, a function returning (model, args), or a model class "
             "with --input; default: [tool.graphlint] targets in the nearest pyproject.toml",
    )


def _output_options(command: argparse.ArgumentParser, formats: tuple[str, ...], output: bool = True) -> None:
    """--format with the command's formats, and --output."""
    command.add_argument("--format", choices=formats, default="text",
                         help="output format (default: text); svg needs Graphviz's dot program, markdown is the "
                              "full rule reference (docs/rules.md)")
    if output:
        command.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")


def _device_option(command: argparse.ArgumentParser, devices: tuple[str, ...]) -> None:
    """--device: where the target is built and run, with the devices the command can run it on."""
    command.add_argument("--device", choices=devices, default=None,
                         help="where to build and run the model (default: device in [tool.graphlint], else auto): "
                              "auto uses the meta device and rebuilds on CPU when the forward needs real values; "
                              "memory and time run the step on meta or CPU only")


def _baseline_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--baseline", metavar="FILE", type=Path,
                         help="report only findings that are not in this baseline file")


def _vary_option(command: argparse.ArgumentParser, **how) -> None:
    command.add_argument("--vary", **how,
                         help="input dimensions graphlint grows to see what changes: check's torch.compile rules "
                              "(GL3xx) grow batch, seq, batch,seq or none by one and two (default: batch, or vary "
                              "in [tool.graphlint]); graph doubles batch or seq, captures again and compares")


def _ddp_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--ddp", metavar="N",
                         help="the targets are trained with DistributedDataParallel over N ranks: check turns on "
                              "GL402 (parameters without a gradient, which DDP refuses; default: distributed in "
                              "[tool.graphlint]); memory measures one rank's step (the whole model, plus DDP's "
                              "gradient buckets)")


def _gpu_option(command: argparse.ArgumentParser) -> None:
    """The device a step is priced on: --gpu NAME or --cpu."""
    command.add_argument("--gpu", metavar="NAME",
                         help="price the training step on this GPU (" + ", ".join(_gpu_names()) + "): time prices "
                              "the whole step; check says what each performance finding (GL101-GL107, GL204, GL301) "
                              "costs per step and what its fix saves (default: no cost)")
    command.add_argument("--cpu", action="store_true",
                         help="price the training step on this machine's CPU instead, as it would train there: each "
                              "op call timed on it, its peaks measured once, all cached")


def _step_options(command: argparse.ArgumentParser) -> None:
    """How the training step of memory and time is run."""
    command.add_argument("--optimizer", default="adamw", metavar="NAME",
                         help="adamw (default), adam, sgd, sgd-momentum or none")
    command.add_argument("--train-on", choices=TRAIN_DEVICES, default=None,
                         help="the device the step is meant for, whose kernels torch would choose: cuda (the "
                              "optimizer's foreach implementation, fused attention) or cpu; default: cuda, except "
                              "for time --cpu")
    command.add_argument("--autocast", choices=("bf16", "fp16"),
                         help="run the forward and the loss under autocast to bfloat16 or float16, as "
                              "torch.autocast(\"cuda\") would")
    command.add_argument("--release-output", action="store_true",
                         help="the training loop keeps only the loss (a loss function that returns only the loss, as "
                              "Hugging Face's Trainer calls it): the model's output is freed before backward; by "
                              "default the output and loss are held until after the optimizer step")
    command.add_argument("--batch", metavar="N", help="resize dimension 0 of the inputs to N")
    command.add_argument("--seq", metavar="T", help="resize dimension 1 of the inputs (and every later dimension "
                                                    "of the same size) to T")


def _model_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--input", action="append", default=[], metavar="SPEC",
        help="an input of the model built by each TARGET, as DTYPE[SHAPE] with an optional :LOW..HIGH range "
             "(float32[2,3,32,32], int64[2,16]:0..1000, bool[2,16], NAME=SPEC for a keyword input); repeat it "
             "for each positional argument of the forward",
    )
    command.add_argument(
        "--init", action="append", default=[], metavar="KEY=VALUE",
        help="a keyword argument for each TARGET's call (the class's constructor), VALUE a Python literal "
             "(depth=2, sizes=[64,128], act=gelu); repeat it for each argument",
    )
    command.add_argument(
        "--pythonpath", action="append", default=[], metavar="DIR", type=Path,
        help="a folder targets import from, before [tool.graphlint] pythonpath (or pytest's), src/ and the "
             "project root; repeat it for each folder",
    )


def _process_options(command: argparse.ArgumentParser, jobs: int | None = None) -> None:
    """The result cache, the children and internal errors, as check has them; `jobs`, the default of --jobs, for a
    command of several targets."""
    command.add_argument("--no-cache", action="store_true",
                         help="capture every target again, ignoring the result cache")
    command.add_argument("--cache-dir", metavar="DIR",
                         help="the result cache's folder (default: $GRAPHLINT_CACHE_DIR, else .graphlint_cache in the "
                              "project root)")
    if jobs is not None:
        command.add_argument("--jobs", "-j", type=int, default=jobs, metavar="N",
                             help="how many targets run at once (default: 1; server: 2); every target runs in its "
                                  "own process either way")
    command.add_argument("--timeout", type=float, metavar="SECONDS",
                         help="stop a target's process after SECONDS, even inside native code (default: 600, or "
                              "timeout in [tool.graphlint]; 0: no limit)")
    command.add_argument("--debug", action="store_true", help="print tracebacks of internal errors")


def _run_options(args: argparse.Namespace, project: Project, config, **more):
    """The session's options from --no-cache, --cache-dir, --jobs, --timeout and --debug, checked; `more` are
    the command's own."""
    from graphlint.cache import default_folder
    from graphlint.session import Options

    jobs = getattr(args, "jobs", 1)  # graph takes one target
    if jobs < 1:
        raise UsageError("--jobs must be 1 or more")
    if args.timeout is not None and args.timeout < 0:
        raise UsageError("--timeout must be a number of seconds (0 for no limit)")
    return Options(debug=args.debug, cache=None if args.no_cache else default_folder(project, args.cache_dir),
                   jobs=jobs, timeout=config.timeout or None, **more)


def _picked(args: argparse.Namespace, project: Project, config, named: list[str],
            one: str | None = None) -> tuple[list[str], Path]:
    """The targets to run and the folder their paths are read from: the TARGET arguments (`named`) with the
    --input specs and --init arguments, from the working directory; else [tool.graphlint] targets, from the
    project root. `one`: the command takes one target, and this is its usage error when there is not one."""
    if named or args.input or args.init:
        return _with_model_options(named, args), Path.cwd()
    if config.targets and (one is None or len(config.targets) == 1):
        return list(config.targets), project.root
    if one is not None:
        raise UsageError(one + (f"; [tool.graphlint] lists {len(config.targets)}" if config.targets else ""))
    raise UsageError("no targets: pass TARGET (path/to/file.py:NAME) or set targets in [tool.graphlint] "
                     "of pyproject.toml")


def _writable(*paths: str | Path | None, what: str = "") -> None:
    """Say before any target runs, not after minutes of linting, that a file asked for (--output, --report,
    --write-baseline: `what`, "the baseline ") cannot be written there; writing it later still says so if the
    folder changes meanwhile."""
    for path in paths:
        if not path:
            continue
        file = Path(path)
        folder = file.parent
        if file.is_dir():
            problem = errno.EISDIR
        elif not folder.exists():
            problem = errno.ENOENT
        elif not folder.is_dir():
            problem = errno.ENOTDIR
        elif not os.access(folder, os.W_OK | os.X_OK) or (file.exists() and not os.access(file, os.W_OK)):
            problem = errno.EACCES
        else:
            continue
        raise UsageError(f"cannot write {what}{path}: {os.strerror(problem)}")


def _write(rendered: str | bytes, output: str | None) -> None:
    """The rendered report to --output FILE (text as UTF-8, bytes as they are), else to stdout."""
    if output:
        try:
            if isinstance(rendered, bytes):
                Path(output).write_bytes(rendered)
            else:
                Path(output).write_text(rendered, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {output}: {error.strerror or error}") from error
    else:
        sys.stdout.flush()
        # UTF-8 whatever the terminal's locale says
        sys.stdout.buffer.write(rendered.encode("utf-8") if isinstance(rendered, str) else rendered)
        sys.stdout.flush()


def _discover(args: argparse.Namespace) -> Project:
    """The project of the working directory, with the command line's --pythonpath folders first."""
    project = Project.discover()
    project.add_pythonpath(list(args.pythonpath))
    return project


def _with_model_options(targets: list[str], args: argparse.Namespace) -> list[str]:
    """The command line's targets with its --input specs and --init arguments, as target texts."""
    if not (args.input or args.init):
        return targets
    if not targets:
        raise UsageError("--input and --init apply to the targets named on the command line; for [tool.graphlint] "
                         "targets write a table: { model = \"pkg/net.py:Net\", inputs = [...], kwargs = { ... } }")
    kwargs = dict(parse_init(item) for item in args.init)
    return [target_text(target, args.input, kwargs) for target in targets]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        commands = {"check": _check, "graph": _graph, "memory": _memory, "time": _time, "rules": _rules,
                    "rule": _rule, "server": _server}
        return commands[args.command](args)
    except UsageError as error:
        print(single_line(f"graphlint: error: {error}"), file=sys.stderr)
        return EXIT_ERROR
    except ImportError as error:
        if not (error.name or "").startswith("torch"):
            raise
        print(f"graphlint: error: cannot import torch ({error}); install PyTorch in this environment "
              "(pip install torch)", file=sys.stderr)
        return EXIT_ERROR


def _check(args: argparse.Namespace) -> int:
    # Nothing on this path imports torch unless a target has to be captured: a cached run never does.
    from graphlint.baseline import write_baseline
    from graphlint.report import SUGGESTING
    from graphlint.report.text import diagnostics, summary
    from graphlint.session import Session

    if args.gpu is not None and args.cpu:
        raise UsageError("--gpu and --cpu are two devices to price the findings on; pass one of them")
    if args.sort == "cost" and args.gpu is None and not args.cpu:
        raise UsageError("--sort cost orders the findings by their time per step on a device; name it with --gpu "
                         "NAME or --cpu")
    cost_gpu = cost_cpu = None
    if args.gpu is not None:
        from graphlint.timing.devices import accelerator

        if accelerator(args.gpu) is None:
            raise UsageError(f"unknown GPU {args.gpu!r}; the known ones are {', '.join(_gpu_names())}")
        cost_gpu = accelerator(args.gpu).name
    elif args.cpu:
        from graphlint.timing.devices import cpu_label

        cost_cpu = cpu_label()
    project = _discover(args)
    config = project.config.overridden(
        cost_gpu=cost_gpu,
        cost_cpu=cost_cpu,
        device=args.device,
        select=split_codes(args.select),
        extend_select=split_codes(args.extend_select),
        ignore=split_codes(args.ignore),
        fail_on=args.fail_on,
        timeout=args.timeout,
        vary=None if args.vary is None else parse_vary(args.vary, "--vary"),
        memory_budget=None if args.memory_budget is None else memory_budget(args.memory_budget, "--memory-budget"),
        distributed=None if args.ddp is None else ("ddp" if world_size(args.ddp, "--ddp") else None),
    )
    targets, base = _picked(args, project, config, list(args.targets))
    show_progress = args.format == "text" and sys.stderr.isatty()
    options = _run_options(args, project, config, show_suppressed=args.show_suppressed, baseline=args.baseline,
                           progress=_Progress(sys.stderr) if show_progress else None)
    outputs = [(args.format, args.output), *args.report]
    suggesting = any(name in SUGGESTING for name, _ in outputs)
    if args.unsafe_fixes and not (args.fix or args.diff or suggesting):
        raise UsageError("--unsafe-fixes applies only with --fix, --diff or --format rdjson/rdjsonl")
    if args.write_baseline is not None and (args.fix or args.diff):
        raise UsageError("--write-baseline cannot be combined with --fix or --diff")
    _writable(*(file for _, file in outputs))
    _writable(args.write_baseline, what="the baseline ")  # as baseline.write_baseline words it
    session = Session(targets, project, config, options, base)
    report = session.report(session.results(targets))
    if args.sort == "cost":
        report.merged = sorted(report.all_findings, key=_by_cost)
    for line in diagnostics(report):
        print(line, file=sys.stderr)
    if args.diff:
        return _diff(session, report, args.unsafe_fixes)
    if args.fix:
        report = _fix(session, report, args.unsafe_fixes)
    if args.write_baseline is not None:
        kept = [f for f in report.all_findings if not f.suppressed]
        write_baseline(args.write_baseline, kept, lambda path: project.relative(path) or path)
        print(f"graphlint: wrote {len(kept)} finding{'' if len(kept) == 1 else 's'} to the baseline "
              f"{args.write_baseline}", file=sys.stderr)
        return EXIT_ERROR if report.errors else EXIT_CLEAN
    # Suggestions are offered only for fixes proven as --fix would prove them (after --fix, none are left).
    proven = report
    if suggesting:
        from graphlint.report.rdjson import keep_fixes  # with SARIF's libraries: only the suggesting formats need it

        proven = keep_fixes(report, [] if args.fix else _proven(session, report, args.unsafe_fixes))
    for name, output in outputs:
        _write(FORMATS[name](proven if name in SUGGESTING else report), output)
    if args.output and args.format != "text":
        print(summary(report), file=sys.stderr)
    if report.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if report.failing else EXIT_CLEAN


def _by_cost(finding) -> tuple:
    """Most time per step first; findings without a cost after, in their usual order."""
    return (finding.cost is None, -(finding.cost.seconds if finding.cost is not None else 0.0), finding.sort_key())


def world_size(value: str, option: str) -> int:
    """The N of --ddp N or --fsdp N: a whole number of ranks, 1 or more."""
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{option} takes the number of ranks, a whole number of 1 or more, not {value!r}")
    return int(value)


def _extra_report(value: str) -> tuple[str, str]:
    name, _, output = value.partition("=")
    if name not in FORMATS or not output:
        raise argparse.ArgumentTypeError(f"{value!r} is not FORMAT=FILE with FORMAT one of {', '.join(FORMATS)}")
    return name, output


def _proven(session: Session, report: Report, unsafe: bool) -> list:
    """The findings whose fixes --fix would apply, proven on the model (with `unsafe`, the unproven ones too)."""
    from graphlint.fix.apply import fixable

    if not fixable(report):
        return []
    plan = session.fixes(report, unsafe)
    _tell_failures(plan, report)
    for finding, reason in plan.refused:
        project = session.project
        where = f"{project.relative(finding.location.path) or finding.location.path}:{finding.location.line}"
        how = "suggested anyway (--unsafe-fixes)" if unsafe and finding not in plan.broken else "not suggested"
        print(single_line(f"graphlint: {where}: {finding.rule_id} fix {how}: {reason}"), file=sys.stderr)
    return plan.applied


def _diff(session: Session, report: Report, unsafe: bool) -> int:
    plan = session.fixes(report, unsafe)
    _tell_failures(plan, report)
    _tell_refused(plan, session.project, unsafe)
    diffs = plan.diffs(session.project)
    sys.stdout.buffer.write(diffs.encode("utf-8"))
    sys.stdout.flush()
    count = len(plan.applied)
    print(f"graphlint: {count} fix{'' if count == 1 else 'es'} would be applied", file=sys.stderr)
    if report.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if diffs else EXIT_CLEAN


def _fix(session: Session, report: Report, unsafe: bool) -> Report:
    """Write the fixes; the report of what is left."""
    plan = session.fixes(report, unsafe)
    _tell_failures(plan, report)
    _tell_refused(plan, session.project, unsafe)
    written = plan.write()
    count = len(plan.applied)
    print(f"graphlint: fixed {count} finding{'' if count == 1 else 's'} in {len(written)} "
          f"file{'' if len(written) == 1 else 's'}", file=sys.stderr)
    return session.without(report, plan.applied)


def _tell_failures(plan, report: Report) -> None:
    """The note that names graphlint for a failure of its own while proving fixes, unless the run said it."""
    from graphlint.report.text import culprit_note

    if not any(result.failures for result in report.results):
        note = culprit_note(plan.failures)
        if note:
            print(note, file=sys.stderr)


def _tell_refused(plan, project: Project, unsafe: bool) -> None:
    for finding, note in plan.notes:
        where = f"{project.relative(finding.location.path) or finding.location.path}:{finding.location.line}"
        print(single_line(f"graphlint: {where}: {finding.rule_id} fix {note}"), file=sys.stderr)
    for finding, reason in plan.refused:
        where = f"{project.relative(finding.location.path) or finding.location.path}:{finding.location.line}"
        if finding in plan.broken:  # never written: the rewritten model does not build or run, or computes otherwise
            print(single_line(f"graphlint: {where}: {finding.rule_id} fix not applied, even with --unsafe-fixes: "
                              f"{reason}"), file=sys.stderr)
            continue
        how = "applied anyway (--unsafe-fixes)" if unsafe else "not applied"
        print(single_line(f"graphlint: {where}: {finding.rule_id} fix {how}: {reason}"
                          + ("" if unsafe else " (--unsafe-fixes applies it)")), file=sys.stderr)


class _Progress:
    """On a terminal, which target is being captured and how long it took; nothing otherwise."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __call__(self, target: str, event: str, result=None, seconds: float | None = None) -> None:
        if event == "started":
            self.stream.write(f"\r\033[Kcapturing {target} …")
        elif event == "cached":
            self.stream.write(f"\r\033[K{target}: unchanged since the last run (cached)\n")
        elif result is not None and result.errors:
            self.stream.write(f"\r\033[K{target}: failed after {seconds:.1f} s\n")
        else:
            self.stream.write(f"\r\033[K{target}: captured on {result.device} in {seconds:.1f} s\n")
        self.stream.flush()


def _graph(args: argparse.Namespace) -> int:
    from graphlint.report.graph import render_graph
    from graphlint.session import Session

    project = _discover(args)
    config = project.config.overridden(device=args.device, timeout=args.timeout)
    [target], base = _picked(args, project, config, [args.target] if args.target else [],
                             one="graphlint graph takes one TARGET (path/to/file.py:NAME)")
    if args.depth is not None and args.depth < 1:
        raise UsageError("--depth must be 1 or more")
    _writable(args.output)
    session = Session([target], project, config, _run_options(args, project, config), base, lints=False)
    result, report = session.graph(target, args.vary)
    for note in result.notes:
        print(single_line(f"graphlint: note: {target}: {note}"), file=sys.stderr)
    if report is None:
        for error in result.errors:  # a failure of the capture with a larger input names that input
            print(single_line(f"graphlint: error: {error.target}: {error.message}"), file=sys.stderr)
        return EXIT_ERROR
    _write(render_graph(report, args.format, collapse=not args.no_collapse, depth=args.depth), args.output)
    return EXIT_CLEAN


def _memory(args: argparse.Namespace) -> int:
    # Nothing on this path imports torch unless a target has to be measured: an estimate from the cache never does.
    from graphlint.memory.choices import OPTIMIZERS
    from graphlint.memory.request import Request
    from graphlint.report.memory import render_memory
    from graphlint.run.wire import PARENT_THREADS
    from graphlint.session import Session
    from graphlint.sizes import parse_bytes

    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {args.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    sizes = _step_sizes(args)
    device_memory = None
    if args.device_memory is not None:
        device_memory = parse_bytes(args.device_memory)
        if device_memory is None:
            raise UsageError(f"--device-memory {args.device_memory!r} is not a size; write it as 80GiB, 24GB or "
                             "a number of bytes")
    distribution = _distribution(args)
    project = _discover(args)
    config = project.config.overridden(device=args.device, timeout=args.timeout)
    targets, base = _picked(args, project, config, list(args.targets))
    _writable(args.output)
    session = Session(targets, project, config, _run_options(args, project, config), base, lints=False)
    device = _step_device(config, "memory")
    if config.distributed == "ddp" and distribution is None:
        print('graphlint: note: [tool.graphlint] distributed = "ddp" names no number of ranks, so memory measures '
              "one device's step; --ddp N measures one rank's of N", file=sys.stderr)
    # Children measure CPU kernels with the threads torch gives the warm parent, as a step run here would.
    request = Request(optimizer=args.optimizer, train_on=args.train_on or "cuda", autocast=args.autocast,
                      release_output=args.release_output, device=device, device_memory=device_memory,
                      distribution=distribution, **sizes)
    answers = session.memory(targets, request, threads=PARENT_THREADS)
    results, failed = [], False
    for result, estimate in answers:
        for error in result.errors:
            print(single_line(f"graphlint: error: {error.target}: {error.message}"), file=sys.stderr)
        if estimate is None:
            failed = True
        else:
            results.append(estimate)
    _write(render_memory(results, args.format), args.output)
    if failed:
        return EXIT_ERROR
    if device_memory is not None and any(not r.fits for r in results):
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _step_device(config, command: str) -> str:
    """Where memory or time runs the step: the configuration's device when the step can run there; a configured
    "cuda" (where check and graph capture) is said in a note, and the step runs as with --device auto."""
    if config.device in STEP_DEVICES:
        return config.device
    print(f'graphlint: note: [tool.graphlint] device = "{config.device}" is where check and graph capture; {command} '
          "runs the step on the meta device, or on CPU when it needs real values (as --device auto), with CUDA's "
          "kernels unless --train-on cpu", file=sys.stderr)
    return "auto"


def _step_sizes(args: argparse.Namespace) -> dict[str, int]:
    """--batch and --seq of `memory` and `time`, checked: the sizes the step's inputs are given."""
    sizes = {}
    for name in ("batch", "seq"):
        value = getattr(args, name)
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"--{name} must be a whole number of 1 or more, not {value!r}")
            sizes[name] = int(value)
    return sizes


def _gpu_names() -> list[str]:
    from graphlint.timing.devices import ACCELERATORS

    return [device.name for device in ACCELERATORS.values()]


def _time(args: argparse.Namespace) -> int:
    # As memory's: nothing here imports torch unless a target has to be measured.
    import json

    from graphlint.memory.choices import OPTIMIZERS
    from graphlint.memory.request import Request
    from graphlint.run.wire import PARENT_THREADS
    from graphlint.session import Session
    from graphlint.timing.devices import accelerator, cpu_label
    from graphlint.timing.text import render_time_text

    if args.gpu is not None and args.cpu:
        raise UsageError("--gpu and --cpu are two devices to price the step on; pass one of them")
    if args.gpu is None and not args.cpu:
        # `time --device cpu` once priced the step on the CPU: now --device says where it runs, and this names --cpu
        raise UsageError(f"name the device to price the step on: --gpu NAME ({', '.join(_gpu_names())}) or --cpu "
                         "(this machine; --device says where the step runs, as for memory)")
    if args.gpu is not None and accelerator(args.gpu) is None:
        raise UsageError(f"unknown GPU {args.gpu!r}; the known ones are {', '.join(_gpu_names())}")
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {args.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    if args.top < 1:
        raise UsageError("--top must be 1 or more")
    sizes = _step_sizes(args)
    project = _discover(args)
    config = project.config.overridden(device=args.device, timeout=args.timeout)
    targets, base = _picked(args, project, config, list(args.targets))
    _writable(args.output)
    session = Session(targets, project, config, _run_options(args, project, config), base, lints=False)
    device = _step_device(config, "time")
    gpu = accelerator(args.gpu).name if args.gpu is not None else None
    train_on = args.train_on or ("cuda" if gpu is not None else "cpu")
    # Children measure the CPU with the threads torch gives the warm parent, as a step run here would.
    request = Request(optimizer=args.optimizer, train_on=train_on, autocast=args.autocast,
                      release_output=args.release_output, device=device, **sizes)
    answers = session.time(targets, request, gpu=gpu, threads=PARENT_THREADS,
                           cpu="" if gpu is not None else cpu_label())
    results, failed = [], False
    for result, step in answers:
        for error in result.errors:
            print(single_line(f"graphlint: error: {error.target}: {error.message}"), file=sys.stderr)
        if step is None:
            failed = True
        else:
            results.append(step)
    if args.format == "json":
        rendered = json.dumps({"flops": sum(r.flops for r in results), "seconds": sum(r.seconds for r in results),
                               "targets": [r.to_dict(args.top) for r in results]}, indent=2, ensure_ascii=False) + "\n"
    else:
        rendered = "\n".join(render_time_text(r, args.top) for r in results)
    _write(rendered, args.output)
    return EXIT_ERROR if failed else EXIT_CLEAN


def _distribution(args: argparse.Namespace) -> Distribution | None:
    """--fsdp N or --ddp N and their options, checked; None for the step of one device."""
    if args.fsdp is not None and args.ddp is not None:
        raise UsageError("--fsdp and --ddp are two ways to train on N devices; pass one of them")
    fsdp_only = [name for name, value in (("--fsdp-wrap", args.fsdp_wrap),
                                          ("--reshard-after-forward", args.reshard_after_forward),
                                          ("--mixed-precision", args.mixed_precision)) if value is not None]
    if fsdp_only and args.fsdp is None:
        raise UsageError(f"{fsdp_only[0]} applies only with --fsdp N")
    if args.bucket_cap_mb is not None and args.ddp is None:
        raise UsageError("--bucket-cap-mb applies only with --ddp N")
    if args.fsdp is None and args.ddp is None:
        return None
    from graphlint.memory.choices import DDP_BUCKET_MB
    from graphlint.memory.request import Distribution

    if args.ddp is not None:
        cap = DDP_BUCKET_MB
        if args.bucket_cap_mb is not None:
            try:
                cap = float(args.bucket_cap_mb)
            except ValueError:
                cap = 0
            if not cap > 0:
                raise UsageError(f"--bucket-cap-mb must be a number of MiB above 0, not {args.bucket_cap_mb!r}")
        return Distribution("ddp", world_size(args.ddp, "--ddp"), bucket_cap_mb=cap)
    wrap = tuple(part.strip() for part in (args.fsdp_wrap or "").split(",") if part.strip())
    if args.fsdp_wrap is not None and not wrap:
        raise UsageError("--fsdp-wrap takes module class names, comma-separated (LlamaDecoderLayer)")
    return Distribution("fsdp", world_size(args.fsdp, "--fsdp"), wrap=wrap,
                        reshard_after_forward=None if args.reshard_after_forward is None
                        else args.reshard_after_forward == "true",
                        mixed_precision=args.mixed_precision)


def _rules(args: argparse.Namespace) -> int:
    from graphlint.engine import listed_rules, rule_origin
    from graphlint.rule import rule_reference

    rules = listed_rules()  # the built-in rules read from their source: no torch
    if args.format == "markdown":
        sys.stdout.write(rule_reference(rules))
        return EXIT_CLEAN
    width = max(len(rule.name) for rule in rules)  # names in one column, however long the longest
    id_width = max(len(rule.id) for rule in rules)  # a plugin's IDs may be longer (GLX001)
    for rule in rules:
        opt_in = "  (opt-in)" if not rule.default_enabled else ""
        origin = f"  (plugin: {rule_origin(rule)})" if rule_origin(rule) else ""
        print(f"{rule.id:<{id_width}}  {rule.name:<{width}} {rule.severity.value:<8} {rule.summary}{opt_in}{origin}")
    return EXIT_CLEAN


def _rule(args: argparse.Namespace) -> int:
    from graphlint.engine import described_rule, listed_rules

    rule = described_rule(args.rule_id)
    if rule is None:
        known = ", ".join(r.id for r in listed_rules())
        raise UsageError(f"no rule {args.rule_id!r}; the rules are {known} (graphlint rules lists them)")
    sys.stdout.write(rule.docs_text(with_examples=True))
    return EXIT_CLEAN


SERVER_EXTRA = ("graphlint server needs the server extra: pip install "
                "'torch-graphlint[server] @ git+https://github.com/torch-graphlint/torch-graphlint' "
                "(or pip install -e '.[server]' in a checkout)")


def _server(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise UsageError("--jobs must be 1 or more")
    if args.timeout is not None and args.timeout < 0:
        raise UsageError("--timeout must be a number of seconds (0 for no limit)")
    try:
        import lsprotocol  # noqa: F401 - checked here so that a missing extra is one line, not a traceback
        import pygls  # noqa: F401
    except ModuleNotFoundError:
        print(SERVER_EXTRA, file=sys.stderr)
        return EXIT_ERROR
    from graphlint.server import Settings, serve

    return serve(Settings(
        device=args.device, timeout=args.timeout,
        baseline=args.baseline.resolve() if args.baseline is not None else None,
        cache_dir=args.cache_dir, no_cache=args.no_cache, jobs=args.jobs, debug=args.debug,
    ))
