"""Locate: turn the problems a rule found into findings at exact source spans, one finding per location.

A pattern that repeats in 12 layers runs the same source line 12 times: those problems share a location and
become one finding that says "12 occurrences" and names the module paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from graphlint.capture import Capture
from graphlint.files import library_name
from graphlint.locate.sites import Site, node_sites
from graphlint.locate.spans import SourceSpans
from graphlint.project import Project
from graphlint.results import Finding, Location, Related
from graphlint.rule import Problem, Rule


@dataclass
class _Group:
    message: str
    count: int = 0
    paths: list[str] = field(default_factory=list)
    related: dict[Location, str] = field(default_factory=dict)


class Locator:
    """Places problems for one run; source files are parsed once and shared across targets."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.spans = SourceSpans()

    def location(self, site: Site) -> Location:
        line, column, end_line, end_column = self.spans.span(site)
        file = site.frame.file
        return Location(file, line, column, end_line, end_column, first_party=self.project.is_first_party(file))

    def place(self, rule: type[Rule], problems: Iterable[Problem], capture: Capture) -> list[Finding]:
        groups: dict[Location, _Group] = {}
        for problem in problems:
            primary, library = node_sites(problem.node, self.project, capture.factory, problem.at_build_site)
            if primary is None:
                continue  # nothing of the user's and no factory: there is no line to show it on
            location = self.location(primary)
            group = groups.setdefault(location, _Group(problem.message))
            group.count += 1
            group.paths.append(problem.node.meta.get("module_path", ""))
            if library is not None:
                label = f"{problem.node.meta.get('op', 'op')} in {library_name(library.frame.file)}"
                group.related.setdefault(self.location(library), label)
            for node, label in problem.related:
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
                message=group.message.replace("{where}", describe_where(group.paths, group.count)),
                location=location,
                related=tuple(Related(where, label) for where, label in group.related.items()),
                occurrences=group.count,
                target=capture.target,
            )
            for location, group in groups.items()
        ]


def describe_where(paths: list[str], count: int) -> str:
    """`blocks.0.attn`, `blocks.0.attn and blocks.1.attn`, or `blocks.0.attn … blocks.11.attn (12 occurrences)`."""
    unique = list(dict.fromkeys(p or "the model" for p in paths))
    if len(unique) == 1:
        text = unique[0]
    elif len(unique) == 2:
        text = f"{unique[0]} and {unique[1]}"
    else:
        text = f"{unique[0]} … {unique[-1]}"
    return f"{text} ({count} occurrences)" if count > 1 else text
