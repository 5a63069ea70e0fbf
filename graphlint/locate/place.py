"""Locate: turn the problems a rule found into findings at exact source spans, one finding per location.

A pattern that repeats in 12 layers runs the same source line 12 times: those problems share a location and
become one finding that says "12 occurrences" and names the module paths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Iterable

from graphlint.capture import Capture
from graphlint.capture.frames import Frame
from graphlint.files import library_name
from graphlint.locate.lines import LineSpans
from graphlint.locate.sites import Site, node_sites, stack_sites
from graphlint.project import Project
from graphlint.results import Finding, Fix, Location, Related
from graphlint.rule import Problem, Rule

if TYPE_CHECKING:
    from graphlint.locate.spans import SourceSpans


@dataclass
class _Group:
    message: str
    count: int = 0
    paths: list[str] = field(default_factory=list)
    parameters: dict[str, None] = field(default_factory=dict)  # ordered set
    related: dict[Location, str] = field(default_factory=dict)
    fix: Fix | str | None = None  # the first problem's fix there, or why it has none

    def render(self) -> str:
        return (
            self.message.replace("{where}", describe_where(self.paths))
            .replace("{occurrences}", f" ({self.count} occurrences)" if self.count > 1 else "")
            .replace("{count}", str(self.count))
            .replace("{parameters}", describe_parameters(list(self.parameters)))
        )


class Locator:
    """Places problems for one run; source files are parsed once and shared across targets."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self._spans: SourceSpans | None = None
        self._library_spans = LineSpans()

    @property
    def spans(self) -> SourceSpans:
        """The run's span finder, made on first use: a run with nothing to locate never imports libcst."""
        if self._spans is None:
            from graphlint.locate.spans import SourceSpans

            self._spans = SourceSpans()
        return self._spans

    @property
    def spans_if_used(self) -> SourceSpans | None:
        """The span finder if this run made one: the files it parsed can serve the policy stage too."""
        return self._spans

    def location(self, site: Site) -> Location:
        file = site.frame.file
        first_party = self.project.is_first_party(file)
        # Library files are never parsed: users do not edit them, and they can be thousands of lines long.
        span = self.spans.span(site) if first_party else self._library_spans.span(site.frame)
        line, column, end_line, end_column = span
        return Location(file, line, column, end_line, end_column, first_party=first_party)

    def place(self, rule: type[Rule], problems: Iterable[Problem], capture: Capture) -> list[Finding]:
        groups: dict[Location, _Group] = {}
        order = {node: index for index, node in enumerate(capture.forward.nodes)}
        # In the order the forward ran them, so that repeats read "layers.0 … layers.11".
        for problem in sorted(problems, key=lambda p: order.get(p.node, len(order))):
            if problem.node is not None:
                primary, library = node_sites(problem.node, self.project, capture.factory, problem.at_build_site)
            else:
                primary, library = stack_sites(problem.stack, self.project, capture.factory)
            if primary is None:
                continue  # nothing of the user's and no factory: there is no line to show it on
            location = self.location(primary)
            group = groups.setdefault(location, _Group(problem.message))
            group.count += 1
            group.paths.append(problem.where)
            group.parameters.update(dict.fromkeys(problem.parameters))
            if problem.fix is not None and group.fix is None and location.first_party:
                group.fix = self.spans.fix(primary, problem.fix)
            if library is not None:
                what = problem.node.meta.get("op", "op") if problem.node is not None else "built"
                group.related.setdefault(self.location(library), f"{what} in {library_name(library.frame.file)}")
            for node, label in problem.related:
                if isinstance(node, Frame):  # a line no node stands for, such as torch's own
                    group.related.setdefault(self.location(Site(node)), label)
                    continue
                related, related_library = node_sites(node, self.project, capture.factory)
                if related is None:
                    continue
                where = self.location(related)
                if where == location and related_library is not None:
                    where = self.location(related_library)  # all in a library: show the library line
                if where != location:
                    group.related.setdefault(where, label)
        return [
            Finding(
                rule_id=rule.id,
                rule_name=rule.name,
                severity=rule.severity,
                message=group.render(),
                location=location,
                related=tuple(Related(where, label) for where, label in group.related.items()),
                occurrences=group.count,
                targets=(capture.target,),
                fix=group.fix if isinstance(group.fix, Fix) else None,
                no_fix=group.fix if isinstance(group.fix, str) else "",
            )
            for location, group in groups.items()
        ]


def describe_where(paths: list[str]) -> str:
    """`blocks.0.attn`, `blocks.0.attn and blocks.1.attn`, or `blocks.0.attn … blocks.11.attn`."""
    unique = list(dict.fromkeys(p or "the model" for p in paths))
    if len(unique) == 1:
        return unique[0]
    if len(unique) == 2:
        return f"{unique[0]} and {unique[1]}"
    return f"{unique[0]} … {unique[-1]}"


def describe_parameters(names: list[str], shown: int = 3) -> str:
    """`a.weight, a.bias` or `enc.0.weight, enc.0.bias, enc.1.weight, ... (6 tensors in enc)`."""
    if len(names) <= shown:
        return ", ".join(names)
    common = os.path.commonprefix([name.split(".")[:-1] for name in names])  # element-wise on lists
    where = f" in {'.'.join(common)}" if common else ""
    return f"{', '.join(names[:shown])}, ... ({len(names)} tensors{where})"
