"""Written in the style of YOLOv5's detection head (ultralytics/yolov5, models/yolo.py `Detect` and
models/common.py `Conv`).

Conv blocks (Conv2d without bias, BatchNorm2d, `nn.SiLU()`), and `Detect.forward`: per level, the 1x1 conv
output `x[i]` viewed as (bs, anchors, outputs, ny, nx) and permuted to (bs, anchors, ny, nx, outputs); outside
training the grid and anchor grid are built with `torch.meshgrid`, `y = x[i].sigmoid()`, and with
`self.inplace` (YOLOv5's default) the boxes are decoded by slice assignment on the sigmoid's output:
`y[..., 0:2] = (y[..., 0:2] * 2 + self.grid[i]) * self.stride[i]` and `y[..., 2:4] = (y[..., 2:4] * 2) ** 2 *
self.anchor_grid[i]`. The factory returns the model in eval mode, the path inference and validation run;
a backward through it (fine-tuning on decoded boxes, a gradient-based explanation) fails, which is why
YOLOv5 has the out-of-place `split`/`cat` branch for `inplace=False`.
"""

import torch
from torch import nn

STYLE = "YOLOv5 Detect head (inplace box decoding)"
REPOSITORY = "ultralytics/yolov5"
BACKWARD_FAILS = True  # the slice assignments overwrite the sigmoid's saved output


def autopad(k, p=None, d=1):
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


class Conv(nn.Module):
    default_act = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Detect(nn.Module):
    stride = None
    dynamic = False
    export = False

    def __init__(self, nc=80, anchors=(), ch=(), inplace=True):
        super().__init__()
        self.nc = nc  # number of classes
        self.no = nc + 5  # number of outputs per anchor
        self.nl = len(anchors)  # number of detection layers
        self.na = len(anchors[0]) // 2  # number of anchors
        self.grid = [torch.empty(0) for _ in range(self.nl)]
        self.anchor_grid = [torch.empty(0) for _ in range(self.nl)]
        self.register_buffer("anchors", torch.tensor(anchors).float().view(self.nl, -1, 2))
        self.m = nn.ModuleList(nn.Conv2d(x, self.no * self.na, 1) for x in ch)
        self.inplace = inplace

    def forward(self, x):
        z = []  # inference output
        for i in range(self.nl):
            x[i] = self.m[i](x[i])
            bs, _, ny, nx = x[i].shape
            x[i] = x[i].view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()

            if not self.training:  # inference
                if self.dynamic or self.grid[i].shape[2:4] != x[i].shape[2:4]:
                    self.grid[i], self.anchor_grid[i] = self._make_grid(nx, ny, i)

                y = x[i].sigmoid()
                if self.inplace:
                    y[..., 0:2] = (y[..., 0:2] * 2 + self.grid[i]) * self.stride[i]  # xy
                    y[..., 2:4] = (y[..., 2:4] * 2) ** 2 * self.anchor_grid[i]  # wh
                else:
                    xy, wh, conf = y.split((2, 2, self.nc + 1), 4)
                    xy = (xy * 2 + self.grid[i]) * self.stride[i]  # xy
                    wh = (wh * 2) ** 2 * self.anchor_grid[i]  # wh
                    y = torch.cat((xy, wh, conf), 4)
                z.append(y.view(bs, self.na * nx * ny, self.no))

        return x if self.training else (torch.cat(z, 1),) if self.export else (torch.cat(z, 1), x)

    def _make_grid(self, nx=20, ny=20, i=0):
        d = self.anchors[i].device
        t = self.anchors[i].dtype
        shape = 1, self.na, ny, nx, 2  # grid shape
        y, x = torch.arange(ny, device=d, dtype=t), torch.arange(nx, device=d, dtype=t)
        yv, xv = torch.meshgrid(y, x, indexing="ij")
        grid = torch.stack((xv, yv), 2).expand(shape) - 0.5  # add grid offset, i.e. y = 2.0 * x - 0.5
        anchor_grid = (self.anchors[i] * self.stride[i]).view((1, self.na, 1, 1, 2)).expand(shape)
        return grid, anchor_grid


class TinyYOLO(nn.Module):
    def __init__(self, nc=3):
        super().__init__()
        self.stem = Conv(3, 8, 3, 2)
        self.p3 = Conv(8, 16, 3, 2)
        self.p4 = Conv(16, 32, 3, 2)
        anchors = ([10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119])
        self.detect = Detect(nc, anchors, ch=(16, 32))
        self.detect.stride = torch.tensor([4.0, 8.0])
        self.detect.anchors /= self.detect.stride.view(-1, 1, 1)

    def forward(self, x):
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        return self.detect([p3, p4])


def make_model():
    torch.manual_seed(0)
    model = TinyYOLO().eval()
    return model, (torch.randn(1, 3, 32, 32),)
