"""What a rule is: an ID, a name, a severity, tags, a summary, documentation in four parts, and example
models that have the problem (BAD) and that do not (GOOD). The test suite lints every example, so a rule
cannot exist without tests.

A rule is a function of one read-only `Capture`: `check` yields `Problem`s anchored at forward-graph nodes,
and the locate step turns them into findings at the user's source spans, one per location.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, ClassVar, TypeVar
from collections.abc import Callable, Iterable, Iterator, Mapping

from graphlint.results import Severity

if TYPE_CHECKING:  # a rule's metadata is read without torch (graphlint.catalog); its problems are made with it
    from torch import fx

    from graphlint.capture.frames import Frame
    from graphlint.rewrite.contract import Fixer, FixSite, Rewrite

# The generated rule reference (docs/rules.md) as published; pyproject.toml's [project.urls] Documentation.
RULES_REFERENCE_URL = "https://github.com/torch-graphlint/torch-graphlint/blob/main/docs/rules.md"
EXPECT_MARKER = re.compile(r"#\s*expect:\s*([A-Z]{2,}\d{3}(?:\s*,\s*[A-Z]{2,}\d{3})*)")  # GL101, a plugin's GLX001


@dataclass(frozen=True)
class Example:
    """A small, complete model file for a rule's tests and docs.

    It defines a zero-argument factory `make()` returning `(model, args)`. In a BAD example, each line where
    a finding must be reported ends with `# expect: GL101` (several IDs separated by commas).
    """

    source: str
    title: str = ""
    fixed: str = ""  # for a BAD example of a rule that fixes: the source after every fix (`--unsafe-fixes`)
    settings: tuple[tuple[str, object], ...] = ()  # configuration the example is linted with (`memory_budget`)

    @property
    def fixed_code(self) -> str:
        return textwrap.dedent(self.fixed).strip() + "\n" if self.fixed else ""

    @property
    def code(self) -> str:
        return textwrap.dedent(self.source).strip() + "\n"

    def expected_lines(self, rule_id: str) -> list[int]:
        lines = []
        for number, line in enumerate(self.code.splitlines(), start=1):
            match = EXPECT_MARKER.search(line)
            if match and rule_id in {part.strip() for part in match.group(1).split(",")}:
                lines.append(number)
        return lines


class LazyFixer:
    """A rule's fixer, imported on its first call. It decorates a function of the rule's own module whose body
    imports the fixer and returns it:

        @LazyFixer
        def library_norm():
            from .fix import library_norm  # the rule package's fix.py
            return library_norm

    That import is at function level, so tests/test_import_graph.py counts the rule → fixer edge and a renamed
    fixer fails the tests (tests/test_lazy_fixers.py loads every one), while loading the rules imports no fixer
    and a run with nothing to fix never imports libcst. `library_norm.bound(kind="rms")` is the same fixer called
    as `function(site, kind="rms")`, as `functools.partial` would call it."""

    def __init__(self, load: Callable[[], Callable[..., Rewrite | str]], **keywords: object) -> None:
        self.load = load
        self.keywords = keywords

    def bound(self, **keywords: object) -> LazyFixer:
        """The same fixer, called with these keywords beside the site."""
        return LazyFixer(self.load, **{**self.keywords, **keywords})

    @property
    def function(self) -> Callable[..., Rewrite | str]:
        """The fixer's function, imported now."""
        return self.load()

    def __call__(self, site: FixSite) -> Rewrite | str:
        return self.function(site, **self.keywords)

    def __repr__(self) -> str:
        keywords = "".join(f", {name}={value!r}" for name, value in self.keywords.items())
        return f"LazyFixer({self.load.__module__}.{self.load.__qualname__}{keywords})"


Matched = TypeVar("Matched")  # a match's node: an fx.Node in the rule, a contract.Role in the fixer
MatchT = TypeVar("MatchT", bound="Match")


@dataclass(frozen=True)
class Match:
    """What a rule matched, typed: the base of a frozen dataclass whose fields name the nodes its fix is built
    from, each a node, None, or a tuple of nodes (`class NormMatch(Match, Generic[Matched])`, `step: Matched`).
    The rule fills it with graph nodes (`Problem.match`); locate hands the fixer the same record with each node
    replaced by the libcst node it ran at (`FixSite.match`, each a `graphlint.rewrite.contract.Role`), None, or
    left out of its tuple, where it ran in no file of the user's. A fixer reads it by attribute, so that a
    misspelt role is an error, not an empty answer."""

    def nodes(self) -> Iterator[tuple[str, object]]:
        """(field name, node) for every node of the record, in field order."""
        for each in fields(self):
            value = getattr(self, each.name)
            for node in value if isinstance(value, tuple) else (value,):
                if node is not None:
                    yield each.name, node

    def resolved(self: MatchT, resolve: Callable[[str, object], object | None]) -> MatchT:
        """The same record with each node replaced by `resolve(field name, node)`; an answer of None is None in a
        field of one node and left out of a tuple."""
        values = {}
        for each in fields(self):
            value = getattr(self, each.name)
            if isinstance(value, tuple):
                values[each.name] = tuple(found for node in value if (found := resolve(each.name, node)) is not None)
            elif value is not None:
                values[each.name] = resolve(each.name, value)
        return replace(self, **values)


