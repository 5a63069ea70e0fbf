"""No import cycle among graphlint's modules and the rules, read statically from the source with `ast`.

Every import that runs counts, at module level or inside a function: a function-level import only delays when a
dependency is paid (torch, libcst), the layer still reaches back up, and the cycle this test was written for
(fix/apply → fix/prove → session → fix/apply) was made of function-level imports. Imports under
`if TYPE_CHECKING:` never run and only name types for annotations, so they do not count. Importing a submodule
also runs its package's `__init__`, but that implicit edge is left out: a package re-exporting its own parts is
no layer reaching back up.

Between folders the implicit edge counts: a module that imports `graphlint.run.parent` runs `graphlint/run/`'s
`__init__` and so depends on the folder as a whole, and two folders that import each other are one layer under two
names, whichever of their modules the imports name. A module directly in `graphlint/` or `rules/` is a layer of
its own (`session.py`, `results.py`); a deeper one is collapsed to its folder (`graphlint/run/`,
`rules/gl101_unfused_attention/fix/`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graphlint", "rules")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages by its dotted name; a package by its `__init__.py`."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported(name: str, source: str, is_package: bool = False) -> set[str]:
    """The dotted names a module's source imports when it runs (a `from a import b` names `a` and `a.b`)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:  # the `else:` branch runs
                    visit(ast.Module(body=[other], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up one level per dot after the first
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(source))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the modules of the packages it imports."""
    modules = module_files(root)
    return {name: {other for other in imported(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")
                   if other in modules and other != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each group of modules that import each other, as [a, b, ..., a]."""
    return [_shortest_cycle(graph, group, min(group)) for group in _strongly_connected(graph)]


def _shortest_cycle(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first inside the group, until an import leads back to `start`
        following = []
        for node in frontier:
            for other in sorted(graph[node] & group):
                if other == start:
                    return paths[node] + [start]
                if other not in paths:
                    paths[other] = paths[node] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"{start} is in a group of modules that import each other, yet no path leads back")


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of more than one module, or of one importing itself, that reach each other (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def test_graphlint_and_the_rules_have_no_import_cycle():
    graph = import_graph()
    assert "graphlint.session" in graph and "rules.gl101_unfused_attention" in graph  # the graph was read
    assert [" → ".join(cycle) for cycle in cycles(graph)] == []


# Each rule that fixes, and the module of its fixer: a function-level import, loaded when a finding is fixed.
RULE_TO_FIXER = {
    "rules.gl101_unfused_attention": "rules.gl101_unfused_attention.fix",
    "rules.gl105_bias_before_norm": "rules.gl105_bias_before_norm.fix",
    "rules.gl106_unfused_norm": "rules.gl106_unfused_norm.fix",
    "rules.gl107_unfused_activation": "rules.gl107_unfused_activation.fix",
    "rules.gl201_inplace_on_saved": "rules.gl201_inplace_on_saved.fix",
    "rules.gl204_unstable_log_softmax": "rules.gl204_unstable_log_softmax.fix",
}


def test_the_graph_sees_each_rule_reach_its_fixer():
    graph = import_graph()
    assert {rule: fixer for rule, fixer in RULE_TO_FIXER.items() if fixer not in graph[rule]} == {}


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_function_level_imports_count_and_type_checking_ones_do_not():
    source = '''
from typing import TYPE_CHECKING
from . import sibling
from .. import up

if TYPE_CHECKING:
    from graphlint.session import Session
else:
    import graphlint.config

def later():
    from graphlint.fix.apply import plan_fixes
'''
    names = imported("graphlint.fix.prove", source)
    assert {"graphlint.fix.sibling", "graphlint.up", "graphlint.config", "graphlint.fix.apply"} <= names
    assert "graphlint.session" not in names
    assert "graphlint.run.parent" in imported("graphlint.run", "from .parent import WarmParent", is_package=True)


PROCESS_LAYER = "graphlint.run"


def process_layer_imports(graph: dict[str, set[str]], package: str) -> dict[str, list[str]]:
    """The modules of `package` that import the process layer (graphlint.run and its modules) themselves."""
    found = {name: sorted(other for other in imports if other == PROCESS_LAYER
                          or other.startswith(PROCESS_LAYER + "."))
             for name, imports in graph.items() if name == package or name.startswith(package + ".")}
    return {name: others for name, others in found.items() if others}


def test_the_language_server_reaches_the_process_layer_only_through_the_session():
    graph = import_graph()
    assert "graphlint.server.linting" in graph and "graphlint.run.scheduler" in graph  # the graph was read
    assert process_layer_imports(graph, "graphlint.server") == {}


def test_a_server_module_that_imports_the_scheduler_is_named():
    graph = {"graphlint.server.linting": {"graphlint.session", "graphlint.run.scheduler", "graphlint.run"},
             "graphlint.server": {"graphlint.server.linting"}, "graphlint.session": {"graphlint.run.scheduler"}}
    assert process_layer_imports(graph, "graphlint.server") == {
        "graphlint.server.linting": ["graphlint.run", "graphlint.run.scheduler"]}
    assert "graphlint.run" in imported("graphlint.server.linting", "def later():\n    from graphlint import run\n")


def folder_of(name: str, packages: set[str]) -> str:
    """The folder a module is collapsed to: its own package below a top one, else the module itself; a rule's
    package is one folder with whatever it holds (GL101's fix is a package inside it)."""
    if name.startswith("rules.") and name.count(".") >= 2:
        return ".".join(name.split(".")[:2])
    folder = name if name in packages else name.rpartition(".")[0]
    return folder if "." in folder else name


def folder_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Folder → the folders its modules import, each import also running the `__init__` of every package above
    the module it names."""
    folders: dict[str, set[str]] = {}
    for name, imports in graph.items():
        reached = set(imports)
        for other in imports:
            parts = other.split(".")
            reached.update(".".join(parts[:end]) for end in range(1, len(parts)) if ".".join(parts[:end]) in packages)
        mine = folder_of(name, packages)
        folders.setdefault(mine, set()).update(
            folder_of(other, packages) for other in reached if folder_of(other, packages) != mine)
    return folders


def packages_of(root: Path = ROOT) -> set[str]:
    return {name for name, path in module_files(root).items() if path.name == "__init__.py"}


def test_no_two_folders_import_each_other():
    # The last two went with this test: target.py took capture/debug.py's import watch as an argument instead of
    # importing it (capture/ loads targets through capture.load_target), and config read byte sizes from
    # memory/ (graphlint.sizes now), which reached graph/ → locate/ → project → config.
    folders = folder_graph(import_graph(), packages_of())
    assert "graphlint.run" in folders and "graphlint.locate" in folders  # the graph was read
    assert not _strongly_connected(folders), [" → ".join(cycle) for cycle in cycles(folders)]


def test_the_fix_workflow_and_the_process_layer_import_each_other_one_way():
    folders = folder_graph(import_graph(), packages_of())
    assert "graphlint.run" in folders["graphlint.fix"]  # the proof runs as jobs of the warm parent
    assert "graphlint.fix" not in folders["graphlint.run"]


def test_a_cycle_between_folders_is_found_through_a_package_init():
    """`b.y` imports only `a.x`'s module, but that runs `a`'s `__init__`, which imports `b`: one cycle."""
    graph = {"p.a": {"p.a.x"}, "p.a.x": {"p.b.y"}, "p.b": set(), "p.b.y": {"p.a.z"}, "p.a.z": set(), "p": set(),
             "p.top": {"p.a.x"}}
    packages = {"p", "p.a", "p.b"}
    assert folder_of("p.a.x", packages) == "p.a" and folder_of("p.a", packages) == "p.a"
    assert folder_of("p.top", packages) == "p.top" and folder_of("p", packages) == "p"
    assert cycles(folder_graph(graph, packages)) == [["p.a", "p.b", "p.a"]]
    assert folder_graph(graph, packages)["p.top"] == {"p.a", "p"}
    assert cycles(folder_graph({"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.a": set(), "p.b": set()}, packages)) == []


REWRITE_LAYER = "graphlint.rewrite"
# The layers above the rewrites: the rewrites are a toolkit they use, and may use nothing of theirs.
ABOVE_THE_REWRITES = ("graphlint.run", "graphlint.locate", "graphlint.capture", "graphlint.session",
                      "graphlint.pipeline", "graphlint.fix", "graphlint.server", "graphlint.cli")


def reaching_up(graph: dict[str, set[str]], package: str, above: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules of `package` that import a module of one of the `above` layers themselves."""
    found = {name: sorted(other for other in imports if any(other == up or other.startswith(up + ".")
                                                                for up in above))
             for name, imports in graph.items() if name == package or name.startswith(package + ".")}
    return {name: others for name, others in found.items() if others}


def test_the_rewrites_import_no_layer_above_them():
    graph = import_graph()
    assert "rules.gl101_unfused_attention.fix.chain" in graph and "graphlint.rewrite.edits" in graph  # the graph was read
    assert reaching_up(graph, REWRITE_LAYER, ABOVE_THE_REWRITES) == {}


def reached(graph: dict[str, set[str]], package: str) -> set[str]:
    """Every module of the packages that `package`'s modules import, directly or through other modules."""
    seen = {name for name in graph if name == package or name.startswith(package + ".")}
    todo = list(seen)
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other in graph and other not in seen:
                seen.add(other)
                todo.append(other)
    return {name for name in seen if not (name == package or name.startswith(package + "."))}


def test_the_rewrites_reach_only_the_bottom_modules_even_through_others():
    # graphlint.ops (torch, the capture's contract) once came in through attention's op names: they live in
    # graphlint.opnames now, so the rewrites load without torch or any layer above them.
    assert reached(import_graph(), REWRITE_LAYER) <= {"graphlint.opnames", "graphlint.results", "graphlint.files",
                                                      "graphlint.errors"}
    assert reached({"graphlint.rewrite.norms": {"graphlint.opnames"}, "graphlint.opnames": {"graphlint.ops"},
                    "graphlint.ops": {"graphlint.capture.contract"}, "graphlint.capture.contract": set()},
                   REWRITE_LAYER) == {"graphlint.opnames", "graphlint.ops", "graphlint.capture.contract"}


def test_a_rules_fix_reaches_only_the_rewrite_toolkit_and_the_bottom_modules():
    """A fixable rule's package holds its fix (rules/<rule>/fix.py), which stays a bottom layer as the toolkit
    it uses is: no capture, locate, session or process layer, even through other modules."""
    graph = import_graph()
    fixes = sorted(name for name in graph if name.startswith("rules.") and name.endswith(".fix"))
    assert fixes == sorted(RULE_TO_FIXER.values())
    bottom = {"graphlint.opnames", "graphlint.results", "graphlint.files", "graphlint.errors"}
    # A fix that is a package (GL101's) reaches its own modules too.
    assert {fix: sorted(other for other in reached(graph, fix) if other not in bottom and not other.startswith(
        (REWRITE_LAYER + ".", fix + ".")) and other != REWRITE_LAYER) for fix in fixes} == {fix: [] for fix in fixes}


def test_a_rewrite_that_imports_a_layer_above_is_named():
    graph = {"graphlint.rewrite.norms": {"graphlint.results", "graphlint.capture.contract"},
             "graphlint.rewrite.edits": {"graphlint.results"}, "graphlint.rewriter": {"graphlint.fix.apply"}}
    assert reaching_up(graph, REWRITE_LAYER, ABOVE_THE_REWRITES) == {
        "graphlint.rewrite.norms": ["graphlint.capture.contract"]}
