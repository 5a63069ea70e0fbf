"""GL102 finds dtype conversions repeated by loops and layers, and leaves one-off and sensitive casts alone."""

from __future__ import annotations

import textwrap

import pytest
import torch

from conftest import findings_of, line_of, lint_file, write

LOOP = '''
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(16, 16)

    def forward(self, x, mask):
        h = x.new_zeros(x.shape[1], 16)
        for t in range(x.shape[0]):
            h = self.cell(x[t], h)
{body}
        return h.float()


def make():
    return Decoder().half(), (torch.randn(6, 4, 16, dtype=torch.float16), torch.ones(6, 4, 1, dtype=torch.bool))
'''


def loop_model(body: str) -> str:
    return LOOP.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 12))


LOOP_INVARIANT = {
    "the whole mask, then indexed": "h = h * mask.to(h.dtype)[t]  # cast",
    "indexed, then converted": "h = h * mask[t].half()  # cast",
    "a parameter converted at every step": "h = h + self.cell.bias_hh.float().half()[:16]  # cast",
}

NOT_FLAGGED = {
    "no-op casts of a tensor already in the dtype": "h = h.half().to(torch.float16) + x[t].half()",
    "a different tensor converted at each step": "h = (h.float() * 2).half()",
}


@pytest.mark.parametrize("body", LOOP_INVARIANT.values(), ids=LOOP_INVARIANT.keys())
def test_a_loop_invariant_cast_is_flagged_with_its_count(body, tmp_path):
    path = write(tmp_path, "model.py", loop_model(body))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert finding.location.line == line_of(path, "# cast")
    assert finding.occurrences == 6
    assert "6 times in one forward (in the model); convert it once, before the loop" in finding.message


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_casts_that_are_no_ops_or_of_new_values_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", loop_model(body)))
    assert report.errors == []
    assert findings_of(report, "GL102") == []


LAYERS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.conv = nn.Conv1d(16, 16, 1)

    def forward(self, x):
{body}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make():
    return Model(), (torch.randn(2, 16, 8, dtype=torch.{dtype}),)
'''


def layers_model(body: str, dtype: str = "float16") -> str:
    source = LAYERS.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))
    return source.replace("{dtype}", dtype)


ROUND_TRIPS = {
    "Linear": ("return x + self.fc(x.transpose(1, 2).float()).half().transpose(1, 2)  # trip", "float16", "linear"),
    "convolution with an activation between": (
        "return torch.relu(self.conv(x.to(torch.float32))).to(torch.float16)  # trip", "float16", "conv1d"),
    "bfloat16 matmul": ("w = self.fc.weight\nreturn (w @ x.float()).bfloat16()  # trip", "bfloat16", "matmul"),
}


@pytest.mark.parametrize("case", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_a_round_trip_around_matrix_work_in_every_layer_is_flagged(case, tmp_path):
    body, dtype, work = case
    path = write(tmp_path, "model.py", layers_model(body, dtype))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert finding.location.line == line_of(path, "# trip")
    assert finding.message.startswith(f"The {dtype} → float32 → {work} → {dtype} round trip runs 4 times in one "
                                      "forward (in blocks.0 … blocks.3); run the layer under torch.autocast")
    assert {r.message for r in finding.related} >= {f"{work} in float32", f"cast back to {dtype}"}


SENSITIVE = {
    "float32 softmax": "return torch.softmax(x.float(), dim=-1).half()",
    "float32 layer norm after a Linear": ("h = self.fc(x.transpose(1, 2).float())\n"
                                          "return torch.nn.functional.layer_norm(h, (16,)).half().transpose(1, 2)"),
    "float32 variance": "v = x.float().pow(2).mean(-1, keepdim=True)\nreturn (x * torch.rsqrt(v + 1e-6).half())",
    "float32 log-sum-exp of matrix work": ("return x + torch.logsumexp(self.fc(x.transpose(1, 2).float()), -1, "
                                           "keepdim=True).half().transpose(1, 2)"),
}


@pytest.mark.parametrize("body", SENSITIVE.values(), ids=SENSITIVE.keys())
def test_up_casts_around_numerically_sensitive_work_are_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", layers_model(body)))
    assert report.errors == []
    assert findings_of(report, "GL102") == []


def test_a_single_cast_outside_any_loop_is_not_flagged(tmp_path):
    path = write(tmp_path, "model.py", layers_model("return x + self.fc(x.transpose(1, 2)).transpose(1, 2)", "float32")
                 .replace("        return x\n\n\ndef make", "        return x.float()\n\n\ndef make"))
    report = lint_file(path)
    assert report.errors == [] and findings_of(report, "GL102") == []


def test_a_library_converting_the_users_input_in_every_step_is_reported_at_the_factory(tmp_path):
    """A library function that converts the same input again at each step (a diffusion model's timestep
    embedding): the user cannot move the library's line, but the input's dtype causes it, so the finding is at
    the factory that makes the input, with the library's line related; the same code in the project is flagged
    at its own line."""
    library = '''
