"""Fixes on the spellings real model files use: the file's own import aliases, attention under `if` guards, in
einsum layouts, through baddbmm, with the weights returned (an unsafe fix), norms in helper methods and in the
middle of a forward, and models that cannot run in float64. Each rewrite is read back from the plan and, where
marked `proof`, proven on the model."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import findings_of, fix_plan, lint_file, prove_fix, write
from graphlint.rewrite.edits import apply_edits, deleted_lines
from graphlint.report.json import render_json
from graphlint.report.text import render_text


def _model(tmp_path, source: str):
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    return write(tmp_path, "model.py", textwrap.dedent(source))


def _rewritten(finding) -> str:
    """The file with the finding's fix applied, as --unsafe-fixes would write it, before any proof."""
    path = finding.location.path
    return apply_edits(open(path, encoding="utf-8").read(), finding.fix.edits)


def _plan(tmp_path, report, unsafe=False):
    return fix_plan(report, tmp_path, unsafe=unsafe)


def _one_line(text: str) -> str:
    """The code with calls split over lines joined again, to look for a call in it."""
    joined = re.sub(r",?\s*\n\s*\)", ")", re.sub(r"\(\s*\n\s*", "(", re.sub(r",\n\s+", ", ", text)))
    return joined.replace(", )", ")")


# -- the file's own names -------------------------------------------------------------------------------------

ALIASES = {
    "import-torch-as-t": ('''
        import torch as t
        from torch import nn


        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(8, 4)

            def forward(self, x):
                return t.log(t.softmax(self.head(x), dim=-1))


        def make():
            return Classifier(), (t.randn(3, 8),)
    ''', "return nn.functional.log_softmax(self.head(x), dim=-1)", ()),
    "only-import-torch-as-th": ('''
        import torch as th


        class Classifier(th.nn.Module):
            def __init__(self):
                super().__init__()
                self.head = th.nn.Linear(8, 4)

            def forward(self, x):
                return th.log(th.sigmoid(self.head(x)))


        def make():
            return Classifier(), (th.randn(3, 8),)
    ''', "return th.nn.functional.logsigmoid(self.head(x))", ()),
    "functional-as-fn": ('''
        import torch
        import torch.nn.functional as fn
        from torch import nn


        class Scorer(nn.Module):
            def __init__(self):
                super().__init__()
                self.score = nn.Linear(8, 1)

            def forward(self, x):
                return torch.log(fn.sigmoid(self.score(x)))


        def make():
            return Scorer(), (torch.randn(3, 8),)
    ''', "return fn.logsigmoid(self.score(x))", ()),
    "no-torch-namespace-imported": ('''
        from torch import log, nn, randn, softmax


        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(8, 4)

            def forward(self, x):
                return log(softmax(self.head(x), dim=-1))


        def make():
            return Classifier(), (randn(3, 8),)
    ''', "return nn.functional.log_softmax(self.head(x), dim=-1)", ()),
    "nothing-to-reach-functional-with": ('''
        from torch import log, randn, sigmoid
        from torch.nn import Linear, Module


        class Scorer(Module):
            def __init__(self):
                super().__init__()
                self.score = Linear(8, 1)

            def forward(self, x):
                return log(sigmoid(self.score(x)))


        def make():
            return Scorer(), (randn(3, 8),)
    ''', "return F.logsigmoid(self.score(x))", ("import torch.nn.functional as F",)),
}


@pytest.mark.parametrize("case", list(ALIASES))
def test_rewrites_use_the_files_own_names_and_add_an_import_only_when_there_is_none(tmp_path, case):
    source, line, added = ALIASES[case]
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL204")
    assert finding.fix is not None, finding.no_fix
    fixed = _rewritten(finding)
    assert line in fixed
    imports = [text for text in fixed.splitlines() if text.startswith(("import ", "from "))]
    original = [text for text in textwrap.dedent(source).splitlines() if text.startswith(("import ", "from "))]
    assert imports == original[: len(original)] + list(added)  # after the file's own imports, nothing else
    compile(fixed, "model.py", "exec")


def test_an_alias_of_torch_is_read_as_a_module_not_blamed_as_the_scores(tmp_path):
    source = '''
        import math

        import torch as th
        from torch import nn


        class Attention(nn.Module):
            def forward(self, q, k, v):
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                return th.softmax(scores, dim=-1) @ v


        def make():
            return Attention(), tuple(th.randn(2, 4, 8, 16) for _ in range(3))
    '''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None, finding.no_fix
    assert "return nn.functional.scaled_dot_product_attention(q, k, v)\n" in _rewritten(finding)


# -- what a deletion leaves ----------------------------------------------------------------------------------

def test_deleting_statements_leaves_no_doubled_or_dangling_blank_lines():
    lines = ["def f(x):", "    a = 1", "", "    b = 2", "", "    # the sum", "    c = 3", "", "    return x", ""]
    # b between two blank lines: one blank goes with it; c after a comment: the blank after it goes.
    assert deleted_lines(lines, [(4, 4)]) == [(4, 5)]
    assert deleted_lines(lines, [(7, 7)]) == [(7, 8)]
    # a right after the def line: the blank after it would open the block, so it goes too.
    assert deleted_lines(lines, [(2, 2)]) == [(2, 3)]
    # the last statements of a block take the blank line before them.
    assert deleted_lines(["def f():", "    a = 1", "", "    b = 2", "x = 1"], [(4, 4)]) == [(3, 4)]


