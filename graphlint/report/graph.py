"""`graphlint graph`'s report: text for the terminal, JSON, and the Graphviz picture (graphlint.report.dot)."""

from __future__ import annotations

import json
import textwrap

from graphlint.files import display_path
from graphlint.graph import GraphReport
from graphlint.graph.categories import COMPUTE, TITLES
from graphlint.sizes import human_bytes

_SHOWN_NAMES = 4


def render_graph(report: GraphReport, format: str, collapse: bool = True, depth: int | None = None) -> bytes:
    """The command's output in one of graphlint.report.GRAPH_FORMATS, as bytes (an SVG is Graphviz's own); `collapse` and
    `depth` shape the picture."""
    if format in ("dot", "svg"):
        from graphlint.report.dot import render_dot, render_svg

        dot = render_dot(report, collapse=collapse, depth=depth)
        return render_svg(dot) if format == "svg" else dot.encode()
    if format == "json":
        return (json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n").encode()
    return render_graph_text(report).encode()


def render_graph_text(report: GraphReport) -> str:
    lines = [f"Autograd graph of {report.target} (captured on {report.device})"]
    lines += textwrap.wrap(report.device_note, 100, initial_indent="  ", subsequent_indent="  ")
    lines += ["", f"Nodes: {report.total}", "  compute"]
    for category, names in report.categories.items():
        indent = "    " if category in COMPUTE else "  "
        width = 22 if category in COMPUTE else 24
        saved = report.saved_by_category.get(category)
        keeps = f"keeps {human_bytes(saved)}" if saved else ""
        lines.append(f"{indent}{TITLES[category]:<{width}}{sum(names.values()):>5}  {keeps:<16}{_names(names)}".rstrip())
    lines.append("")
    lines.append("Fused kernels: " + (_names(report.fused, limit=None) or "none"))
    if report.fused_calls:
        lines.append("Fused calls in the forward: " + _names(report.fused_calls, limit=None))
    if report.could_fuse:
        lines.append("Could be fused (GL101):")
        for finding in report.could_fuse:
            where = f"{display_path(finding.location.path)}:{finding.location.line}:{finding.location.column}"
            lines += textwrap.wrap(f"{where}  {finding.message}", 100, initial_indent="  ", subsequent_indent="    ")
    else:
        lines.append("Could be fused (GL101): nothing")
    lines.append("")
    missing = (f"without a sink: {', '.join(report.without_sink)}" if report.without_sink
               else "every one has a sink")
    lines.append(f"Parameters: {report.sinks} AccumulateGrad sinks for {report.trainable} trainable parameter "
                 f"tensors; {missing}.")
    lines.append("")
    lines.append(f"Saved activations: {human_bytes(report.saved_bytes)} in {report.saved_tensors} tensors "
                 "(weights kept for backward not counted)")
    for line in report.saved_by_line:
        lines.append(f"  {human_bytes(line.bytes):>10}  {line.location}  {', '.join(line.ops)} in {line.where} "
                     f"({line.tensors} tensor{'' if line.tensors == 1 else 's'})")
    if report.sizes:
        lines += ["", _sizes(report)]
    return "\n".join(lines) + "\n"


def _names(counts: dict[str, int], limit: int | None = _SHOWN_NAMES) -> str:
    items = list(counts.items())
    shown = items if limit is None else items[:limit]
    text = ", ".join(f"{_short(name)} ×{count}" if count > 1 else _short(name) for name, count in shown)
    if limit is not None and len(items) > limit:
        text += f", … ({len(items) - limit} more)"
    return text


def _sizes(report: GraphReport) -> str:
    rows = [f"  {label}: {nodes} nodes, {human_bytes(saved)} of saved activations" for label, nodes, saved in report.sizes]
    (_, first_nodes, first_saved), (_, last_nodes, last_saved) = report.sizes[0], report.sizes[-1]
    growth = f"×{last_saved / first_saved:.1f}" if first_saved else "from nothing"
    if first_nodes == last_nodes:
        verdict = (f"  The number of nodes does not depend on the input size; saved activation memory grows with it "
                   f"({growth}).")
    else:
        verdict = (f"  The number of nodes changed ({first_nodes} → {last_nodes}): the forward runs different ops "
                   "for this input size (a loop over the sequence, say).")
    return "\n".join(["Graph size against input size:", *rows, verdict])


def _short(name: str) -> str:
    return name.rsplit("::", 1)[-1]  # torch::autograd::AccumulateGrad -> AccumulateGrad
