"""`graphlint memory --fsdp N` and `--ddp N` against real distributed runs, on CPU.

    python benchmarks/memory_distributed.py              # the table, world sizes 2 and 4
    python benchmarks/memory_distributed.py --quick      # world size 2 only, fewer rows

Truth: N processes started as torchrun starts them (benchmarks/distributed_runs.py: one spawned process per rank,
the gloo backend), the target sharded with torch's `fully_shard` (each block, then the root) or wrapped in
`DistributedDataParallel`, AdamW (the CPU's for-loop implementation), a first step for the optimizer's state,
then five steady-state steps (zero_grad(set_to_none=True), forward, loss, backward, step, output and loss held),
each under `torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)` on every rank; a
step's peak is the largest sum over the profiler's categories at one timestamp (as benchmarks/memory_accuracy.py
reads a single process), and a rank's truth the lowest of its five (up to eight steps when the profiler's own
analysis trips on one, every rank stepping alike; the lowest, because on a loaded machine the collectives' timing
raised a step's peak now and then, which is the machine's and not the model's). Estimate: `graphlint memory --train-on cpu
--fsdp N` (or `--ddp N`), made in this process with a fake process group; its `peak_bytes` against every rank's
truth, and the worst rank's error.

The models are small plain-torch shapes of GPT-2, Llama, a ViT and an LSTM language model (below), each a
graphlint target; `checkpoint=True` wraps each block in torch.utils.checkpoint (non-reentrant), and the bf16 rows
run FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as run_checkpointed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import distributed_runs  # noqa: E402
import memory_models  # noqa: E402
import model_state_formulas  # noqa: E402
import torch_trackers  # noqa: E402

import graphlint  # noqa: E402

VOCAB, SEQ, BATCH = 512, 64, 4


class Stack(nn.Module):
    """Blocks in a ModuleList, each optionally checkpointed, between an input and an output layer."""

    def run_blocks(self, x):
        for block in self.blocks:
            x = run_checkpointed(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return x


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(Stack):
    def __init__(self, dim: int = 128, depth: int = 4, heads: int = 4, checkpoint: bool = False):
        super().__init__()
        self.checkpoint = checkpoint
        self.tokens, self.positions = nn.Embedding(VOCAB, dim), nn.Embedding(SEQ, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads) for _ in range(depth))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.ln(self.run_blocks(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(Stack):
    def __init__(self, dim: int = 128, depth: int = 4, heads: int = 4, kv_heads: int = 2, hidden: int = 352,
                 checkpoint: bool = False, vocab: int = VOCAB):
        super().__init__()
        self.checkpoint = checkpoint
        self.tokens = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, kv_heads, hidden) for _ in range(depth))
        self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.norm(self.run_blocks(self.tokens(ids))))


class ViT(memory_models.ViT, Stack):
    def __init__(self, checkpoint: bool = False):
        super().__init__()
        self.checkpoint = checkpoint

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.run_blocks(x)[:, 0]))


class LSTMBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return x + self.lstm(self.norm(x))[0]


class LSTMLM(Stack):
    def __init__(self, dim: int = 128, depth: int = 3, checkpoint: bool = False):
        super().__init__()
        self.checkpoint = checkpoint
        self.tokens = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(LSTMBlock(dim) for _ in range(depth))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        return self.head(self.run_blocks(self.tokens(ids)))


def _language_model(model, batch: int = BATCH, seq: int = SEQ, vocab: int = VOCAB):
    ids = torch.randint(0, vocab, (batch, seq))
    labels = torch.randint(0, vocab, (batch, seq))
    return graphlint.Target(model, (ids,), loss=lambda out: F.cross_entropy(out.flatten(0, 1).float(),
                                                                          labels.flatten()))


def gpt2(checkpoint: bool = False):
    return _language_model(GPT(checkpoint=checkpoint))


def llama(checkpoint: bool = False):
    return _language_model(Llama(checkpoint=checkpoint))


def llama2_70b(depth: int = 80, seq: int = 4096, batch: int = 1):
    """The Llama-2-70B shape (8192 wide, 80 blocks, 64 heads over 8 key-value heads, 28672 hidden, a 32000-token
    vocabulary), every block checkpointed: a target for `graphlint memory --fsdp 64` on meta, never run for real."""
    model = Llama(dim=8192, depth=depth, heads=64, kv_heads=8, hidden=28672, checkpoint=True, vocab=32000)
    ids = torch.randint(0, 32000, (batch, seq))

    def loss(out):  # labels made to the output's size, so that the batch search can resize the inputs
        labels = torch.zeros(out.shape[0] * out.shape[1], dtype=torch.long, device=out.device)
        return F.cross_entropy(out.flatten(0, 1).float(), labels)

    return graphlint.Target(model, (ids,), loss=loss)


def lstm(checkpoint: bool = False):
    return _language_model(LSTMLM(checkpoint=checkpoint))


def vit(checkpoint: bool = False):
    images = torch.randn(8, 3, 32, 32)
    labels = torch.randint(0, 10, (8,))
    return graphlint.Target(ViT(checkpoint=checkpoint), (images,),
                            loss=lambda out: F.cross_entropy(out.float(), labels))


MODELS = {"GPT-2 shape": "gpt2", "Llama shape": "llama", "ViT": "vit", "LSTM LM": "lstm"}


def truth(rank: int, world: int, factory: str, strategy: str, checkpoint: bool, bf16: bool) -> int:
    """One rank's peak over one steady-state step, as PyTorch's memory profiler records it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    from graphlint.capture.loss import choose_loss

    torch.manual_seed(0)
    made = globals()[factory](checkpoint=checkpoint)
    model = made.model
    if strategy == "fsdp":
        options = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
            if bf16 else {}
        for block in model.blocks:
            fully_shard(block, **options)
        fully_shard(model, **options)
        wrapped = model
    else:
        wrapped = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    def step():
        output = wrapped(*made.args)
        loss = choose_loss(output, made.loss)
        loss.backward()
        optimizer.step()
        return output, loss

    step()  # the optimizer's state, and DDP's buckets rebuilt in the order gradients arrive
    optimizer.zero_grad(set_to_none=True)
    peaks = []
    for _ in range(8):  # every rank profiles the same steps, as collectives need every rank in the same step
        with profile(profile_memory=True, record_shapes=True, with_stack=True) as prof:
            optimizer.zero_grad(set_to_none=True)
            held = step()  # noqa: F841 - the loop's variables hold the output and loss to the end of the step
        del held
        try:
            _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
            peaks.append(max(sum(at) for at in sizes))
        except AssertionError:  # the profiler's own data-flow analysis trips now and then on a step
            pass
        read = torch.tensor([len(peaks)])
        torch.distributed.all_reduce(read, op=torch.distributed.ReduceOp.MIN)
        if read.item() >= 5:  # five steps read on every rank; more steps only where the profiler tripped
            break
    if not peaks:
        raise RuntimeError("the profiler could not analyse any of the steps")
    # The lowest step: on a quiet machine the steps are alike to the byte; on a loaded one (CI, two test workers
    # on two cores) FSDP's GPT-2 rank once peaked 1,071,488 bytes higher in most steps, the collectives' timing
    # against the step's own allocations, which is the machine's and not the model's.
    return min(peaks)