# -- applicability -------------------------------------------------------------------------------------------

GL105_MODEL = '''
    import torch
    from torch import nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.norm = nn.BatchNorm1d(8)

        def forward(self, x):
            return self.norm(self.fc(x))


    def make():
        return Model(), (torch.randn(4, 8),)
'''


def test_a_fix_that_changes_the_state_dict_is_declared_unsafe_and_not_counted_as_fixable(tmp_path):
    report = lint_file(_model(tmp_path, GL105_MODEL), device="meta", extend_select=("GL105",))
    [finding] = findings_of(report, "GL105")
    assert finding.fix is not None and finding.fix.applicability == "unsafe"
    text = render_text(report)
    assert "[*]" not in text
    assert text.rstrip().endswith("; 1 with an unsafe fix (--fix --unsafe-fixes applies it).")
    [shown] = [f for f in __import__("json").loads(render_json(report))["findings"] if f["rule"] == "GL105"]
    assert shown["fix"]["applicability"] == "unsafe"
    plan = _plan(tmp_path, report)  # declared unsafe: proven for the report, applied only with --unsafe-fixes
    [(refused, why)] = plan.refused
    assert plan.applied == [] and refused is finding and plan.broken == []
    assert why.startswith(f"declared unsafe: {finding.fix.message}; on the model: the state dict changes"), why
    assert "bias=False" in _plan(tmp_path, report, unsafe=True).texts[str(finding.location.path)]


# -- attention spellings, proven on the model ----------------------------------------------------------------

ATTENTION_HEADER = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


'''

# (the model, a fragment the fixed file must contain (calls joined on one line), fragments it must not contain)
ATTENTION = {
    "llama-mask-guard-keys-transposed-2-3": ('''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, mask):
        b, n, _ = x.shape
        xq, keys, values = (w(x).view(b, n, self.heads, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, heads, seqlen, seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        return torch.matmul(scores, values)


def make():
    return Attention(), (torch.randn(2, 6, 16), torch.triu(torch.full((6, 6), float("-inf")), diagonal=1))
''', "F.scaled_dot_product_attention(xq, keys, values, attn_mask=mask)",
        ("transpose(-2, -1)", "if mask")),
    "masked-fill-under-a-guard-with-a-scale-after": ('''
class Attention(nn.Module):
    def forward(self, q, k, v, mask=None):
        scores = torch.matmul(q, k.transpose(-2, -1))
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        p = (scores / math.sqrt(q.size(-1))).softmax(dim=-1)
        return torch.matmul(p, v)


def make():
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    return Attention(), (q, k, v, torch.tril(torch.ones(6, 6)))
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(mask != 0, q.new_zeros(()), -1e9) "
    "if mask is not None else None)", ("masked_fill",)),
    "causal-under-a-python-flag": ('''
class Attention(nn.Module):
    def __init__(self, causal=True):
        super().__init__()
        self.causal = causal
        self.register_buffer("tri", torch.tril(torch.ones(6, 6)))

    def forward(self, q, k, v):
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(self.tri == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
''', "F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)", ("masked_fill",)),
    "baddbmm-with-an-additive-bias": ('''
class Attention(nn.Module):
    def forward(self, q, k, v, bias):
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=q.shape[-1] ** -0.5)
        return torch.bmm(torch.softmax(scores, dim=-1), v)


def make():
    return Attention(), (*(torch.randn(4, 6, 8) for _ in range(3)), torch.randn(4, 6, 6))
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=bias)", ("baddbmm", "scale=")),
    "single-head-addmm-and-mm": ('''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rel", torch.randn(6, 6))

    def forward(self, q, k, v):
        scores = torch.addmm(self.rel, q, k.t(), alpha=q.shape[-1] ** -0.5)
        return torch.mm(torch.softmax(scores, dim=-1), v)


def make():
    return Attention(), tuple(torch.randn(6, 8) for _ in range(3))
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=self.rel)", ("addmm", "scale=", ".t()")),
    "einsum-channels-first-scaled-under-a-view": ('''
class Attention(nn.Module):
    def forward(self, qkv):
        bs, width, length = qkv.shape
        ch = width // 6
        q, k, v = qkv.chunk(3, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", (q * scale).view(bs * 2, ch, length), (k * scale).view(bs * 2, ch, length))
        weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
        a = torch.einsum("bts,bcs->bct", weight, v.reshape(bs * 2, ch, length))
        return a.reshape(bs, -1, length)


def make():
    return Attention(), (torch.randn(2, 24, 5),)
''', ").transpose(-2, -1)", ("einsum",)),
    "helper-with-a-guarded-dropout-module-passed-in": ('''
def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.1)

    def forward(self, q, k, v, mask):
        return attention(q, k, v, mask=mask, dropout=self.dropout)


def make():
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    return Attention(), (q, k, v, torch.tril(torch.ones(6, 6)))
''', "dropout_p=dropout.p if dropout is not None and dropout.training else 0.0", ("d_k", "p_attn")),
    "a-pre-transposed-key-variable": ('''
class Attention(nn.Module):
    def forward(self, q, k, v):
        kt = k.transpose(2, 3)
        scores = q @ kt * 0.5
        return scores.softmax(-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
''', "F.scaled_dot_product_attention(q, k, v, scale=0.5)", ("kt", "transpose")),
}


