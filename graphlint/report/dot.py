"""The autograd graph as a Graphviz picture: nodes coloured by category, clusters by module path, saved
activation sizes on the labels and source lines in the tooltips.

A 12-layer model stays readable: layers that are siblings in a container (`blocks.0` … `blocks.11`) and have
the same nodes are drawn once, with a count (`collapse`), and `depth` draws each module path cut at that
depth as one box instead of its nodes.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict

from graphlint.errors import UsageError
from graphlint.graph import GraphReport, NodeView
from graphlint.graph.categories import CATEGORIES, TITLES, family
from graphlint.sizes import human_bytes

COLORS = {
    "matmul-class": "#8fb3e0", "normalisation": "#9fd19a", "attention": "#f28b82", "activation": "#f9b872",
    "elementwise": "#f5e28c", "reduction": "#c9a7d6", "shape": "#dddddd", "copy": "#f7b6c8",
    "accumulate-grad": "#9ed8d3", "loss": "#c8a98a", "other": "#ffffff",
}


def render_dot(report: GraphReport, collapse: bool = True, depth: int | None = None) -> str:
    nodes = {view.index: view for view in report.nodes}
    edges = {(view.index, target) for view in report.nodes for target in view.next}
    labels: dict[str, str] = {}
    if collapse:
        nodes, edges, labels = _collapse_layers(nodes, edges)
    if depth is not None:
        nodes, edges = _cut_at_depth(nodes, edges, depth)
    lines = [
        "digraph autograd {",
        f'  label="{_escape(f"Autograd graph of {report.target} ({report.total} nodes, captured on {report.device})")}";',
        '  labelloc="t"; rankdir="TB"; newrank=true;',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]
    lines += _clusters(nodes, labels)
    for source, target in sorted(edges):
        lines.append(f"  n{source} -> n{target};")
    lines += _legend(nodes)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_text: str) -> bytes:
    """SVG from Graphviz's `dot` program; a clear error when it is not installed."""
    program = shutil.which("dot")
    if program is None:
        raise UsageError("--format svg needs Graphviz's dot program, which is not installed; install it "
                         "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz) or use "
                         "--format dot and render the file elsewhere")
    result = subprocess.run([program, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=300)
    if result.returncode != 0:
        raise UsageError(f"dot could not render the graph: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def _collapse_layers(nodes: dict[int, NodeView], edges: set[tuple[int, int]]):
    """Draw identical sibling layers once: their nodes map onto the first layer's, position by position."""
    members: dict[str, dict[int, list[NodeView]]] = defaultdict(lambda: defaultdict(list))
    for view in nodes.values():
        parent, index = _layer_of(view.module_path)
        if parent is not None:
            members[parent][index].append(view)
    mapping: dict[int, int] = {}
    kept: dict[int, int] = {}  # node index in a kept layer -> that layer's marker
    labels: dict[str, str] = {}
    for parent, layers in members.items():
        if len(layers) < 2:
            continue
        ordered = sorted(layers)
        signature = [_signature(layers[i], parent, i) for i in ordered]
        if any(s != signature[0] for s in signature[1:]):
            continue
        first = sorted(layers[ordered[0]], key=lambda v: (_relative(v, parent, ordered[0]), v.name, v.index))
        for index in ordered[1:]:
            others = sorted(layers[index], key=lambda v: (_relative(v, parent, index), v.name, v.index))
            for mine, theirs in zip(first, others, strict=True):
                mapping[theirs.index] = mine.index
        for view in first:
            kept[view.index] = ordered[0]
        prefix = f"{parent}." if parent else ""
        labels[f"{prefix}{ordered[0]}"] = (f"{prefix}{ordered[0]} … {prefix}{ordered[-1]} "
                                           f"(×{len(ordered)} identical layers)")
    if not mapping:
        return nodes, edges, labels
    remaining = {index: view for index, view in nodes.items() if index not in mapping}
    remapped = set()
    for source, target in edges:
        both_collapsed = (source in mapping or source in kept) and (target in mapping or target in kept)
        if both_collapsed and not (source in kept and target in kept):
            continue  # wiring between two layers of the stack
        edge = (mapping.get(source, source), mapping.get(target, target))
        if edge[0] != edge[1]:
            remapped.add(edge)
    return remaining, remapped, labels


def _layer_of(path: str) -> tuple[str | None, int]:
    """(`blocks`, 3) for `blocks.3.attn`: the first numbered component and what contains it."""
    parts = path.split(".")
    for position, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:position]), int(part)
    return None, -1


