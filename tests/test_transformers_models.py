"""Real Hugging Face `transformers` models, built from small configs with random weights (no downloads)."""

from __future__ import annotations

import os

import pytest

from conftest import findings_of, line_of, lint_file, write

pytest.importorskip("transformers")
pytestmark = pytest.mark.transformers

TARGETS = '''
import torch
from transformers import AutoModel, AutoModelForCausalLM, BertConfig, GPT2Config, LlamaConfig

CONFIGS = {
    "gpt2": lambda: GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                               bos_token_id=0, eos_token_id=0),
    "llama": lambda: LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128),
    "bert": lambda: BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, vocab_size=128),
}


def build(family, implementation, dtype=torch.float32):
    auto = AutoModel if family == "bert" else AutoModelForCausalLM
    model = auto.from_config(CONFIGS[family](), attn_implementation=implementation, dtype=dtype)  # built here
    return model, (), {"input_ids": torch.randint(0, 128, (2, 16))}


def with_mask(family, implementation, dtype=torch.float32):
    model, args, kwargs = build(family, implementation, dtype)
    return model, args, {**kwargs, "attention_mask": torch.ones(2, 16, dtype=torch.long)}


def gpt2_eager(): return build("gpt2", "eager")
def gpt2_sdpa(): return build("gpt2", "sdpa")
def llama_eager(): return build("llama", "eager")
def llama_sdpa(): return build("llama", "sdpa")
def bert_eager(): return build("bert", "eager")
def bert_sdpa(): return build("bert", "sdpa")
def llama_bf16_eager(): return build("llama", "eager", torch.bfloat16)
def llama_bf16_sdpa(): return build("llama", "sdpa", torch.bfloat16)
def gpt2_masked_sdpa(): return with_mask("gpt2", "sdpa")
def gpt2_masked_eager(): return with_mask("gpt2", "eager")
def llama_masked_eager(): return with_mask("llama", "eager")
def llama_masked_sdpa(): return with_mask("llama", "sdpa")
def bert_masked_sdpa(): return with_mask("bert", "sdpa")
def bert_masked_eager(): return with_mask("bert", "eager")
def llama_bf16_masked_sdpa(): return with_mask("llama", "sdpa", torch.bfloat16)
def llama_bf16_masked_eager(): return with_mask("llama", "eager", torch.bfloat16)


class DetachedEmbeddings(torch.nn.Module):
    """A real Llama whose input embeddings are detached before the decoder."""

    def __init__(self):
        super().__init__()
        self.lm = build("llama", "sdpa")[0]

    def forward(self, input_ids):
        embeds = self.lm.get_input_embeddings()(input_ids).detach()  # the cut
        return self.lm(inputs_embeds=embeds).logits


def llama_detached_embeddings():
    return DetachedEmbeddings(), (torch.randint(0, 128, (2, 16)),)


def deberta():
    from transformers import DebertaV2Config

    config = DebertaV2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             vocab_size=128)
    return AutoModel.from_config(config), (), {"input_ids": torch.randint(0, 128, (2, 16))}  # deberta built
'''

FAMILIES = {"gpt2": "modeling_gpt2.py", "llama": "modeling_llama.py", "bert": "modeling_bert.py"}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return write(tmp_path_factory.mktemp("hf"), "hf_targets.py", TARGETS)


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_attention_is_flagged_where_the_user_built_the_model(family, targets):
    report = lint_file(targets, f"{family}_eager")
    assert report.errors == []
    [finding] = findings_of(report, "GL101")
    assert finding.location.path == str(targets)
    assert finding.location.line == line_of(targets, "# built here")
    assert finding.occurrences == 2  # two layers, one line of library code
    assert 'attn_implementation="sdpa"' in finding.message
    library = [r for r in finding.related if r.message.startswith("softmax in transformers")]
    assert library and os.path.basename(library[0].location.path) == FAMILIES[family]
    assert not library[0].location.first_party


@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_attention_is_not_flagged(family, targets):
    report = lint_file(targets, f"{family}_sdpa")
    assert report.errors == []
    assert findings_of(report, "GL101") == []


def test_a_model_class_without_sdpa_gets_no_advice_to_use_it(targets):
    """DeBERTa-v2 has no SDPA attention in transformers: building it with attn_implementation="sdpa" raises, so
    the finding says so and offers no fix."""
    from transformers import AutoModel, DebertaV2Config

    with pytest.raises(ValueError, match="does not support"):  # what the advice would have led to
        AutoModel.from_config(DebertaV2Config(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                              vocab_size=128), attn_implementation="sdpa")
    report = lint_file(targets, "deberta")
    assert report.errors == []
    [finding] = findings_of(report, "GL101")
    assert finding.location.line == line_of(targets, "# deberta built")
    assert 'attn_implementation="sdpa"' not in finding.message
    assert "no fused (sdpa) attention for DebertaV2Model" in finding.message
    assert finding.fix is None
    assert finding.no_fix == 'DebertaV2Model does not support attn_implementation="sdpa" in the installed transformers'


CLEAN_OF_CORRECTNESS_RULES = ["gpt2_eager", "gpt2_sdpa", "llama_eager", "llama_sdpa", "bert_eager", "bert_sdpa",
                              "llama_bf16_eager", "llama_bf16_sdpa", "gpt2_masked_sdpa", "bert_masked_eager",
                              "llama_bf16_masked_sdpa", "gpt2_masked_eager", "llama_masked_eager", "bert_masked_sdpa"]


@pytest.mark.parametrize("name", CLEAN_OF_CORRECTNESS_RULES)
def test_real_models_have_no_cast_inplace_or_gradient_findings(name, targets):
    report = lint_file(targets, name)
    assert report.errors == []
    assert [f for f in report.findings if f.rule_id != "GL101"] == []


@pytest.mark.parametrize("name", CLEAN_OF_CORRECTNESS_RULES)
def test_real_models_do_not_stall_the_device_from_the_users_code(name, targets):
    """Host syncs and host-built tensors inside transformers are the library's, not the project's; the factory
    switches no debugging mode on."""
    report = lint_file(targets, name, select=("GL103", "GL104", "GL108"))
    assert report.errors == []
    assert [r.id for r in report.rules] == ["GL103", "GL104", "GL108"]  # the rules really ran
    assert report.findings == []


KERNEL_AND_NUMERICS_RULES = ("GL105", "GL106", "GL107", "GL204")
EVERY_VARIANT = CLEAN_OF_CORRECTNESS_RULES + ["llama_masked_sdpa", "llama_bf16_masked_eager"]


@pytest.mark.parametrize("name", EVERY_VARIANT)
def test_library_norms_and_activations_are_not_the_users_to_fuse(name, targets):
    # Llama's RMSNorm and GPT-2's tanh GELU are written out by hand inside transformers, with no switch.
    report = lint_file(targets, name, extend_select=KERNEL_AND_NUMERICS_RULES)
    assert report.errors == []
    assert [f for f in report.findings if f.rule_id in KERNEL_AND_NUMERICS_RULES] == []


def test_a_detached_embedding_in_front_of_a_real_llama_is_a_gradient_cut(targets):
    report = lint_file(targets, "llama_detached_embeddings")
    assert report.errors == []
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(targets, "# the cut")
    assert finding.message.startswith(".detach() in the model cuts lm.model.embed_tokens.weight off from the loss")
