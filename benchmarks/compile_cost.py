"""The cost of the torch.compile rules (GL301, GL302, on by default) per target: `graphlint check` of one target
without them (`--ignore GL3`: the check they are compared with), with GL301 alone, and with both (the default),
in the same run, from one warm parent (torch, the rules and dynamo imported and warmed up once, as `graphlint
check` does), interleaved and repeated; medians. Each is measured cold (no result cache) and warm: with the
result cache, after a one-line edit of the target's file outside the model (a comment appended). The edit
misses the result cache, as any edit of the file does, so the model is captured again; the torch.compile
analysis is read from the memo the cold-cache fill left (graphlint.capture.compile_memo), since nothing it
compiled changed. `--block-edit` adds the warm cost after a one-line edit inside one block of the repeated
stack (a statement added to the block's forward), which the memo cannot reuse for that block.

`--commands` measures instead what a user runs, as whole commands in fresh processes with no cache, side by
side and interleaved: `graphlint check --no-cache --ignore GL3`, `graphlint check --no-cache` (GL3 on), and
plain `torch._dynamo.explain` on the CPU (benchmarks/dynamo_explain.py: what a user would otherwise run to learn
where the graph breaks; it fails on meta for transformers models); the bar is the default check costing no
more than the other two together.

    python benchmarks/compile_cost.py --repeat 3 --block-edit
    python benchmarks/compile_cost.py --repeat 3 --commands
    python benchmarks/compile_cost.py --repeat 3 --only vit,resnet

Targets, all on the meta device:
- gpt2: the GPT-2-small shape of benchmarks/models.py (12 x 768, batch 2, sequence 128), hand-written attention;
- llama: a transformers Llama (16 layers x 2048, 32 heads, 4 key-value heads, batch 2, sequence 128);
- vit: a ViT-B/16 shape in plain PyTorch (12 x 768, 224 x 224 images, batch 2), fused attention;
- resnet: a ResNet-50 shape in plain PyTorch (bottleneck blocks 3-4-6-3, 224 x 224 images, batch 2).

`--whole-model` adds a column: GL3 with the repeated-block shortcut off (GRAPHLINT_COMPILE_WHOLE_MODEL=1), the
analysis as it was before the shortcut, measured in the same run.

`--floor` adds two columns measured without graphlint's analysis: plain dynamo with a backend that only returns
the traced graph, on the target's meta model, in a process where torch and dynamo are already warm, timed around
the compiled model's calls alone: the first call (one trace: the least any analysis that asks dynamo where the
graph breaks can cost), and that call then the batch one and two larger (the automatic-dynamic recompile: the
least an analysis that asks dynamo what recompiles can cost). Each is added to the plain check's time of the same
run and quoted against it, so it is the ratio GL301 and GL3 could reach if graphlint's own work cost nothing.

The bar: with the cache kept, GL3 costs at most 1.3x the check without it on all four.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent

LLAMA = '''
import torch
from transformers import AutoModelForCausalLM, LlamaConfig


def llama():
    config = LlamaConfig(num_hidden_layers=16, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000)
    return AutoModelForCausalLM.from_config(config), (), {"input_ids": torch.randint(0, 32000, (2, 128))}
'''

VISION = '''
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image=224, patch=16, dim=768, depth=12, heads=12, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class Bottleneck(nn.Module):
    def __init__(self, c_in, width, stride):
        super().__init__()
        c_out = 4 * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        blocks, c_in = [], 64
        for stage, count in enumerate(layers):
            width = 64 * 2 ** stage
            for index in range(count):
                blocks.append(Bottleneck(c_in, width, 2 if index == 0 and stage > 0 else 1))
                c_in = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes)

    def forward(self, images):
        return self.head(self.blocks(self.stem(images)).mean(dim=(2, 3)))


def vit():
    return ViT(), (torch.randn(2, 3, 224, 224),)


def resnet():
    return ResNet(), (torch.randn(2, 3, 224, 224),)


def unrelated_helper():
    """Outside the model: the edit between warm runs changes the file, not the model."""
    return None
'''

# The repeated block whose forward `--block-edit` edits, by target (None: the blocks are a library's).
BLOCKS = {"gpt2": "GPTBlock", "llama": None, "vit": "Block", "resnet": "Bottleneck"}


def _targets(folder: Path) -> dict[str, str]:
    shutil.copyfile(HERE / "models.py", folder / "models.py")
    (folder / "llama.py").write_text(LLAMA, encoding="utf-8")
    (folder / "vision.py").write_text(VISION, encoding="utf-8")
    return {"gpt2": f"{folder / 'models.py'}:gpt2_small", "llama": f"{folder / 'llama.py'}:llama",
            "vit": f"{folder / 'vision.py'}:vit", "resnet": f"{folder / 'vision.py'}:resnet"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="gpt2,llama,vit,resnet", help="comma-separated target names")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache measurements")
    parser.add_argument("--floor", action="store_true",
                        help="also plain dynamo alone on the target (no graphlint analysis), in the same run")
    parser.add_argument("--floor-of", help=argparse.SUPPRESS)  # internal: one floor measurement, in its own process
    parser.add_argument("--block-edit", action="store_true",
                        help="also the warm cost after a one-line edit inside one block of the repeated stack")
    parser.add_argument("--commands", action="store_true",
                        help="whole commands, cold: the check with and without GL3 against plain dynamo explain")
    parser.add_argument("--whole-model", action="store_true",
                        help="also GL3 with the repeated-block shortcut off (the whole model compiled), in the same run")
    options = parser.parse_args()
    if options.floor_of:
        print(*(f"{value:.4f}" for value in _floor_of(options.floor_of)))
        return

    from graphlint.capture.compile_regions import WHOLE_MODEL_ENV
    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.run.parent import WarmParent
    from graphlint.session import Options, check

    folder = Path(tempfile.mkdtemp(prefix="graphlint-compile-cost-"))
    targets = {name: text for name, text in _targets(folder).items() if name in options.only.split(",")}
    if options.commands:
        _commands(targets, folder, options.repeat)
        return
    project = Project(root=folder, first_party_folders=[folder])
    parent = WarmParent()
    configs = {"check": Config(ignore=("GL3",)), "+ GL301": Config(ignore=("GL302",)), "+ GL3": Config()}
    if options.whole_model:
        configs["+ GL3 whole model"] = Config()
    cache = folder / ".cache"

    def seconds(target: str, config: Config, warm: bool | str) -> float:
        path = Path(target.rsplit(":", 1)[0])
        if warm == "block":  # a one-line edit inside one block: that block's code changed
            _edit_block(path, BLOCKS[next(n for n, t in targets.items() if t == target)])
        elif warm:  # a one-line edit outside the model: the file changed, the model did not
            with path.open("a", encoding="utf-8") as handle:
                handle.write(f"# edited {time.perf_counter()}\n")
        # The children inherit the environment: the shortcut is off for the whole-model column only.
        os.environ.pop(WHOLE_MODEL_ENV, None)
        if config is configs.get("+ GL3 whole model"):
            os.environ[WHOLE_MODEL_ENV] = "1"
        start = time.perf_counter()
        report = check([target], project, config, Options(cache=cache if warm else None), parent=parent)
        elapsed = time.perf_counter() - start
        os.environ.pop(WHOLE_MODEL_ENV, None)
        if report.errors:
            sys.exit(f"{target}: {report.errors[0].message}")
        return elapsed

    for target in targets.values():  # warm-up: the parent imports the libraries and dynamo once; fills the cache
        seconds(target, configs["+ GL3"], warm=False)
        for config in configs.values():
            check([target], project, config, Options(cache=cache), parent=parent)
    print(f"graphlint compile cost, {date.today()}, {platform.machine()} with {_cores()} cores, Python "
          f"{platform.python_version()}; medians of {options.repeat} (seconds per target, ratio to the check)")
    modes = (False,) if options.no_warm else (False, True)
    for name, target in targets.items():
        for warm in (*modes, *(("block",) if options.block_edit and BLOCKS[name] else ())):
            times: dict[str, list[float]] = {label: [] for label in configs}
            for _ in range(options.repeat):
                for label, config in configs.items():
                    times[label].append(seconds(target, config, warm))
            medians = {label: statistics.median(values) for label, values in times.items()}
            base = medians["check"]
            if options.floor and not warm:
                floors = [_floor(target) for _ in range(options.repeat)]
                for index, label in enumerate(("one trace", "trace and recompile", "one block's trace",
                                               "one block's trace and recompile")):
                    medians[f"check + {label}"] = base + statistics.median(f[index] for f in floors)
            shown = "; ".join(f"{label} {m:.2f} s ({m / base:.2f}x)" for label, m in medians.items())
            mode = {False: "cold", True: "warm cache, one-line edit", "block": "warm cache, edit inside one block"}[warm]
            print(f"{name} ({mode}): {shown}")


def _edit_block(path: Path, block: str) -> None:
    """Add a statement at the top of `block`'s forward (a new constant each time, so its code changes)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"class {block}("))
    at = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("def forward(")) + 1
    lines.insert(at, f"        edited = {time.perf_counter_ns()}  # one-line edit\n")
    path.write_text("".join(lines), encoding="utf-8")


