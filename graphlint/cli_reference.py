"""Reference text generated from the code itself, so that it cannot drift: docs/options.md from the command
line's parser, and the README's rules table from the rule registry. tests/test_docs.py compares both with the
committed files.

    python -m graphlint.cli_reference > docs/options.md
    python -m graphlint.cli_reference --rules-table      # the README's block between the rules markers
"""

from __future__ import annotations

import argparse
import functools
import sys

RULES_BEGIN = "<!-- rules:begin (generated: python -m graphlint.cli_reference --rules-table) -->"
RULES_END = "<!-- rules:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = "" if action.nargs == 0 else " " + (action.metavar or "{" + ",".join(map(str, action.choices or ())) + "}")
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options_reference() -> str:
    """docs/options.md: every command and option, with the help text the command line prints."""
    from graphlint.cli import _parser

    parser = _parser()
    commands = _subcommands(parser)
    parts = [
        "# Command-line reference",
        "",
        "Generated from graphlint's argument parser by `python -m graphlint.cli_reference > docs/options.md`; do not",
        "edit by hand. `graphlint COMMAND --help` prints the same. The settings in `[tool.graphlint]` are described",
        "in [configuration.md](configuration.md), exit codes and output formats in [formats.md](formats.md).",
        "",
        "| command | what it does |",
        "|---|---|",
        *[f"| [`graphlint {name}`](#graphlint-{name}) | {_cell(command.description or '')} |"
          for name, command in commands.items()],
        "",
    ]
    for name, command in commands.items():
        # A fixed width, so that the page does not depend on the terminal that generated it.
        command.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
        usage = command.format_usage().strip()
        parts += [f"## graphlint {name}", "", "```text", usage, "```", ""]
        rows = [action for action in command._actions if not isinstance(action, argparse._HelpAction)]
        if rows:
            parts += ["| option | meaning |", "|---|---|"]
            parts += [f"| {_flags(action)} | {_cell(action.help or '')} |" for action in rows]
            parts.append("")
    return "\n".join(parts)


def rules_table(rules) -> str:
    """The README's table of rules, between its markers: one row per rule of the registry."""
    rows = [
        RULES_BEGIN,
        "| rule | name | severity | on by default | what it flags |",
        "|---|---|---|---|---|",
    ]
    for rule in rules:
        anchor = rule.help_uri().split("#", 1)[1]
        rows.append(f"| [{rule.id}](docs/rules.md#{anchor}) | {rule.name} | {rule.severity.value} | "
                    f"{'yes' if rule.default_enabled else 'no'} | {_cell(rule.summary)} |")
    rows.append(RULES_END)
    return "\n".join(rows)


def readme_rules_block(readme: str) -> str:
    """The rules table as committed in the README, markers included ('' when the markers are missing)."""
    start, end = readme.find(RULES_BEGIN), readme.find(RULES_END)
    return readme[start:end + len(RULES_END)] if 0 <= start < end else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphlint.cli_reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules-table", action="store_true", help="print the README's rules table instead")
    args = parser.parse_args(argv)
    if args.rules_table:
        from graphlint.engine import builtin_rules

        print(rules_table(builtin_rules()))  # graphlint's own: a rule plugin installed here is not in its README
    else:
        sys.stdout.write(options_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
