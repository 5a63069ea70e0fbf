"""GL301 graph-break and GL302 recompile, checked against plain torch.compile: every curated remedy removes the
break by torch's own count of graph breaks, and a reported recompile keeps recompiling in plain torch."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from conftest import check_targets, findings_of, line_of, lint_file, run_graphlint, write
from graphlint.capture.compile import GraphBreak, analyse_compile, graph_break_ids
from graphlint.config import Config, read_config
from graphlint.errors import UsageError
from graphlint.project import Project
from graphlint.session import check
from graphlint.target import target_vary

pytestmark = pytest.mark.compile

# Each case: a forward body line that breaks the graph (BAD), and its curated rewrite (GOOD). `x` is the input.
CASES = {
    "branch": ("if h.sum() > 0:\n            h = h * 2", "h = torch.where(h.sum() > 0, h * 2, h)"),
    "print": ("print(h.mean())", "if not torch.compiler.is_compiling():\n            print(h.mean())"),
    "item": ("h = h / h.abs().max().item()", "h = h / h.abs().max()"),
    "mask_index": ("h = h[h > 0].sum() + h", "h = (h * (h > 0)).sum() + h"),
    "nonzero": ("h = h + h.nonzero().shape[0]", "h = h + (h != 0).sum()"),
    "numpy": ("h = h * float(np.mean(h.detach().numpy()))", "h = h * h.detach().mean()"),
    "time": ("h = h * (time.time() > 0)", "h = h * 1"),
    "random": ("h = h * random.random()", "h = h * torch.rand(())"),
    "logging": ('logger.info("shape %s", h.shape)',
                'if not torch.compiler.is_compiling():\n            logger.info("shape %s", h.shape)'),
    "warnings": ('warnings.warn("slow path")',
                 'if not torch.compiler.is_compiling():\n            warnings.warn("slow path")'),
    "explicit": ("torch._dynamo.graph_break()", "pass"),
}

TEMPLATE = '''
import logging
import random
import time
import warnings

import numpy as np
import torch
from torch import nn

logger = logging.getLogger("model")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        {line}  # the line
        return h * 2


def make():
    return Model(), (torch.randn(4, 8),)
'''


def _module(path):
    spec = importlib.util.spec_from_file_location(f"case_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _breaks_in_plain_torch(path) -> bool:
    """Whether plain torch.compile breaks the model's graph, by torch's own means: its count of graph breaks, or
    the forward compiled as more than one graph."""
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    model, args = _module(path).make()
    torch._dynamo.reset()
    counters.clear()
    graphs = CompileCounter()
    try:
        with torch.no_grad():
            torch.compile(model, backend=graphs)(*args)
        return sum(counters["graph_break"].values()) > 0 or graphs.frame_count > 1
    finally:
        torch._dynamo.reset()


@pytest.fixture(scope="module")
def case_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cases")
    files = {}
    for name, (bad, good) in CASES.items():
        files[name, "bad"] = write(folder, f"{name}_bad.py", TEMPLATE.replace("{line}", bad))
        files[name, "good"] = write(folder, f"{name}_good.py", TEMPLATE.replace("{line}", good))
    report = check_targets(folder, [f"{path.name}:make" for path in files.values()], select=("GL301",))
    return files, report


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_of_break_is_reported_at_its_line_and_its_remedy_compiles_whole(name, case_files):
    files, report = case_files
    bad, good = files[name, "bad"], files[name, "good"]
    assert _breaks_in_plain_torch(bad)
    assert not _breaks_in_plain_torch(good)
    found = [f for f in findings_of(report, "GL301") if f.location.path == str(bad)]
    assert [f.location.line for f in found] == [line_of(bad, CASES[name][0].splitlines()[0].strip())]
    assert "torch.compile breaks the graph here" in found[0].message
    assert not [f for f in findings_of(report, "GL301") if f.location.path == str(good)]
    assert not [e for e in report.errors if e.target.startswith(str(good))]


def test_a_break_carries_torch_registry_id_and_type(case_files):
    files, report = case_files
    found = [f for f in findings_of(report, "GL301") if f.location.path == str(files["branch", "bad"])]
    registry = graph_break_ids()
    assert registry.get("Data-dependent branching", "").startswith("GB")
    assert f'{registry["Data-dependent branching"]} "Data-dependent branching"' in found[0].message
    assert "torch.where" in found[0].message


def test_a_break_in_a_block_of_every_layer_is_one_finding_with_its_count(tmp_path):
    path = write(tmp_path, "layers.py", '''
        import torch
        from torch import nn


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                if h.mean() > 0:
                    h = h * 2
                return h


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList(Block() for _ in range(4))

            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return x


        def make():
            return Model(), (torch.randn(2, 8),)
    ''')
    report = lint_file(path, select=("GL301",))
    found = findings_of(report, "GL301")
    assert [f.location.line for f in found] == [line_of(path, "if h.mean() > 0")]
    assert found[0].occurrences == 4 and "blocks.0 … blocks.3" in found[0].message


def test_a_break_that_only_a_training_forward_hits_is_reported(tmp_path):
    # A mixture-of-experts layer's router weights made with requires_grad=h.requires_grad (mamba.py's Jamba):
    # torch.compile breaks there when gradients are on, as in training, and not under no_grad.
    path = write(tmp_path, "router.py", '''
        import torch
        from torch import nn


        class Router(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                weights = torch.ones(h.shape[0], 1, requires_grad=h.requires_grad)
                return h * weights


        def make():
            return Router(), (torch.randn(4, 8),)
    ''')
    model, args = _module(path).make()
    breaks = {}
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            breaks[grad] = torch._dynamo.explain(model)(*args).graph_break_count
        torch._dynamo.reset()
    assert breaks == {True: 1, False: 0}
    found = findings_of(lint_file(path, select=("GL301",)), "GL301")
    assert [f.location.line for f in found] == [line_of(path, "requires_grad=h.requires_grad")]
    assert "requires_grad=True" in found[0].message


def test_one_tensor_given_as_inputs_and_labels_is_grown_as_one_and_dynamic_shapes_absorb_it(tmp_path):
    # nanoGPT's GPT(idx, targets) given (idx, idx): grown into two copies, the inputs lost their aliasing, the
    # next batch size compiled as a constant, and GL302 said the batch size was specialised.
    path = write(tmp_path, "lm.py", '''
        import torch
        from torch import nn
        from torch.nn import functional as F


        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(32, 16)
                self.head = nn.Linear(16, 32)

            def forward(self, idx, targets):
                logits = self.head(self.embed(idx))
                return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


        def make():
            idx = torch.randint(0, 32, (2, 8))
            return LM(), (idx, idx)
    ''')
    from torch._dynamo.testing import CompileCounter

    model, (idx, _) = _module(path).make()
    torch._dynamo.reset()
    frames = CompileCounter()
    compiled = torch.compile(model, backend=frames)
    for batch in (2, 3, 4):  # as training calls it, one tensor both times
        grown = torch.cat([idx] + [idx[:1]] * (batch - 2))
        compiled(grown, grown)
    torch._dynamo.reset()
    assert frames.frame_count == 2  # the second size makes the batch dynamic
    report = lint_file(path, select=("GL302",))
    assert not findings_of(report, "GL302"), [f.message for f in report.findings]


def test_a_break_inside_a_library_is_a_note_not_a_finding_and_one_reached_from_the_users_line_is_theirs(tmp_path):
    library = tmp_path / "env" / "site-packages" / "breaky"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text(
        "import torch\n\n\ndef scale(h):\n    if h.sum() > 0:\n        return h * 2\n    return h\n\n\n"
        "class Layer(torch.nn.Module):\n    def forward(self, h):\n        if h.sum() > 0:\n            h = h * 3\n"
        "        return h\n", encoding="utf-8")
    project = tmp_path / "project"
    path = write(project, "model.py", f'''
        import sys
        sys.path.insert(0, {str(library.parent)!r})
        import torch
        from torch import nn
        import breaky


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.layer = breaky.Layer()

            def forward(self, x):
                h = breaky.scale(self.fc(x))
                return self.layer(h)


        def make():
            return Model(), (torch.randn(2, 8),)


        def make_library():
            return breaky.Layer(), (torch.randn(2, 8),)
    ''')
    report = lint_file(path, select=("GL301",))
    found = findings_of(report, "GL301")
    assert [f.location.line for f in found] == [line_of(path, "breaky.scale("), line_of(path, "self.layer(h)")]
    assert [[r.location.line for r in f.related] for f in found] == [[5], [12]]
    library_only = lint_file(path, "make_library", select=("GL301",))
    assert findings_of(library_only, "GL301") == []
    notes = library_only.results[0].notes
    assert any("library code only" in note and "breaky/__init__.py:12" in note for note in notes)


RECOMPILES = '''
import torch
from torch import nn
import graphlint


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        return self.fc(x) * self.calls


class LoopOverBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        for i in range(x.shape[0]):
            h[i] = h[i] + i
        return h


class Steps(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, steps):
        for _ in range(steps):
            x = self.fc(x)
        return x


class ShapeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        if x.shape[0] > 2:
            h = h - h.mean(0)
        return h * self.calls


def counter():
    return Counter(), (torch.randn(4, 8),)


def loop_over_batch():
    return LoopOverBatch(), (torch.randn(4, 8),)


def steps():
    x = torch.randn(4, 8)
    return graphlint.Target(Steps(), (x, 2), calls=[((x, 3),), ((x, 4), {})])


def shape_branch():
    return ShapeBranch(), (torch.randn(4, 8),)
'''


def _recompiles_in_plain_torch(make, calls: int = 5) -> int:
    """Recompilations plain torch.compile makes over the last calls of a longer run of varied inputs."""
    from torch._dynamo.testing import CompileCounter

    target = make()
    model, args, kwargs = (target.model, target.args, target.kwargs or {}) if hasattr(target, "model") else (*target, {})
    extra = list(getattr(target, "calls", ()))
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        compiled(*args, **kwargs)
        compiled(*args, **kwargs)
        settled = counter.frame_count
        for step in range(calls):
            if extra:
                call = extra[step % len(extra)]
                compiled(*call[0][:-1], call[0][-1] + step, **(call[1] if len(call) > 1 else {}))
            else:
                grown = [torch.cat([a, a[: step + 1]]) if isinstance(a, torch.Tensor) else a for a in args]
                compiled(*grown, **kwargs)
    torch._dynamo.reset()
    return counter.frame_count - settled


@pytest.fixture(scope="module")
def recompile_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recompiles")
    path = write(folder, "models.py", RECOMPILES)
    report = check_targets(folder, [f"models.py:{name}" for name in ("counter", "loop_over_batch", "steps",
                                                                       "shape_branch")], select=("GL302",))
    return path, report


@pytest.mark.parametrize("name, fragment", [("counter", "self.calls = self.calls + 1"),
                                            ("loop_over_batch", "for i in range(x.shape[0])"),
                                            ("steps", "for _ in range(steps)")])
def test_a_recompile_that_never_settles_is_reported_at_the_line_that_reads_the_value(name, fragment, recompile_report):
    path, report = recompile_report
    module = _module(path)
    assert _recompiles_in_plain_torch(getattr(module, name)) >= 3  # plain torch keeps recompiling
    found = [f for f in findings_of(report, "GL302") if name in f.targets[0]]
    assert [f.location.line for f in found] == [line_of(path, fragment)]
    assert "recompile_limit" in found[0].message and "guard" in found[0].message


def test_a_size_change_dynamic_shapes_absorb_is_not_a_finding(recompile_report):
    path, report = recompile_report
    assert _recompiles_in_plain_torch(_module(path).shape_branch) <= 1
    assert [f for f in findings_of(report, "GL302") if "shape_branch" in f.targets[0]] == []
    assert [e for e in report.errors] == []


def test_target_calls_must_be_args_kwargs_pairs(tmp_path):
    path = write(tmp_path, "model.py", '''
        import torch
        import graphlint


        def make():
            return graphlint.Target(torch.nn.Linear(4, 4), (torch.randn(2, 4),), calls=[torch.randn(2, 4)])
    ''')
    report = lint_file(path, select=("GL302",))
    assert len(report.errors) == 1
    assert "calls[0] is a Tensor; write each call as (args, kwargs) or (args,)" in report.errors[0].message


def test_the_analysis_says_when_it_did_not_run_and_breaks_keep_without_registry_ids(monkeypatch):
    from torch._dynamo import convert_frame

    from graphlint.rules.gl301_graph_break import describe_break

    monkeypatch.delattr(convert_frame, "get_and_maybe_log_recompilation_reasons")
    result = analyse_compile(torch.nn.Linear(2, 2), [("once", (torch.randn(1, 2),), {})])
    assert result.unavailable.startswith(f"torch {torch.__version__} lacks the dynamo hooks")
    assert describe_break(GraphBreak("Data-dependent branching", "", "", (), ())) == '"Data-dependent branching"'


def test_vary_is_read_from_the_pyproject_and_checked(tmp_path):

    (tmp_path / "pyproject.toml").write_text('[tool.graphlint]\nvary = ["batch", "seq"]\n', encoding="utf-8")
    assert read_config(tmp_path / "pyproject.toml").vary == ("batch", "seq")
    (tmp_path / "pyproject.toml").write_text('[tool.graphlint]\nvary = ["width"]\n', encoding="utf-8")
    with pytest.raises(UsageError, match="vary entry must be one of batch, seq"):
        read_config(tmp_path / "pyproject.toml")


SEQ_LOOP = '''
        import torch
        from torch import nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                h = self.fc(x)
                for t in range(x.shape[1]):
                    h[:, t] = h[:, t] * 2
                return h


        def make():
            return Model(), (torch.randn(2, 5, 8),)
    '''


def test_seq_is_grown_only_when_asked(tmp_path):
    path = write(tmp_path, "model.py", SEQ_LOOP)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    plain = check([f"{path}:make"], project, Config(select=("GL302",)))
    both = check([f"{path}:make"], project, Config(select=("GL302",), vary=("batch", "seq")))
    assert findings_of(plain, "GL302") == []
    assert [f.location.line for f in findings_of(both, "GL302")] == [line_of(path, "range(x.shape[1])")]



def test_a_target_table_sets_its_own_vary(tmp_path):
    """`vary` in a target's table overrides the run's setting for that target alone."""
    path = write(tmp_path, "model.py", SEQ_LOOP)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.graphlint]\nselect = ["GL302"]\n'
        'targets = ["model.py:make", { model = "model.py:make", vary = ["batch", "seq"] }]\n', encoding="utf-8")
    project = Project.discover(tmp_path)
    plain, own = project.config.targets
    assert plain == "model.py:make" and target_vary(own, ("batch",)) == ("batch", "seq")
    report = check(list(project.config.targets), project, project.config, base=tmp_path)
    assert [(f.targets, f.location.line) for f in findings_of(report, "GL302")] == [
        ((own,), line_of(path, "range(x.shape[1])"))]


def test_a_malformed_vary_in_a_target_table_is_one_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.graphlint]\ntargets = [{ model = "model.py:make", vary = ["width"] }]\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"targets\[0\]\.vary entry must be one of batch, seq; got 'width'"):
        read_config(tmp_path / "pyproject.toml")

@pytest.mark.cli
def test_the_command_reports_a_break_in_json_and_takes_vary(tmp_path):
    write(tmp_path, "model.py", TEMPLATE.replace("{line}", "print(h.mean())"))
    done = run_graphlint("check", "model.py:make", "--select", "GL3", "--vary", "batch", "--format", "json",
                         "--no-cache", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert [(f["rule"], f["location"]["line"]) for f in findings] == [("GL301", 20)]
    wrong = run_graphlint("check", "model.py:make", "--select", "GL3", "--vary", "width", "--no-cache", cwd=tmp_path)
    assert wrong.returncode == 2 and "--vary entry must be one of batch, seq" in wrong.stderr