def _commands(targets: dict[str, str], folder: Path, repeat: int) -> None:
    """Whole commands in fresh processes, cold, interleaved: the check without GL3, the default check (GL3 on),
    and plain dynamo explain on the CPU; medians, and the default check against the other two together."""
    import subprocess

    runs = {"check --ignore GL3": [sys.executable, "-m", "graphlint", "check", "--no-cache", "--ignore", "GL3"],
            "check (GL3 on)": [sys.executable, "-m", "graphlint", "check", "--no-cache"],
            "dynamo explain (CPU)": [sys.executable, str(HERE / "dynamo_explain.py")]}
    print(f"graphlint check against plain dynamo explain, whole commands, cold, {date.today()}, {platform.machine()} "
          f"with {_cores()} cores, Python {platform.python_version()}; medians of {repeat} (seconds)")
    for name, target in targets.items():
        times: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(repeat):
            for label, command in runs.items():
                start = time.perf_counter()
                done = subprocess.run([*command, target], cwd=folder, capture_output=True, text=True)
                times[label].append(time.perf_counter() - start)
                if done.returncode not in (0, 1):
                    sys.exit(f"{name}: {label} failed: {(done.stderr or done.stdout).strip()[-400:]}")
        plain, default, explain = (statistics.median(times[label]) for label in runs)
        print(f"{name}: check without GL3 {plain:.2f} s; check with GL3 {default:.2f} s ({default / plain:.2f}x); "
              f"dynamo explain {explain:.2f} s; with GL3 / (without + explain) = {default / (plain + explain):.2f}")


