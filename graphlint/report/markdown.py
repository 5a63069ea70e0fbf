"""`--format markdown`: every finding in one Markdown table, for a CI job summary (GitHub's
`$GITHUB_STEP_SUMMARY`, which graphlint's action writes) or a merge request comment.

Unlike annotations, which GitHub caps at 10 of each level per step, the table lists every finding, each
with a link to its lines and to its rule's documentation. Lines link to the commit the job checked out
(`$GITHUB_SHA` on GitHub, `$CI_COMMIT_SHA` on GitLab); outside CI the locations are plain text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import quote

from graphlint.files import writable
from graphlint.report.paths import relative_to, source_root
from graphlint.report.text import summary
from graphlint.results import Location, Report

TITLE = "## graphlint"


def render_markdown(report: Report, environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    root = source_root(report.project_root, environ)
    link = _line_links(environ)
    docs = {rule.id: rule.help_uri for rule in report.rules}
    lines = [TITLE, "", _cell(summary(report)), ""]
    if report.findings:
        lines += ["| level | rule | where | finding |", "|---|---|---|---|"]
        for finding in report.findings:
            rule = f"{finding.rule_id} {finding.rule_name}"
            rule = f"[{_cell(rule)}]({docs[finding.rule_id]})" if finding.rule_id in docs else _cell(rule)
            text = finding.message
            if finding.occurrences > 1 and f"{finding.occurrences} occurrences" not in text:
                text += f" ({finding.occurrences} occurrences)"
            if finding.fix is not None and not finding.suppressed:
                text += " [*]"
            if finding.suppressed:
                text += " (suppressed)"
            related = "; ".join(f"{_place(r.location, root, link)} {_cell(r.message)}" for r in finding.related)
            cell = _cell(text) + (f"<br>related: {related}" if related else "")
            lines.append(f"| {finding.severity.value} | {rule} | {_place(finding.location, root, link)} | {cell} |")
        lines.append("")
        if any(f.fix is not None and not f.suppressed for f in report.findings):
            lines += ["[*] graphlint has a fix for it: `graphlint check --diff` shows it, `graphlint check --fix` "
                      "proves it on the model and applies it.", ""]
    if report.errors:
        lines += ["### Targets that could not be linted", ""]
        lines += [f"- `{_code(error.target)}`: {_cell(error.message)}" for error in report.errors]
        lines.append("")
    notes = [(result.target, note) for result in report.results for note in result.notes]
    if notes:
        lines += ["<details><summary>Notes</summary>", ""]
        lines += [f"- `{_code(target)}`: {_cell(note)}" for target, note in notes]
        lines += ["", "</details>", ""]
    return writable("\n".join(lines))


def _place(location: Location, root: str, link) -> str:
    path = relative_to(location.path, root)
    label = f"{path}:{location.line}:{location.column}"
    url = link(path, location.line, location.end_line) if link is not None and not path.startswith("/") else None
    return f"[`{_code(label)}`]({url})" if url else f"`{_code(label)}`"


def _line_links(environ: Mapping[str, str]):
    """A function (path, first line, last line) -> URL of those lines at the checked-out commit, or None."""
    server, repository, sha = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA"))
    if server and repository and sha:
        return lambda path, first, last: (f"{server}/{repository}/blob/{sha}/{quote(path)}#L{first}"
                                          + (f"-L{last}" if last > first else ""))
    project, sha = environ.get("CI_PROJECT_URL"), environ.get("CI_COMMIT_SHA")
    if project and sha:
        return lambda path, first, last: (f"{project}/-/blob/{sha}/{quote(path)}#L{first}"
                                          + (f"-{last}" if last > first else ""))
    return None


def _cell(text: str) -> str:
    """Text that stays inside one table cell and is not read as HTML."""
    parts = " ".join(text.split()).split("`")
    # Entities outside `code spans` only: inside one, Markdown shows them as written.
    parts[::2] = [p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for p in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def _code(text: str) -> str:
    return " ".join(text.split()).replace("`", "'").replace("|", "\\|")
