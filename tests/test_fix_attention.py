"""GL101's fix: hand-written attention rewritten as one scaled_dot_product_attention call, each supported
spelling proven on the model (float64 outputs and gradients, the state dict loading strictly), and the
chains the fused call cannot express left alone with the reason."""

from __future__ import annotations

import re
import textwrap

import pytest

from conftest import WITHOUT_COMPILE, findings_of, fix_plan, lint_file, run_graphlint, write
from graphlint.rewrite.edits import apply_edits
from graphlint.results import UNSAFE

HEADER = '''
import math
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, seq=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def split(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return [z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)]

'''

FOOTER = '''

def make():
    mask = torch.randn(8, 8).masked_fill(torch.rand(8, 8) > 0.7, float("-inf")).fill_diagonal_(0)
    keep = torch.rand(2, 2, 8, 8) > 0.3
    keep[..., 0] = True
    return Attention(), (torch.randn(2, 8, 16), mask, keep)
'''

# (the forward, a piece of the fused call that --fix must write)
FORMS = {
    "additive-mask-divided-scale": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        d = q.size(-1) + 1
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        scores = scores + mask
        probs = F.softmax(scores, dim=-1)
        return probs @ v
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(d))"),
    "causal-buffer-masked-fill-and-dropout-module": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        t = x.shape[1]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.drop(att)
        return (att @ v).transpose(1, 2)
''', "F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.drop.p if self.training else 0.0)"
     ".transpose(1, 2)"),
    "triu-made-in-the-forward-no-scale-matmul": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        t = x.shape[1]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(future, -1e9)
        return torch.matmul(scores.softmax(dim=-1), v)
''', "F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)"),
    "where-keep-float32-softmax-functional-dropout-scaled-query": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        scores = (q * 0.5) @ k.mT
        scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
        probs = scores.float().softmax(-1).type_as(q)
        probs = F.dropout(probs, p=0.2, training=self.training)
        return probs @ v
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(keep, q.new_zeros(()), "
     "torch.finfo(q.dtype).min), dropout_p=0.2 if self.training else 0.0, scale=0.5)"),
    "flipped-where-and-a-pre-transposed-key": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        kt = k.transpose(2, 3)
        scores = q @ kt * self.heads
        scores = torch.where(~keep, float("-inf"), scores)
        return scores.softmax(-1) @ v
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=self.heads)"),
    "scale-after-an-additive-mask-scales-the-mask-too": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        scores = q @ k.transpose(-2, -1) + mask
        scores = scores / 4
        return scores.softmax(-1) @ v
''', "F.scaled_dot_product_attention(q, k, v, attn_mask=mask / 4, scale=1 / 4)"),
}

# Forms whose fix is declared unsafe, and a piece of the reason its message gives: one whose finite fill no mask
# of the fused call reproduces. (One that stops calling a plain dropout module with no hook is safe.)
UNSAFE_FORMS = {
    "where-keep-float32-softmax-functional-dropout-scaled-query": "the fill `torch.finfo(scores.dtype).min`",
}

# (the forward, the start of the reason the fix is left alone)
REFUSED = {
    "probabilities-used-before-the-values-product": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        probs = (q @ k.transpose(-2, -1)).softmax(-1)
        total = probs.sum()
        return probs @ v + total
''', "the probabilities pass through `.sum()`"),
    "chain-across-functions": ('''
    def attend(self, scores, v):
        return scores.softmax(-1) @ v

    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        return self.attend(q @ k.transpose(-2, -1), v)
''', "`scores` comes from outside the function"),
    "two-masks": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        scores = (q @ k.transpose(-2, -1)).masked_fill(mask > 0, float("-inf")).masked_fill(~keep, float("-inf"))
        return scores.softmax(-1) @ v
''', "the scores are masked twice"),
    "key-reassigned-before-the-values": ('''
    def forward(self, x, mask, keep):
        q, k, v = self.split(x)
        probs = (q @ k.transpose(-2, -1)).softmax(-1)
        k = k * 2
        return probs @ v + k