def estimated(factory: str, strategy: str, world: int, checkpoint: bool, bf16: bool) -> int:
    """`graphlint memory benchmarks/memory_distributed.py:FACTORY --train-on cpu --fsdp|--ddp WORLD`."""
    from graphlint.memory.distributed import Distribution
    from graphlint.memory.measure import Request, measure

    from graphlint.target import target_text

    target = target_text(f"{__file__}:{factory}", kwargs={"checkpoint": True} if checkpoint else None)
    distribution = Distribution(strategy, world, mixed_precision="bf16" if bf16 else None)
    request = Request(train_on="cpu", distribution=distribution)
    return measure(target, HERE, request).peak_bytes


def _worst(value: int, peaks: list[int]) -> float:
    return max((value - p) / p for p in peaks) if value >= max(peaks) else min((value - p) / p for p in peaks)


def _others(factory: str, strategy: str, world: int, checkpoint: bool, peaks: list[int]) -> str:
    """DeepSpeed's ZeRO-3 and accelerate's figures for the same model, with their error against the truth."""
    torch.manual_seed(0)
    model = globals()[factory](checkpoint=checkpoint).model
    zero3 = model_state_formulas.deepspeed_zero3(model, world) if strategy == "fsdp" else None
    accelerate = model_state_formulas.accelerate_training(model)
    cells = ["n/a (ZeRO-3 shards; DDP does not)" if zero3 is None else
             f"{zero3 / 2**20:.2f} MiB ({_worst(zero3, peaks):+.1%})",
             f"{accelerate / 2**20:.2f} MiB ({_worst(accelerate, peaks):+.1%})"]
    return " | ".join(cells)


