"""GL302 on the patterns of real code, each finding checked against plain torch.compile run the way the analysis
runs it (gradients on, one eager call first, the same calls): a guided-diffusion ResBlock whose Python bool
`updown` differs between instances, run through a checkpoint helper of another file whose `*args` length differs
too (dynamo compiles the helper's frames once per variant until recompile_limit), and a forward whose counter is
read after a graph break, in the function dynamo resumes there."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest
import torch

from conftest import check_targets, findings_of, line_of, write
from graphlint.capture.compile import Recompile
from graphlint.capture.frames import Frame
from graphlint.rules.gl302_recompile import hazards

pytestmark = pytest.mark.compile

CHECKPOINT = '''
import torch
from torch import nn


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, length, *args):
        ctx.run_function = run_function
        ctx.input_tensors = list(args[:length])
        ctx.input_params = list(args[length:])
        with torch.no_grad():
            output_tensors = ctx.run_function(*ctx.input_tensors)
        return output_tensors

    @staticmethod
    def backward(ctx, *output_grads):
        ctx.input_tensors = [x.detach().requires_grad_(True) for x in ctx.input_tensors]
        with torch.enable_grad():
            shallow = [x.view_as(x) for x in ctx.input_tensors]
            output_tensors = ctx.run_function(*shallow)
        grads = torch.autograd.grad(output_tensors, ctx.input_tensors + ctx.input_params, output_grads,
                                    allow_unused=True)
        return (None, None) + grads


def checkpoint(func, inputs, params, flag):
    if flag:
        args = tuple(inputs) + tuple(params)
        return CheckpointFunction.apply(func, len(inputs), *args)
    return func(*inputs)


'''

UNET = '''
import torch
from torch import nn

from gd_nn import checkpoint


class ResBlock(nn.Module):
    def __init__(self, channels, out_channels=None, up=False, down=False):
        super().__init__()
        out_channels = out_channels or channels
        self.updown = up or down
        self.in_layers = nn.Sequential(nn.GroupNorm(4, channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1))
        if up:
            self.h_upd = self.x_upd = nn.Upsample(scale_factor=2)
        elif down:
            self.h_upd = self.x_upd = nn.AvgPool2d(2)
        self.emb_layers = nn.Linear(16, out_channels)
        self.out_layers = nn.Sequential(nn.GroupNorm(4, out_channels), nn.SiLU(),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip = nn.Identity() if out_channels == channels else nn.Conv2d(channels, out_channels, 1)

    def forward(self, x, emb):
        return checkpoint(self._forward, (x, emb), self.parameters(), True)

    def _forward(self, x, emb):
        if self.updown:
            in_rest, in_conv = self.in_layers[:-1], self.in_layers[-1]
            h = in_rest(x)
            h = self.h_upd(h)
            x = self.x_upd(x)
            h = in_conv(h)
        else:
            h = self.in_layers(x)
        emb_out = self.emb_layers(emb)
        while len(emb_out.shape) < len(h.shape):
            emb_out = emb_out[..., None]
        h = h + emb_out
        h = self.out_layers(h)
        return self.skip(x) + h


class UNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([
            ResBlock(8), ResBlock(8, down=True), ResBlock(8, 16), ResBlock(16), ResBlock(16, down=True),
            ResBlock(16, up=True), ResBlock(16, 8), ResBlock(8, up=True), ResBlock(8, 12), ResBlock(12, 8)])

    def forward(self, x, emb):
        for block in self.blocks:
            x = block(x, emb)
        return x



def unet():
    return UNetish(), (torch.randn(2, 8, 8, 8), torch.randn(2, 16))
'''

RESUMED = '''
import torch
from torch import nn

from gd_steps import next_scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.step = 0

    def forward(self, x):
        h = self.fc(x)
        print("logged")
        return h * next_scale(self)


def resumed():
    return Net(), (torch.randn(4, 8),)
'''

STEPS = '''
def next_scale(module):
    module.step += 1
    return module.step % 7
'''


def _plain_torch(folder, module_name: str, factory: str) -> tuple[int, list[str], list[str]]:
    """Plain torch.compile on the analysis's calls (the inputs three times, the batch one and two larger), with
    gradients on after one eager call: the frames it compiled after the first call, its recompile_limit warnings
    (each names the function and its last reason, with the guard's user stack) and its `recompiles` log."""
    from torch._dynamo.testing import CompileCounter

    sys.path.insert(0, str(folder))
    warnings: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logger = logging.getLogger("torch._dynamo.convert_frame")
    handler = Kept(logging.WARNING)
    logger.addHandler(handler)
    recompiles: list[str] = []
    torch._logging.set_logs(recompiles=True)
    log = logging.getLogger("torch._dynamo.guards.__recompiles")
    kept_log = Kept(logging.DEBUG)
    kept_log.emit = lambda record: recompiles.append(record.getMessage())
    log.addHandler(kept_log)
    try:
        model, args = getattr(importlib.import_module(module_name), factory)()
        grown = [tuple(torch.cat([a] + [a[:1]] * extra) for a in args) for extra in (1, 2)]
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter)
        with torch.enable_grad():
            model(*args)
            compiled(*args)
            first = counter.frame_count
            for call in (args, args, *grown):
                compiled(*call)
        return counter.frame_count - first, [w for w in warnings if "recompile_limit" in w], recompiles
    finally:
        torch._dynamo.reset()
        torch._logging.set_logs()
        log.removeHandler(kept_log)
        logger.removeHandler(handler)
        sys.path.remove(str(folder))
        for name in (module_name, "gd_nn", "gd_steps"):
            sys.modules.pop(name, None)


