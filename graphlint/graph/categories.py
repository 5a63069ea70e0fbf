"""What each autograd node is, by its name: compute (by family), shape/metadata, copies, sinks or loss.

Names depend on the device (`ScaledDotProductFlashAttentionForCpuBackward0` on CPU, `...Efficient...` on CUDA;
on meta, attention is lowered to bmm and `_safe_softmax`), so families are matched on the name without its
`Backward0` suffix, and a node made while computing the loss is `loss` whatever its name.
"""

from __future__ import annotations

import re

# In display order; compute categories first.
CATEGORIES = (
    "matmul-class", "normalisation", "attention", "activation", "elementwise", "reduction",
    "shape", "copy", "accumulate-grad", "loss", "other",
)
COMPUTE = CATEGORIES[:6]
TITLES = {
    "matmul-class": "matmul-class", "normalisation": "normalisation", "attention": "fused attention",
    "activation": "activation", "elementwise": "elementwise", "reduction": "reduction",
    "shape": "shape/metadata", "copy": "dtype/device copies", "accumulate-grad": "AccumulateGrad",
    "loss": "loss", "other": "other",
}

_FAMILIES = {
    "matmul-class": {
        "Addmm", "Mm", "Bmm", "Baddbmm", "Addbmm", "Addmv", "Mv", "Dot", "Matmul", "Linear", "Einsum", "Bilinear",
        "Convolution", "ConvolutionBackwardOverrideable", "CudnnConvolution", "CudnnConvolutionTranspose",
        "MkldnnConvolution", "SlowConv2D", "SlowConvDilated2D", "SlowConvTranspose2D", "ConvDepthwise2D",
        "Tensordot", "ScaledMm",
    },
    "normalisation": {
        "NativeLayerNorm", "NativeBatchNorm", "CudnnBatchNorm", "MiopenBatchNorm", "NativeGroupNorm",
        "FusedRmsNorm", "RmsNorm", "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "WeightNormInterface",
    },
    "activation": {
        "Gelu", "Relu", "Silu", "Sigmoid", "Tanh", "Elu", "LeakyRelu", "Hardtanh", "Hardswish", "Hardsigmoid",
        "Softplus", "Mish", "Prelu", "PreluKernel", "Glu", "Threshold", "LogSigmoid", "Softmax", "LogSoftmax",
        "SafeSoftmax", "RreluWithNoise", "Celu", "Selu", "Softshrink", "Hardshrink",
    },
    "elementwise": {
        "Add", "Sub", "Rsub", "Mul", "Div", "Pow", "Neg", "Exp", "Exp2", "Log", "Log1P", "Log2", "Expm1", "Sqrt",
        "Rsqrt", "Reciprocal", "Abs", "Clamp", "ClampMin", "ClampMax", "Where", "MaskedFill", "Sin", "Cos", "Tan",
        "Atan2", "Maximum", "Minimum", "Lerp", "Addcmul", "Addcdiv", "Sign", "Round", "Floor", "Ceil", "Erf",
        "Erfinv", "Fmod", "Remainder", "Hypot", "Square", "NativeDropout", "FusedDropout", "Dropout", "Sgn",
    },
    "reduction": {
        "Sum", "Mean", "Max", "Min", "Amax", "Amin", "Norm", "LinalgVectorNorm", "Var", "Std", "VarMean",
        "StdMean", "Logsumexp", "Cumsum", "Cumprod", "Prod", "Median", "Kthvalue", "Topk", "MaxPool2DWithIndices",
        "MaxPool1DWithIndices", "MaxPool3DWithIndices", "AvgPool2D", "AvgPool1D", "AvgPool3D",
        "AdaptiveAvgPool2D", "AdaptiveAvgPool1D", "AdaptiveMaxPool2D",
    },
    "shape": {
        "View", "UnsafeView", "Reshape", "ReshapeAlias", "Transpose", "Permute", "Expand", "Squeeze", "Unsqueeze",
        "Select", "Slice", "T", "Split", "SplitWithSizes", "Unbind", "Alias", "AsStrided", "Narrow", "Diagonal",
        "Unfold", "Flatten", "Unflatten", "ViewAs", "Chunk", "Clone", "CopySlices", "UnsafeSplit",
    },
    "copy": {"ToCopy", "Copy", "CopyBackwards", "ToDense", "ToSparse", "Lift", "LiftFresh"},
    "loss": {
        "NllLoss", "NllLoss2D", "MseLoss", "BinaryCrossEntropy", "BinaryCrossEntropyWithLogits", "SmoothL1Loss",
        "HuberLoss", "L1Loss", "KlDiv", "SoftMarginLoss", "MultiMarginLoss", "MultilabelMarginLoss", "CtcLoss",
    },
}
_FAMILY_OF = {family: category for category, families in _FAMILIES.items() for family in families}
# Kernels that do in one node what would otherwise be several.
FUSED_PREFIXES = ("ScaledDotProduct", "FlashAttention", "EfficientAttention", "CudnnAttention",
                  "NativeLayerNorm", "NativeBatchNorm", "CudnnBatchNorm", "NativeGroupNorm", "FusedRmsNorm")


def family(name: str) -> str:
    """`AddmmBackward0` -> `Addmm`; `torch::autograd::AccumulateGrad` -> `AccumulateGrad`."""
    return re.sub(r"Backward\d*$", "", name.rsplit("::", 1)[-1])


def categorize(name: str, in_loss: bool = False) -> str:
    base = family(name)
    if base == "AccumulateGrad":
        return "accumulate-grad"
    if in_loss:
        return "loss"
    if "Attention" in base and base != "MultiheadAttention":
        return "attention"
    return _FAMILY_OF.get(base, "other")


def is_fused(name: str) -> bool:
    return family(name).startswith(FUSED_PREFIXES)
