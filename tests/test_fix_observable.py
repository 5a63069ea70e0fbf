"""A fix that stops calling a submodule is judged on what the program can observe, in the model as built: a
stateless torch.nn module of exactly its class (a dropout, `Softmax`, `Identity`) with no hook, whose
configuration the fix keeps reading, is safe to stop calling; a hook on it (its own or a global one), a
subclass, a project module or one with parameters keeps the fix unsafe, with the reason. The attention blocks
are written as nanoGPT, minGPT, vit-pytorch and Stable Diffusion's CrossAttention write theirs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import findings_of, fix_plan, lint_file, model_file, run_graphlint, write
from graphlint.results import SAFE, UNSAFE

NANOGPT = '''
import math

import torch
from torch import nn
from torch.nn import functional as F

CLASSES


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=32, n_head=4, block_size=16, dropout=0.1):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = DROPOUT
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.attn = CausalSelfAttention()

    def forward(self, x):
        return x + self.attn(self.ln(x))


RECORDED = []


def make():
    model = nn.Sequential(Block(), Block())
    HOOK
    return model, (torch.randn(2, 8, 32),)
'''

MINGPT = '''
import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd=32, n_head=4, block_size=16, attn_pdrop=0.1):
        super().__init__()
        self.key = nn.Linear(n_embd, n_embd)
        self.query = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(attn_pdrop)
        self.proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        k = self.key(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


RECORDED = []


def make():
    model = CausalSelfAttention()
    HOOK
    return model, (torch.randn(2, 8, 32),)
'''

VIT = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4, dim_head=8, dropout=0.1):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        x = self.norm(x)
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        attn = self.dropout(attn)
        out = torch.matmul(attn, v)
        out = out.transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


RECORDED = []


def make():
    model = Attention()
    HOOK
    return model, (torch.randn(2, 6, 32),)
'''

CROSS = '''
import torch
from torch import einsum, nn


class CrossAttention(nn.Module):
    def __init__(self, query_dim=32, context_dim=24, heads=4, dim_head=8, dropout=0.1):
        super().__init__()
        inner_dim = dim_head * heads
        self.scale = dim_head ** -0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, query_dim), nn.Dropout(dropout))

    def forward(self, x, context):
        h = self.heads
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.reshape(t.shape[0], t.shape[1], h, -1).transpose(1, 2) for t in (q, k, v))
        sim = einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
        attn = sim.softmax(dim=-1)
        attn = self.attn_dropout(attn)
        out = einsum("b h i j, b h j d -> b h i d", attn, v)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.to_out(out)


RECORDED = []


def make():
    model = CrossAttention()
    HOOK
    return model, (torch.randn(2, 6, 32), torch.randn(2, 5, 24))
'''

STYLES = {"nanoGPT": (NANOGPT, "attn_dropout"), "minGPT": (MINGPT, "attn_drop"), "vit-pytorch": (VIT, "dropout"),
          "CrossAttention": (CROSS, "attn_dropout")}


def _source(style: str, hook: str = "", dropout: str = "nn.Dropout(dropout)", classes: str = "") -> str:
    return STYLES[style][0].replace("HOOK", hook or "pass").replace("DROPOUT", dropout).replace("CLASSES", classes)


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path, name, p=None, train=False, dtype=torch.float64):
    """The model's output in plain PyTorch, with every dropout's `p` set to `p` when given."""
    module = _import(path, name)
    torch.manual_seed(0)
    model, inputs = module.make()
    model = model.to(dtype).train(train)
    if p is not None:
        for layer in model.modules():
            if isinstance(layer, torch.nn.Dropout):
                layer.p = p
    torch.manual_seed(1)
    return model(*(t.to(dtype) for t in inputs)), module


@pytest.mark.proof
@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_dropout_module_with_no_hook_is_safe_to_stop_calling_and_fix_applies_it(tmp_path, style):
    path = model_file(tmp_path, _source(style))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == SAFE, finding.fix.message
    attribute = STYLES[style][1]
    assert f"self.{attribute} (a Dropout module)" in finding.fix.message
    assert "in the model as built and comput" in finding.fix.message
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and plan.applied == [finding]
    text = plan.texts[str(path)]
    assert f"dropout_p=self.{attribute}.p if self.training else 0.0" in text
    fixed = write(tmp_path / "fixed", "model.py", text)
    # In plain PyTorch: the same outputs in eval, and the module's `p` still changes the fixed model in training.
    assert torch.allclose(_run(path, f"{style}_a")[0], _run(fixed, f"{style}_b")[0], atol=1e-10)
    assert not torch.allclose(_run(fixed, f"{style}_c", p=0.0, train=True)[0],
                              _run(fixed, f"{style}_d", p=0.9, train=True)[0])
    assert torch.allclose(_run(fixed, f"{style}_e", p=0.0, train=True)[0], _run(fixed, f"{style}_f", p=0.0)[0],
                          atol=1e-10)


HOOKS = {
    "forward": "model.{module}.register_forward_hook(lambda module, inputs, output: RECORDED.append(output))",
    "forward-pre": "model.{module}.register_forward_pre_hook(lambda module, inputs: RECORDED.append(inputs))",
    "backward": "model.{module}.register_full_backward_hook(lambda module, gin, gout: RECORDED.append(gout))",
    "global forward": "nn.modules.module.register_module_forward_hook(lambda m, i, o: RECORDED.append(type(m)))",
}


@pytest.mark.proof
@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_hook_registered_in_the_model_as_built_keeps_the_fix_unsafe_and_the_reason_names_it(tmp_path, hook):
    """minGPT with an attention recorder on its dropout: the hook fires in the original and never in the fix.
    (The capture runs in a child process, so the global hook never reaches this one.)"""
    path = model_file(tmp_path, _source("minGPT", HOOKS[hook].format(module="attn_drop")))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == UNSAFE
    kind = "global forward" if hook.startswith("global") else hook
    assert f"the fix no longer calls self.attn_drop (a Dropout module): attn_drop has hooks registered ({kind})" \
           f", which would stop firing" in finding.fix.message
    if hook.startswith("global"):
        return
    plan = fix_plan(report, tmp_path, unsafe=True)
    fixed = write(tmp_path / "fixed", "model.py", plan.texts[str(path)])
    for source, fires in ((path, True), (fixed, False)):  # in plain PyTorch: the hook stops firing
        output, module = _run(source, f"hooked_{hook}_{fires}")
        if hook == "backward":
            output.sum().backward()
        assert bool(module.RECORDED) == fires


@pytest.mark.proof
@pytest.mark.parametrize(("dropout", "classes", "reason"), [
    ("MyDropout(dropout)", "class MyDropout(nn.Dropout):\n    pass\n",
     "attn_dropout is a MyDropout, not exactly one of torch.nn's stateless modules: its own forward would no "
     "longer run"),
    ("nn.Dropout(dropout) if dropout > 0 else Scaled()",
     "class Scaled(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.gain = nn.Parameter(torch.ones(()))\n\n    def forward(self, x):\n        return x * self.gain\n",
     None),
])
def test_a_subclass_keeps_the_fix_unsafe_and_the_model_as_built_decides_a_choice(tmp_path, dropout, classes, reason):
    """A subclass of Dropout (its forward may do anything) stays unsafe; `nn.Dropout(p) if p > 0 else X()` is
    judged by what the model built: here the plain Dropout."""
    path = model_file(tmp_path, _source("nanoGPT", dropout=dropout, classes=classes))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    if reason is None:
        assert finding.fix.applicability == SAFE, finding.fix.message
    else:
        assert finding.fix.applicability == UNSAFE
        assert reason in finding.fix.message


@pytest.mark.proof
def test_a_project_module_with_parameters_keeps_the_fix_unsafe(tmp_path):
    scaled = ("class Scaled(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.gain = nn.Parameter(torch.ones(()))\n\n    def forward(self, x):\n        return x * self.gain\n")
    path = model_file(tmp_path, _source("nanoGPT", dropout="Scaled() if dropout > 0 else nn.Dropout(dropout)",
                                        classes=scaled))
    report = lint_file(path, device="cpu")
    # The graph ran `att * gain`, so the chain the rule matched does not end where a fused call could go:
    # either no finding, or no fix that drops the module silently.
    for finding in findings_of(report, "GL101"):
        assert finding.fix is None or finding.fix.applicability != SAFE or "attn_dropout" not in finding.fix.message


@pytest.mark.proof
def test_a_softmax_module_with_no_hook_is_safe_to_stop_calling(tmp_path):
    """vit-pytorch's `self.attend = nn.Softmax(dim=-1)` and `self.dropout`: both are no longer called."""
    path = model_file(tmp_path, _source("vit-pytorch"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == SAFE
    assert "the fix no longer calls self.attend (a Softmax module), self.dropout (a Dropout module), which have " \
           "no hooks in the model as built" in finding.fix.message


@pytest.mark.cli
@pytest.mark.proof
def test_fix_writes_the_nanogpt_attention_and_leaves_the_hooked_one(tmp_path):
    """The real command: `--fix` rewrites the unhooked nanoGPT block; with a recorder's hook on every
    attention dropout, it writes nothing and says why."""
    plain = model_file(tmp_path, _source("nanoGPT"), name="plain.py")
    hooked = model_file(tmp_path, _source("nanoGPT", "for block in model:\n        block.attn.attn_dropout."
                                          "register_forward_hook(lambda m, i, o: RECORDED.append(o))"),
                        name="hooked.py")
    before = hooked.read_text()
    done = run_graphlint("check", "plain.py:make", "hooked.py:make", "--select", "GL101", "--fix", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F.scaled_dot_product_attention(" in plain.read_text()
    assert "dropout_p=self.attn_dropout.p if self.training else 0.0" in plain.read_text()
    assert hooked.read_text() == before
    assert "0.attn.attn_dropout has hooks registered (forward), which would stop firing" in done.stderr + done.stdout


def test_the_judgement_reads_the_model_as_built_and_the_fixed_code():
    """The rule on its own, for each observable reason, on modules as the capture describes them."""
    import libcst as cst

    from graphlint.capture.modules import ModuleInfo
    from graphlint.rewrite.submodules import Dropped, judged

    def modules(**changes):
        drop = ModuleInfo("blocks.0.drop", "torch.nn.modules.dropout.Dropout", True)
        return {"": ModuleInfo("", "model.Net", False), "blocks.0": ModuleInfo("blocks.0", "model.Attention", False),
                "blocks.0.drop": ModuleInfo(**{**vars(drop), **changes})}

    one = Dropped("self.drop", "a Dropout module", "drop", "Attention")
    reads_p = [cst.parse_expression("F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if "
                                    "self.training else 0.0)")]
    assert judged([one], reads_p, modules()) == (True, "the fix no longer calls self.drop (a Dropout module), "
                                                       "which has no hook in the model as built and computes nothing "
                                                       "the fused call does not")
    fixed_p = [cst.parse_expression("F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)")]
    assert judged([one], fixed_p, modules()) == (False, "the fix no longer calls self.drop (a Dropout module): the "
                                                        "fix does not read its `p`, so changing it would no longer "
                                                        "change the model")
    for changes, reason in (({"hooks": ("global forward-pre",)}, "has hooks registered (global forward-pre)"),
                            ({"tensors": 1}, "holds parameters or buffers"),
                            ({"type_name": "model.MyDropout", "library": False}, "is a MyDropout, not exactly one"),
                            ({"path": "blocks.0.other"}, "graphlint did not find it in the model as built")):
        quiet, clause = judged([one], reads_p, {k if k != "blocks.0.drop" else changes.get("path", k): v
                                                for k, v in modules(**changes).items()})
        assert not quiet and reason in clause, clause
    assert not judged([one], reads_p, None)[0]  # the model unknown: unsafe


def test_an_alpha_dropout_on_the_probabilities_gets_no_fix_and_says_why(tmp_path):
    """AlphaDropout is stateless too, but the fused call's `dropout_p` is an elementwise dropout: in training,
    alpha dropout gives probabilities negative values, which no elementwise dropout of them does."""
    path = model_file(tmp_path, _source("nanoGPT", dropout="nn.AlphaDropout(dropout)"))
    [finding] = findings_of(lint_file(path, device="meta"), "GL101")
    assert finding.fix is None
    assert finding.no_fix == ("the probabilities pass through alpha_dropout, which the fused call's dropout_p (an "
                              "elementwise dropout) does not compute in training")
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 8, 8), dim=-1)
    assert (torch.nn.AlphaDropout(0.5).train()(probs) < 0).any()
    assert not (torch.nn.Dropout(0.5).train()(probs) < 0).any()
