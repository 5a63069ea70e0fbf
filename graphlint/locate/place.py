"""Locate: turn the problems a rule found into findings at exact source spans, one finding per location.

A pattern that repeats in 12 layers runs the same source line 12 times: those problems share a location and
become one finding that says "12 occurrences" and names the module paths. The merge is explicit: problems
with different messages at one location each keep their sentence in the finding's message (in the order the
forward ran them, each with its own count), and when they offer different fixes the finding has none and
says why.

Detection stands alone: a failure of graphlint's own code while finding a span, a related site or a role, or
while building a fix, never costs the finding. The finding keeps its line (the whole line when the exact span
could not be found) and says, in `no_fix`, that graphlint failed there; `Locator.failures` lists what failed,
for the run to name graphlint, once, as the culprit.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Iterable

from graphlint.capture import Capture, facts
from graphlint.capture.frames import Frame
from graphlint.errors import one_line
from graphlint.files import library_name
from graphlint.locate.lines import LineSpans
from graphlint.locate.sites import Site, node_sites, stack_sites
from graphlint.project import Project
from graphlint.results import Finding, Fix, Location, Related
from graphlint.rule import LazyFixer, Match, Problem, Rule, fill

if TYPE_CHECKING:
    from torch import fx

    from graphlint.locate.spans import SourceSpans


@dataclass
class _Said:
    """The problems at one location that say the same thing."""

    first: Problem
    count: int = 0
    paths: list[str] = field(default_factory=list)
    parameters: dict[str, None] = field(default_factory=dict)  # ordered set
    drawn: tuple[str, ...] = ()  # generators the forward drew from: the count holds for this draw

    def render(self) -> str:
        return fill(self.first.message, {
            **self.first.facts,
            "where": describe_where(self.paths),
            "occurrences": self._occurrences(),
            "count": self.count,
            "parameters": describe_parameters(list(self.parameters)),
            "them": "it" if len(self.parameters) == 1 else "them",
        })

    def _occurrences(self) -> str:
        if self.count <= 1:
            return ""
        if not self.drawn:
            return f" ({self.count} occurrences)"
        return (f" ({self.count} occurrences on this capture's draw: the forward draws from "
                f"{' and '.join(f'`{name}`' for name in self.drawn)}, so the count may differ from step to step)")


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


def fix_failed(error: BaseException) -> str:
    """A finding's `no_fix` when graphlint's own code failed while building its fix."""
    return f"graphlint could not build this fix: {one_line(error)}; please report it with --debug"


class Locator:
    """Places problems for one run; source files are parsed once and shared across targets. `failures` names
    each place where graphlint's own code failed after detection (the findings are kept regardless)."""

    def __init__(self, project: Project, debug: bool = False) -> None:
        self.project = project
        self.debug = debug
        self.failures: list[str] = []
        self._spans: SourceSpans | None = None
        self._library_spans = LineSpans()

    def _failed(self, what: str, error: BaseException) -> None:
        if self.debug:
            traceback.print_exception(error)
        self.failures.append(f"{what}: {one_line(error)}")

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

    def location(self, site: Site, rule_id: str = "") -> Location:
        file = site.frame.file
        first_party = self.project.is_first_party(file)
        # Library files are never parsed: users do not edit them, and they can be thousands of lines long.
        if first_party:
            try:
                span = self.spans.span(site)
            except Exception as error:  # graphlint's bug: the finding keeps its line, without the exact span
                self._failed(f"finding the exact span of a {rule_id or 'finding'} at "
                             f"{os.path.basename(file)}:{site.frame.line}", error)
                span = self._library_spans.span(site.frame)
        else:
            span = self._library_spans.span(site.frame)
        line, column, end_line, end_column = span
        return Location(file, line, column, end_line, end_column, first_party=first_party)

    def place(self, rule: type[Rule], problems: Iterable[Problem], capture: Capture) -> list[Finding]:
        """The problems as findings, one per location. Never raises for graphlint's own failures after
        detection: see the module docstring."""
        problems = list(problems)
        try:
            return self._place(rule, problems, capture)
        except Exception as error:  # a bug in the merge itself: each problem alone, at its plain line
            self._failed(f"placing the {rule.id} findings", error)
            return self._bare(rule, problems, capture)

    def _sites(self, problem: Problem, capture: Capture, rule_id: str):
        """(primary site, library site or None); the innermost frame of the node when placing it failed."""
        try:
            if problem.node is not None:
                return node_sites(problem.node, self.project, capture.factory, problem.at_build_site)
            return stack_sites(problem.stack, self.project, capture.factory)
        except Exception as error:
            self._failed(f"placing a {rule_id} finding", error)
            stack = (problem.node.meta.get("stack") or ()) if problem.node is not None else problem.stack
            return stack_sites(tuple(stack), self.project, capture.factory)

    def _place(self, rule: type[Rule], problems: list[Problem], capture: Capture) -> list[Finding]:
        groups: dict[Location, _Group] = {}
        order = {node: index for index, node in enumerate(capture.forward.nodes)}
        # In the order the forward ran them, so that repeats read "layers.0 … layers.11".
        for problem in sorted(problems, key=lambda p: order.get(p.node, len(order))):
            primary, library = self._sites(problem, capture, rule.id)
            if primary is None:
                continue  # nothing of the user's and no factory: there is no line to show it on
            location = self.location(primary, rule.id)
            group = groups.setdefault(location, _Group())
            said = group.said.setdefault(problem.own_message, _Said(problem, drawn=capture.python_draws))
            said.count += 1
            said.paths.append(problem.where)
            said.parameters.update(dict.fromkeys(problem.parameters))
            group.saves_bytes += problem.saves_bytes
            if problem.fix is not None and location.first_party:
                self._add_fix(group, rule, problem, primary, capture)
            try:
                self._add_related(group, location, problem, library, capture, rule.id)
            except Exception as error:  # the finding stands without its related locations
                self._failed(f"locating a site related to a {rule.id} finding", error)
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

    def _add_fix(self, group: _Group, rule: type[Rule], problem: Problem, primary: Site, capture: Capture) -> None:
        """The problem's fix at its site, once per fixer and roles; a failure becomes the finding's `no_fix`."""
        try:
            roles, match = self._role_sites(problem, capture)
            key = (_fixer_key(problem.fix), roles, match)  # layers that ran the same lines share one fix
            if key not in group.fixes:
                group.fixes[key] = self.spans.fix(primary, problem.fix, roles, capture.modules, match)
        except Exception as error:
            self._failed(f"building the {rule.id} fix at {os.path.basename(primary.frame.file)}:{primary.frame.line}",
                         error)
            group.fixes[("failed", id(problem))] = fix_failed(error)

    def _add_related(self, group: _Group, location: Location, problem: Problem, library: Site | None,
                     capture: Capture, rule_id: str) -> None:
        if library is not None:
            what = (facts(problem.node).op or "op") if problem.node is not None else "built"
            group.related.setdefault(self.location(library, rule_id), f"{what} in {library_name(library.frame.file)}")
        for node, label in problem.related:
            if isinstance(node, Frame):  # a line no node stands for, such as torch's own
                group.related.setdefault(self.location(Site(node), rule_id), label)
                continue
            related, related_library = node_sites(node, self.project, capture.factory)
            if related is None:
                continue
            where = self.location(related, rule_id)
            if where == location and related_library is not None:
                where = self.location(related_library, rule_id)  # all in a library: show the library line
            if where != location:
                group.related.setdefault(where, label)

    def _bare(self, rule: type[Rule], problems: list[Problem], capture: Capture) -> list[Finding]:
        """Each problem as its own finding at its plain line, with no fix: what is left when merging failed."""
        findings = {}
        for problem in problems:
            try:
                primary, _ = self._sites(problem, capture, rule.id)
                if primary is None:
                    continue
                file = primary.frame.file
                line, column, end_line, end_column = self._library_spans.span(primary.frame)
                location = Location(file, line, column, end_line, end_column,
                                    first_party=self.project.is_first_party(file))
                message = fill(problem.own_message, {"where": problem.where, "occurrences": "", "count": 1,
                                                     "parameters": describe_parameters(list(problem.parameters)),
                                                     "them": "it" if len(problem.parameters) == 1 else "them"})
            except Exception as error:
                self._failed(f"placing a {rule.id} finding", error)
                continue
            key = (location, message)
            if key in findings:
                findings[key] = dataclasses.replace(findings[key], occurrences=findings[key].occurrences + 1)
                continue
            findings[key] = Finding(rule_id=rule.id, rule_name=rule.name, severity=rule.severity, message=message,
                                    location=location, targets=(capture.target,),
                                    no_fix=fix_failed(RuntimeError("the findings could not be merged"))
                                    if problem.fix is not None else "")
        return list(findings.values())

    def _role_sites(self, problem: Problem, capture: Capture) -> tuple[tuple[tuple[str, Site], ...], Match | None]:
        """(the roles, the match) with each node the rule matched at the line of the user's code it ran at; nodes
        in no file of the user's are left out (the fixer cannot edit a library)."""

        def site(node: fx.Node) -> Site | None:
            found = node_sites(node, self.project, capture.factory)[0]
            return found if found is not None and self.project.is_first_party(found.frame.file) else None

        roles = tuple((name, found) for name, node in problem.roles if (found := site(node)) is not None)
        return roles, problem.match.resolved(lambda _, node: site(node)) if problem.match is not None else None


# From this much on, what a fix saves for backward is worth a sentence in the message, not only a property.
LARGE_SAVING = 256 * 2**20


def _price(saves: int) -> str:
    from graphlint.sizes import format_bytes

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
    """Fixers that rewrite alike: the same function, or partials (or `LazyFixer`s) of it with equal arguments (a
    rule makes one per problem)."""
    if isinstance(fixer, LazyFixer):
        key = (fixer.load, tuple(sorted(fixer.keywords.items())))
    elif isinstance(fixer, functools.partial):
        key = (fixer.func, fixer.args, tuple(sorted(fixer.keywords.items())))
    else:
        return fixer
    try:
        hash(key)
    except TypeError:  # an argument that cannot be compared: this fixer is its own kind
        return fixer
    return key


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
