"""Fixes right in every dtype the user may run: a mask the forward builds with a dtype of its own (a float32
`-inf` causal mask beside float64 queries) is cast to the queries' dtype in the fused call, since on the CPU
`scaled_dot_product_attention` computes float64 queries with a float32 mask wrongly where `scores + mask`
promoted; the proof says which dtype a difference appeared in; transformers' eager attention for Llama,
Mistral, Qwen2 and Gemma gets its fix proven."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import findings_of, fix_plan, lint_file, model_file, write

# The spelling of transformers' eager attention, written in the project: the softmax upcast to float32 and cast
# back, and a float32 `-inf` causal mask built in the forward (its dtype stays when the model runs in another).
EAGER = '''
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        mask = MASK
        mask = torch.triu(mask, diagonal=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (c // self.heads) ** 0.5
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)


def make():
    return Attention(), (torch.randn(4, 64, 64),)
'''
OWN_DTYPE = 'torch.full((n, n), float("-inf"), device=x.device)'
QUERIES_DTYPE = 'torch.full((n, n), float("-inf"), device=x.device, dtype=q.dtype)'


def float32_mask_is_wrong() -> bool:
    """Whether this torch computes float64 queries with a float32 additive mask wrongly on the CPU."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 16, 64, 32, dtype=torch.float64) for _ in range(3))
    mask = torch.full((64, 64), float("-inf")).triu(1)
    right = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.double())
    return not torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), right, atol=1e-6)


