"""A PyTorch ViT in timm's VisionTransformer layout, written out in plain torch.

Used only as an optional reference (tests skip without torch; the benchmark
times it): it loads a tinyvit ``state_dict`` as it is, so both compute the same
function and their logits, losses and gradients can be compared key by key.
"""

import math

import torch
from torch import nn


class TorchAttention(nn.Module):
    def __init__(self, dim, num_heads, qkv_bias):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, D = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, D)
        return self.proj(x)


class TorchMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TorchBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, qkv_bias):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TorchAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TorchMlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, in_channels, dim):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, D)


class TorchViT(nn.Module):
    """timm's VisionTransformer (no dropout), for a tinyvit ``ViTConfig``."""

    def __init__(self, config):
        super().__init__()
        c = config
        self.pool = c.pool
        self.patch_embed = PatchEmbed(c.patch_size, c.in_channels, c.embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, c.num_patches + 1, c.embed_dim))
        self.blocks = nn.ModuleList(
            TorchBlock(c.embed_dim, c.num_heads, c.mlp_ratio, c.qkv_bias) for _ in range(c.depth)
        )
        final_norm = nn.LayerNorm(c.embed_dim, eps=1e-6)
        if c.pool == "mean":
            self.fc_norm = final_norm
        else:
            self.norm = final_norm
        self.head = nn.Linear(c.embed_dim, c.num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        if self.pool == "mean":
            return self.head(self.fc_norm(x[:, 1:].mean(dim=1)))
        return self.head(self.norm(x[:, 0]))


def torch_vit_from(model, dtype=torch.float64):
    """A TorchViT holding exactly the weights of the tinyvit ``model``."""
    reference = TorchViT(model.config).to(dtype)
    state = {k: torch.from_numpy(v).to(dtype) for k, v in model.state_dict().items()}
    reference.load_state_dict(state, strict=True)
    return reference
