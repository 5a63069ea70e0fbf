"""What a rule is: an ID, a name, a severity, tags, a summary, documentation in four parts, and example
models that have the problem (BAD) and that do not (GOOD). The test suite lints every example, so a rule
cannot exist without tests.

A rule is a function of one read-only `Capture`: `check` yields `Problem`s anchored at forward-graph nodes,
and the locate step turns them into findings at the user's source spans, one per location.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import ClassVar, Iterable

from torch import fx

from graphlint.capture.frames import Frame
from graphlint.results import Severity

EXPECT_MARKER = re.compile(r"#\s*expect:\s*(GL\d{3}(?:\s*,\s*GL\d{3})*)")


@dataclass(frozen=True)
class Example:
    """A small, complete model file for a rule's tests and docs.

    It defines a zero-argument factory `make()` returning `(model, args)`. In a BAD example, each line where
    a finding must be reported ends with `# expect: GL101` (several IDs separated by commas).
    """

    source: str
    title: str = ""

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


@dataclass(frozen=True)
class Problem:
    """One occurrence of what a rule looks for, anchored at a forward-graph node, or at a user stack: the one
    that built something that never ran (an unused parameter), or a chosen outer frame of an op.

    `message` is one sentence in the user's terms. Problems at the same source location merge into one finding;
    these placeholders are then filled in from all of them:
    - `{where}`: the module paths (`blocks.0.attn … blocks.11.attn`);
    - `{occurrences}`: `" (12 occurrences)"`, or nothing for one;
    - `{count}`: the number of occurrences;
    - `{parameters}`: the union of `parameters`, grouped (`enc.0.weight, enc.0.bias, ... (4 tensors in enc)`).

    `related` are other nodes of the same pattern with a short label. With `at_build_site`, an op inside a
    torch.nn module is placed where the user constructed that module (the `nn.ReLU(inplace=True)`), not where
    it was called.
    """

    message: str
    node: fx.Node | None = None
    stack: tuple[Frame, ...] = ()  # the anchor when there is no node: the user stack that built or ran it
    module_path: str = ""  # for a problem without a node
    related: tuple[tuple[fx.Node, str], ...] = ()
    at_build_site: bool = False
    parameters: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return self.node.meta.get("module_path", "") if self.node is not None else self.module_path


class Rule:
    """Base class of every rule; see the module docstring. Subclasses fill in every class attribute."""

    id: ClassVar[str]  # "GL101": 1xx performance, 2xx autograd correctness, 3xx capture, 9xx tool
    name: ClassVar[str]  # "unfused-attention"
    severity: ClassVar[Severity]
    tags: ClassVar[tuple[str, ...]]
    precision: ClassVar[str] = "high"  # SARIF precision: very-high, high, medium, low
    summary: ClassVar[str]  # one line
    what: ClassVar[str]  # what it flags
    why: ClassVar[str]  # why it matters
    example: ClassVar[str]  # code that is flagged
    instead: ClassVar[str]  # what to write instead
    bad_examples: ClassVar[tuple[Example, ...]]
    good_examples: ClassVar[tuple[Example, ...]]

    def check(self, capture) -> Iterable[Problem]:
        raise NotImplementedError

    @classmethod
    def docs_markdown(cls) -> str:
        """The rule's documentation page, in the four parts every rule has."""
        return "\n".join([
            f"# {cls.id} {cls.name}",
            "",
            cls.summary,
            "",
            "## What it flags",
            "",
            textwrap.dedent(cls.what).strip(),
            "",
            "## Why it matters",
            "",
            textwrap.dedent(cls.why).strip(),
            "",
            "## Example",
            "",
            "```python",
            textwrap.dedent(cls.example).strip(),
            "```",
            "",
            "## Use instead",
            "",
            "```python",
            textwrap.dedent(cls.instead).strip(),
            "```",
            "",
        ])

    @classmethod
    def docs_text(cls) -> str:
        """The same documentation as plain text."""
        return re.sub(r"^```\w*\n", "", cls.docs_markdown(), flags=re.M).replace("```\n", "")


REQUIRED = ("id", "name", "severity", "tags", "summary", "what", "why", "example", "instead",
            "bad_examples", "good_examples")
RULE_ID = re.compile(r"GL\d{3}")


def anatomy_problems(rule: type[Rule]) -> list[str]:
    """What a rule class lacks of the required anatomy; empty when it is complete."""
    missing = [f"no {attr}" for attr in REQUIRED if not getattr(rule, attr, None)]
    if getattr(rule, "id", None) and not RULE_ID.fullmatch(rule.id):
        missing.append(f"id {rule.id!r} is not GLnnn")
    for example in getattr(rule, "bad_examples", ()) or ():
        if not example.expected_lines(rule.id):
            missing.append(f"a BAD example without a '# expect: {rule.id}' line")
    return missing