def _tracker(factory: str, strategy: str, world: int, checkpoint: bool, bf16: bool, peaks: list[int],
             reasons: list[str], tracked: list[float]) -> str:
    """torch's FSDPMemTracker (FSDP2 rows) or MemTracker (DDP rows) on the same step, with its error; where it
    cannot run the row, why (the reason's text once, under the table, as a numbered note)."""
    status, value = torch_trackers.tracker_peak(factory, strategy, world, checkpoint, bf16)
    if status == "ok":
        tracked.append(abs(_worst(value, peaks)))
        return f"{value / 2**20:.2f} MiB ({_worst(value, peaks):+.1%})"

    def note(reason: str) -> int:
        if reason not in reasons:
            reasons.append(reason)
        return reasons.index(reason) + 1

    if status == "refused":
        reason, plain = value
        return (f"DDP fails on the fake group [{note(reason)}]; MemTracker, model unwrapped: "
                f"{plain / 2**20:.2f} MiB ({_worst(plain, peaks):+.1%})")
    return f"cannot run [{note(value)}]"


def cases(quick: bool) -> list[tuple[str, str, str, int, bool, bool]]:
    rows = []
    for world in (2,) if quick else (2, 4):
        for name, factory in MODELS.items():
            rows.append((name, factory, "fsdp", world, False, False))
            rows.append((name, factory, "ddp", world, False, False))
            if not quick or factory == "gpt2":
                rows.append((name, factory, "fsdp", world, True, False))
                rows.append((name, factory, "fsdp", world, False, True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help="one factory")
    args = parser.parse_args()
    print("| model | strategy | ranks | checkpointing | params | estimate | truth (per rank) | error (worst rank) "
          "| FSDPMemTracker / MemTracker | DeepSpeed ZeRO-3 | accelerate |")
    print("|---|---|---:|---|---|---:|---|---:|---:|---:|---:|")
    errors, reasons, tracked = [], [], []
    for name, factory, strategy, world, checkpoint, bf16 in cases(args.quick):
        if args.only and factory != args.only:
            continue
        estimate = estimated(factory, strategy, world, checkpoint, bf16)
        ranks = distributed_runs.run_ranks(world, truth, factory, strategy, checkpoint, bf16)
        failed = [value for status, value in ranks if status != "ok"]
        if failed:
            print(f"| {name} | {'FSDP2' if strategy == 'fsdp' else 'DDP'} | {world} | {'yes' if checkpoint else 'no'} | "
                  f"{'bf16' if bf16 else 'fp32'} | "
                  f"{estimate / 2**20:.2f} MiB | failed: {str(failed[0]).splitlines()[0]} | | | | |", flush=True)
            continue
        peaks = [value for _, value in ranks]
        worst = max((estimate - p) / p for p in peaks) if estimate >= max(peaks) else \
            min((estimate - p) / p for p in peaks)
        errors.append(abs(worst))
        others = _tracker(factory, strategy, world, checkpoint, bf16, peaks, reasons, tracked) + " | " + \
            _others(factory, strategy, world, checkpoint, peaks)
        print(f"| {name} | {'FSDP2' if strategy == 'fsdp' else 'DDP'} | {world} | {'yes' if checkpoint else 'no'} | "
              f"{'bf16' if bf16 else 'fp32'} | {estimate / 2**20:.2f} MiB | "
              f"{', '.join(f'{p / 2**20:.2f}' for p in peaks)} MiB | {worst:+.2%} | {others} |", flush=True)
    for number, reason in enumerate(reasons, 1):
        print(f"\n[{number}] {reason}")
    if errors:
        print(f"\nmedian |error| {statistics.median(errors):.2%}, worst {max(errors):.2%} over {len(errors)} rows; "
              f"{datetime.date.today()}, {platform.machine()} CPU, torch {torch.__version__}")
    if tracked:
        print(f"torch's tracker: median |error| {statistics.median(tracked):.2%}, worst {max(tracked):.2%} over "
              f"{len(tracked)} rows it ran")


if __name__ == "__main__":
    main()
