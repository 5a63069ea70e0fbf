"""The command line: `graphlint check [TARGET ...]`.

Exit codes: 0 no findings, 1 findings, 2 usage, configuration or target errors (each one line on stderr;
the other targets are still linted and reported, and a SARIF file is still written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import graphlint
from graphlint.errors import UsageError
from graphlint.project import DEVICES, Project

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphlint",
        description="A linter for PyTorch models: it builds each target, captures one forward graph and one "
                    "autograd pass, and reports anti-patterns at your source lines.",
    )
    parser.add_argument("--version", action="version", version=f"graphlint {graphlint.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser("check", help="lint targets", description="Lint targets and report findings.")
    check.add_argument(
        "targets", nargs="*", metavar="TARGET",
        help="path/to/file.py:NAME or package.module:NAME, a function returning (model, args); "
             "default: [tool.graphlint] targets in the nearest pyproject.toml",
    )
    check.add_argument("--format", choices=("text", "sarif"), default="text", help="output format (default: text)")
    check.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    check.add_argument(
        "--device", choices=DEVICES, default=None,
        help="where to build and run the model; auto (default) uses the meta device and rebuilds on CPU "
             "when the forward needs real values",
    )
    check.add_argument("--debug", action="store_true", help="print tracebacks of internal errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return _check(args)
    except UsageError as error:
        print(f"graphlint: error: {error}", file=sys.stderr)
        return EXIT_ERROR


def _check(args: argparse.Namespace) -> int:
    # Imported here so that --help and --version answer without importing torch.
    from graphlint.pipeline import Options, check
    from graphlint.report import FORMATS
    from graphlint.report.text import diagnostics

    project = Project.discover()
    config = project.config
    if args.targets:
        targets, base = list(args.targets), Path.cwd()
    elif config.targets:
        targets, base = list(config.targets), project.root
    else:
        raise UsageError("no targets: pass TARGET (path/to/file.py:NAME) or set targets in [tool.graphlint] "
                         "of pyproject.toml")
    options = Options(device=args.device or config.device, debug=args.debug)
    report = check(targets, project, options, base)
    for line in diagnostics(report):
        print(line, file=sys.stderr)
    rendered = FORMATS[args.format](report)
    if args.output:
        try:
            Path(args.output).write_text(rendered, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.output}: {error.strerror or error}") from error
        if args.format != "text":
            from graphlint.report.text import summary

            print(summary(report), file=sys.stderr)
    else:
        sys.stdout.write(rendered)
    if report.errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if report.findings else EXIT_CLEAN