def _relative(view: NodeView, parent: str, index: int) -> str:
    prefix = f"{parent}.{index}" if parent else str(index)
    return view.module_path[len(prefix):]


def _signature(views: list[NodeView], parent: str, index: int) -> Counter:
    return Counter((_relative(v, parent, index), v.name) for v in views)


def _cut_at_depth(nodes: dict[int, NodeView], edges: set[tuple[int, int]], depth: int):
    """One box per module path cut at `depth` (`blocks.3` at depth 2), labelled with what it holds."""
    groups: dict[str, list[NodeView]] = defaultdict(list)
    for view in nodes.values():
        key = ".".join(view.module_path.split(".")[:depth]) if view.module_path else "(model)"
        groups[key].append(view)
    boxes: dict[int, NodeView] = {}
    owner: dict[int, int] = {}
    for key, views in groups.items():
        anchor = min(v.index for v in views)
        counts = Counter(v.category for v in views)
        summary = ", ".join(f"{TITLES[c]} {counts[c]}" for c in CATEGORIES if counts[c])
        main = counts.most_common(1)[0][0]
        boxes[anchor] = NodeView(anchor, f"{key}: {len(views)} nodes\n{summary}", main, "",
                                 "", sum(v.saved_bytes for v in views), ())
        for view in views:
            owner[view.index] = anchor
    grouped = {(owner[s], owner[t]) for s, t in edges if s in owner and t in owner and owner[s] != owner[t]}
    return boxes, grouped


def _clusters(nodes: dict[int, NodeView], labels: dict[str, str]) -> list[str]:
    """Nested `subgraph cluster_*` blocks following the module hierarchy."""
    tree: dict = {"children": {}, "nodes": []}
    for view in nodes.values():
        branch = tree
        if view.module_path:
            for part in view.module_path.split("."):
                branch = branch["children"].setdefault(part, {"children": {}, "nodes": []})
        branch["nodes"].append(view)
    lines: list[str] = []
    counter = [0]

    def emit(branch: dict, path: str, indent: str) -> None:
        for view in sorted(branch["nodes"], key=lambda v: v.index):
            lines.append(indent + _node(view))
        for name, child in branch["children"].items():
            child_path = f"{path}.{name}" if path else name
            counter[0] += 1
            label = labels.get(child_path, child_path)
            lines.append(f'{indent}subgraph cluster_{counter[0]} {{')
            lines.append(f'{indent}  label="{_escape(label)}"; style="rounded,dashed"; color="#999999"; '
                         'fontname="Helvetica"; fontsize=10;')
            emit(child, child_path, indent + "  ")
            lines.append(f"{indent}}}")

    emit(tree, "", "  ")
    return lines


def _node(view: NodeView) -> str:
    label = view.name if "\n" in view.name else family(view.name)
    if view.saved_bytes:
        label += f"\nsaved {human_bytes(view.saved_bytes)}"
    tooltip = f"{view.name} ({TITLES[view.category]})"
    if view.module_path:
        tooltip += f" in {view.module_path}"
    if view.source:
        tooltip += f" at {view.source}"
    return (f'n{view.index} [label="{_escape(label)}", fillcolor="{COLORS[view.category]}", '
            f'tooltip="{_escape(tooltip)}"];')


def _legend(nodes: dict[int, NodeView]) -> list[str]:
    present = [c for c in CATEGORIES if any(v.category == c for v in nodes.values())]
    lines = ['  subgraph cluster_legend {', '    label="categories"; style="rounded"; color="#bbbbbb"; '
             'fontname="Helvetica"; fontsize=10;']
    for category in present:
        lines.append(f'    legend_{category.replace("-", "_")} [label="{TITLES[category]}", '
                     f'fillcolor="{COLORS[category]}"];')
    lines.append("  }")
    return lines


def _escape(text: str) -> str:
    """A DOT string's contents: backslashes and quotes escaped, line breaks as DOT's `\n`."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
