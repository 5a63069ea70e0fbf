"""GL101's match: the nodes the rule found in the graph, by name, in one typed record that the rule fills with
graph nodes and the fixer reads, by attribute, as the source nodes they ran at.

The record crosses locate as `Problem.roles` (name, node) pairs; `to_roles` and `from_site` are the one place
that turns it into them and back, so that a role the rule writes and one the fixer reads cannot differ by a
spelling: a name outside `STEPS` fails loudly in both directions. It imports no torch and no libcst, so that
the rule can fill it without either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from graphlint.rewrite.contract import FixSite, Role

N = TypeVar("N")  # a graph node (torch.fx.Node) in the rule, a located one (rewrite.contract.Role) in the fixer

# What a step between the products does, by the op's family (the rule's _STEP_NAMES); "view" before the softmax
# and "layout" after it for any other op.
STEPS = ("scale", "mask", "cast", "dropout")
_BEFORE = (*STEPS, "view")
_AFTER = (*STEPS, "layout")
_PROBABILITIES = "probabilities "  # a step after the softmax, as its role is named
_ELSEWHERE = "probabilities elsewhere"


@dataclass(frozen=True)
class Step(Generic[N]):
    """One op between the scores product and the values product, and what it does (`STEPS`, "view", "layout")."""

    kind: str
    node: N


@dataclass(frozen=True)
class AttentionMatch(Generic[N]):
    """The chain GL101 matched: the scores product, the steps from it to the softmax, the softmax, the steps on
    the probabilities, the product with the values, and every other use of the probabilities (which the fused
    call cannot give back). In the fixer, a node the locate stage could not place in the user's files is None
    (or missing from its tuple)."""

    scores: N | None = None
    before: tuple[Step[N], ...] = ()
    softmax: N | None = None
    after: tuple[Step[N], ...] = ()
    values: N | None = None
    elsewhere: tuple[N, ...] = ()

    def __post_init__(self) -> None:
        for steps, kinds, where in ((self.before, _BEFORE, "before"), (self.after, _AFTER, "after")):
            for step in steps:
                if step.kind not in kinds:
                    raise ValueError(f"GL101's match has no step {step.kind!r} {where} the softmax; one of "
                                     f"{', '.join(kinds)}")

    @property
    def dropout_after(self) -> bool:
        """The graph saw dropout on the probabilities."""
        return any(step.kind == "dropout" for step in self.after)

    def nodes(self) -> tuple[N, ...]:
        """Every node of the match, in the order of `to_roles`."""
        return tuple(node for _, node in self.to_roles())

    def to_roles(self) -> tuple[tuple[str, N], ...]:
        """The match as `Problem.roles`: (name, node) pairs, products and softmax by their field's name, a step
        by its kind (after the softmax prefixed "probabilities "), other uses as "probabilities elsewhere"."""
        roles: list[tuple[str, N]] = [("scores", self.scores)] if self.scores is not None else []
        roles += [(step.kind, step.node) for step in self.before]
        roles += [("softmax", self.softmax)] if self.softmax is not None else []
        roles += [(_PROBABILITIES + step.kind, step.node) for step in self.after]
        roles += [("values", self.values)] if self.values is not None else []
        roles += [(_ELSEWHERE, node) for node in self.elsewhere]
        return tuple(roles)

    @classmethod
    def from_site(cls, site: FixSite) -> AttentionMatch[Role]:
        """The match as the fixer reads it, from the site's located roles (`to_roles` resolved to source: a node
        outside the user's files is left out); a role name `to_roles` never writes raises ValueError."""
        fields: dict[str, Role] = {}
        before: list[Step[Role]] = []
        after: list[Step[Role]] = []
        elsewhere: list[Role] = []
        for role in site.roles:
            name = role.name
            if name in ("scores", "softmax", "values"):
                if name in fields:
                    raise ValueError(f"GL101's match has two {name!r} nodes")
                fields[name] = role
            elif name == _ELSEWHERE:
                elsewhere.append(role)
            elif name.startswith(_PROBABILITIES):
                after.append(Step(name[len(_PROBABILITIES):], role))
            elif name in _BEFORE:
                before.append(Step(name, role))
            else:
                raise ValueError(f"GL101's match has no role {name!r}")
        return cls(**fields, before=tuple(before), after=tuple(after), elsewhere=tuple(elsewhere))
