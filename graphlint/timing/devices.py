"""The devices a step can be priced on: a table of accelerators with their vendors' peak figures, and this machine's
CPU, measured once by small benchmarks and cached on disk.

Every GPU figure is the vendor's dense (no 2:4 sparsity) peak, from the datasheet named in its row. PyTorch's
defaults decide which peak a float32 op meets: matrix products run in true float32
(`torch.backends.cuda.matmul.allow_tf32` is False), convolutions in TF32 (`torch.backends.cudnn.allow_tf32` is
True), so a float32 convolution is priced at the TF32 peak and a float32 matmul at the FP32 one.
"""

from __future__ import annotations

import hashlib
import math
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

TERA = 1e12
# The share of a peak that eager PyTorch's kernels reach on large shapes, per op class (see docs/time.md):
# cuBLAS/rocBLAS GEMMs reach 70-80% of the tensor-core peak, cuDNN convolutions and fused attention less, and
# elementwise or reduction kernels about 80% of the memory bandwidth.
GPU_EFFICIENCY = {"matmul": 0.70, "conv": 0.55, "attention": 0.50, "memory": 0.80}
GPU_LAUNCH = 5e-6  # seconds per kernel: launch and the host's eager dispatch, which small kernels cannot hide


@dataclass(frozen=True)
class Accelerator:
    """One row of the table: dense peak FLOP/s per dtype (fp32, tf32, bf16, fp16, fp8 where the chip has it),
    memory bandwidth in bytes/s, and where each figure comes from."""

    name: str  # what --gpu takes, lower case
    label: str
    peaks: dict[str, float]
    bandwidth: float
    source: str

    def peak(self, dtype: str, kind: str) -> float:
        """The peak an op of this dtype and class meets (see the module's docstring for float32)."""
        if dtype in ("bfloat16", "float16"):
            return self.peaks["bf16" if dtype == "bfloat16" else "fp16"]
        if dtype.startswith("float8"):
            return self.peaks.get("fp8", self.peaks["fp16"])
        if dtype == "float32" and kind == "conv":
            return self.peaks.get("tf32", self.peaks["fp32"])
        return self.peaks["fp32"]


ACCELERATORS = {a.name: a for a in (
    Accelerator("h100", "NVIDIA H100 SXM5 80GB",
                {"fp32": 66.9 * TERA, "tf32": 494.7 * TERA, "bf16": 989.4 * TERA, "fp16": 989.4 * TERA,
                 "fp8": 1978.9 * TERA}, 3.35e12,
                "NVIDIA H100 Tensor Core GPU datasheet (2023); tensor figures there are with sparsity, halved here"),
    Accelerator("h200", "NVIDIA H200 SXM 141GB",
                {"fp32": 67 * TERA, "tf32": 494.5 * TERA, "bf16": 989.5 * TERA, "fp16": 989.5 * TERA,
                 "fp8": 1979 * TERA}, 4.8e12,
                "NVIDIA H200 Tensor Core GPU datasheet (2024); tensor figures there are with sparsity, halved here"),
    Accelerator("a100", "NVIDIA A100 SXM4 80GB",
                {"fp32": 19.5 * TERA, "tf32": 156 * TERA, "bf16": 312 * TERA, "fp16": 312 * TERA}, 2.039e12,
                "NVIDIA A100 Tensor Core GPU datasheet (2021), dense figures; no FP8"),
    Accelerator("l4", "NVIDIA L4 24GB",
                {"fp32": 30.3 * TERA, "tf32": 60 * TERA, "bf16": 121 * TERA, "fp16": 121 * TERA,
                 "fp8": 242.5 * TERA}, 300e9,
                "NVIDIA L4 Tensor Core GPU datasheet (2023); tensor figures there are with sparsity, halved here"),
    Accelerator("rtx4090", "NVIDIA GeForce RTX 4090 24GB",
                {"fp32": 82.6 * TERA, "tf32": 82.6 * TERA, "bf16": 165.2 * TERA, "fp16": 165.2 * TERA,
                 "fp8": 330.3 * TERA}, 1008e9,
                "NVIDIA Ada Lovelace GPU Architecture whitepaper (2023), dense tensor figures with FP32 accumulate "
                "(what PyTorch's GEMMs use; GeForce runs them at half the FP16-accumulate rate)"),
    Accelerator("mi300x", "AMD Instinct MI300X 192GB",
                {"fp32": 163.4 * TERA, "tf32": 653.7 * TERA, "bf16": 1307.4 * TERA, "fp16": 1307.4 * TERA,
                 "fp8": 2614.9 * TERA}, 5.3e12,
                "AMD Instinct MI300X accelerator datasheet (2023), dense matrix-core figures (FP32 matrix)"),
)}
# Other spellings users write.
ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-80g": "a100",
           "4090": "rtx4090", "rtx-4090": "rtx4090", "mi300": "mi300x"}


