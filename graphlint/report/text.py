"""The default output: `path:line:col: GL101 message`, one finding a line (`[*]` when a safe fix is offered,
one `--fix` would apply once proven), then a one-line summary that also counts the unsafe fixes."""

from __future__ import annotations

from graphlint.errors import single_line
from graphlint.files import display_path, writable
from graphlint.results import SAFE, UNSAFE, Cost, Report
from graphlint.sizes import format_seconds


FIX_HINT = "graphlint check --fix proves and applies it"


def render_text(report: Report, fix_hint: str = FIX_HINT) -> str:
    """The findings and the summary; `fix_hint` says how to apply the fixes (the plugin names its commands)."""
    lines = [
        f"{display_path(f.location.path)}:{f.location.line}:{f.location.column}: {f.rule_id} {f.message}"
        + (f" ({cost_sentence(f.cost)})" if f.cost is not None else "")
        + (" (suppressed)" if f.suppressed else "")
        + (" [*]" if f.fix is not None and f.fix.applicability == SAFE and not f.suppressed else "")
        for f in report.findings
    ]
    lines.append(summary(report, fix_hint))
    return writable("\n".join(lines) + "\n")


def cost_sentence(cost: Cost) -> str:
    """"about 3.1 ms of 18 ms per step on NVIDIA H100 SXM5 80GB at batch 8; the fix saves about 2.9 ms"."""
    text = (f"about {format_seconds(cost.seconds)} of {format_seconds(cost.step_seconds)} per step on {cost.device}"
            + (f" at batch {cost.batch}" if cost.batch is not None else ""))
    if cost.saves is not None and cost.saves < 0:  # measured on this CPU: the fused kernel is the slower there
        text += f"; the fix would cost about {format_seconds(-cost.saves)} more on it"
    elif cost.saves is not None:
        text += f"; the fix saves about {format_seconds(cost.saves)}"
    return text


def summary(report: Report, fix_hint: str = FIX_HINT) -> str:
    count = len(report.findings)
    targets = len(report.results)
    failed = sum(1 for r in report.results if r.errors)
    found = f"Found {count} finding{_s(count)}" if count else "No findings"
    text = f"{found} in {targets} target{_s(targets)}"
    suppressed, baselined = report.hidden()
    hidden = [f"{suppressed} suppressed"] if suppressed else []
    hidden += [f"{baselined} in the baseline"] if baselined else []
    if hidden:
        text += f" ({' and '.join(hidden)} not shown)"
    if failed:
        text += f"; {failed} target{_s(failed)} could not be linted"
    fixable = sum(1 for f in report.findings if f.fix is not None and f.fix.applicability == SAFE and not f.suppressed)
    unsafe = sum(1 for f in report.findings if f.fix is not None and f.fix.applicability == UNSAFE and not f.suppressed)
    if fixable:
        text += f"; [*] {fixable} with a fix ({fix_hint})"
    if unsafe:
        text += f"; {unsafe} {'more ' if fixable else ''}with an unsafe fix (--fix --unsafe-fixes applies it)"
    return text + "."


def diagnostics(report: Report) -> list[str]:
    """Errors and notes, one line each, for stderr: `graphlint: error: TARGET: what went wrong; what to do`;
    then, once, the note that names graphlint when its own code failed after detection."""
    lines = []
    for result in report.results:
        lines += [single_line(f"graphlint: note: {result.target}: {note}") for note in result.notes]
        lines += [single_line(f"graphlint: error: {error.target}: {error.message}") for error in result.errors]
    culprit = culprit_note([failure for result in report.results for failure in result.failures])
    return lines + ([culprit] if culprit else [])


def culprit_note(failures: list[str]) -> str | None:
    """One line that names graphlint as the culprit of these failures of its own code, None for none."""
    unique = list(dict.fromkeys(failures))
    if not unique:
        return None
    more = f", and {len(unique) - 1} more" if len(unique) > 1 else ""
    return single_line(f"graphlint: note: graphlint's own code failed after detection ({unique[0]}{more}); no "
                       "finding was lost, but these lack the fix or the exact span graphlint could not make; "
                       "this is a bug in graphlint, please report it with the output of --debug")


def _s(count: int) -> str:
    return "" if count == 1 else "s"
