"""Real `diffusers` models as graphlint targets, built from small configurations with random weights (no
downloads): a Stable-Diffusion-style conditional U-Net, an unconditional U-Net, the KL autoencoder, a DiT-style
transformer. `benchmarks/compile_agreement.py` judges GL301/GL302 on them against plain torch.compile.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, DiTTransformer2DModel, UNet2DConditionModel, UNet2DModel


def unet_conditional():
    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    return model, (torch.randn(2, 4, 16, 16), torch.tensor([10, 20])), \
        {"encoder_hidden_states": torch.randn(2, 7, 32)}


def unet():
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                        norm_num_groups=8, attention_head_dim=8)
    return model, (torch.randn(2, 3, 16, 16), torch.tensor([10, 20])), {}


def autoencoder_kl():
    torch.manual_seed(0)
    model = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          norm_num_groups=8, sample_size=32)
    return model, (torch.randn(2, 3, 32, 32),), {}


def dit():
    torch.manual_seed(0)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                  num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=8)
    return model, (torch.randn(2, 4, 8, 8),), {"timestep": torch.tensor([1, 2]), "class_labels": torch.tensor([0, 3])}


ARCHITECTURES = ["unet_conditional", "unet", "autoencoder_kl", "dit"]
