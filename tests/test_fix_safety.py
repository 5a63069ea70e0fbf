"""A safe fix is safe for the code around it: a fix that stops calling a submodule (whose hooks would stop
firing) is unsafe, a finite fill's fix says how a fully masked row changes, and proofs run the edge cases
(a fully masked row, a sequence of length one) that the factory's random inputs miss."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from conftest import findings_of, fix_plan, lint_file, prove_fix, run_graphlint, write
from graphlint.run import edge_cases
from graphlint.rewrite.edits import apply_edits
from graphlint.results import SAFE, UNSAFE

PYPROJECT = '[project]\nname = "user-project"\nversion = "0"\n'

HOOKED = '''
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attend = nn.Softmax(dim=-1)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = SOFTMAX
        return torch.matmul(attn, v)


RECORDED = []


def make():
    model = Attention()
    model.attend.register_forward_hook(lambda module, inputs, output: RECORDED.append(output))
    return model, (torch.randn(2, 6, 16),)
'''


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.proof
def test_a_fix_that_stops_calling_a_softmax_module_with_a_hook_is_unsafe_and_says_why(tmp_path):
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", HOOKED.replace("SOFTMAX", "self.attend(dots)"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == UNSAFE
    assert "the fix no longer calls self.attend (a Softmax module): attend has hooks registered (forward), which " \
           "would stop firing" in finding.fix.message
    plan = fix_plan(report, tmp_path, unsafe=True)
    assert plan.applied == [finding]
    fixed = write(tmp_path / "fixed", "model.py", plan.texts[str(path)])
    # What the reason says, in plain PyTorch: the original's hook fires, the fixed model's never does.
    for source, fires in ((path, 1), (fixed, 0)):
        module = _import(source, f"hooked_{fires}")
        model, inputs = module.make()
        model(*inputs)
        assert len(module.RECORDED) == fires


@pytest.mark.proof
@pytest.mark.parametrize("softmax", ["F.softmax(dots, dim=-1)", "dots.softmax(dim=-1)"])
def test_a_functional_softmax_stays_safe(tmp_path, softmax):
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", HOOKED.replace("SOFTMAX", softmax))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == SAFE, finding.fix.message
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and plan.applied == [finding]


HELPER = '''
import math

import torch
from torch import nn


def attention(query, key, value, mask=None, dropout=None):
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value)


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dropout = DROPOUT

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return CALL


RECORDED = []


def make():
    model = Attention()
    if isinstance(model.dropout, nn.Module):
        model.dropout.register_forward_hook(lambda module, inputs, output: RECORDED.append(output))
    return model, (torch.randn(2, 6, 16),)
'''


@pytest.mark.proof
@pytest.mark.parametrize("call", ["attention(q, k, v, dropout=self.dropout)", "attention(q, k, v, None, self.dropout)"])
def test_a_fix_that_stops_calling_a_module_passed_to_a_helper_is_unsafe_and_says_why(tmp_path, call):
    """The Annotated Transformer's spelling: the module reaches the helper as a parameter, by keyword or position."""
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", HELPER.replace("DROPOUT", "nn.Dropout(0.1)").replace("CALL", call))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == UNSAFE
    assert "the fix no longer calls dropout (self.dropout, a Dropout module): dropout has hooks registered " \
           "(forward), which would stop firing" in finding.fix.message
    plan = fix_plan(report, tmp_path, unsafe=True)
    fixed = write(tmp_path / "fixed", "model.py", plan.texts[str(path)])
    for source, fires in ((path, 1), (fixed, 0)):  # in plain PyTorch: the hook stops firing
        module = _import(source, f"helper_{fires}")
        model, inputs = module.make()
        model(*inputs)
        assert len(module.RECORDED) == fires