import torch


def embed(mask, h):
    return h * mask.to(h.dtype)  # cast
'''
    write(tmp_path / "site-packages", "masklib.py", library)
    call = "h = masklib.embed(mask[t], h)"
    path = write(tmp_path, "model.py", loop_model(call).replace(
        "import torch\n", "import sys\nsys.path.insert(0, __file__.rsplit('/', 1)[0] + '/site-packages')\n"
                          "import masklib\nimport torch\n", 1))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert finding.location.path == str(path) and finding.location.line == line_of(path, "def make")
    assert finding.occurrences == 6
    assert "input 2 (bool, shape [6, 4, 1]) is converted to float16 6 times in one forward inside `masklib`" in (
        finding.message)
    assert [r.location.path for r in finding.related] == [str(tmp_path / "site-packages" / "masklib.py")]
    write(tmp_path / "project", "masklib.py", library)  # the same code as the project's own: flagged there
    own = write(tmp_path / "project", "model.py", path.read_text().replace("/site-packages", "/project"))
    [finding] = findings_of(lint_file(own), "GL102")
    assert finding.location.path == str(tmp_path / "project" / "masklib.py") and finding.occurrences == 6


DITLIB = '''
import math

import torch
from torch import nn


def timestep_embedding(t, dim, freqs):
    args = t.to(freqs.dtype)[:, None] * freqs[None]  # timestep cast
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("freqs", torch.exp(-math.log(10000) * torch.arange(dim // 2) / (dim // 2)).half())
        self.ada = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, t):
        emb = timestep_embedding(t, x.shape[-1], self.freqs.to(x.dtype))  # own buffer, whatever the user does
        shift, scale = self.ada(emb).chunk(2, dim=-1)
        return x + self.mlp(self.norm(x) * (1 + scale[:, None]) + shift[:, None])


class DiT(nn.Module):
    def __init__(self, dim=16, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x, timesteps):
        for block in self.blocks:
            x = block(x, timesteps)
        return x
'''

DIT_PROJECT = '''
import sys
sys.path.insert(0, __file__.rsplit('/', 1)[0] + '/site-packages')
import ditlib
import torch


def make():
    timesteps = torch.randint(0, 1000, (2,))
    return ditlib.DiT(), (torch.randn(2, 5, 16), timesteps)
'''


def test_integer_timesteps_a_library_converts_in_every_block_are_reported_at_the_users_factory(tmp_path):
    """A diffusion transformer from an installed library converts integer timesteps in each of its 4 blocks;
    float timesteps avoid it. Reported at the project's factory, naming the input; the library's conversion of
    its own buffer (which happens whatever the user passes) is not reported."""
    write(tmp_path / "site-packages", "ditlib.py", DITLIB)
    path = write(tmp_path, "model.py", DIT_PROJECT)
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert (finding.location.path, finding.location.line) == (str(path), line_of(path, "def make"))
    assert finding.occurrences == 4
    assert "input 2 (int64, shape [2]) is converted to float32 4 times in one forward inside `ditlib`" in (
        finding.message)
    assert "make the input float32 where it is created" in finding.message
    [related] = {r.location.line for r in finding.related}
    assert related == line_of(tmp_path / "site-packages" / "ditlib.py", "# timestep cast")
    fixed = write(tmp_path, "fixed.py", DIT_PROJECT.replace("(2,))", "(2,)).float()"))
    assert findings_of(lint_file(fixed), "GL102") == []


def test_float_timesteps_remove_the_librarys_conversions_in_plain_pytorch(tmp_path, monkeypatch):
    """The user's change removes the casts: counted with a torch function mode around the library's forward."""
    from torch.overrides import TorchFunctionMode

    write(tmp_path / "site-packages", "ditlib.py", DITLIB)
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import ditlib

    class Casts(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.changed = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "to" and isinstance(out, torch.Tensor) and out.dtype != args[0].dtype:
                self.changed.append((args[0].dtype, out.dtype))
            return out

    model, x = ditlib.DiT(), torch.randn(2, 5, 16)
    counts = {}
    for name, timesteps in {"int": torch.randint(0, 1000, (2,)), "float": torch.randint(0, 1000, (2,)).float()}.items():
        with Casts() as mode:
            model(x, timesteps)
        counts[name] = [pair for pair in mode.changed if pair[0] != torch.float16]  # the buffer's own casts
    assert counts == {"int": [(torch.int64, torch.float32)] * 4, "float": []}


def test_casts_in_a_librarys_generated_forward_are_not_placed_at_the_project_definition(tmp_path):
    """A library model run through its torch.fx forward (generated code, no file of its own, so the casts have
    no frame at all): they were grouped as one site and reported as "the same tensor" converted, at the project's
    definition. Now they are the library's, reported with their cause: the input's dtype."""
    write(tmp_path / "site-packages", "ditlib.py", DITLIB)
    project = DIT_PROJECT.replace("import torch\n", "import torch\nimport torch.fx\n").replace(
        "return ditlib.DiT(), (torch.randn(2, 5, 16), timesteps)",
        "return torch.fx.symbolic_trace(ditlib.DiT()), (torch.randn(2, 5, 16), timesteps)")
    path = write(tmp_path, "model.py", project)
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert "The same tensor" not in finding.message
    assert "input 2 (int64, shape [2]) is converted to float32 4 times" in finding.message


LORALIB = '''
import torch
from torch import nn


class LoraLinear(nn.Module):
    def __init__(self, base, r=4, adapter_dtype=torch.float32):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False, dtype=adapter_dtype)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, dtype=adapter_dtype)

    def forward(self, x):
        out = self.base(x)
        return out + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))).to(out.dtype)  # adapter cast


