"""Locate: turn the problems a rule found into findings at exact source spans, one finding per location.

A pattern that repeats in 12 layers runs the same source line 12 times: those problems share a location and
become one finding that says "12 occurrences" and names the module paths. The merge is explicit: problems
with different messages at one location each keep their sentence in the finding's message (in the order the
forward ran them, each with its own count), and when they offer different fixes the finding has none and
says why.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Iterable

from graphlint.capture import Capture, facts
from graphlint.capture.frames import Frame
from graphlint.files import library_name
from graphlint.locate.lines import LineSpans
from graphlint.locate.sites import Site, node_sites, stack_sites
from graphlint.project import Project
from graphlint.results import Finding, Fix, Location, Related
from graphlint.rule import Problem, Rule, fill

if TYPE_CHECKING:
    from graphlint.locate.spans import SourceSpans


@dataclass
class _Said:
    """The problems at one location that say the same thing."""

    first: Problem
    count: int = 0
    paths: list[str] = field(default_factory=list)
    parameters: dict[str, None] = field(default_factory=dict)  # ordered set

    def render(self) -> str:
        return fill(self.first.message, {
            **self.first.facts,
            "where": describe_where(self.paths),
            "occurrences": f" ({self.count} occurrences)" if self.count > 1 else "",
            "count": self.count,
            "parameters": describe_parameters(list(self.parameters)),
        })


@dataclass
class _Group:
    """Every problem of one rule at one location."""

    said: dict[str, _Said] = field(default_factory=dict)  # by message with the problem's own facts filled in
    related: dict[Location, str] = field(default_factory=dict)
    fixes: dict[object, Fix | str] = field(default_factory=dict)  # each distinct fixer's answer here
    saves_bytes: int = 0

    @property
    def count(self) -> int:
        return sum(said.count for said in self.said.values())

    def message(self) -> str:
        return " ".join(said.render() for said in self.said.values())

    def fix(self) -> Fix | str | None:
        """The fix all the problems here agree on, or why there is none; None when none offers one. Rewrites
        of different places (a helper called from two functions, each rewritten at its call) become one fix."""
        answers = list(dict.fromkeys(self.fixes.values()))
        if len(answers) <= 1:
            return answers[0] if answers else None
        refusal = next((answer for answer in answers if isinstance(answer, str)), None)
        return refusal or _together(answers) or "the occurrences at this location need different rewrites"


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
            group = groups.setdefault(location, _Group())
            said = group.said.setdefault(problem.own_message, _Said(problem))
            said.count += 1
            said.paths.append(problem.where)
            said.parameters.update(dict.fromkeys(problem.parameters))
            group.saves_bytes += problem.saves_bytes
            if problem.fix is not None and location.first_party:
                roles = self._role_sites(problem, capture)
                key = (_fixer_key(problem.fix), roles)  # layers that ran the same lines share one fix
                if key not in group.fixes:
                    group.fixes[key] = self.spans.fix(primary, problem.fix, roles)
            if library is not None:
                what = (facts(problem.node).op or "op") if problem.node is not None else "built"
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
        findings = []
        for location, group in groups.items():
            fix = group.fix()
            findings.append(Finding(
                rule_id=rule.id,
                rule_name=rule.name,
                severity=rule.severity,
                message=group.message() + _price(group.saves_bytes),
                location=location,
                related=tuple(Related(where, label) for where, label in group.related.items()),
                occurrences=group.count,
                targets=(capture.target,),
                fix=fix if isinstance(fix, Fix) else None,
                no_fix=fix if isinstance(fix, str) else "",
                saves_bytes=group.saves_bytes,
            ))
        return findings

    def _role_sites(self, problem: Problem, capture: Capture) -> tuple[tuple[str, Site], ...]:
        """Each node the rule matched, at the line of the user's code it ran at; nodes in no file of the
        user's are left out (the fixer cannot edit a library)."""
        found = []
        for name, node in problem.roles:
            site = node_sites(node, self.project, capture.factory)[0]
            if site is not None and self.project.is_first_party(site.frame.file):
                found.append((name, site))
        return tuple(found)


# From this much on, what a fix saves for backward is worth a sentence in the message, not only a property.
LARGE_SAVING = 256 * 2**20


def _price(saves: int) -> str:
    from graphlint.memory.sizes import format_bytes

    if saves < LARGE_SAVING:
        return ""
    return f" The fix keeps {format_bytes(saves)} less for backward at the target's input shapes."


def _together(fixes: list[Fix]) -> Fix | None:
    """One fix made of several whose edits touch different text (an edit they share is made once), of one
    applicability; None when two of them would change the same text differently."""
    if len({f.applicability for f in fixes}) != 1:
        return None
    edits = sorted({e for f in fixes for e in f.edits}, key=lambda e: (e.path, e.line, e.column, e.end_line, e.end_column))
    for before, after in zip(edits, edits[1:], strict=False):
        if before.path == after.path and (after.line, after.column) < (before.end_line, before.end_column):
            return None
    messages = " ".join(dict.fromkeys(f.message for f in fixes))
    return Fix(messages, tuple(edits), fixes[0].applicability)


def _fixer_key(fixer) -> object:
    """Fixers that rewrite alike: the same function, or partials of it with equal arguments (a rule makes one
    partial per problem)."""
    if isinstance(fixer, functools.partial):
        key = (fixer.func, fixer.args, tuple(sorted(fixer.keywords.items())))
        try:
            hash(key)
        except TypeError:  # an argument that cannot be compared: this partial is its own kind
            return fixer
        return key
    return fixer


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
