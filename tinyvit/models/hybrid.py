"""The hybrid ViT's patch embedding: a convolutional stem whose feature map becomes
the token sequence (ViT paper, section 3.1, "Hybrid Architecture").

    images (B, C, H, W)
      -> stem: per stage conv k x k / s -> norm -> ReLU, then an optional max pool
                                           (B, C', H', W'),  H' = H / (product of strides)
      -> patches of P x P on the feature map (P = 1: every position a token)
      -> Linear(C' P^2, D)                 (B, (H'/P)(W'/P), D)

The stem's layers are in ``tinyvit/nn/conv.py``. Parameter names follow timm's
hybrid models: the stem under ``patch_embed.backbone``, the projection
``patch_embed.proj``.
"""

import math

from ..nn.conv import BatchNorm2d, Conv2d, GroupNorm, MaxPool2d, ReLU
from ..nn.layers import PatchEmbed
from ..nn.module import Sequential
from .config import STEM_NORMS, STEM_POOL


class ConvStem(Sequential):
    """Convolutional stages, each conv -> norm -> ReLU, then an optional 3 x 3 max
    pool of stride 2: (B, C, H, W) -> (B, C', H', W').

    ``stages``: one (out_channels, kernel, stride) per convolution, padded by
    kernel // 2 and without bias (the norm's beta takes its place).
    ``norm``: "batch" (BatchNorm2d), or "group": GroupNorm with gcd(32, C)
    groups over weight-standardized convolutions, as BiT's ResNet-V2 that the
    ViT paper's hybrids use. The layers are named ``conv1, norm1, conv2, ...``.
    """

    def __init__(self, in_channels, stages, norm="batch", pool=False, rng=None, dtype=None):
        if norm not in STEM_NORMS:
            raise ValueError(f"stem norm must be one of {STEM_NORMS}, got {norm!r}")
        layers, channels = [], in_channels
        for i, (out_channels, kernel, stride) in enumerate(stages, start=1):
            conv = Conv2d(channels, out_channels, kernel, stride, padding=kernel // 2, bias=False,
                          weight_standardization=norm == "group", rng=rng, dtype=dtype)
            if norm == "batch":
                normalize = BatchNorm2d(out_channels, dtype=dtype)
            else:
                normalize = GroupNorm(math.gcd(32, out_channels), out_channels, dtype=dtype)
            setattr(self, f"conv{i}", conv)
            setattr(self, f"norm{i}", normalize)
            layers += [conv, normalize, ReLU()]
            channels = out_channels
        if pool:
            self.pool = MaxPool2d(*STEM_POOL)
            layers.append(self.pool)
        self.out_channels = channels
        super().__init__(*layers)


class HybridEmbed(PatchEmbed):
    """The stem, then ``PatchEmbed`` on its feature map: (B, C, H, W) -> (B, G^2, D),
    G = H'/P patches per side of the (B, C', H', W') feature map."""

    def __init__(self, stem, patch_size, embed_dim, rng=None, dtype=None):
        self.backbone = stem
        super().__init__(patch_size, stem.out_channels, embed_dim, rng=rng, dtype=dtype)

    def forward(self, x):
        return super().forward(self.backbone.forward(x))  # (B, G^2, D)

    def backward(self, dout):
        return self.backbone.backward(super().backward(dout))  # (B, C, H, W)