def _floor(target: str) -> list[float]:
    """One floor measurement (see `--floor`) in a fresh process: nothing of another run's dynamo state reaches it."""
    import subprocess

    done = subprocess.run([sys.executable, __file__, "--floor-of", target], capture_output=True, text=True, check=True)
    return [float(value) for value in done.stdout.split()]


def _floor_of(target: str) -> list[float]:
    """Seconds of plain dynamo on the target's meta model: the first call, and the first call with the batch one
    and two larger after it; then the same for the first of its repeated blocks alone, on the inputs it got in
    the first call (the least a shortcut that traces one block of each kind could cost, glue not counted).
    torch, dynamo and the target's model are ready before each clock starts."""
    import copy

    import torch
    import torch._dynamo as dynamo

    from graphlint.capture import dimensions
    from graphlint.capture.compile import _real_meta_tensors_accepted, grown, warm_up
    from graphlint.capture.compile_regions import repeated_blocks
    from graphlint.capture.build import move_to_meta
    from graphlint.target import TargetSpec, importable, load_factory, normalize_factory_result

    warm_up()
    spec = TargetSpec.parse(target, Path.cwd())
    with importable(spec):
        loaded = load_factory(spec)
    with torch.device("meta"):
        made = normalize_factory_result(loaded.factory())
    move_to_meta(made)
    model = made.model
    block = model.get_submodule(repeated_blocks(model)[0])
    seen = []
    # A copy as it came in: a cache object the call fills (transformers' DynamicCache) starts empty on each call.
    handle = block.register_forward_pre_hook(lambda _, args, kwargs: seen.append(copy.deepcopy((args, kwargs))),
                                             with_kwargs=True)
    with torch.no_grad():
        model(*made.args, **made.kwargs)
    handle.remove()

    def timed(module, args, kwargs) -> list[float]:
        size = dimensions.sizes(args, kwargs).get("batch")
        calls = [copy.deepcopy((args, kwargs))] + ([grown(args, kwargs, "batch", size, extra) for extra in (1, 2)]
                                                   if size else [])
        dynamo.reset()
        compiled = dynamo.optimize(lambda gm, example_inputs: gm.forward)(module)
        with torch.enable_grad(), _real_meta_tensors_accepted(True):  # as a training step; meta needs the second
            start = time.perf_counter()
            compiled(*calls[0][0], **calls[0][1])
            first = time.perf_counter() - start
            for call_args, call_kwargs in calls[1:]:
                compiled(*copy.deepcopy(call_args), **copy.deepcopy(call_kwargs))
            return [first, time.perf_counter() - start]

    return timed(model, made.args, made.kwargs) + timed(block, *seen[0])


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    main()
