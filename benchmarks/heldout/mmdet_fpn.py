"""Written in the style of MMDetection's FPN on MMCV's ConvModule, with MMCV's NonLocal2d (open-mmlab/
mmdetection mmdet/models/necks/fpn.py as of its v1 releases, open-mmlab/mmcv mmcv/cnn/bricks/conv_module.py
and non_local.py).

ConvModule (conv, optional norm, activation from an `act_cfg` dict, `inplace` passed to the ReLU); the FPN's
lateral 1x1 ConvModules, configured here with `act_cfg=dict(type="ReLU")` as downstream projects set it, its
top-down pathway written `laterals[i - 1] += F.interpolate(laterals[i], scale_factor=2, mode="nearest")` (the
in-place add overwrites the lateral's ReLU output, which the ReLU saved), and 3x3 output ConvModules; a
NonLocal2d block on the coarsest input in `embedded_gaussian` mode (`torch.matmul(theta_x, phi_x)`,
`pairwise_weight /= theta_x.shape[-1] ** 0.5`, `.softmax(dim=-1)`, `torch.matmul(pairwise_weight, g_x)`,
the pairwise function chosen by `getattr(self, self.mode)`).
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "MMDetection FPN + MMCV ConvModule/NonLocal2d"
REPOSITORY = "open-mmlab/mmdetection, open-mmlab/mmcv"
BACKWARD_FAILS = True  # laterals[i - 1] += ... on a ReLU output


class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, norm_cfg=None,
                 act_cfg=dict(type="ReLU"), inplace=True):  # noqa: B006 (mmcv's signature)
        super().__init__()
        self.with_norm = norm_cfg is not None
        self.with_activation = act_cfg is not None
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                              bias=not self.with_norm)
        if self.with_norm:
            self.norm = nn.BatchNorm2d(out_channels)
        if self.with_activation:
            act_cfg_ = act_cfg.copy()
            act_cfg_.setdefault("inplace", inplace)
            assert act_cfg_.pop("type") == "ReLU"
            self.activate = nn.ReLU(**act_cfg_)

    def forward(self, x, activate=True, norm=True):
        x = self.conv(x)
        if norm and self.with_norm:
            x = self.norm(x)
        if activate and self.with_activation:
            x = self.activate(x)
        return x


class NonLocal2d(nn.Module):
    def __init__(self, in_channels, reduction=2, use_scale=True, mode="embedded_gaussian"):
        super().__init__()
        self.in_channels = in_channels
        self.reduction = reduction
        self.use_scale = use_scale
        self.inter_channels = max(in_channels // reduction, 1)
        self.mode = mode
        self.g = ConvModule(self.in_channels, self.inter_channels, kernel_size=1, act_cfg=None)
        self.conv_out = ConvModule(self.inter_channels, self.in_channels, kernel_size=1, act_cfg=None)
        self.theta = ConvModule(self.in_channels, self.inter_channels, kernel_size=1, act_cfg=None)
        self.phi = ConvModule(self.in_channels, self.inter_channels, kernel_size=1, act_cfg=None)

    def embedded_gaussian(self, theta_x, phi_x):
        # NonLocal2d pairwise_weight: [N, HxW, HxW]
        pairwise_weight = torch.matmul(theta_x, phi_x)
        if self.use_scale:
            # theta_x.shape[-1] is `self.inter_channels`
            pairwise_weight /= theta_x.shape[-1] ** 0.5
        pairwise_weight = pairwise_weight.softmax(dim=-1)
        return pairwise_weight

    def forward(self, x):
        n = x.size(0)
        # g_x: [N, HxW, C]
        g_x = self.g(x).view(n, self.inter_channels, -1)
        g_x = g_x.permute(0, 2, 1)
        # theta_x: [N, HxW, C], phi_x: [N, C, HxW]
        theta_x = self.theta(x).view(n, self.inter_channels, -1)
        theta_x = theta_x.permute(0, 2, 1)
        phi_x = self.phi(x).view(n, self.inter_channels, -1)
        pairwise_func = getattr(self, self.mode)
        # pairwise_weight: [N, HxW, HxW]
        pairwise_weight = pairwise_func(theta_x, phi_x)
        # y: [N, HxW, C]
        y = torch.matmul(pairwise_weight, g_x)
        # y: [N, C, H, W]
        y = y.permute(0, 2, 1).contiguous().reshape(n, self.inter_channels, *x.size()[2:])
        output = x + self.conv_out(y)
        return output


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, act_cfg=None):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_ins = len(in_channels)
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for i in range(self.num_ins):
            l_conv = ConvModule(in_channels[i], out_channels, 1, act_cfg=act_cfg, inplace=False)
            fpn_conv = ConvModule(out_channels, out_channels, 3, padding=1, act_cfg=act_cfg, inplace=False)
            self.lateral_convs.append(l_conv)
            self.fpn_convs.append(fpn_conv)

    def forward(self, inputs):
        assert len(inputs) == len(self.in_channels)
        # build laterals
        laterals = [lateral_conv(inputs[i]) for i, lateral_conv in enumerate(self.lateral_convs)]
        # build top-down path
        used_backbone_levels = len(laterals)
        for i in range(used_backbone_levels - 1, 0, -1):
            laterals[i - 1] += F.interpolate(laterals[i], scale_factor=2, mode="nearest")
        # build outputs
        outs = [self.fpn_convs[i](laterals[i]) for i in range(used_backbone_levels)]
        return tuple(outs)


class TinyDetectorNeck(nn.Module):
    def __init__(self):
        super().__init__()
        self.c2 = ConvModule(3, 8, 3, stride=2, padding=1, norm_cfg=dict(type="BN"))
        self.c3 = ConvModule(8, 16, 3, stride=2, padding=1, norm_cfg=dict(type="BN"))
        self.c4 = ConvModule(16, 32, 3, stride=2, padding=1, norm_cfg=dict(type="BN"))
        self.non_local = NonLocal2d(32)
        self.neck = FPN([8, 16, 32], 16, act_cfg=dict(type="ReLU"))

    def forward(self, img):
        c2 = self.c2(img)
        c3 = self.c3(c2)
        c4 = self.non_local(self.c4(c3))
        return self.neck([c2, c3, c4])


def make_model():
    torch.manual_seed(0)
    return TinyDetectorNeck(), (torch.randn(2, 3, 32, 32),)
