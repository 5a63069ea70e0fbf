"""The cost of the torch.compile rules (GL301, GL302) per target, warm: `graphlint check` of one target with the
default rules against the same check with GL3xx added, in the same run, from one warm parent (torch, the rules
and dynamo imported and warmed up once, as `graphlint check` does), interleaved and repeated; medians.

    python benchmarks/compile_cost.py --repeat 5

Targets: the GPT-2-small shape of benchmarks/models.py (12 x 768, batch 2, sequence 128) and a transformers
Llama (16 layers x 2048, 32 heads, 4 key-value heads, batch 2, sequence 128), both on the meta device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()

    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.session import Options, check
    from graphlint.run.parent import WarmParent

    folder = Path(tempfile.mkdtemp(prefix="graphlint-compile-cost-"))
    (folder / "llama.py").write_text(LLAMA, encoding="utf-8")
    targets = {"GPT-2-small shape": f"{HERE / 'models.py'}:gpt2_small", "transformers Llama": f"{folder / 'llama.py'}:llama"}
    project = Project(root=folder, first_party_folders=[folder, HERE])
    parent = WarmParent()
    configs = {"check": Config(), "+ GL301": Config(extend_select=("GL301",)), "+ GL301, GL302": Config(extend_select=("GL3",))}

    def seconds(target: str, config: Config) -> float:
        start = time.perf_counter()
        report = check([target], project, config, Options(), parent=parent)
        elapsed = time.perf_counter() - start
        if report.errors:
            sys.exit(f"{target}: {report.errors[0].message}")
        return elapsed

    for target in targets.values():  # warm-up: the parent imports the libraries and dynamo once
        seconds(target, configs["+ GL301, GL302"])
    print(f"medians of {options.repeat}, seconds per target (extra over the check's, and the ratio)")
    for name, target in targets.items():
        times: dict[str, list[float]] = {label: [] for label in configs}
        for _ in range(options.repeat):
            for label, config in configs.items():
                times[label].append(seconds(target, config))
        base = statistics.median(times["check"])
        shown = [f"check {base:.2f}"] + [f"{label} {m:.2f} (+{m - base:.2f}, {m / base:.2f}x)"
                                          for label, m in ((label, statistics.median(t)) for label, t in times.items())
                                          if label != "check"]
        print(f"{name}: " + "; ".join(shown))


if __name__ == "__main__":
    main()
