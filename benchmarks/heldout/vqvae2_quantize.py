"""Written in the style of rosinality's VQ-VAE-2 (rosinality/vq-vae-2-pytorch, vqvae.py).

`Quantize` keeps its codebook as a buffer `embed` of shape (dim, n_embed): distances
`flatten.pow(2).sum(1, keepdim=True) - 2 * flatten @ self.embed + self.embed.pow(2).sum(0, keepdim=True)`, the
nearest code by `(-dist).max(1)`, and in training the exponential-moving-average update written through
`.data`: `self.cluster_size.data.mul_(self.decay).add_(...)`, `self.embed_avg.data.mul_(...)` and
`self.embed.data.copy_(embed_normalized)`, which overwrites the codebook the distance product saved for its
backward. The straight-through `input + (quantize - input).detach()`; encoder and decoder with rosinality's
ResBlock (`nn.ReLU(inplace=True)` first, on the block's own input) and `out += input`.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "VQ-VAE-2 Quantize (EMA codebook update through .data)"
REPOSITORY = "rosinality/vq-vae-2-pytorch"
BACKWARD_FAILS = False


class Quantize(nn.Module):
    def __init__(self, dim, n_embed, decay=0.99, eps=1e-5):
        super().__init__()
        self.dim = dim
        self.n_embed = n_embed
        self.decay = decay
        self.eps = eps
        embed = torch.randn(dim, n_embed)
        self.register_buffer("embed", embed)
        self.register_buffer("cluster_size", torch.zeros(n_embed))
        self.register_buffer("embed_avg", embed.clone())

    def forward(self, input):
        flatten = input.reshape(-1, self.dim)
        dist = (
            flatten.pow(2).sum(1, keepdim=True)
            - 2 * flatten @ self.embed
            + self.embed.pow(2).sum(0, keepdim=True)
        )
        _, embed_ind = (-dist).max(1)
        embed_onehot = F.one_hot(embed_ind, self.n_embed).type(flatten.dtype)
        embed_ind = embed_ind.view(*input.shape[:-1])
        quantize = self.embed_code(embed_ind)

        if self.training:
            embed_onehot_sum = embed_onehot.sum(0)
            embed_sum = flatten.transpose(0, 1) @ embed_onehot

            self.cluster_size.data.mul_(self.decay).add_(embed_onehot_sum, alpha=1 - self.decay)
            self.embed_avg.data.mul_(self.decay).add_(embed_sum, alpha=1 - self.decay)
            n = self.cluster_size.sum()
            cluster_size = (self.cluster_size + self.eps) / (n + self.n_embed * self.eps) * n
            embed_normalized = self.embed_avg / cluster_size.unsqueeze(0)
            self.embed.data.copy_(embed_normalized)

        diff = (quantize.detach() - input).pow(2).mean()
        quantize = input + (quantize - input).detach()

        return quantize, diff, embed_ind

    def embed_code(self, embed_id):
        return F.embedding(embed_id, self.embed.transpose(0, 1))


class ResBlock(nn.Module):
    def __init__(self, in_channel, channel):
        super().__init__()
        self.conv = nn.Sequential(
            nn.ReLU(inplace=True),
            nn.Conv2d(in_channel, channel, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, in_channel, 1),
        )

    def forward(self, input):
        out = self.conv(input)
        out += input
        return out


class Encoder(nn.Module):
    def __init__(self, in_channel, channel, n_res_block, n_res_channel):
        super().__init__()
        blocks = [
            nn.Conv2d(in_channel, channel // 2, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel // 2, channel, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, channel, 3, padding=1),
        ]
        for _ in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))
        blocks.append(nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


class Decoder(nn.Module):
    def __init__(self, in_channel, out_channel, channel, n_res_block, n_res_channel):
        super().__init__()
        blocks = [nn.Conv2d(in_channel, channel, 3, padding=1)]
        for _ in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))
        blocks.append(nn.ReLU(inplace=True))
        blocks.extend([
            nn.ConvTranspose2d(channel, channel // 2, 4, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.ConvTranspose2d(channel // 2, out_channel, 4, stride=2, padding=1),
        ])
        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


class VQVAE(nn.Module):
    """One level of VQ-VAE-2 (the top level's encoder, quantizer and decoder), small."""

    def __init__(self, in_channel=3, channel=16, n_res_block=1, n_res_channel=8, embed_dim=8, n_embed=32):
        super().__init__()
        self.enc = Encoder(in_channel, channel, n_res_block, n_res_channel)
        self.quantize_conv = nn.Conv2d(channel, embed_dim, 1)
        self.quantize = Quantize(embed_dim, n_embed)
        self.dec = Decoder(embed_dim, in_channel, channel, n_res_block, n_res_channel)

    def forward(self, input):
        enc = self.enc(input)
        quant = self.quantize_conv(enc).permute(0, 2, 3, 1)
        quant, diff, _ = self.quantize(quant)
        quant = quant.permute(0, 3, 1, 2)
        dec = self.dec(quant)
        recon_loss = (dec - input).pow(2).mean()
        return recon_loss + 0.25 * diff


def make_model():
    torch.manual_seed(0)
    return VQVAE(), (torch.randn(2, 3, 16, 16),)