def add_adapters(model, r=4, adapter_dtype=torch.float32):
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, LoraLinear(child, r, adapter_dtype))
        else:
            add_adapters(child, r, adapter_dtype)
    return model
'''

LORA_PROJECT = '''
import sys
sys.path.insert(0, __file__.rsplit('/', 1)[0] + '/site-packages')
import loralib
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.relu(self.proj(x))


class Model(nn.Module):
    def __init__(self, dim=16, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make():
    model = loralib.add_adapters(Model().to(torch.bfloat16){options})  # configured
    return model, (torch.randn(2, 16, dtype=torch.bfloat16),)
'''


def test_float32_adapters_on_a_bfloat16_model_are_reported_at_the_users_configuration(tmp_path):
    """LoRA adapters an installed library keeps in float32 on a bfloat16 base: the library converts the
    activations up and back around them in every layer. The user's call that adds them decides their dtype, so
    the finding is there; adapters in bfloat16 run no conversion and get none."""
    write(tmp_path / "site-packages", "loralib.py", LORALIB)
    path = write(tmp_path, "model.py", LORA_PROJECT.replace("{options}", ""))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL102")
    assert (finding.location.path, finding.location.line) == (str(path), line_of(path, "# configured"))
    assert finding.occurrences == 4
    assert "`loralib` runs a bfloat16 → float32 → linear → bfloat16 round trip 4 times" in finding.message
    assert "blocks.0.proj.lora_B.weight" in finding.message and "keep them in bfloat16" in finding.message
    fixed = write(tmp_path, "fixed.py", LORA_PROJECT.replace("{options}", ", adapter_dtype=torch.bfloat16"))
    report = lint_file(fixed)
    assert report.errors == [] and findings_of(report, "GL102") == []


def test_bfloat16_adapters_remove_the_conversions_in_plain_pytorch(tmp_path, monkeypatch):
    """Counted in plain PyTorch: 8 dtype-changing conversions per forward with float32 adapters, none with
    bfloat16 ones."""
    from torch.overrides import TorchFunctionMode

    write(tmp_path / "site-packages", "loralib.py", LORALIB)
    path = write(tmp_path, "project.py", LORA_PROJECT.replace("{options}", "").replace("import sys\n", "import sys  # noqa\n"))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import loralib
    import project

    class Casts(TorchFunctionMode):
        changed = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "to" and isinstance(out, torch.Tensor) and out.dtype != args[0].dtype:
                Casts.changed += 1
            return out

    counts = []
    for dtype in (torch.float32, torch.bfloat16):
        model = loralib.add_adapters(project.Model().to(torch.bfloat16), adapter_dtype=dtype)
        Casts.changed = 0
        with Casts():
            model(torch.randn(2, 16, dtype=torch.bfloat16))
        counts.append(Casts.changed)
    assert path.exists() and counts == [8, 0]
