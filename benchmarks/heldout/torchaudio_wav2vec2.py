"""Written in the style of torchaudio's wav2vec 2.0 components (pytorch/audio,
torchaudio/models/wav2vec2/components.py, the SelfAttention of releases before it moved to SDPA).

A conv feature extractor (GroupNorm on the first layer, GELU), FeatureProjection, a convolutional relative
position embedding with weight padding removed, and `SelfAttention`: `q = self.q_proj(x).view(batch_size,
length, heads, head_dim).transpose(2, 1)`, `k` permuted to (B, H, D, L), `weights = (self.scaling * q) @ k`,
`weights += attention_mask` in place, the row maximum subtracted before `torch.nn.functional.softmax`,
dropout, `weights @ v`; post-norm encoder layers as in wav2vec 2.0 base.
"""

import torch
from torch import Tensor, nn

STYLE = "torchaudio wav2vec2 SelfAttention (pre-SDPA)"
REPOSITORY = "pytorch/audio"
BACKWARD_FAILS = False


class ConvLayerBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, layer_norm):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.layer_norm = layer_norm
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, bias=False)

    def forward(self, x):
        x = self.conv(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return nn.functional.gelu(x)


class FeatureExtractor(nn.Module):
    def __init__(self, channels=16):
        super().__init__()
        self.conv_layers = nn.ModuleList([
            ConvLayerBlock(1, channels, 10, 5, nn.GroupNorm(channels, channels, affine=True)),
            ConvLayerBlock(channels, channels, 3, 2, None),
            ConvLayerBlock(channels, channels, 2, 2, None),
        ])

    def forward(self, x):
        x = x.unsqueeze(1)  # (batch, channel==1, frame)
        for layer in self.conv_layers:
            x = layer(x)  # (batch, feature, frame)
        return x.transpose(1, 2)  # (batch, frame, feature)


class FeatureProjection(nn.Module):
    def __init__(self, in_features, out_features, dropout=0.1):
        super().__init__()
        self.layer_norm = nn.LayerNorm(in_features)
        self.projection = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.projection(self.layer_norm(x)))


class ConvolutionalPositionalEmbedding(nn.Module):
    def __init__(self, embed_dim, kernel_size=4, groups=4):
        super().__init__()
        self.conv = nn.Conv1d(embed_dim, embed_dim, kernel_size=kernel_size, padding=kernel_size // 2, groups=groups)
        self.num_remove = 1 if kernel_size % 2 == 0 else 0

    def forward(self, x):
        x = x.transpose(-2, -1)
        x = self.conv(x)
        if self.num_remove > 0:
            x = x[..., : -self.num_remove]
        x = nn.functional.gelu(x)
        return x.transpose(-2, -1)


class SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        head_dim = embed_dim // num_heads
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = torch.nn.Dropout(dropout)
        self.head_dim = head_dim
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=True)

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        batch_size, length, embed_dim = x.size()
        shape = (batch_size, length, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(*shape).transpose(2, 1)  # B, nH, L, Hd
        k = self.k_proj(x).view(*shape).permute(0, 2, 3, 1)  # B, nH, Hd, L
        v = self.v_proj(x).view(*shape).transpose(2, 1)  # B, nH, L, Hd

        weights = (self.scaling * q) @ k  # B, nH, L, L
        if attention_mask is not None:
            weights += attention_mask
        # subtracting a constant value from the tensor won't change the output of softmax.
        # apply the subtraction to avoid value overflow in torch.nn.functional.softmax.
        weights = weights - weights.max(dim=-1, keepdim=True)[0]

        weights = torch.nn.functional.softmax(weights, dim=-1)
        weights = self.dropout(weights)

        output = weights @ v  # B, nH, L, Hd
        output = output.transpose(2, 1).reshape(batch_size, length, embed_dim)
        return self.out_proj(output)


class EncoderLayer(nn.Module):
    def __init__(self, embed_dim, heads, ffn_dim, dropout=0.1):
        super().__init__()
        self.attention = SelfAttention(embed_dim, heads)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.intermediate_dense = nn.Linear(embed_dim, ffn_dim)
        self.output_dense = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def forward(self, x, attention_mask=None):
        residual = x
        x = self.attention(x, attention_mask)
        x = self.dropout(x)
        x = self.layer_norm(residual + x)
        x = x + self.output_dense(nn.functional.gelu(self.intermediate_dense(x)))
        return self.final_layer_norm(x)


class Wav2Vec2Model(nn.Module):
    def __init__(self, channels=16, embed_dim=32, heads=4, layers=2):
        super().__init__()
        self.feature_extractor = FeatureExtractor(channels)
        self.feature_projection = FeatureProjection(channels, embed_dim)
        self.pos_conv_embed = ConvolutionalPositionalEmbedding(embed_dim)
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.layers = nn.ModuleList([EncoderLayer(embed_dim, heads, 2 * embed_dim) for _ in range(layers)])

    def forward(self, waveforms, lengths):
        x = self.feature_extractor(waveforms)
        frames = x.size(1)
        valid = torch.arange(frames)[None, :] < lengths[:, None]
        mask = (~valid)[:, None, None, :].to(x.dtype) * -10000.0  # B, 1, 1, L
        x = self.feature_projection(x)
        x = self.layer_norm(x + self.pos_conv_embed(x))
        for layer in self.layers:
            x = layer(x, mask)
        return x


def make_model():
    torch.manual_seed(0)
    # 400 samples -> 79 -> 39 -> 19 frames; the second utterance has 15 valid frames
    return Wav2Vec2Model(), (torch.randn(2, 400), torch.tensor([19, 15]))
