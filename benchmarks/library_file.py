"""A library file of several thousand lines holding a model's attention, hand-written or fused, installed in
a site-packages folder: the benchmark's "findings inside a big library file" scenario.

    write_scenario(folder) -> (site-packages folder, target with findings, target without findings)
"""

from __future__ import annotations

from pathlib import Path

FILLER_FUNCTIONS = 1200  # about 6,000 lines, like diffusers' attention_processor.py (5,679)

ATTENTION = '''
class Attention(nn.Module):
    def __init__(self, dim=256, heads=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        {attention}
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Model(nn.Module):
    def __init__(self, layers=8, dim=256):
        super().__init__()
        self.blocks = nn.ModuleList(Attention(dim) for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x
'''
HAND_WRITTEN = "out = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v"
FUSED = "out = F.scaled_dot_product_attention(q, k, v)"
FILLER = '''

def helper_{n}(x, scale={n}):
    """Filler: library code that never runs."""
    y = x * scale + {n}
    return [y for _ in range(3)]
'''


def write_scenario(folder: Path) -> tuple[Path, str, str]:
    site = folder / "site-packages"
    targets = {}
    for name, attention in (("handwritten", HAND_WRITTEN), ("fused", FUSED)):
        package = site / f"biglib_{name}"
        package.mkdir(parents=True)
        source = "import math\n\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
        source += "".join(FILLER.format(n=n) for n in range(FILLER_FUNCTIONS))
        source += ATTENTION.replace("{attention}", attention)
        (package / "__init__.py").write_text(source, encoding="utf-8")
        target = folder / f"use_{name}.py"
        target.write_text(f"import torch\nfrom biglib_{name} import Model\n\n\n"
                          "def make():\n    return Model(), (torch.randn(2, 64, 256),)\n", encoding="utf-8")
        targets[name] = f"{target}:make"
    return site, targets["handwritten"], targets["fused"]