def accelerator(name: str) -> Accelerator | None:
    """The table's row for a --gpu name (any case; `H100`, `h100-sxm`), or None."""
    key = name.strip().lower().replace(" ", "")
    return ACCELERATORS.get(ALIASES.get(key, key))


@dataclass
class CpuPeaks:
    """This machine's CPU, measured: achieved FLOP/s of a matrix product per dtype at several sizes (FLOPs of the
    product -> FLOP/s), achieved copy bandwidth at several sizes (bytes moved -> bytes/s), the fixed cost of one op
    in each phase of a step (`launch`: forward, backward, optimizer; what eager PyTorch pays per op beyond its
    arithmetic: the dispatcher, autograd's bookkeeping, the Python around it) and of a view."""

    label: str
    threads: int
    matmul: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    copy: list[tuple[float, float]] = field(default_factory=list)
    launch: dict[str, float] = field(default_factory=dict)
    view: float = 0.0
    # achieved FLOP/s of a float32 3x3 convolution per direction ("forward", "backward": FLOPs of the op -> FLOP/s)
    conv: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # the same for float32 scaled_dot_product_attention's fused kernel
    attention: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # oneDNN's float32 LSTM layer: FLOPs of one time step's hidden product -> FLOP/s of the layer's work
    recurrent: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # the fixed cost per op, by phase ("forward", "backward"), of the ops a kernel's own C++ loop issues (aten's
    # GRU), with no Python around them, and of their gradients
    native: dict[str, float] = field(default_factory=dict)
    # the fixed cost of each phase once per step, beyond its ops' (autograd's engine starting, optimizer.step()'s
    # hooks and checks)
    per_phase: dict[str, float] = field(default_factory=dict)
    # `Module.zero_grad(set_to_none=True)` per parameter, the walk over the modules included (the micro-step's)
    zero_grad: float = 0.0
    # a forward's seconds on this CPU per second of its host side probed on meta (graphlint.timing.record
    # .HostProbe), both measured on the micro-step's forward, whose kernels are tiny; 0.0 if not measured
    host_scale: float = 0.0
    # (seconds on the threads, on one) of the stall probe's product when these were measured while the threads
    # waited for cores (stalled_threads): such peaks are not this machine's and are never cached
    stalled: tuple[float, float] | None = None

    def notes(self) -> list[str]:
        if self.stalled is None:
            return []
        return [waiting_note(self.threads, "while its peaks were measured", self.stalled,
                             "so its times are not this machine's and were not cached")]

    def flops_at(self, dtype: str, flops: float, kind: str = "matmul", direction: str = "forward") -> float:
        """The FLOP/s an op of this dtype, class and size reaches, read from the measured curve (log-linear): a
        convolution or a fused attention from its class's curve of its direction (scaled by the dtype's product
        rate against float32's), a recurrent layer's work from its own (`flops`: its grain), every other op from
        the products'."""
        curve = self.matmul.get(dtype) or self.matmul["float32"]
        own = {"conv": self.conv, "attention": self.attention, "recurrent": self.recurrent}.get(kind, {}).get(
            direction)
        if own and kind == "recurrent":
            return _interpolate(own, flops)  # oneDNN's bfloat16 layer does not follow the products' bfloat16 rate
        if own:
            scale = _interpolate(curve, flops) / _interpolate(self.matmul["float32"], flops)
            return _interpolate(own, flops) * scale
        return _interpolate(curve, flops)

    def bandwidth_at(self, nbytes: float) -> float:
        return _interpolate(self.copy, nbytes)


