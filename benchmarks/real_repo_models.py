"""The models of the real repositories of docs/real-repositories.md, installed from PyPI, as graphlint targets
(their classes as the document lints them, batch 2 where it used 1, so that a batch can grow):

    pip install -c constraints.txt local-attention vector-quantize-pytorch egnn-pytorch ncps efficientnet_pytorch

`benchmarks/compile_agreement.py --set real-repos` judges GL301/GL302 on them against plain torch.compile.
"""

from __future__ import annotations

import torch


def local_transformer():
    from local_attention.transformer import LocalTransformer

    torch.manual_seed(0)
    model = LocalTransformer(num_tokens=256, max_seq_len=128, dim=64, depth=2, local_attn_window_size=32)
    return model, (torch.randint(0, 256, (2, 128)),)


def vector_quantize():
    from vector_quantize_pytorch import VectorQuantize

    torch.manual_seed(0)
    return VectorQuantize(dim=64, codebook_size=128), (torch.randn(2, 256, 64),)


def residual_vq():
    from vector_quantize_pytorch import ResidualVQ

    torch.manual_seed(0)
    return ResidualVQ(dim=64, num_quantizers=4, codebook_size=128, quantize_dropout=True), (torch.randn(2, 256, 64),)


def lookup_free_quantization():
    from vector_quantize_pytorch import LFQ

    torch.manual_seed(0)
    return LFQ(dim=16, codebook_size=2**8), (torch.randn(2, 16, 8, 8),)


def egnn():
    from egnn_pytorch import EGNN

    torch.manual_seed(0)
    return EGNN(dim=32), (torch.randn(2, 16, 32), torch.randn(2, 16, 3))


def cfc():
    from ncps.torch import CfC

    torch.manual_seed(0)
    return CfC(8, 16), (torch.randn(2, 10, 8),)


def efficientnet_b0():
    from efficientnet_pytorch import EfficientNet

    torch.manual_seed(0)
    return EfficientNet.from_name("efficientnet-b0", image_size=64), (torch.randn(2, 3, 64, 64),)