# Ten checkpointed blocks, more than recompile_limit (8), no two alike (channels, `updown`, input size): a model
# of alike repeated blocks that recompiles is also analysed with the repeated-block shortcut, which is refused,
# twice as many compilations for the same findings (test_compile_shortcut compares the shortcut with the whole).
@pytest.fixture(scope="module")
def real_code(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real_code")
    write(folder, "gd_nn.py", CHECKPOINT)
    write(folder, "gd_unet.py", UNET)
    write(folder, "gd_resumed.py", RESUMED)
    write(folder, "gd_steps.py", STEPS)
    report = check_targets(folder, ["gd_unet.py:unet", "gd_resumed.py:resumed"], select=("GL302",))
    return folder, report


def test_a_function_that_hits_recompile_limit_is_reported_at_the_line_of_its_last_failed_guard(real_code):
    folder, report = real_code
    found = [f for f in findings_of(report, "GL302") if "unet" in f.targets[0]]
    _, limits, _ = _plain_torch(folder, "gd_unet", "unet")
    # Plain torch hits recompile_limit on the checkpoint function's `forward`, its last reason `len(args) == N`
    # read at the line that slices `args`: GL302 is there, not at the `def` line.
    line = line_of(folder / "gd_nn.py", "ctx.input_tensors = list(args[:length])")
    plain = [w for w in limits if "function: 'forward'" in w]
    assert plain and f'line {line}, in forward' in plain[0] and "len(args) ==" in plain[0]
    at_line = [f for f in found if f.location.path.endswith("gd_nn.py") and f.location.line == line]
    assert len(at_line) == 1 and "recompile_limit" in at_line[0].message and "len(args)" in at_line[0].message
    assert line_of(folder / "gd_nn.py", "def forward(ctx") not in [f.location.line for f in found
                                                                    if f.location.path.endswith("gd_nn.py")]
    # The helper's frame that dynamo resumes after the break on `tuple(params)` hits it too, in plain torch as
    # here, and is named as the user wrote it.
    assert any("torch_dynamo_resume_in_checkpoint" in w for w in limits)
    assert any("compiling `checkpoint`" in f.message for f in found)
    assert not any("torch_dynamo_resume" in f.message for f in found)
    # Every GL302 finding here is a function plain torch stopped compiling.
    assert len(found) == len(limits)


def test_a_recompile_in_the_function_that_resumes_after_a_break_is_reported_at_the_users_line(real_code):
    folder, report = real_code
    found = [f for f in findings_of(report, "GL302") if "resumed" in f.targets[0]]
    recompiled, _, log = _plain_torch(folder, "gd_resumed", "resumed")
    # Plain torch compiles the part of `forward` after the print again on every call, for the counter that the
    # helper of another file reads: its recompile reasons name that line.
    line = line_of(folder / "gd_steps.py", "module.step += 1")
    resumed = [entry for entry in log if "torch_dynamo_resume_in_forward" in entry]
    assert recompiled >= 3 and len(resumed) >= 3
    assert all(f'gd_steps.py", line {line}, in next_scale' in entry for entry in resumed if "step ==" in entry)
    assert [(f.location.path.endswith("gd_steps.py"), f.location.line) for f in found] == [(True, line)]
    assert "`forward`" in found[0].message and "step ==" in found[0].message


def _recompile(call: str, code: int) -> Recompile:
    line = Frame("/m/model.py", 13, "forward")
    return Recompile(f"tensor 'h' size mismatch at index 0. expected 4, actual {call[-1]}", Frame("/m/model.py", 13,
                     "forward"), call, line, code=code)


def test_one_off_size_recompiles_of_two_code_objects_of_one_resume_site_are_not_a_hazard():
    # Dynamo can make a resume site's code more than once; each copy has its own cache and absorbs a size change
    # with automatic dynamic shapes once: one recompile each, on two calls, never reaches recompile_limit.
    apart = [_recompile("batch 5", code=1), _recompile("batch 6", code=2)]
    assert hazards(apart, "the factory's inputs") == {}
    together = [_recompile("batch 5", code=1), _recompile("batch 6", code=1)]
    assert len(hazards(together, "the factory's inputs")) == 1