@pytest.mark.proof
@pytest.mark.parametrize("case", list(ATTENTION))
def test_attention_spellings_of_real_files_are_rewritten_and_proven(tmp_path, case):
    _, fixed = _proven_attention_fix(tmp_path, *ATTENTION[case], unsafe=UNSAFE_CASES.get(case))
    assert "softmax" not in fixed.split("def forward", 1)[1].split("def make", 1)[0]


# Cases whose fix is declared unsafe, and a piece of its reason: a finite fill (a fully masked row changes). A
# plain softmax or dropout module with no hook that the fix stops calling leaves it safe.
UNSAFE_CASES = {
    "masked-fill-under-a-guard-with-a-scale-after": "the fill `-1e9`",
    "helper-with-a-guarded-dropout-module-passed-in": "on a row whose every key is masked",
    "a-guard-that-reshapes-the-mask-it-tests": "the fill `-torch.finfo(sim.dtype).max`",
    "an-in-place-fill-with-a-fill-variable-made-under-the-guard": "the fill `-torch.finfo(sim.dtype).max`",
}


def _proven_attention_fix(tmp_path, source: str, expected: str, absent: tuple[str, ...], only_forward=False,
                          unsafe: str | None = None):
    """The model's one GL101 finding gets a safe fix that the proof applies (with `unsafe`, a piece of its
    reason, an unsafe fix that --unsafe-fixes applies); the fixed file contains `expected` (calls joined on one
    line) and none of `absent` before `make` (in `forward` only, with `only_forward`), and keeps no doubled
    blank lines. Returns the plan and the fixed text."""
    path = _model(tmp_path, ATTENTION_HEADER + source.lstrip("\n"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == ("unsafe" if unsafe else "safe"), finding.no_fix
    plan = _plan(tmp_path, report, unsafe=bool(unsafe))
    # A declared unsafe fix is proven too; it is written with --unsafe-fixes where its proof passed.
    assert [(f, why.startswith(f"declared unsafe: {finding.fix.message}; ")) for f, why in plan.refused] == \
        ([(finding, True)] if unsafe else [])
    known_wrong = False
    if unsafe:
        assert unsafe in finding.fix.message, finding.fix.message
        # It computes what the original did on the factory's inputs, and only a fully masked row (the reason a
        # finite fill's fix is unsafe) may tell them apart; where it does, no flag writes it.
        verdict = prove_fix(report, tmp_path, finding)
        assert verdict.ok or "with its first row all" in verdict.reason, verdict.reason
        known_wrong = not verdict.ok
    assert plan.broken == ([finding] if known_wrong else [])
    assert plan.applied == ([] if known_wrong else [finding])
    fixed = _rewritten(finding) if known_wrong else plan.texts[str(path)]
    assert expected in _one_line(fixed), fixed
    body = fixed.split("def make", 1)[0].split("def forward" if only_forward else "\n\n\n", 1)[1]
    assert not [fragment for fragment in absent if fragment in body], body
    assert "\n\n\n\n" not in fixed and (only_forward or "softmax(" not in body)
    return plan, fixed


GUARDS_AND_LAYOUTS = {
    "a-causal-mask-made-under-a-flag": ("""
class Attention(nn.Module):
    def forward(self, q, k, v, causal: bool = True):
        scores = q @ k.transpose(-2, -1)
        if causal:
            n = scores.size(-1)
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return F.softmax(scores, dim=-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
""", "F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)", ("if causal", "n = ")),
    "an-eager-function-slicing-its-mask-under-the-guard-with-the-callers-training-flag": ("""
def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), None


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, attention_mask=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out, _ = eager_attention_forward(self, q, k, v, attention_mask, self.scaling, dropout=0.1)
        return out.reshape(b, n, -1)


def make():
    mask = torch.zeros(2, 1, 6, 8)
    mask[..., 3:] = float("-inf")
    return Attention(), (torch.randn(2, 6, 16), mask)
""", "attn_mask=attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None, "
     "dropout_p=dropout if module.training else 0.0, scale=scaling)", ("causal_mask", "    if attention_mask")),
    "a-guard-that-reshapes-the-mask-it-tests": ("""
def exists(val):
    return val is not None


class Attention(nn.Module):
    def forward(self, q, k, v, mask=None):
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * q.shape[-1] ** -0.5
        if exists(mask):
            mask = mask[:, None, None, :]
            sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim=-1)
        return torch.einsum("b h i j, b h j d -> b h i d", attn, v)


def make():
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), mask)
""", "mask = mask[:, None, None, :]\n        return F.scaled_dot_product_attention("
        "q, k, v, attn_mask=torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min) if exists(mask) else None)",
        ("masked_fill", "einsum")),
    "probabilities-transposed-onto-the-right-of-the-values-product": ("""
class SelfAttention(nn.Module):
    def __init__(self, channels=16):
        super().__init__()
        self.query = nn.Conv2d(channels, channels // 8, 1)
        self.key = nn.Conv2d(channels, channels // 8, 1)
        self.value = nn.Conv2d(channels, channels, 1)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        b, c, w, h = x.size()
        q = self.query(x).view(b, -1, w * h).permute(0, 2, 1)
        k = self.key(x).view(b, -1, w * h)
        energy = torch.bmm(q, k)
        attention = self.softmax(energy)
        v = self.value(x).view(b, -1, w * h)
        out = torch.bmm(v, attention.permute(0, 2, 1))
        return out.view(b, c, w, h) + x


def make():
    return SelfAttention(), (torch.randn(2, 16, 4, 4),)
""", "F.scaled_dot_product_attention(q, k.transpose(-2, -1), v.transpose(-2, -1), scale=1.0).transpose(-2, -1)",
        ("energy", "permute(0, 2, 1))")),
    "an-augmented-assignment-adds-the-position-bias": ("""
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = 0.1

    def forward(self, query_states, key_states, value_states, position_bias):
        scores = torch.matmul(query_states, key_states.transpose(3, 2))
        scores += position_bias
        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        return torch.matmul(attn_weights, value_states)


def make():
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.randn(1, 2, 6, 6))
""", "F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=position_bias, "
     "dropout_p=self.dropout if self.training else 0.0, scale=1.0)", ("scores", "attn_weights")),
    "an-in-place-fill-with-a-fill-variable-made-under-the-guard": ("""
class Attention(nn.Module):
    def __init__(self, dim_head=8):
        super().__init__()
        self.scale = dim_head ** -0.5

    def forward(self, q, k, v, mask=None):
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        if mask is not None:
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = mask[:, None, :].repeat_interleave(2, dim=0)
            sim.masked_fill_(~mask, max_neg_value)
        attn = sim.softmax(dim=-1)
        return torch.einsum("b i j, b j d -> b i d", attn, v)


def make():
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 5:] = False
    return Attention(), (*(torch.randn(4, 6, 8) for _ in range(3)), mask)
""", "mask = mask[:, None, :].repeat_interleave(2, dim=0)\n"
     "        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(mask, q.new_zeros(()), "
     "torch.finfo(q.dtype).min) if mask is not None else None)",
        ("sim", "max_neg_value", "scale=")),
    "a-position-bias-and-a-mask-under-a-guard": ("""
class Attention(nn.Module):
    def __init__(self, heads=2, seq=6):
        super().__init__()
        self.rel = nn.Parameter(torch.randn(heads, seq, seq))

    def forward(self, q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores + self.rel.unsqueeze(0)
        if mask is not None:
            scores = scores + mask
        return scores.softmax(dim=-1) @ v


def make():
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.randn(2, 1, 6, 6))
""", "attn_mask=self.rel.unsqueeze(0) + mask if mask is not None else self.rel.unsqueeze(0))", ("scores", "    if mask")),
    "two-additive-biases-in-place": ("""
class Attention(nn.Module):
    def forward(self, q, k, v, alibi, causal):
        scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores += alibi
        scores += causal
        return torch.matmul(F.softmax(scores, dim=-1), v)


def make():
    causal = torch.triu(torch.full((6, 6), float("-inf")), diagonal=1)
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.randn(1, 2, 1, 6), causal)
""", "return F.scaled_dot_product_attention(q, k, v, attn_mask=alibi + causal)", ("scores", "scale=")),
    "a-mask-set-by-index-and-a-key-permuted-by-the-function": ("""
class Attention(nn.Module):
    def forward(self, q, k, v, pad):
        scores = torch.bmm(q, torch.permute(k, (0, 2, 1))) / math.sqrt(q.shape[-1])
        scores[pad] = float("-inf")
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights, v)


def make():
    pad = torch.zeros(2, 6, 6, dtype=torch.bool)
    pad[:, :, 5] = True
    return Attention(), (*(torch.randn(2, 6, 8) for _ in range(3)), pad)
""", "return F.scaled_dot_product_attention(q, k, v, attn_mask=~pad)", ("scores", "permute")),
    "a-query-scaled-on-its-own-line-in-the-unfused-branch": ("""
class Attention(nn.Module):
    def __init__(self, head_dim=8):
        super().__init__()
        self.scale = head_dim ** -0.5
        self.fused_attn = False
        self.attn_drop = nn.Dropout(0.1)

    def forward(self, q, k, v):
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        return x


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
""", "        else:\n            x = F.scaled_dot_product_attention("
     "q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)",
        ("q = q * self.scale", "attn.softmax", "scale=")),
    "an-upcast-under-a-flag-and-a-baddbmm-bias": ("""
class Attention(nn.Module):
    def __init__(self, upcast_softmax=True):
        super().__init__()
        self.upcast_softmax = upcast_softmax
        self.scale = 0.5

    def forward(self, q, k, v, mask):
        scores = torch.baddbmm(mask, q, k.transpose(-1, -2), beta=1, alpha=self.scale)
        if self.upcast_softmax:
            scores = scores.float()
        probs = scores.softmax(dim=-1)
        probs = probs.to(q.dtype)
        return torch.bmm(probs, v)


def make():
    return Attention(), (*(torch.randn(2, 6, 8) for _ in range(3)), torch.randn(2, 6, 6))
""", "return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)", ("upcast_softmax:", "probs")),
    "probabilities-transposed-into-a-values-einsum": ("""
class Attention(nn.Module):
    def forward(self, q, k, v):
        attn = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
        attn = attn.softmax(dim=-1).transpose(-2, -1)
        return torch.einsum("bhji,bhjd->bhid", attn, v)


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
""", "return F.scaled_dot_product_attention(q, k, v)", ("einsum", "transpose")),
}


@pytest.mark.proof
@pytest.mark.parametrize("case", list(GUARDS_AND_LAYOUTS))
def test_guards_that_prepare_the_mask_and_permuted_probabilities_are_rewritten_and_proven(tmp_path, case):
    _proven_attention_fix(tmp_path, *GUARDS_AND_LAYOUTS[case], unsafe=UNSAFE_CASES.get(case))


@pytest.mark.parametrize("guard, body, reason", [
    ("if scale_mask:", "q = q * 2\n            scores = scores + mask", "`q` changes between the scores and the values product"),
    ("if mask is not None:", "mask = mask if q.shape[-2] > 1 else None\n            scores = scores + mask",
     "`if mask is not None:` changes `mask`, which it tests"),
    ("if mask is not None:",
     "scores = scores.masked_fill(mask == 0, -1e9)\n        if scale_mask:\n            scores = scores + mask",
     "the scores are masked twice; the fused call takes one mask"),
])
def test_a_guard_whose_setup_cannot_move_into_the_call_is_left_alone_with_the_reason(tmp_path, guard, body, reason):
    source = ATTENTION_HEADER + f'''
class Attention(nn.Module):
    def forward(self, q, k, v, mask=None, scale_mask: bool = True):
        scores = q @ k.transpose(-2, -1)
        {guard}
            {body}
        return F.softmax(scores, dim=-1) @ v


def make():
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.zeros(6, 6))
'''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is None and finding.no_fix == reason


def test_a_mask_computed_from_the_scores_is_not_fusable_attention(tmp_path):
    """A bias made from the scores themselves is something the fused call cannot compute: no finding at all."""
    source = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            bias = scores.mean(-1, keepdim=True)
            scores = scores + mask * bias
        return F.softmax(scores, dim=-1) @ v


def make():
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.zeros(6, 6))
'''
    report = lint_file(_model(tmp_path, source), device="meta")
    assert report.errors == [] and findings_of(report, "GL101") == []


RETURNS_WEIGHTS = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return x, attn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, x, return_attention=False):
        y, attn = self.attn(x)
        if return_attention:
            return attn
        return x + y


def make():
    return Block(), (torch.randn(2, 5, 16),)
'''


def test_weights_also_returned_get_an_unsafe_fix_that_compiles_and_runs(tmp_path):
    path = _model(tmp_path, RETURNS_WEIGHTS)
    report = lint_file(path, device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == "unsafe"
    assert "`attn` returned or stored as None" in finding.fix.message
    fixed = _rewritten(finding)
    assert "return x, None\n" in fixed and "attn.softmax" not in fixed
    assert "y, attn = self.attn(x)" in fixed  # the caller gets None for the weights
    path.write_text(fixed, encoding="utf-8")  # the trade is documented: it must still run
    spec = importlib.util.spec_from_file_location("fixed_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, (x,) = module.make()
    assert model(x).shape == x.shape


# -- norms ---------------------------------------------------------------------------------------------------

NORMS = {
    "llama-norm-helper-between-casts": ('''
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def make():
    return RMSNorm(16), (torch.randn(2, 5, 16),)
''', "return nn.functional.rms_norm(x, (x.shape[-1],), eps=self.eps)", "output = self._norm(x.float()).type_as(x)"),
    "rmsnorm-in-the-middle-of-a-forward": ('''
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.g = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.fc(x)
        ms = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(ms + 1e-6) * self.g  # normalise
        return self.out(F.gelu(h))


def make():
    return Block(), (torch.randn(2, 5, 16),)
''', "h = F.rms_norm(h, (h.shape[-1],), eps=1e-6) * self.g  # normalise", "ms ="),
    "layernorm-in-the-middle-of-a-forward": ('''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.fc(x)
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        h = (h - mu) / torch.sqrt(var + 1e-5)
        return self.out(h)


def make():
    return Block(), (torch.randn(2, 5, 16),)
''', "h = nn.functional.layer_norm(h, (h.shape[-1],), eps=1e-5)", "mu ="),
}


@pytest.mark.proof
@pytest.mark.parametrize("case", list(NORMS))
def test_norms_in_helpers_and_inside_a_forward_are_rewritten_and_proven(tmp_path, case):
    source, expected, other = NORMS[case]
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL106")
    assert finding.fix is not None, finding.no_fix
    plan = _plan(tmp_path, report)
    assert plan.refused == [] and plan.applied == [finding]
    fixed = plan.texts[str(path)]
    assert expected in fixed
    assert (other in fixed) == other.startswith("output")  # the casts around the helper stay; dead statistics go


LOG_OF_A_VARIABLE = '''
import torch
import torch.nn.functional as F
from torch import nn


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 5)

    def forward(self, x, actions):
        logits = self.head(x)
        probs = F.softmax(logits, dim=-1)
        log_probs = torch.log(probs)
        entropy = -(probs * log_probs).sum(-1)
        return log_probs.gather(-1, actions[:, None]).squeeze(-1) + 0.01 * entropy


def make():
    return Policy(), (torch.randn(4, 8), torch.randint(0, 5, (4,)))
'''


@pytest.mark.proof
def test_the_log_of_probabilities_in_a_variable_is_rewritten_from_the_logits_and_proven(tmp_path):
    path = _model(tmp_path, LOG_OF_A_VARIABLE)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL204")
    plan = _plan(tmp_path, report)
    assert plan.refused == [] and plan.applied == [finding]
    fixed = plan.texts[str(path)]
    # The probabilities are still read by the entropy: their statement stays.
    assert "        probs = F.softmax(logits, dim=-1)\n        log_probs = F.log_softmax(logits, dim=-1)\n" in fixed


# -- the proof -----------------------------------------------------------------------------------------------

MIXED = '''
import torch
from torch import nn


class MixedMLP(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.register_buffer("table", torch.randn(4 * dim, dim))

    def forward(self, x):
        h = self.fc1(x)
        h = h * torch.sigmoid(h)
        return self.fc2(h) + h @ self.table.float()


def make():
    return MixedMLP(), (torch.randn(2, 5, 16),)
'''


@pytest.mark.proof
def test_a_model_that_cannot_run_in_float64_is_proven_in_its_own_dtype_and_says_so(tmp_path):
    path = _model(tmp_path, MIXED)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL107")
    plan = _plan(tmp_path, report)
    assert plan.refused == [] and plan.applied == [finding]
    [(noted, note)] = plan.notes
    assert noted == finding and note.startswith("proven in float32 at its tolerance, since the model cannot run in "
                                                "float64 (")
    assert "h = nn.functional.silu(h)\n" in plan.texts[str(path)]


# -- formatting ----------------------------------------------------------------------------------------------

FORMATTED = '''\
import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, dim=32, heads=4, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        # scores over the keys
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)

        y = att @ v  # (B, nh, T, hs)
        return y.transpose(1, 2).contiguous().view(b, t, c)


def make():
    return SelfAttention(), (torch.randn(2, 8, 32), torch.rand(8, 8) > 0.3)
'''


def test_a_formatted_file_stays_formatted_and_keeps_its_comments(tmp_path):
    ruff = [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "--isolated"]
    path = _model(tmp_path, FORMATTED)
    assert subprocess.run([*ruff, str(path)], capture_output=True).returncode == 0  # formatted to begin with
    report = lint_file(path, device="meta")
    [finding] = findings_of(report, "GL101")
    fixed = _rewritten(finding)
    assert "        # scores over the keys\n        y = F.scaled_dot_product_attention(\n" in fixed
    assert "\n        )  # (B, nh, T, hs)\n" in fixed
    path.write_text(fixed, encoding="utf-8")
    checked = subprocess.run([*ruff, "--diff", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.server
def test_the_language_server_offers_an_unsafe_fix_once_proven_labelled_never_as_the_preferred_quick_fix(tmp_path):
    """As `--unsafe-fixes` would write it: not before its proof, not when the proof refused it, and then as a
    quick fix titled with why it is unsafe, never the preferred one."""
    from lsprotocol import types

    from graphlint.report.columns import SourceColumns
    from graphlint.server.diagnostics import Shown, quick_fix

    report = lint_file(_model(tmp_path, GL105_MODEL), device="meta", extend_select=("GL105",))
    [finding] = findings_of(report, "GL105")
    diagnostic = types.Diagnostic(range=types.Range(types.Position(0, 0), types.Position(0, 1)), message="")
    shown = Shown(diagnostic, finding)
    assert quick_fix(shown, SourceColumns()) is None  # not yet proven
    assert quick_fix(shown, SourceColumns(), "output 0 differs by up to 0.5 in float64") is None
    action = quick_fix(shown, SourceColumns(), "")
    assert action.kind == types.CodeActionKind.QuickFix and not action.is_preferred
    assert action.title.startswith("Fix GL105 (unsafe: the state dict loses the layer's bias): ")


# -- chains through the project's helpers ---------------------------------------------------------------------

HELPER_MODULE = '''
import torch
import torch.nn.functional as F


def attention_scores(q, k, scale):
    return torch.matmul(q, k.transpose(-2, -1)) * scale


def softmax_fp32(x):
    """A softmax that always accumulates in float32."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def attention_probs(q, k, scale, bias=None):
    scores = torch.bmm(q, k.transpose(1, 2)) * scale
    if bias is not None:
        scores = scores + bias
    probs = F.softmax(scores.float(), dim=-1)
    del scores
    return probs.to(q.dtype)
'''

# (the model, a fragment the fixed model must contain (calls joined on one line), fragments its forward must lose)
THROUGH_HELPERS = {
    "scores-made-by-a-method": ('''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, 0.25
        self.qkv = nn.Linear(dim, 3 * dim)

    def _scores(self, q, k):
        return q @ k.transpose(-2, -1) * self.scale

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = self._scores(q, k)
        attn = attn.softmax(dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, n, c)


def make():
    return Attention(), (torch.randn(2, 5, 16),)
''', "F.scaled_dot_product_attention(q, k, v, scale=self.scale).transpose(1, 2)", ("self._scores(", "attn")),
    "a-mask-applied-by-a-function-under-its-own-guard": ('''
def apply_mask(scores, mask=None):
    """Hide the padded keys."""
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return scores


class Attention(nn.Module):
    def forward(self, q, k, v, mask=None):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = apply_mask(scores, mask)
        weights = F.softmax(scores, dim=-1)
        return torch.matmul(weights, v)


def make():
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    return Attention(), (q, k, v, torch.tril(torch.ones(6, 6)))
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=mask != 0 if mask is not None else None)",
        ("apply_mask(", "weights")),
    "a-softmax-method-between-the-products": ('''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def _softmax(self, x):
        return F.softmax(x.float(), dim=-1).type_as(x)

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        probs = self._softmax(scores)
        probs = self.drop(probs)
        return probs @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
''', "F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0)", ("_softmax(", "probs")),
    "scores-and-softmax-from-another-file-of-the-project": ('''
from attn_ops import attention_scores, softmax_fp32


class Attention(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.scale = 0.5
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = attention_scores(q, k, self.scale)
        p = softmax_fp32(s)
        return torch.bmm(p, v)


def make():
    return Attention(), (torch.randn(2, 6, 16),)
''', "return F.scaled_dot_product_attention(q, k, v, scale=self.scale)", ("attention_scores(", "softmax_fp32(")),
    "probabilities-made-and-masked-by-a-function-of-another-module": ('''
import attn_ops


class Attention(nn.Module):
    def forward(self, q, k, v, bias=None):
        probs = attn_ops.attention_probs(q, k, 0.5, bias)
        return torch.bmm(probs, v)


def make():
    return Attention(), (*(torch.randn(2, 6, 8) for _ in range(3)), torch.randn(2, 6, 6))
''', "return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.5)", ("attention_probs(", "probs")),
}


@pytest.mark.proof
@pytest.mark.parametrize("case", list(THROUGH_HELPERS))
def test_chains_through_helpers_are_rewritten_where_the_values_product_is_and_proven(tmp_path, case):
    helpers = write(tmp_path, "attn_ops.py", HELPER_MODULE.lstrip("\n"))
    plan, _ = _proven_attention_fix(tmp_path, *THROUGH_HELPERS[case], only_forward=True,
                                    unsafe=UNSAFE_CASES.get(case))
    assert str(helpers) not in plan.texts  # the helpers stay as they are: other callers may need them


@pytest.mark.parametrize("helper, reason", [
    ('''
    def _scores(self, q, k):
        d = q.shape[-1]
        return q @ k.transpose(-2, -1) / d
''', "`d` is computed inside `_scores`, where the fused call cannot read it"),
    ('''
    def _scores(self, q, k):
        if self.training:
            return q @ k.transpose(-2, -1)
        return q @ k.transpose(-2, -1) * 0.5
''', "the scores come from `_scores`, which graphlint reads only when it ends in its one `return`"),
])
def test_a_helper_the_fused_call_cannot_read_through_is_left_alone_with_the_reason(tmp_path, helper, reason):
    source = ATTENTION_HEADER + f'''
class Attention(nn.Module):
{textwrap.indent(textwrap.dedent(helper), "    ")}
    def forward(self, q, k, v):
        return self._scores(q, k).softmax(-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
'''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is None and finding.no_fix == reason


SCALE_ATTRIBUTE = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, qk_scale=None):
        super().__init__()
        self.heads, self.scale = heads, {scale}
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        return (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)


def make():
    return Attention(), (torch.randn(2, 5, 16),)
'''


@pytest.mark.parametrize("scale, written", [
    ("(dim // heads) ** -0.5", ""),  # the graph saw 1/sqrt(8), and the attribute can hold nothing else
    ("qk_scale or (dim // heads) ** -0.5", ", scale=self.scale"),  # the default here, a choice elsewhere
    ("0.25", ", scale=self.scale"),
])
def test_a_scale_attribute_is_left_out_only_when_the_graph_saw_the_default_and_the_source_cannot_hold_another(
        tmp_path, scale, written):
    report = lint_file(_model(tmp_path, SCALE_ATTRIBUTE.format(scale=scale)), device="meta")
    [finding] = findings_of(report, "GL101")
    assert f"F.scaled_dot_product_attention(q, k, v{written})" in _one_line(_rewritten(finding))


def test_a_source_reading_that_strays_from_the_products_the_graph_ran_is_refused(tmp_path):
    # The graph ran the first product; read from the source alone, the `if` looks like the scores' last step.
    source = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.cross = False

    def forward(self, q, k, v, memory):
        scores = q @ k.transpose(-2, -1)
        if self.cross:
            scores = q @ memory.transpose(-2, -1)
        return scores.softmax(-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(4))
'''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is None
    assert finding.no_fix == ("the source leads to another scores product (`q @ memory.transpose(-2, -1)`) than the one "
                              "the graph ran (`q @ k.transpose(-2, -1)`)")


def test_weights_returned_only_when_asked_for_become_none_there_in_an_unsafe_fix(tmp_path):
    source = ATTENTION_HEADER + '''
class SelfAttention(nn.Module):
    def forward(self, q, k, v, output_attentions=False):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        probs = nn.functional.softmax(scores, dim=-1)
        context = torch.matmul(probs, v)
        outputs = (context, probs) if output_attentions else (context,)
        return outputs


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = SelfAttention()

    def forward(self, q, k, v):
        return self.attention(q, k, v)[0]


def make():
    return Layer(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
'''
    path = _model(tmp_path, source)
    report = lint_file(path, device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == "unsafe"
    fixed = _rewritten(finding)
    assert "outputs = (context, None) if output_attentions else (context,)" in fixed
    namespace: dict = {}
    exec(compile(fixed, str(path), "exec"), namespace)  # the unsafe fix compiles and runs
    model, inputs = namespace["make"]()
    assert model(*inputs).shape == (2, 2, 6, 8)


def test_a_query_scaled_on_its_own_line_and_read_again_keeps_its_line(tmp_path):
    source = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v):
        q = q * 0.5
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return attn @ v, q


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
'''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    fixed = _rewritten(finding)
    assert "q = q * 0.5" in fixed and "F.scaled_dot_product_attention(q, k, v, scale=1.0), q" in _one_line(fixed)


@pytest.mark.proof
def test_a_softmax_helper_called_from_two_functions_gets_one_fix_rewriting_both_calls(tmp_path):
    source = ATTENTION_HEADER + '''
class Attention(nn.Module):
    def _softmax(self, x):
        return F.softmax(x.float(), dim=-1).type_as(x)

    def self_attention(self, q, k, v):
        scores = q @ k.transpose(-2, -1) * 0.5
        return self._softmax(scores) @ v

    def cross_attention(self, q, memory):
        scores = q @ memory.transpose(-2, -1) * 0.25
        probs = self._softmax(scores)
        return probs @ memory

    def forward(self, q, k, v, memory):
        return self.self_attention(q, k, v) + self.cross_attention(q, memory)


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(4))
'''
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")  # both run the helper's softmax line
    assert finding.occurrences == 2 and finding.fix is not None, finding.no_fix
    plan = _plan(tmp_path, report)
    assert plan.refused == [] and plan.applied == [finding]
    fixed = plan.texts[str(path)]
    assert "return F.scaled_dot_product_attention(q, k, v, scale=0.5)" in fixed
    assert "return F.scaled_dot_product_attention(q, memory, memory, scale=0.25)" in fixed
    assert "self._softmax(" not in fixed and "def _softmax" in fixed  # the helper stays


@pytest.mark.parametrize("caller_binds, helper_file, reason", [
    # The helper's constant, read where the caller has a parameter of the same name.
    ("bias_scale=5.0", False,
     "`bias_scale` in `scores` is its module's, but the caller binds its own; the fused call there would read the caller's"),
    # The helper's constant, in a file the caller's file does not share it with.
    ("", True, "`bias_scale` is a name of `scores`'s module, which the fused call in the caller's file could not read "
               "as the helper does"),
])
def test_a_helper_reading_its_own_modules_names_is_not_pasted_where_they_mean_something_else(
        tmp_path, caller_binds, helper_file, reason):
    helper = '''
bias_scale = 0.3


def scores(q, k, m=None):
    s = q @ k.transpose(-2, -1) * 0.25
    if m is not None:
        s = s + m * bias_scale
    return s
'''
    if helper_file:
        write(tmp_path, "attn_helpers.py", "import torch\n" + helper)
    model = f'''
{"from attn_helpers import scores" if helper_file else helper}


class Attention(nn.Module):
    def forward(self, q, k, v, mask=None{", " + caller_binds if caller_binds else ""}):
        return scores(q, k, mask).softmax(-1) @ v


def make():
    return Attention(), tuple(torch.randn(2, 2, 6, 8) for _ in range(3))
'''
    report = lint_file(_model(tmp_path, ATTENTION_HEADER + model), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is None and finding.no_fix == reason


def test_a_root_of_the_model_width_that_equals_the_head_dim_here_keeps_its_scale(tmp_path):
    # With one head the width is the head dim, so the graph saw the default; with two it would not be.
    source = SCALE_ATTRIBUTE.replace("self.heads, self.scale = heads, {scale}", "self.heads, self.scale = heads, dim ** -0.5")
    source = source.replace("return Attention(), ", "return Attention(heads=1), ")
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL101")
    assert "F.scaled_dot_product_attention(q, k, v, scale=self.scale)" in _one_line(_rewritten(finding))