# Filled in by the merge of problems at one location (graphlint.locate.place), never by a problem's facts.
MERGE_PLACEHOLDERS = frozenset({"where", "occurrences", "count", "parameters", "them"})
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def fill(template: str, values: Mapping[str, object]) -> str:
    """The one formatter of messages: `{name}` becomes `values[name]` in a single pass (a value that contains
    braces is never filled again); braces around a name not in `values` stay."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


@dataclass(frozen=True)
class Problem:
    """One occurrence of what a rule looks for, anchored at a forward-graph node, or at a user stack: the one
    that built something that never ran (an unused parameter), or a chosen outer frame of an op.

    `message` is one sentence in the user's terms, a template that `fill` completes: `{name}` for a name in
    `facts` is that fact (`Problem(message="The in-place {op} ...", facts={"op": "mul_"})`). Problems at the
    same source location merge into one finding (graphlint.locate.place); these placeholders are then filled
    in from all the problems with the same message:
    - `{where}`: the module paths (`blocks.0.attn … blocks.11.attn`);
    - `{occurrences}`: `" (12 occurrences)"`, or nothing for one;
    - `{count}`: the number of occurrences;
    - `{parameters}`: the union of `parameters`, grouped (`enc.0.weight, enc.0.bias, ... (4 tensors in enc)`);
    - `{them}`: "it" for one of those parameters, "them" for more.
    Braces around any other word are left as they are.

    `related` are other nodes of the same pattern (or frames of lines no node stands for, such as a torch
    helper's) with a short label. With `at_build_site`, an op inside a
    torch.nn module is placed where the user constructed that module (the `nn.ReLU(inplace=True)`), not where
    it was called. `fix` rewrites the libcst node at the finding's span (graphlint.rewrite.contract), a `LazyFixer`
    so that nothing imports it before a finding needs it; `match` is what the rule matched, a `Match`
    of named nodes, which locate hands the fixer as the libcst nodes they ran at, so that a fix is built from
    the match rather than from a second reading of the source (`roles`, the same as `(name, node)` pairs, is
    the older form that GL101 still gives).
    """

    message: str
    node: fx.Node | None = None
    stack: tuple[Frame, ...] = ()  # the anchor when there is no node: the user stack that built or ran it
    module_path: str = ""  # for a problem without a node
    related: tuple[tuple[fx.Node | Frame, str], ...] = ()
    at_build_site: bool = False
    parameters: tuple[str, ...] = ()
    fix: Fixer | None = None  # the rewrite of the source at the finding's span, when the rule offers one
    roles: tuple[tuple[str, fx.Node], ...] = ()  # what the fix is built from, by role (GL101; the others: `match`)
    match: Match | None = None  # what the fix is built from, typed
    facts: Mapping[str, object] = field(default_factory=dict, compare=False)  # what the message names
    saves_bytes: int = 0  # activation memory the fix would keep less for backward here (graphlint.memory.savings)

    def __post_init__(self) -> None:
        if MERGE_PLACEHOLDERS & set(self.facts):
            raise ValueError(f"a problem's facts cannot be named {sorted(MERGE_PLACEHOLDERS & set(self.facts))}")

    @property
    def own_message(self) -> str:
        """The message with this problem's own facts filled in; the placeholders of a merge remain."""
        return fill(self.message, self.facts)

    @property
    def where(self) -> str:
        from graphlint.capture.contract import facts

        return facts(self.node).module_path if self.node is not None else self.module_path


class Rule:
    """Base class of every rule; see the module docstring. Subclasses fill in every class attribute."""

    id: ClassVar[str]  # "GL101": 1xx performance, 2xx autograd correctness, 3xx capture, 9xx tool
    name: ClassVar[str]  # "unfused-attention"
    severity: ClassVar[Severity]
    tags: ClassVar[tuple[str, ...]]
    precision: ClassVar[str] = "high"  # SARIF precision: very-high, high, medium, low
    default_enabled: ClassVar[bool] = True  # False: runs only when selected by ID or prefix
    summary: ClassVar[str]  # one line
    what: ClassVar[str]  # what it flags
    why: ClassVar[str]  # why it matters
    example: ClassVar[str]  # code that is flagged
    instead: ClassVar[str]  # what to write instead
    fixes: ClassVar[str] = ""  # what `--fix` rewrites and what it leaves alone; empty: the rule has no fix
    bad_examples: ClassVar[tuple[Example, ...]]
    good_examples: ClassVar[tuple[Example, ...]]
    # True: the rule weighs the other rules' findings, so the engine runs it after them and passes them in
    reads_findings: ClassVar[bool] = False

    def check(self, capture) -> Iterable[Problem]:
        """The problems in one capture; a rule that `reads_findings` is called as `check(capture, findings)`."""
        raise NotImplementedError

    @classmethod
    def help_uri(cls) -> str:
        """The rule's section of the published rule reference (GitHub's anchor for its heading)."""
        return f"{RULES_REFERENCE_URL}#{cls.id.lower()}-{cls.name}"

    @classmethod
    def docs_markdown(cls, heading: str = "#", with_examples: bool = False) -> str:
        """The rule's documentation page in the four parts every rule has, and what `--fix` does; `heading` is
        its title's level."""
        sub = heading + "#"
        parts = [
            f"{heading} {cls.id} {cls.name}",
            "",
            f"{cls.summary} Default severity: {cls.severity.value}"
            + ("; off unless selected." if not cls.default_enabled else "."),
            "",
            f"{sub} What it flags", "", textwrap.dedent(cls.what).strip(), "",
            f"{sub} Why it matters", "", textwrap.dedent(cls.why).strip(), "",
            f"{sub} Example", "", "```python", textwrap.dedent(cls.example).strip(), "```", "",
            f"{sub} Use instead", "", "```python", textwrap.dedent(cls.instead).strip(), "```", "",
            f"{sub} Fix", "", textwrap.dedent(cls.fixes).strip() if cls.fixes else "None: `--fix` leaves these "
            "findings alone.", "",
        ]
        if with_examples:
            parts += [f"{sub} Example models", "",
                      "The test suite lints these; `# expect:` marks the lines that must be reported.", ""]
            for label, examples in (("Flagged", cls.bad_examples), ("Not flagged", cls.good_examples)):
                for example in examples:
                    parts += [f"{label}: {example.title}.", "", "```python", example.code.rstrip(), "```", ""]
                    if example.fixed:
                        parts += ["After `graphlint check --fix`:", "", "```python", example.fixed_code.rstrip(),
                                  "```", ""]
        return "\n".join(parts)

    @classmethod
    def docs_text(cls, with_examples: bool = False) -> str:
        """The same documentation as plain text, for the terminal and SARIF's help.text."""
        return re.sub(r"^```\w*\n", "", cls.docs_markdown(with_examples=with_examples), flags=re.M).replace("```\n", "")


def rule_reference(rules) -> str:
    """docs/rules.md: every rule's documentation and example models, generated by `graphlint rules --format markdown`."""
    index = [f"| [{r.id}](#{r.id.lower()}-{r.name}) | {r.name} | {r.severity.value} | {r.summary} |" for r in rules]
    parts = [
        "# graphlint rule reference",
        "",
        "Generated by `graphlint rules --format markdown > docs/rules.md`; do not edit by hand.",
        "",
        "| ID | name | default | summary |",
        "|---|---|---|---|",
        *index,
        "",
    ]
    for rule in rules:
        parts.append(rule.docs_markdown(heading="##", with_examples=True))
    return "\n".join(parts)


REQUIRED = ("id", "name", "severity", "tags", "summary", "what", "why", "example", "instead",
            "bad_examples", "good_examples")
RULE_ID = re.compile(r"[A-Z]{2,}\d{3}")  # GL101; a plugin's rules have their own letters, GLX001


def anatomy_problems(rule: type[Rule]) -> list[str]:
    """What a rule class lacks of the required anatomy; empty when it is complete."""
    missing = [f"no {attr}" for attr in REQUIRED if not getattr(rule, attr, None)]
    if getattr(rule, "id", None) and not RULE_ID.fullmatch(rule.id):
        missing.append(f"id {rule.id!r} is not capital letters and three digits (GL101)")
    for example in getattr(rule, "bad_examples", ()) or ():
        if not example.expected_lines(rule.id):
            missing.append(f"a BAD example without a '# expect: {rule.id}' line")
    return missing
