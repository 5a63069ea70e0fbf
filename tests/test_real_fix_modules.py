"""The modules of benchmarks/real_fixes/ (written after real repositories' attention code; benchmarks/real_fix_share.py
measures GL101's fixes on them) stay runnable and name their source, and that benchmark's own oracle tells a
rewrite that computes the same from one that does not. Nothing of graphlint runs here."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys

import pytest
import torch

from conftest import REPO

REAL = REPO / "benchmarks" / "real_fixes"
MODULES = sorted(p for p in REAL.glob("*.py") if not p.name.startswith("_"))
sys.path.insert(0, str(REPO / "benchmarks"))
real_fix_share = pytest.importorskip("real_fix_share")


def _constants(path):
    constants = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return constants


def test_the_set_spans_enough_repositories():
    assert len(MODULES) >= 10 and len({_constants(p)["REPOSITORY"] for p in MODULES}) >= 10


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_module_names_its_source_and_runs_forward_and_backward(path):
    constants = _constants(path)
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", constants["REPOSITORY"]) and constants["PATH"]
    assert re.fullmatch(r"[0-9a-f]{40}", constants["COMMIT"]), "the commit the file was read at"
    assert constants["COMMIT"] in path.read_text(encoding="utf-8").split('"""')[1], "the docstring names it too"
    spec = importlib.util.spec_from_file_location(f"real_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, inputs = module.make_model()
    out = model(*inputs)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_apply_edits_uses_one_based_columns_with_exclusive_ends():
    edits = [{"line": 2, "column": 2, "end_line": 3, "end_column": 1, "text": "X\n"},
             {"line": 1, "column": 1, "end_line": 1, "end_column": 2, "text": "Z"}]
    assert real_fix_share.apply_edits("ab\ncdef\ngh\n", edits) == "Zb\ncX\ngh\n"


def test_oracle_tells_same_from_different(tmp_path):
    original = REAL / "nanogpt_model.py"
    source = original.read_text(encoding="utf-8")
    fused = tmp_path / "fused" / original.name
    fused.parent.mkdir()
    chain = "att = F.softmax(att, dim=-1)\n            att = self.attn_dropout(att)\n            y = att @ v"
    fused.write_text(source.replace(chain, "y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[:, :, :T, :T] != 0)"),
                     encoding="utf-8")
    assert fused.read_text(encoding="utf-8") != source
    assert real_fix_share.oracle(original, fused)[0] == "same"  # the masked scores are left unused: same result
    scaled = tmp_path / "scaled" / original.name
    scaled.parent.mkdir()
    scaled.write_text(source.replace("F.softmax(att, dim=-1)", "F.softmax(att * 1.01, dim=-1)"), encoding="utf-8")
    verdict, detail = real_fix_share.oracle(original, scaled)
    assert verdict == "differs" and "largest gap" in detail


def test_oracle_sees_a_fully_masked_row(tmp_path):
    # perceiver's finite fill: a boolean-masked SDPA agrees on the factory's inputs, not on a row with every key masked
    original = REAL / "perceiver_pytorch.py"
    source = original.read_text(encoding="utf-8")
    old = """            sim.masked_fill_(~mask, max_neg_value)
        attn = sim.softmax(dim=-1)
        out = einsum("b i j, b j d -> b i d", attn, v)"""
    new = """            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)"""
    assert old in source
    fixed = tmp_path / original.name
    fixed.write_text(source.replace("        sim = einsum(\"b i d, b j d -> b i j\", q, k) * self.scale\n", "")
                     .replace("            max_neg_value = -torch.finfo(sim.dtype).max\n", "")
                     .replace(old, new), encoding="utf-8")
    verdict, detail = real_fix_share.oracle(original, fixed)
    assert verdict == "differs" and "first row all False" in detail