def test_torch_computes_float64_queries_with_a_float32_mask_wrongly_on_the_cpu():
    """The fact the cast rests on, in plain PyTorch (torch 2.13, CPU): float64 queries with a float32 additive
    mask give a wrong result; with the mask cast to float64, or float32 queries, the result is right."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 16, 64, 32, dtype=torch.float64) for _ in range(3))
    mask = torch.full((64, 64), float("-inf")).triu(1)
    reference = torch.softmax(q @ k.transpose(-2, -1) / 32 ** 0.5 + mask.double(), -1) @ v
    wrong = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    cast = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))
    single = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    if torch.allclose(wrong, reference, atol=1e-6):
        pytest.skip("this torch computes a float32 mask with float64 queries right: the cast is only a no-op")
    assert (wrong - reference).abs().max() > 0.1
    assert torch.allclose(cast, reference, atol=1e-10)
    assert torch.allclose(single.double(), reference, atol=1e-5)


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _output(path, name, dtype, autocast=False):
    module = _import(path, name)
    torch.manual_seed(0)
    model, (x,) = module.make()
    model = model.to(torch.float32 if autocast else dtype).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return model(x.to(torch.float32 if autocast else dtype)).double()


@pytest.mark.proof
@pytest.mark.parametrize("mask", [OWN_DTYPE, QUERIES_DTYPE], ids=["mask-of-its-own-dtype", "mask-in-the-queries-dtype"])
def test_an_upcast_softmax_with_a_mask_built_in_the_forward_is_fixed_right_in_every_dtype(tmp_path, mask):
    path = model_file(tmp_path, EAGER.replace("MASK", mask))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix.applicability == "safe", finding.fix.message
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and plan.applied == [finding]
    text = plan.texts[str(path)]
    assert "F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))" in text
    fixed = write(tmp_path / "fixed", "model.py", text)
    # In plain PyTorch, independently of the proof: the same result in each dtype, and under autocast.
    for dtype, tolerance in ((torch.float64, 1e-6), (torch.float32, 1e-5), (torch.bfloat16, 5e-2),
                             (torch.float16, 5e-3)):
        before, after = _output(path, "a", dtype), _output(fixed, "b", dtype)
        assert torch.allclose(before, after, atol=tolerance), (dtype, (before - after).abs().max())
    before, after = _output(path, "c", None, autocast=True), _output(fixed, "d", None, autocast=True)
    assert torch.allclose(before, after, atol=5e-2)


def _model_run(mode, base, record, verdict=""):
    done = subprocess.run([sys.executable, "-m", "graphlint.run.proof", mode, "model.py:make", str(base),
                           str(record), str(verdict)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.cli
@pytest.mark.proof
def test_the_uncast_rewrite_is_refused_and_the_proof_says_the_dtype_it_differed_in(tmp_path):
    """The rewrite the fix wrote before the cast: right in float32, wrong in the proof's float64 run, and the
    reason says float64 (at the float32 precision the model's upcast softmax computes in)."""
    original, rewritten = tmp_path / "original", tmp_path / "rewritten"
    source = EAGER.replace("MASK", OWN_DTYPE)
    write(original, "model.py", source)
    chain = source[source.index("        scores = torch.matmul"):source.index("\n\n\ndef make")]
    write(rewritten, "model.py", source.replace(chain, "        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)"))
    assert torch.allclose(_output(original / "model.py", "e", torch.float32),
                          _output(rewritten / "model.py", "f", torch.float32), atol=1e-5)
    _model_run("save", original, tmp_path / "record.pt")
    _model_run("compare", rewritten, tmp_path / "record.pt", tmp_path / "verdict.json")
    verdict = json.loads((tmp_path / "verdict.json").read_text(encoding="utf-8"))
    assert not verdict["ok"] and verdict["differs"]
    assert verdict["reason"].startswith("output 0 differs by up to ")
    assert " in float64 (compared at float32 precision, which part of the model computes in)" in verdict["reason"]


@pytest.mark.proof
def test_a_mask_the_forward_is_given_is_not_cast(tmp_path):
    """A float mask passed to the forward runs in the model's dtype (the proof casts it too): no cast added."""
    source = EAGER.replace("    def forward(self, x):", "    def forward(self, x, mask):").replace(
        "        mask = MASK\n        mask = torch.triu(mask, diagonal=1)\n", "").replace(
        "return Attention(), (torch.randn(4, 64, 64),)",
        'return Attention(), (torch.randn(4, 64, 64), torch.full((64, 64), float("-inf")).triu(1))')
    path = model_file(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    plan = fix_plan(report, tmp_path)
    assert plan.applied == [finding]
    assert "F.scaled_dot_product_attention(q, k, v, attn_mask=mask)" in plan.texts[str(path)]


TRANSFORMERS = '''
import torch
from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig, MistralConfig, Qwen2Config

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "gemma": GemmaConfig}


def build(family, implementation):
    torch.manual_seed(0)
    config = CONFIGS[family](**SMALL, **({"head_dim": 16} if family == "gemma" else {}))
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    return model, (torch.randint(0, 128, (2, 16)),)


def llama():
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMALL), attn_implementation="eager")
    return model, (torch.randint(0, 128, (2, 16)),)


def mistral():
    model = AutoModelForCausalLM.from_config(MistralConfig(**SMALL), attn_implementation="eager")
    return model, (torch.randint(0, 128, (2, 16)),)


def qwen2():
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL), attn_implementation="eager")
    return model, (torch.randint(0, 128, (2, 16)),)


def gemma():
    model = AutoModelForCausalLM.from_config(GemmaConfig(**SMALL, head_dim=16), attn_implementation="eager")
    return model, (torch.randint(0, 128, (2, 16)),)
'''


@pytest.mark.transformers
@pytest.mark.proof
def test_transformers_eager_attention_of_llama_mistral_qwen2_and_gemma_gets_a_proven_fix(tmp_path):
    """One run over the four families: each eager attention is reported with the fix `attn_implementation=
    "sdpa"`, proven on the model; in plain PyTorch the two builds agree in float64 and float32."""
    pytest.importorskip("transformers")
    path = model_file(tmp_path, TRANSFORMERS, name="models.py")
    from conftest import check_targets

    families = ["llama", "mistral", "qwen2", "gemma"]
    report = check_targets(tmp_path, [f"models.py:{family}" for family in families], device="cpu",
                           select=("GL101",))
    findings = findings_of(report, "GL101")
    assert len(findings) == 4 and all(f.fix is not None and f.fix.applicability == "safe" for f in findings)
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and len(plan.applied) == 4
    assert plan.texts[str(path)].count('attn_implementation="sdpa"') == 4
    module = _import(path, "families")
    for family in families:
        # The eager softmax computes in float32 even in a float64 model: agreement to float32's precision.
        for dtype, tolerance in ((torch.float64, 1e-5), (torch.float32, 1e-4)):
            outputs = []
            for implementation in ("eager", "sdpa"):
                model, (ids,) = module.build(family, implementation)
                outputs.append(model.to(dtype).eval()(ids).logits)
            assert torch.allclose(*outputs, atol=tolerance), (family, dtype, (outputs[0] - outputs[1]).abs().max())


LAYERS = '''
import torch
from torch import nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (c // self.heads) ** 0.5
        scores = scores + mask
        return torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, n, c)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Attention(), Attention()])

    def forward(self, x, valid):
        mask = (~valid)[:, None, None, :].float() * -10000.0
        for layer in self.layers:
            x = x + layer(x, mask)
        return x


def make():
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    return Encoder(), (torch.randn(2, 6, 32), valid)
'''


@pytest.mark.proof
def test_layers_sharing_a_mask_of_its_own_dtype_get_one_cast_rewrite(tmp_path):
    """The mask is made once with `.float()` and given to every layer: the second layer's scores depend on it
    through the first, yet both layers' occurrences get the one rewrite, with the cast, proven."""
    path = model_file(tmp_path, LAYERS)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.occurrences == 2 and finding.fix is not None, finding.no_fix
    plan = fix_plan(report, tmp_path)
    assert plan.applied == [finding]
    assert "attn_mask=mask.to(q.dtype)" in plan.texts[str(path)]
