"""What a Vision Transformer is described by: ``ViTConfig``, the named presets, and
the sizes that follow from a config (tokens, the hybrid stem's feature map).

Shape legend: D embed_dim, N tokens (the patches and the class token), P
patch_size, C in_channels, K num_classes.
"""

import dataclasses
import numbers

from ..checks import check_fields, check_number_types

STEM_NORMS = ("batch", "group")
STEM_POOL = (3, 2, 1)  # the stem's max pool: kernel 3, stride 2, padding 1, as ResNet's


def stem_stages(stem):
    """``stem`` as a tuple of (channels, kernel, stride) triples of ints (JSON gives lists),
    or a ValueError naming it."""
    expected = "stem must hold (channels, kernel, stride) triples of positive ints"
    try:
        stages = tuple(tuple(stage) for stage in stem)
    except TypeError:
        raise ValueError(f"{expected}, got {stem!r}") from None
    if any(len(stage) != 3 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral)
                                  or v < 1 for v in stage) for stage in stages):
        raise ValueError(f"{expected}, got {stem!r}")
    return tuple(tuple(int(v) for v in stage) for stage in stages)


def stem_output_size(size, stages, pool):
    """The feature map's side for an input side ``size``: each k x k convolution of
    stride s pads k // 2 and gives floor((size + 2 (k // 2) - k) / s) + 1, the pool
    likewise."""
    for _, kernel, stride in stages:
        size = (size + 2 * (kernel // 2) - kernel) // stride + 1
    if pool:
        kernel, stride, padding = STEM_POOL
        size = (size + 2 * padding - kernel) // stride + 1
    return size


@dataclasses.dataclass
class ViTConfig:
    """The shape of a ViT (and of a hybrid's stem); every value is checked when a
    config is made, so a bad one is named before a model is built."""

    image_size: int = 28
    patch_size: int = 7
    in_channels: int = 1
    num_classes: int = 10
    embed_dim: int = 64
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 2.0
    qkv_bias: bool = True
    dropout: float = 0.0
    attn_dropout: float = 0.0
    pool: str = "cls"
    norm_eps: float = 1e-6  # LayerNorm's eps: 1e-6 as the paper's code and timm (HF: 1e-12)
    representation_size: int = 0  # > 0: a pre-logits layer tanh(Linear(D, R)) before the head
    # the hybrid model (models/hybrid.py): a convolutional stem, one (channels, kernel, stride)
    # per conv, patch_size then counting feature-map positions; () for the plain ViT
    stem: tuple = ()
    stem_norm: str = "batch"  # or "group": GroupNorm over weight-standardized convs
    stem_pool: bool = False  # a 3x3 max pool of stride 2 after the convs

    def __post_init__(self):
        self.stem = stem_stages(self.stem)
        check_number_types(self)
        check_fields(self, ("image_size", "patch_size", "in_channels", "num_classes", "embed_dim",
                            "depth", "num_heads"), lambda n: n >= 1, "at least 1")
        check_fields(self, ("dropout", "attn_dropout"), lambda p: 0.0 <= p < 1.0, "in [0, 1)")
        check_fields(self, ("norm_eps",), lambda e: e > 0, "positive")
        check_fields(self, ("representation_size",), lambda n: n >= 0, "at least 0")
        if int(self.embed_dim * self.mlp_ratio) < 1:
            raise ValueError(
                f"mlp_ratio {self.mlp_ratio} leaves the MLP no hidden unit "
                f"at embed_dim {self.embed_dim}"
            )
        if self.stem_norm not in STEM_NORMS:
            raise ValueError(f"stem_norm must be one of {STEM_NORMS}, got {self.stem_norm!r}")
        if self.feature_size % self.patch_size:
            what = "the stem's feature map" if self.stem else "image_size"
            raise ValueError(
                f"{what} {self.feature_size} is not divisible by patch_size {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}"
            )
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")

    @property
    def feature_size(self):
        """The side of what the patches are cut from: the image, or the stem's feature map."""
        return stem_output_size(self.image_size, self.stem, self.stem_pool)

    @property
    def num_patches(self):
        return (self.feature_size // self.patch_size) ** 2

    @property
    def token_size(self):
        """The side, in input pixels, of the image region one patch token stands for."""
        return self.image_size / (self.feature_size // self.patch_size)


PRESETS = {
    # 139,018 parameters: patch 7 (16 tokens), dim 64, depth 4, 4 heads, MLP ratio 2
    "mnist": ViTConfig(),
    "cifar10": ViTConfig(
        image_size=32, patch_size=4, in_channels=3, embed_dim=192, depth=6, num_heads=3
    ),
    # hybrids (tinyvit/models/hybrid.py) for 2 CPU cores: a two-convolution stem to a 7x7 map of
    # 64 channels, each position a token (161,002 parameters)
    "mnist_hybrid": ViTConfig(stem=((32, 3, 2), (64, 3, 2)), patch_size=1),
    # a finer stem for Fashion-MNIST's textures: a first convolution at full resolution, then
    # two of stride 2 to the same 7x7x64 map, mean-pooled (165,498 parameters)
    "fashion_mnist_hybrid": ViTConfig(
        stem=((16, 3, 1), (32, 3, 2), (64, 3, 2)), patch_size=1, pool="mean"
    ),
    # 32x32: three convolutions to an 8x8 map of 128 channels, 4 blocks of dim 128
    "cifar10_hybrid": ViTConfig(
        image_size=32, patch_size=1, in_channels=3, embed_dim=128, depth=4, num_heads=4,
        pool="mean", stem=((32, 3, 1), (64, 3, 2), (128, 3, 2)),
    ),
    # one GPU: the same stem, wider, then 7 blocks of dim 256 (ViT-Lite-7's transformer)
    "cifar10_hybrid_gpu": ViTConfig(
        image_size=32, patch_size=1, in_channels=3, embed_dim=256, depth=7, num_heads=4,
        pool="mean", stem=((64, 3, 1), (128, 3, 2), (256, 3, 2)),
    ),
    # the paper's models (ViT-Ti from DeiT) at 224x224, as timm's vit_*_patch16_224
    "vit_tiny_patch16_224": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, num_classes=1000,
        embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0,
    ),
    "vit_small_patch16_224": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, num_classes=1000,
        embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0,
    ),
    "vit_base_patch16_224": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, num_classes=1000,
        embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0,
    ),
}


def preset_config(name, **overrides):
    """The ViTConfig of a named preset, with any field overridden; a ValueError
    names an unknown preset or field, or a value out of range."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown config field(s) {sorted(unknown)}; fields: {sorted(fields)}")
    return dataclasses.replace(PRESETS[name], **overrides)
