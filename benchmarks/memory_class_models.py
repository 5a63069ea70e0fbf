"""Small models, one per class of code the memory tracker once got wrong (issue 52), for the checks against
PyTorch's CPU memory profiler in tests/test_memory_tracker_classes.py: each is built from a small config with
random weights, so that the profiler's run takes seconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import graphlint


class Slices(nn.Module):
    """One activation read through 8 slices: backward sends 8 gradients of the activation's full size into one
    input buffer, which the engine adds up in place."""

    def __init__(self, width: int = 512, parts: int = 8) -> None:
        super().__init__()
        self.up = nn.Linear(64, width * parts)
        self.parts = parts
        self.width = width

    def forward(self, x):
        wide = self.up(x)
        return sum((wide[:, i * self.width:(i + 1) * self.width] ** 2).sum(-1) for i in range(self.parts))


def slices():
    x = torch.randn(512, 64)
    return graphlint.Target(Slices(), (x,), loss=lambda out: out.mean())


class PackedLstm(nn.Module):
    """An LSTM with a projection, fed a packed sequence (aten's packed loop: the input buffers of the cells'
    hidden states add up the gradients of the steps that read them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(64, 128, num_layers=2, proj_size=32, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return self.head(out)


def packed_lstm():
    x = torch.randn(16, 48, 64)
    lengths = torch.tensor([48 - 2 * i for i in range(16)])
    labels = torch.randint(0, 10, (16, 48))
    return graphlint.Target(PackedLstm(), (x, lengths),
                            loss=lambda out: F.cross_entropy(out.flatten(0, 1), labels[:, :out.shape[1]].flatten()))


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(256, 256, batch_first=True)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        with torch.backends.mkldnn.flags(enabled=False):  # aten's own loop, not oneDNN's kernel
            out, _ = self.lstm(x)
        return self.head(out)


def lstm_without_onednn():
    x = torch.randn(16, 128, 256)
    labels = torch.randint(0, 10, (16, 128))
    return graphlint.Target(Tagger(), (x,), loss=lambda out: F.cross_entropy(out.flatten(0, 1), labels.flatten()))


class DataDependentLm(nn.Module):
    """A small language model whose forward needs real values (a length read with `.item()`), so the step runs
    on CPU: the LM head's gradient from `sum()` reaches BLAS with stride 0 and is copied at the logits' size."""

    def __init__(self, vocab: int = 4000, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        used = int((ids >= 0).sum(1).max().item())  # real values: the meta device cannot run this
        hidden = torch.tanh(self.mix(self.embed(ids[:, :used])))
        return self.head(hidden)


def data_dependent_lm():
    ids = torch.randint(0, 4000, (8, 128))
    return graphlint.Target(DataDependentLm(), (ids,), loss=lambda logits: logits.sum())


class Conv1dLstm(nn.Module):
    """Audio features (batch, mel bins, frames) through a convolution and an LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(80, 64, 3, padding=1)
        self.lstm = nn.LSTM(64, 64, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, mels):
        out, _ = self.lstm(self.conv(mels).transpose(1, 2))
        return self.head(out)


def conv1d_lstm():
    return graphlint.Target(Conv1dLstm(), (torch.randn(4, 80, 200),), loss=lambda out: out.mean())


def large_bf16_product():
    """A bfloat16 product of 2^36 multiply-adds: its oneDNN buffers on CPU are not measured (on meta, no cost)."""
    model = nn.Linear(4096, 4096, dtype=torch.bfloat16)
    return graphlint.Target(model, (torch.randn(4096, 4096, dtype=torch.bfloat16),), loss=lambda out: out.float().mean())


class SparseGraph(nn.Module):
    """A graph convolution over a sparse adjacency matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x, adjacency):
        return torch.sparse.mm(adjacency, self.linear(x))


def sparse_graph():
    edges = torch.randint(0, 256, (2, 1024))
    adjacency = torch.sparse_coo_tensor(edges, torch.ones(1024), (256, 256)).coalesce()
    return graphlint.Target(SparseGraph(), (torch.randn(256, 32), adjacency), loss=lambda out: out.pow(2).mean())


class BagRecommender(nn.Module):
    """A DLRM-shaped recommender: dense features, and for each of 4 tables a bag of ids per example (ids and
    offsets stacked per table, as the data loaders of such models batch them)."""

    def __init__(self, tables: int = 4, rows: int = 1000, width: int = 16) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, width, mode="sum") for _ in range(tables))
        self.bottom = nn.Linear(13, width)
        self.top = nn.Linear(width * (tables + 1), 1)

    def forward(self, dense, ids, offsets):
        pooled = [bag(ids[i], offsets[i]) for i, bag in enumerate(self.bags)]
        return self.top(torch.cat([self.bottom(dense), *pooled], 1))


def bag_recommender():
    batch, per_example = 64, 128
    ids = torch.randint(0, 1000, (4, batch * per_example))
    offsets = torch.arange(0, batch * per_example, per_example).repeat(4, 1)
    return graphlint.Target(BagRecommender(), (torch.randn(batch, 13), ids, offsets),
                            loss=lambda out: F.binary_cross_entropy_with_logits(out, torch.ones_like(out)))


def hf_llama_checkpointed():
    """transformers' Llama from a small config, random weights, with gradient_checkpointing_enable()."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2000, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 2000, (4, 128))
    return graphlint.Target(model, (), {"input_ids": ids, "labels": ids}, loss=lambda out: out.loss)


def fsdp_truth(rank: int, world: int, factory: str) -> int:
    """One rank's peak over a steady-state step of `factory`'s model under FSDP2 (fully_shard on every repeated
    block, as graphlint wraps it by default, then the root), as PyTorch's memory profiler records it: the median of
    three steps."""
    import statistics

    from torch.distributed.fsdp import fully_shard
    from torch.profiler import profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    from graphlint.capture.loss import choose_loss
    from graphlint.memory.distributed import blocks_to_shard
    from graphlint.target import normalize_factory_result

    torch.manual_seed(0)
    made = normalize_factory_result(globals()[factory]())
    model = made.model
    modules = dict(model.named_modules())
    for name in blocks_to_shard(model, ()):
        fully_shard(modules[name])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    def step():
        output = model(*made.args, **made.kwargs)
        loss = choose_loss(output, made.loss)
        loss.backward()
        optimizer.step()
        return output, loss

    step()
    peaks = []
    for _ in range(3):
        with profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
            optimizer.zero_grad(set_to_none=True)
            held = step()  # noqa: F841 - the loop holds the output and loss to the end of the step
        del held
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
        peaks.append(max(sum(at) for at in sizes))
    return statistics.median_low(peaks)