''', "`k` changes between the scores and the values product"),
}


def _source(forward: str) -> str:
    return HEADER.lstrip() + textwrap.indent(textwrap.dedent(forward).strip("\n"), "    ") + "\n" + FOOTER


def _project(tmp_path, source):
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    return write(tmp_path, "model.py", source)


@pytest.mark.proof
@pytest.mark.parametrize("form", list(FORMS))
def test_each_supported_spelling_is_rewritten_and_proven_on_the_model(tmp_path, form):
    forward, call = FORMS[form]
    path = _project(tmp_path, _source(forward))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None, finding.no_fix
    unsafe = form in UNSAFE_FORMS
    assert (finding.fix.applicability == UNSAFE) == unsafe, finding.fix.message
    assert not unsafe or UNSAFE_FORMS[form] in finding.fix.message, finding.fix.message
    plan = fix_plan(report, tmp_path, unsafe=unsafe)
    # A declared unsafe fix is proven too; it is written with --unsafe-fixes unless the proof found it computes
    # something else (the finite fill on a fully masked row: the reason it is unsafe).
    assert [(f, why.startswith(f"declared unsafe: {finding.fix.message}; ")) for f, why in plan.refused] == \
        ([(finding, True)] if unsafe else [])
    known_wrong = bool(plan.broken)
    assert plan.broken == ([finding] if known_wrong else []) and (unsafe or not known_wrong)
    assert not known_wrong or "with its first row all" in plan.refused[0][1], plan.refused
    assert plan.applied == ([] if known_wrong else [finding])
    fixed = apply_edits(path.read_text(), finding.fix.edits) if known_wrong else plan.texts[str(path)]
    # A long call is written over three lines, or one argument a line with a trailing comma.
    assert call in re.sub(r"\(\s+", "(", re.sub(r",?\s+\)", ")", re.sub(r",\n\s+", ", ", fixed)))
    assert "softmax" not in fixed  # the chain's statements are gone, not left as dead code
    compile(fixed, str(path), "exec")


@pytest.mark.parametrize("case", list(REFUSED))
def test_chains_the_fused_call_cannot_express_are_left_alone_with_the_reason(tmp_path, case):
    forward, reason = REFUSED[case]
    report = lint_file(_project(tmp_path, _source(forward)), device="meta")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is None
    assert finding.no_fix.startswith(reason), finding.no_fix


@pytest.mark.proof
@pytest.mark.cli
def test_fix_rewrites_the_attention_and_the_finding_is_gone(tmp_path):
    path = _project(tmp_path, _source(FORMS["triu-made-in-the-forward-no-scale-matmul"][0]))
    first = run_graphlint("check", *WITHOUT_COMPILE, "--fix", "model.py:make", cwd=tmp_path)
    assert "fixed 1 finding in 1 file" in first.stderr, first.stderr
    assert first.returncode == 0, first.stdout
    fixed = path.read_text(encoding="utf-8")
    assert "is_causal=True" in fixed and "masked_fill(future" not in fixed
    again = run_graphlint("check", *WITHOUT_COMPILE, "model.py:make", cwd=tmp_path)
    assert again.returncode == 0 and "GL101" not in again.stdout


@pytest.mark.proof
@pytest.mark.transformers
@pytest.mark.cli
def test_transformers_models_get_attn_implementation_sdpa_on_the_users_call(tmp_path):
    source = '''
        import torch
        from transformers import AutoModelForCausalLM, GPT2Config


        def make():
            config = GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                                bos_token_id=0, eos_token_id=0)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # the slow path
            return model, (torch.randint(0, 64, (2, 8)),)
    '''
    path = _project(tmp_path, textwrap.dedent(source))
    result = run_graphlint("check", *WITHOUT_COMPILE, "--fix", "model.py:make", cwd=tmp_path)
    assert "fixed 1 finding in 1 file" in result.stderr, result.stderr
    assert 'from_config(config, attn_implementation="sdpa")  # the slow path\n' in path.read_text(encoding="utf-8")
