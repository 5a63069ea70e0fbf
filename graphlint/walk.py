"""Searches of the forward graph that rules share: from a node up (to its inputs) or down (to its users), passing
through given ops or where a predicate holds, stopping where another holds, within a limit.

Each rule keeps its own bound (graphlint.ops has the common ones): a longer path is other code, and the bound
keeps every search short. `through` is a set of op names (the capture's canonical names, graphlint.opnames) or
a predicate of the node.

- `reach` and `find`: breadth-first, nearest first, each node once (or, with `again`, until it is passed);
- `reachable`: the nodes `reach` yields, as a set;
- `chain`: up a line of first arguments (`x.float().view(...)` back to `x`);
- `line`: along any one-next-node rule (a value's only user);
- `operands`: an expression's terms, every occurrence counted (`x * x` has two).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, Literal, NamedTuple

from torch import fx

Direction = Literal["up", "down"]
UP: Direction = "up"  # to a node's inputs
DOWN: Direction = "down"  # to the nodes that use it
Through = Collection[str] | Callable[[fx.Node], bool]


def op(node: fx.Node) -> str | None:
    """`facts(node).op`, the one fact every walk reads, without making the record."""
    return node.meta.get("op")


def _predicate(through: Through | None) -> Callable[[fx.Node], bool]:
    if through is None:
        return lambda node: True
    if callable(through):
        return through
    return lambda node: op(node) in through


class Step(NamedTuple):
    """A node a search reached, how many steps from a start node, and the step before (a start node has none)."""

    node: fx.Node
    depth: int
    before: tuple | None  # (node, depth, before) of the node it was reached from

    @property
    def came_from(self) -> fx.Node | None:
        """The node it was reached from; None for a start node."""
        return self.before[0] if self.before is not None else None

    def path(self) -> list[fx.Node]:
        """The nodes from the start node to this one, in the order walked."""
        nodes: list[fx.Node] = []
        entry: tuple | None = self
        while entry is not None:
            nodes.append(entry[0])
            entry = entry[2]
        return nodes[::-1]


def _search(start: Iterable[fx.Node], direction: Direction, stop: Callable[[fx.Node], bool] | None,
            through: Through | None, limit: int | None, again: bool, passed: set[fx.Node] | None) -> Iterator[Step]:
    names = None if through is None or callable(through) else through  # looked up here, without a call per node
    passed = set() if passed is None else passed
    up = direction == UP
    considered: set[fx.Node] = set()
    skipped = passed if again else considered  # a node in it is not asked again
    # Plain (node, depth, before) entries, made a Step only when yielded: a search may reach the whole graph.
    queue: deque[tuple] = deque((node, 0, None) for node in start)
    while queue:
        entry = queue.popleft()
        node, depth = entry[0], entry[1]
        if node in skipped:
            continue
        considered.add(node)
        if stop is None:
            yield tuple.__new__(Step, entry)
        elif stop(node):
            yield tuple.__new__(Step, entry)
            continue
        # Asked after the caller saw the node: a caller that returns there never has it asked.
        if through is not None and not (op(node) in names if names is not None else through(node)):
            continue
        passed.add(node)
        if limit is None or depth < limit:
            queue.extend((following, depth + 1, entry) for following in (node.all_input_nodes if up else node.users)
                         if following not in skipped)


def reachable(start: Iterable[fx.Node], direction: Direction, *, through: Through | None = None,
              found: set[fx.Node] | None = None) -> set[fx.Node]:
    """Every node `reach` would yield, as a set, without the order or the steps (a closure over a whole graph).
    Nodes already in `found` count as reached, and the search does not go past them; the set is filled in."""
    passes = None if through is None else _predicate(through)
    up = direction == UP  # read once: this loop may visit the whole graph on each call
    found = set() if found is None else found
    pending = list(start)
    while pending:
        node = pending.pop()
        if node not in found:
            found.add(node)
            if passes is None or passes(node):
                pending.extend(node.all_input_nodes if up else node.users)
    return found


def reach(start: Iterable[fx.Node], direction: Direction, *, through: Through | None = None,
          limit: int | None = None) -> Iterator[Step]:
    """Every node reached from the `start` nodes (step 0), breadth-first, each once: the search goes on past a
    node where `through` holds (every node when None), to nodes at most `limit` steps from a start node."""
    return _search(start, direction, None, through, limit, again=False, passed=None)


def find(start: Iterable[fx.Node], direction: Direction, stop: Callable[[fx.Node], bool], *,
         through: Through | None = None, limit: int | None = None, again: bool = False,
         passed: set[fx.Node] | None = None) -> Iterator[Step]:
    """The nodes where `stop` holds, nearest first, searching from the `start` nodes (step 0) past the nodes
    where it does not and `through` does (every node when None), at most `limit` steps from a start node; never
    past a stop. Each node is asked once; with `again`, a node not passed is asked again each time the search
    reaches it, since the predicates may read `passed`, the set of nodes passed so far (the caller's, if given)."""
    return _search(start, direction, stop, through, limit, again, passed)


class Chain(NamedTuple):
    """A walk up a line of first arguments: the nodes it passed, in order, and the value where it ended; `found`
    when `stop` held there."""

    nodes: tuple[fx.Node, ...]
    end: Any
    found: bool


def chain(value: Any, through: Through, *, stop: Callable[[fx.Node], bool] | None = None,
          limit: int | None = None) -> Chain:
    """From `value` to its first argument, and on, while the node is one of `through` (and has arguments), at
    most `limit` steps: ends at a stop, at another op or a value that is not a node, or where the last step
    allowed led (asked nothing there)."""
    names = None if callable(through) else through
    nodes: list[fx.Node] = []
    while isinstance(value, fx.Node) and (limit is None or len(nodes) < limit):
        if stop is not None and stop(value):
            return Chain(tuple(nodes), value, True)
        if not (op(value) in names if names is not None else through(value)) or not value.args:
            break
        nodes.append(value)
        value = value.args[0]
    return Chain(tuple(nodes), value, False)


def line(node: fx.Node | None, following: Callable[[fx.Node], fx.Node | None], *,
         limit: int | None = None) -> Iterator[fx.Node]:
    """`node` and each node `following` leads to from the one before (None ends the line), at most `limit`
    nodes in all."""
    count = 0
    while node is not None:
        yield node
        count += 1
        if limit is not None and count >= limit:
            return
        node = following(node)


def operands(value: Any, expand: Callable[[Any], bool], *, limit: int) -> list[Any] | None:
    """The terms of an expression, depth-first: `value`, and the arguments of every term where `expand` holds,
    each occurrence counted (a value used twice is two terms); None when there are more than `limit`."""
    terms: list[Any] = []
    stack = [value]
    while stack:
        term = stack.pop()
        if len(terms) == limit:
            return None
        terms.append(term)
        if expand(term):
            stack.extend(term.args)
    return terms