@pytest.mark.proof
def test_a_module_passed_to_a_helper_with_no_hook_is_safe_and_its_p_still_read(tmp_path):
    """The same model, no hook registered: nothing outside the model can tell that the dropout is no longer
    called, and the fused call reads the module's `p` (and its training flag) where it was passed."""
    write(tmp_path, "pyproject.toml", PYPROJECT)
    source = HELPER.replace("DROPOUT", "nn.Dropout(0.1)").replace("CALL", "attention(q, k, v, dropout=self.dropout)")
    path = write(tmp_path, "model.py", source.replace("        model.dropout.register_forward_hook", "        0 and "
                                                                                     "model.dropout.register_forward_hook"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == SAFE, finding.fix.message
    assert "the fix no longer calls dropout (self.dropout, a Dropout module), which has no hook" in finding.fix.message
    plan = fix_plan(report, tmp_path)
    assert plan.applied == [finding]
    assert "dropout_p=dropout.p if dropout is not None and dropout.training else 0.0" in plan.texts[str(path)]


@pytest.mark.proof
def test_a_helper_given_a_function_stays_safe(tmp_path):
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", HELPER.replace("DROPOUT", "nn.functional.dropout").replace(
        "CALL", "attention(q, k, v, dropout=None)"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == SAFE, finding.fix.message


PERCEIVER = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_kv = nn.Linear(dim, 2 * dim)

    def forward(self, x, mask):
        b, n, c = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = self.to_kv(x).view(b, n, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * q.shape[-1] ** -0.5
        sim = sim.masked_fill(~mask, FILL)
        attn = sim.softmax(dim=-1)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        return out.transpose(1, 2).reshape(b, n, c)


def make():
    mask = torch.rand(2, 1, 6, 6) > 0.3
    mask[..., 0] = True
    return Attention(), (torch.randn(2, 6, 16), mask)
'''


def _fixed_pair(tmp_path, fill):
    """The original and the fixed model (the fix's edits applied whether or not a flag would write them), the
    finding, the plan of `--fix --unsafe-fixes` and the fixed text."""
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", PERCEIVER.replace("FILL", fill))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    plan = fix_plan(report, tmp_path, unsafe=True)
    text = apply_edits(path.read_text(), finding.fix.edits)
    assert plan.texts.get(str(path), text) == text
    fixed = write(tmp_path / "fixed", "model.py", text)
    _fixed_pair.report = report
    return _import(path, f"original_{abs(hash(fill))}"), _import(fixed, f"fixed_{abs(hash(fill))}"), finding, plan, text


def _run_fully_masked(module):
    torch.manual_seed(0)
    model, (x, mask) = module.make()
    model = model.double()
    mask[0, 0, 2] = False  # one query's every key masked
    x = x.double().requires_grad_()
    out = model(x, mask)
    out.sum().backward()
    return out.detach(), x.grad


@pytest.mark.proof
def test_a_dtype_minimum_fill_becomes_an_additive_mask_that_gives_a_fully_masked_row_the_same_output(tmp_path):
    original, fixed, finding, plan, text = _fixed_pair(tmp_path, "-torch.finfo(sim.dtype).max")
    assert "attn_mask=torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min)" in text
    # Unsafe, and why: the outputs agree on a fully masked row, the gradients there do not.
    assert finding.fix.applicability == UNSAFE and "its outputs there agree, its gradients do not" in finding.fix.message
    before, after = _run_fully_masked(original), _run_fully_masked(fixed)
    assert torch.allclose(before[0], after[0], rtol=1e-7, atol=1e-9)
    assert not torch.allclose(before[1], after[1], rtol=1e-7, atol=1e-9)
    # The proof's edge case of a fully masked row tells them apart: known to compute something else, the fix is
    # never written, even with --unsafe-fixes.
    assert plan.applied == [] and plan.broken == [finding] and plan.texts == {}
    verdict = prove_fix(_fixed_pair.report, tmp_path, finding)
    assert not verdict.ok and verdict.reason.startswith(
        "on an input the factory's do not cover (argument 1 with its first row all False), the gradient of "), \
        verdict.reason


@pytest.mark.proof
def test_a_number_fill_is_unsafe_because_a_fully_masked_row_changes(tmp_path):
    original, fixed, finding, plan, text = _fixed_pair(tmp_path, "-1e9")
    assert "attn_mask=torch.where(mask, q.new_zeros(()), -1e9)" in text
    assert finding.fix.applicability == UNSAFE and "its outputs there differ too" in finding.fix.message
    assert not torch.allclose(_run_fully_masked(original)[0], _run_fully_masked(fixed)[0])
    assert plan.applied == [] and plan.broken == [finding]
    [(_, why)] = plan.refused
    assert "on an input the factory's do not cover (argument 1 with its first row all False), output 0 differs by " \
           "up to " in why, why


@pytest.mark.proof
def test_an_infinite_fill_stays_a_safe_boolean_mask_proven_on_a_fully_masked_row(tmp_path):
    original, fixed, finding, plan, text = _fixed_pair(tmp_path, 'float("-inf")')
    assert finding.fix.applicability == SAFE and plan.refused == []
    assert "attn_mask=mask" in plan.texts[str(tmp_path / "model.py")]


# -- the edge-case proof -------------------------------------------------------------------------------------

WRONG_REWRITE = PERCEIVER.replace("FILL", "-1e9").replace(
    '''        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * q.shape[-1] ** -0.5
        sim = sim.masked_fill(~mask, -1e9)
        attn = sim.softmax(dim=-1)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
''', '''        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
''')


def _model_run(mode, base, record, verdict=""):
    done = subprocess.run([sys.executable, "-m", "graphlint.run.proof", mode, "model.py:make", str(base),
                           str(record), str(verdict)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.cli
@pytest.mark.proof
def test_a_boolean_mask_for_a_finite_fill_is_caught_by_the_fully_masked_row_of_the_edge_case_proof(tmp_path):
    assert WRONG_REWRITE != PERCEIVER.replace("FILL", "-1e9")
    original, rewritten = tmp_path / "original", tmp_path / "rewritten"
    write(original, "model.py", PERCEIVER.replace("FILL", "-1e9"))
    write(rewritten, "model.py", WRONG_REWRITE)
    _model_run("save", original, tmp_path / "record.pt")
    _model_run("compare", rewritten, tmp_path / "record.pt", tmp_path / "verdict.json")
    verdict = json.loads((tmp_path / "verdict.json").read_text(encoding="utf-8"))
    # The factory's mask has no fully masked row: only the edge case shows the difference.
    assert not verdict["ok"]
    assert verdict["reason"].startswith("on an input the factory's do not cover (argument 1 with its first row all "
                                        "False), output 0 differs by up to "), verdict["reason"]


def test_edge_cases_force_one_row_of_each_boolean_mask_and_cut_the_sequence_to_one():
    x, mask = torch.randn(2, 6, 16), torch.ones(2, 1, 6, 6, dtype=torch.bool)
    cases, notes = edge_cases.variants((x, mask), {"flag": torch.tensor(True)})
    names = [name for name, _, _ in cases]
    assert names == ["argument 1 with its first row all False", "argument 1 with its first row all True",
                     "a sequence of length one"]
    forced = cases[0][1][1]
    assert not forced[0, 0, 0].any() and forced[0, 0, 1:].all() and forced[1].all() and mask.all()
    short_x, short_mask = cases[2][1]
    assert short_x.shape == (2, 1, 16) and short_mask.shape == (2, 1, 1, 1) and notes == []
    assert edge_cases.variants((torch.randn(3),), {})[1] == [
        "proven without a sequence of length one: no input has a sequence dimension to cut"]


SQUEEZED = """
import torch
from torch import nn


class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(x).SQUEEZE


def make():
    return Pool(), (torch.randn(2, 6, 16),)
"""


@pytest.mark.cli
@pytest.mark.proof
def test_a_rewrite_that_differs_only_on_a_sequence_of_length_one_is_caught_by_the_edge_case_proof(tmp_path):
    original, rewritten = tmp_path / "original", tmp_path / "rewritten"
    write(original, "model.py", SQUEEZED.replace("SQUEEZE", "view(x.shape[0], x.shape[1], -1)"))
    write(rewritten, "model.py", SQUEEZED.replace("SQUEEZE", "squeeze()"))  # a no-op unless a dimension is 1
    _model_run("save", original, tmp_path / "record.pt")
    _model_run("compare", rewritten, tmp_path / "record.pt", tmp_path / "verdict.json")
    verdict = json.loads((tmp_path / "verdict.json").read_text(encoding="utf-8"))
    assert verdict == {"ok": False, "note": "", "runs": True, "differs": True, "reason": "on an input the factory's do not cover "
                       "(a sequence of length one), output 0 has shape (2, 16) instead of (2, 1, 16)"}


def test_the_log_of_a_softmax_module_gets_no_fix_that_would_call_log_softmax_on_self(tmp_path):
    # Made unsafe (a Softmax module no longer called), GL204's fix would go unproven: it must not be wrong.
    write(tmp_path, "pyproject.toml", PYPROJECT)
    path = write(tmp_path, "model.py", '''
        import torch
        from torch import nn


        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(16, 10)
                self.softmax = nn.Softmax(dim=-1)

            def forward(self, x):
                return torch.log(self.softmax(self.proj(x)))


        def make():
            return Head(), (torch.randn(4, 16),)
    ''')
    [finding] = findings_of(lint_file(path, device="meta"), "GL204")
    assert finding.fix is None
    assert finding.no_fix == "the softmax is the module `self.softmax`; take the log of the logits with " \
                             "F.log_softmax instead"


@pytest.mark.cli
@pytest.mark.proof
def test_no_flag_writes_a_fix_whose_proof_found_different_outputs_and_diff_shows_the_evidence(tmp_path):
    """The real command: the `-1e9` fill's fix is declared unsafe, and its proof finds different outputs on a
    fully masked row. `--fix --unsafe-fixes` leaves the file as it was, and `--diff --unsafe-fixes` shows no diff
    and says why, with what the proof found; the safe `-inf` fill in the other file is written all the same."""
    write(tmp_path, "pyproject.toml", PYPROJECT)
    finite = write(tmp_path, "finite.py", PERCEIVER.replace("FILL", "-1e9"))
    infinite = write(tmp_path, "infinite.py", PERCEIVER.replace("FILL", 'float("-inf")'))
    before = finite.read_text()
    shown = run_graphlint("check", "finite.py:make", "infinite.py:make", "--select", "GL101", "--diff",
                          "--unsafe-fixes", cwd=tmp_path)
    assert "--- a/finite.py" not in shown.stdout and "--- a/infinite.py" in shown.stdout, shown.stdout
    assert "graphlint: finite.py:18: GL101 fix not applied, even with --unsafe-fixes: declared unsafe: " in shown.stderr
    assert "on the model: on an input the factory's do not cover (argument 1 with its first row all False), " \
           "output 0 differs by up to " in shown.stderr, shown.stderr
    assert "graphlint: 1 fix would be applied" in shown.stderr
    done = run_graphlint("check", "finite.py:make", "infinite.py:make", "--select", "GL101", "--fix",
                         "--unsafe-fixes", cwd=tmp_path)
    assert finite.read_text() == before
    assert "attn_mask=mask" in infinite.read_text()
    assert "fix not applied, even with --unsafe-fixes" in done.stderr and "applied anyway" not in done.stderr