def _interpolate(curve: list[tuple[float, float]], x: float) -> float:
    """y at x on a curve of (x, y) points sorted by x, linear in log x between points, flat outside them."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x <= x1:
            share = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + share * (y1 - y0)
    return curve[-1][1]


def cpu_label() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cache_folder() -> Path:
    """The user's cache folder for graphlint's measurements of this machine ($XDG_CACHE_HOME, ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "graphlint" / "cpu-peaks"


def cpu_peaks(threads: int | None = None, folder: Path | None = None) -> CpuPeaks:
    """This CPU's peaks for `threads` threads (default: torch's), from the cache, else measured (a few seconds)
    and cached, keyed by the CPU's model, torch's version, the thread count and MEASUREMENT."""
    import torch

    threads = threads or torch.get_num_threads()
    label = cpu_label()
    key = hashlib.sha256(f"{label}|{torch.__version__}|{threads}|{MEASUREMENT}".encode()).hexdigest()[:16]
    path = (folder or cache_folder()) / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        return CpuPeaks(label=data["label"], threads=data["threads"],
                        matmul={k: [tuple(p) for p in v] for k, v in data["matmul"].items()},
                        copy=[tuple(p) for p in data["copy"]], launch=dict(data["launch"]), view=data["view"],
                        conv={k: [tuple(p) for p in v] for k, v in data.get("conv", {}).items()},
                        attention={k: [tuple(p) for p in v] for k, v in data.get("attention", {}).items()},
                        recurrent={k: [tuple(p) for p in v] for k, v in data.get("recurrent", {}).items()},
                        native=dict(data["native"]), per_phase=dict(data["per_phase"]), zero_grad=data["zero_grad"],
                        host_scale=data["host_scale"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    stalled = stalled_threads(threads)
    peaks = measure_cpu(threads, label)
    stalled = stalled or stalled_threads(threads)
    if stalled is not None:
        # measured while the threads waited for cores: not this machine's, so not kept, and said
        return replace(peaks, stalled=stalled)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(peaks)))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only home: measured again next time
    return peaks


WAITING = "were waiting for cores"  # in each note of a measurement the threads' wait for cores spoiled


def waiting_note(threads: int, when: str, stalled: tuple[float, float], consequence: str) -> str:
    """The note of a measurement the threads' wait spoiled (`stalled`: stalled_threads' seconds)."""
    many, one = stalled
    during = f" {when}" if when else ""
    return (f"this CPU's {threads} threads {WAITING}{during} (a 64 x 64 matrix product took {many * 1e3:.1f} ms on "
            f"them, {one * 1e6:.0f} us on one), {consequence}; run again when the machine is less busy, or with "
            "OMP_NUM_THREADS=1")


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to `count` for the block, and given back after it."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def spoiled_by_waiting(notes) -> bool:
    """Whether these notes say a measurement was made while the threads waited for cores (stalled_threads): an
    answer made of it is not kept in the result cache, so that the next run measures again."""
    return any(WAITING in note for note in notes)


STALLED = 10.0  # a product this many times slower on the threads than on one thread: they wait for cores
STALL_PROBES = 20  # single products timed on the threads; two that slow mean a stall


def stalled_threads(threads: int) -> tuple[float, float] | None:
    """(seconds on `threads` threads, on one thread) of a 64 x 64 matrix product when the threads wait for cores,
    else None (and for one thread). On a machine busier than its cores (two busy processes on two cores), a
    parallel region waited a scheduler slice for its second thread, 8 ms whatever the op (a product, a GELU of
    four numbers), in stretches: so STALL_PROBES single calls are timed, and two of them STALLED times one
    thread's median mean a stall (a quiet machine's products take microseconds; one preempted call is not a
    stall). What is measured during one is the wait, and a cache would keep it."""
    import torch

    if threads <= 1:
        return None
    a = torch.ones(64, 64)
    with torch_threads(1):
        one = call_seconds(lambda: torch.mm(a, a), time.thread_time, budget=0.0, median=True)
    with torch_threads(threads):
        calls = _single_calls(lambda: torch.mm(a, a), STALL_PROBES)
    slow = sorted(seconds for seconds in calls if seconds > STALLED * one)
    return (slow[len(slow) // 2], one) if len(slow) >= 2 else None


def _single_calls(run, count: int) -> list[float]:
    """The wall seconds of each of `count` calls of `run`, one at a time, after one untimed call."""
    run()
    calls = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        calls.append(time.perf_counter() - started)
    return calls


MEASUREMENT = 15  # the version of what measure_cpu measures: a cache file of another version is measured again
MATMUL_SIZES = (16, 48, 128, 256, 512)
COPY_SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20)
CONV_SIZES = ((4, 16, 16), (8, 32, 32), (8, 128, 16))
ATTENTION_SIZES = ((2, 4, 32, 16), (2, 8, 128, 64), (4, 12, 256, 64))
RECURRENT_SIZES = ((32, 4, 16), (128, 16, 32), (256, 32, 32))
ELEMENTWISE_POOL = 16 << 20  # bytes of operands taken in turn: more than a core's nearest caches hold
CHAIN = 32  # tiny ops in the micro-step that measures the fixed cost per op


def measure_cpu(threads: int, label: str = "") -> CpuPeaks:
    """Measure this CPU with `threads` threads: square matrix products per dtype at MATMUL_SIZES (the median of a
    Linear's three layouts), memory-bound ops at COPY_SIZES (the median of a mix, see _elementwise), 3x3
    convolutions and fused attention forward and backward (_convolutions, _attention), a view, and the fixed cost
    per op of a micro-step on 4-wide tensors (CHAIN / 2 tiny Linear and GELU modules, forward with autograd
    recording, backward, and an AdamW step over their parameters), its ops counted by graphlint.timing.record as a
    step's are. Each is the median of repeated batches, the statistic a step's time is judged by; rates are net of
    the fixed cost of a no-grad op. The fixed costs (the micro-steps, a view, a no-grad op, zero_grad, the
    recurrent loop's ops, the host scale) are measured on one thread whatever `threads` is. With one thread, time
    is the thread's own CPU time, which other processes' use of the core does not lengthen. The thread count is
    given back."""
    import torch

    # The fixed costs are the dispatcher's and Python's, which one thread runs; with a second intra-op thread on a
    # loaded machine, the micro-step was seen to take 15x its time (parallel regions waiting for a thread).
    with torch_threads(1):
        tiny = torch.ones(4)
        view = call_seconds(lambda: tiny.view(2, 2), time.thread_time, budget=0.1, median=True)
        plain = call_seconds(lambda: torch.add(tiny, tiny), time.thread_time, budget=0.1, median=True)
        launch, per_phase = _fixed_costs(time.thread_time, view)
        zero_grad = _zero_grad_cost(time.thread_time)
        host_scale = _host_scale()
        native = _native_cost(time.thread_time, view)
    clock = time.thread_time if threads == 1 else time.perf_counter
    with torch_threads(threads):
        with torch.no_grad():
            matmul = {}
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                points = []
                for n in MATMUL_SIZES:
                    a = torch.randn(n, n).to(dtype)
                    b = torch.randn(n, n).to(dtype)
                    # a Linear's three products: x @ w.t() forward, grad @ w and grad.t() @ x backward
                    seconds = statistics.median(
                        call_seconds(lambda left=left, right=right: torch.mm(left, right), clock, budget=0.05, median=True)
                        for left, right in ((a, b.t()), (a, b), (a.t(), b)))
                    points.append((2.0 * n * n * n, 2.0 * n * n * n / max(seconds - plain, seconds / 10)))
                matmul[str(dtype).removeprefix("torch.")] = points
            copy = [_elementwise(size, clock, plain) for size in COPY_SIZES]
        conv = _convolutions(clock)
        attention = _attention(clock)
        recurrent = _recurrent(clock)
    return CpuPeaks(label or cpu_label(), threads, matmul, copy, launch, view, conv, attention, recurrent, native,
                    per_phase, zero_grad, host_scale)


def _chain(layers: int, device: str = "cpu"):
    """The micro-step's modules: `layers` tiny Linear and GELU modules in a Sequential."""
    import torch

    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
                                 for _ in range(layers))).to(device)


def _host_scale(probes: int = 5) -> float:
    """The micro-step's forward (CHAIN / 2 tiny Linear and GELU modules and a sum, autograd recording; its kernels
    are tiny) on this CPU, over the same forward's host seconds probed on meta (graphlint.timing.record.probe_host,
    the median total of `probes` probes). The probe's round trip through Python for each op is most of the
    difference; a forward of about as much Python per op as these modules' (a `transformers` model's is close)
    is scaled right, one of much more plain Python per op is under-counted. Both sides run on one thread: what is
    measured is Python, which one thread runs, and on a loaded machine (two busy processes on two cores) the tiny
    CPU forward with a second intra-op thread was seen to take 128 ms a call instead of 0.4 ms for a whole run."""
    import torch

    from graphlint.timing.record import probe_host

    def chain(device: str):
        model, x = _chain(CHAIN // 2, device), torch.ones(1, 4, device=device)
        return lambda: model(x).sum()

    with torch_threads(1):
        on_cpu = call_seconds(chain("cpu"), time.perf_counter, budget=0.1, median=True)  # the probe's own clock
        on_meta = chain("meta")
        with torch.device("meta"):  # as the step's forward is probed: inside the capture's device context
            probed = sorted(sum(probe[1]) for probe in (probe_host(on_meta) for _ in range(probes)) if probe)
    host = probed[len(probed) // 2] if probed else 0.0
    return on_cpu / host if host > 0 else 0.0


def _zero_grad_cost(clock) -> float:
    """Seconds per parameter of `zero_grad(set_to_none=True)` on the fixed-cost micro-step's modules (CHAIN / 2
    Linear and GELU modules in their Sequential), gradients set: the loop's walk over modules and parameters."""
    import torch

    model = _chain(CHAIN // 2)
    parameters = list(model.parameters())

    def zero_grad():
        for p in parameters:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        started = clock()
        model.zero_grad(set_to_none=True)
        return clock() - started

    times = sorted(sum(zero_grad() for _ in range(20)) / 20 for _ in range(9))
    return times[len(times) // 2] / len(parameters)


def _native_cost(clock, view: float) -> dict[str, float]:
    """Seconds per op of aten's GRU on 4-wide tensors (its loop in C++ issues each step's ops, with autograd
    recording) forward, and of their gradients backward, less their views', as the recorder counts their ops
    (run on meta with the stand-in that marks them, graphlint.memory.kernels)."""
    import torch

    from graphlint.memory.modes import StandIns
    from graphlint.timing.record import OpRecorder

    layer = torch.nn.GRU(4, 4)
    x = torch.randn(16, 1, 4, requires_grad=True)

    def forward():
        return layer(x)[0]

    import graphlint.memory.kernels  # noqa: F401 (registers the recurrent layers' stand-in)

    on_meta = torch.nn.GRU(4, 4, device="meta")
    with StandIns("cpu", False), OpRecorder() as recorder:
        on_meta(torch.empty(16, 1, 4, device="meta", requires_grad=True))[0].sum().backward()
    # backward timed on its own (not as a difference of two medians, which a busy machine can make negative)
    seconds = {"forward": call_seconds(forward, clock, budget=0.1, median=True),
               "backward": _backward_seconds(lambda: forward().sum(), clock)}
    costs = {}
    for phase, spent in seconds.items():
        ops = [r for r in recorder.records if r.phase == phase and r.native]
        kernels = sum(1 for r in ops if r.kind != "view")
        costs[phase] = max(spent - (len(ops) - kernels) * view, 0.0) / max(kernels, 1)
    return costs


def _recurrent(clock) -> dict[str, list[tuple[float, float]]]:
    """FLOP/s of a float32 LSTM layer's work (graphlint.timing.record.WORK_FORMULAS) at RECURRENT_SIZES (width,
    batch, steps), forward (with autograd recording) and backward, keyed by one time step's hidden product."""
    import torch

    from graphlint.timing.record import OpRecorder

    curves = {"forward": [], "backward": []}
    for width, batch, steps in RECURRENT_SIZES:
        layer = torch.nn.LSTM(width, width)
        x = torch.randn(steps, batch, width, requires_grad=True)

        def forward(layer=layer, x=x):
            return layer(x)[0]

        def both():
            forward().sum().backward()

        with OpRecorder() as recorder:
            both()
        work = {phase: [r for r in recorder.records if r.work_flops and r.phase == phase] for phase in curves}
        if not (work["forward"] and work["backward"]):
            continue  # no oneDNN layer in this build: its recurrent layers are priced by their parts
        ahead = call_seconds(forward, clock, budget=0.1, median=True)
        behind = max(call_seconds(both, clock, budget=0.1, median=True) - ahead, ahead / 10)
        for phase, seconds in (("forward", ahead), ("backward", behind)):
            curves[phase].append((work[phase][0].work_grain, sum(r.work_flops for r in work[phase]) / seconds))
    return curves


def _attention(clock) -> dict[str, list[tuple[float, float]]]:
    """FLOP/s of float32 causal scaled_dot_product_attention at ATTENTION_SIZES (batch, heads, sequence, head
    width), forward (with autograd recording, as in training) and backward, its FLOPs as the recorder counts them."""
    import torch
    import torch.nn.functional as F

    from graphlint.timing.record import OpRecorder

    curves = {"forward": [], "backward": []}
    for batch, heads, sequence, width in ATTENTION_SIZES:
        q, k, v = (torch.randn(batch, heads, sequence, width, requires_grad=True) for _ in range(3))

        def forward(q=q, k=k, v=v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both():
            y = forward()
            y.backward(torch.ones_like(y))

        with OpRecorder() as recorder:
            both()
        flops = {phase: sum(r.flops for r in recorder.records if r.kind == "attention" and r.phase == phase)
                 for phase in curves}
        ahead = call_seconds(forward, clock, budget=0.1, median=True)
        behind = max(call_seconds(both, clock, budget=0.1, median=True) - ahead, ahead / 10)
        if flops["forward"] and flops["backward"]:
            curves["forward"].append((flops["forward"], flops["forward"] / ahead))
            curves["backward"].append((flops["backward"], flops["backward"] / behind))
    return curves


def _convolutions(clock) -> dict[str, list[tuple[float, float]]]:
    """FLOP/s of a float32 3x3 convolution (padding 1) at CONV_SIZES (batch, channels in and out, side), forward
    alone and its backward (the input's and the weight's gradients: twice the forward's FLOPs), as
    FlopCounterMode counts them."""
    import torch
    import torch.nn.functional as F

    curves = {"forward": [], "backward": []}
    for batch, channels, side in CONV_SIZES:
        x = torch.randn(batch, channels, side, side, requires_grad=True)
        w = torch.randn(channels, channels, 3, 3, requires_grad=True)
        flops = 2.0 * batch * channels * side * side * channels * 9
        with torch.no_grad():
            forward = call_seconds(lambda x=x, w=w: F.conv2d(x, w, padding=1), clock, budget=0.1, median=True)

        def both(x=x, w=w):
            y = F.conv2d(x, w, padding=1)
            y.backward(torch.ones_like(y))

        backward = max(call_seconds(both, clock, budget=0.1, median=True) - forward, forward / 10)
        curves["forward"].append((flops, flops / forward))
        curves["backward"].append((2 * flops, 2 * flops / backward))
    return curves


def _elementwise(size: int, clock, plain: float) -> tuple[float, float]:
    """(bytes moved, bytes/s) of a memory-bound op as a step runs it, on operands of `size` // 2 bytes: the median
    of a mix of kernels (a copy, a sum of two tensors, a scaling, exp, SiLU, a row sum, a softmax), each allocating
    its output and reading inputs that other work has pushed out of the nearest cache (a pool of ELEMENTWISE_POOL
    bytes in turn), net of a no-grad op's fixed cost."""
    import torch
    import torch.nn.functional as F

    count = size // 8
    pool = max(1, min(32, ELEMENTWISE_POOL // size))
    xs = [torch.randn(max(count // 64, 1), 64) for _ in range(pool)]
    ys = [torch.randn(max(count // 64, 1), 64) for _ in range(pool)]
    turn = [0]

    def next_x():
        turn[0] = (turn[0] + 1) % pool
        return xs[turn[0]]

    def next_y():
        return ys[turn[0]]

    element = xs[0].nbytes
    kernels = ((lambda: next_x().clone(), 2), (lambda: torch.add(next_x(), next_y()), 3), (lambda: next_x() * 0.5, 2),
               (lambda: next_x().exp(), 2), (lambda: F.silu(next_x()), 2), (lambda: next_x().sum(-1), 1),
               (lambda: next_x().softmax(-1), 2))
    rates = []
    for run, operands in kernels:
        seconds = call_seconds(run, clock, budget=0.04, median=True)
        rates.append(operands * element / max(seconds - plain, seconds / 10))
    return 2.0 * element, statistics.median(rates)


def _fixed_costs(clock, view: float) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds that eager PyTorch pays beyond arithmetic in each phase (the dispatcher, autograd, the modules' and
    the optimizer's Python): per op that runs a kernel, and per phase once (`loss.backward()` starting autograd's
    engine, `optimizer.step()` its hooks and checks). From two micro-steps on 4-wide tensors: CHAIN / 2 tiny
    Linear and GELU modules, whose time over its kernel ops (as the recorder counts them, its views' time taken
    off) is the cost per op, and one of each, whose time beyond its ops at that cost is the cost per phase. (Not
    the two steps' difference over their ops': on a busy machine with more threads than free cores, a parallel
    region's wait for its threads can outweigh a step's ops, and that difference can come out nothing.)"""
    large, small = _micro_step(CHAIN // 2, clock, view), _micro_step(1, clock, view)
    per_op, per_phase = {}, {}
    for phase in large:
        (spent, kernels), (spent_small, kernels_small) = large[phase], small[phase]
        per_op[phase] = spent / max(kernels, 1)
        per_phase[phase] = max(spent_small - kernels_small * per_op[phase], 0.0)
    return per_op, per_phase


def _micro_step(layers: int, clock, view: float) -> dict[str, tuple[float, int]]:
    """(seconds less its views', kernel ops) of each phase of a step of `layers` tiny Linear and GELU modules
    trained with AdamW."""
    import torch

    from graphlint.timing.record import OpRecorder

    model = _chain(layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.ones(1, 4)

    def forward():
        return model(x).sum()

    forward().backward()
    optimizer.step()  # the state exists, as in a step after the first
    with OpRecorder() as recorder:
        forward().backward()
        optimizer.step()
    counts = {phase: [0, 0] for phase in ("forward", "backward", "optimizer")}
    for record in recorder.records:
        counts[record.phase][0 if record.kind != "view" else 1] += 1
    seconds = {"forward": call_seconds(forward, clock, budget=0.1, median=True),
               "backward": _backward_seconds(forward, clock),
               "optimizer": call_seconds(optimizer.step, clock, budget=0.1, median=True)}
    return {phase: (max(seconds[phase] - views * view, 0.0), kernels)
            for phase, (kernels, views) in counts.items()}


def _backward_seconds(forward, clock, batches: int = 9, calls: int = 10) -> float:
    """The median over batches of the seconds one backward of `forward()`'s loss takes, the forward untimed."""
    times = []
    for _ in range(batches):
        spent = 0.0
        for _ in range(calls):
            loss = forward()
            start = clock()
            loss.backward()
            spent += clock() - start
        times.append(spent / calls)
    times.sort()
    return times[len(times) // 2]


def call_seconds(run, clock, budget: float, median: bool = False) -> float:
    """Seconds one call of `run` takes on `clock`: calls batched to about a millisecond, for about `budget`
    seconds; the median batch, or the fastest (the machine at its best)."""
    run()
    start = clock()
    run()
    once = max(clock() - start, 1e-7)
    batch = max(1, int(1e-3 / once))
    times = []
    deadline = time.perf_counter() + budget
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 200):
        start = clock()
        for _ in range(batch):
            run()
        times.append((clock() - start) / batch)
    times.sort()
    return times[len(times) // 2] if median else times[0]
