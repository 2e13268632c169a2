"""The Vision Transformer (Dosovitskiy et al. 2020), its configs and named presets.

    images (B, C, H, W)
      -> patch_embed                       (B, N-1, D)   N-1 = (H/P)(W/P) patches
      -> [cls_token; patches] + pos_embed  (B, N, D)
      -> dropout, depth x Block            (B, N, D)   cls pooling: the last block is a
                                                         ClassAttentionBlock, (B, 1, D)
      -> pool: class token or mean         (B, D)
      -> norm (LayerNorm), head (Linear)   (B, K)

Parameter names and layouts follow timm's VisionTransformer, so a state dict can
be compared key by key with PyTorch implementations (see ``state_dict``).
"""

import dataclasses
import json

from .backend import float_dtype, host_rng, to_device, to_host, xp
from .backend import rng as device_rng
from .checks import check_fields
from .hybrid import STEM_NORMS, ConvStem, HybridEmbed, stem_output_size
from .layers import Block, ClassAttentionBlock, Dropout, LayerNorm, Linear, PatchEmbed, PreLogits
from .module import Module, Parameter, trunc_normal


@dataclasses.dataclass
class ViTConfig:
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
    # the hybrid model (tinyvit/hybrid.py): a convolutional stem, one (channels, kernel, stride)
    # per conv, patch_size then counting feature-map positions; () for the plain ViT
    stem: tuple = ()
    stem_norm: str = "batch"  # or "group": GroupNorm over weight-standardized convs
    stem_pool: bool = False  # a 3x3 max pool of stride 2 after the convs

    def __post_init__(self):
        self.stem = tuple(tuple(int(v) for v in stage) for stage in self.stem)  # JSON gives lists
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
        if any(len(stage) != 3 or min(stage) < 1 for stage in self.stem):
            raise ValueError(f"stem must hold (channels, kernel, stride) triples of positive "
                             f"ints, got {self.stem}")
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
    # hybrids (tinyvit/hybrid.py) for 2 CPU cores: a two-convolution stem to a 7x7 map of
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


def create_model(name, seed=0, dtype=None, **overrides):
    """A ViT from a named preset, with any config field overridden:
    ``create_model("mnist", depth=6, embed_dim=96)``."""
    return ViT(preset_config(name, **overrides), seed=seed, dtype=dtype)


class ViT(Module):
    """The Vision Transformer. ``seed`` fixes the initial weights (drawn on the
    host, the same on every backend) and the dropout masks.

    Initialization follows timm: Linear weights truncated normal (std 0.02),
    biases 0, pos_embed truncated normal (std 0.02), cls_token normal (std 1e-6),
    the patch embedding as PyTorch's Conv2d default.
    """

    def __init__(self, config=None, seed=0, dtype=None, **fields):
        super().__init__()
        config = config or ViTConfig(**fields)
        self.config = config
        dtype = float_dtype(dtype)
        init = host_rng(seed)
        D, N = config.embed_dim, config.num_patches + 1
        if config.stem:
            stem = ConvStem(config.in_channels, config.stem, config.stem_norm, config.stem_pool,
                            rng=init, dtype=dtype)
            self.patch_embed = HybridEmbed(stem, config.patch_size, D, rng=init, dtype=dtype)
        else:
            self.patch_embed = PatchEmbed(config.patch_size, config.in_channels, D, rng=init,
                                          dtype=dtype)
        self.cls_token = Parameter(trunc_normal(init, (1, 1, D), std=1e-6, dtype=dtype))
        self.pos_embed = Parameter(trunc_normal(init, (1, N, D), dtype=dtype))
        self.pos_drop = Dropout(config.dropout)
        # under class-token pooling only the class token's output of the last block
        # reaches the head: that block computes its row alone
        last = ClassAttentionBlock if config.pool == "cls" else Block
        self.blocks = [
            (last if i == config.depth - 1 else Block)(
                D, config.num_heads, config.mlp_ratio, config.qkv_bias, config.dropout,
                config.attn_dropout, rng=init, dtype=dtype, eps=config.norm_eps)
            for i in range(config.depth)
        ]
        self.norm = LayerNorm(D, eps=config.norm_eps, dtype=dtype)
        R = config.representation_size
        self.pre_logits = PreLogits(D, R, rng=init, dtype=dtype) if R else None
        self.head = Linear(R or D, config.num_classes, rng=init, dtype=dtype)
        self._dropouts = None
        self.seed_dropout(seed)

    def seed_dropout(self, seed):
        """Give every Dropout layer with p > 0 one fresh generator on the active
        backend; ``seed`` is an int or a tuple such as (seed, step)."""
        if self._dropouts is None:
            self._dropouts = tuple(m for _, m in self.named_modules()
                                   if isinstance(m, Dropout) and m.p > 0)
        if self._dropouts:
            generator = device_rng(seed)
            for module in self._dropouts:
                module.rng = generator

    # -- forward and backward ------------------------------------------------

    def check_input(self, images):
        """Raise a ValueError naming what was expected and what came."""
        c = self.config
        expected = f"(B, {c.in_channels}, {c.image_size}, {c.image_size})"
        if not hasattr(images, "ndim") or images.ndim != 4:
            got = f"shape {images.shape}" if hasattr(images, "shape") else type(images).__name__
            raise ValueError(f"ViT: expected images of shape {expected}, got {got}")
        if not xp.issubdtype(images.dtype, xp.floating):
            raise ValueError(
                f"ViT: expected float images (normalized pixels), got dtype {images.dtype}"
            )
        _, C, H, W = images.shape
        if C != c.in_channels:
            raise ValueError(
                f"ViT: expected {c.in_channels} channel(s), got {C} "
                f"(images of shape {images.shape})"
            )
        if (H, W) != (c.image_size, c.image_size):
            raise ValueError(
                f"ViT: expected {c.image_size}x{c.image_size} images, got {H}x{W} "
                f"(shape {images.shape}; resize them or build the model with image_size={H})"
            )

    def forward(self, images):
        self.check_input(images)
        x = self.patch_embed.forward(images)  # (B, N-1, D)
        B, _, D = x.shape
        cls = xp.broadcast_to(self.cls_token.data, (B, 1, D))
        x = xp.concatenate([cls, x], axis=1)  # (B, N, D)
        x += self.pos_embed.data
        x = self.pos_drop.forward(x)
        for block in self.blocks:
            x = block.forward(x)  # (B, N, D); the last block under cls pooling: (B, 1, D)
        self.cache = x.shape
        if self.config.pool == "cls":
            pooled = x[:, 0]  # (B, D)
        else:
            pooled = x[:, 1:].mean(axis=1)  # (B, D)
        features = self.norm.forward(pooled)  # (B, D)
        if self.pre_logits is not None:
            features = self.pre_logits.forward(features)  # (B, R)
        return self.head.forward(features)  # (B, K)

    def backward(self, dlogits):
        """Reverse of forward. Pooling: the class token's row gets the gradient
        (cls), or every patch token gets 1/(N-1) of it (mean). The class token
        and the position embedding are added to every image, so their gradients
        are sums over the batch; the patch rows go back through patch_embed."""
        B, N, D = self._take_cache()
        dfeatures = self.head.backward(dlogits)  # (B, D), or (B, R)
        if self.pre_logits is not None:
            dfeatures = self.pre_logits.backward(dfeatures)  # (B, D)
        dpooled = self.norm.backward(dfeatures)  # (B, D)
        dx = xp.zeros((B, N, D), dtype=dpooled.dtype)
        if self.config.pool == "cls":
            dx[:, 0] = dpooled
        else:
            dx[:, 1:] = (dpooled / (N - 1))[:, None, :]
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        dx = self.pos_drop.backward(dx)
        self.pos_embed.grad += dx.sum(axis=0, keepdims=True)
        self.cls_token.grad += dx[:, :1].sum(axis=0, keepdims=True)
        return self.patch_embed.backward(dx[:, 1:])  # (B, C, H, W)

    def keep_attention(self, keep=True):
        """Whether each block keeps its attention weights of the next forwards
        (for ``attention_maps``); off by default, and turning it off drops the
        maps kept so far. Returns the model."""
        for block in self.blocks:
            block.attn.keep_attn = keep
            if not keep:
                block.attn.attn = None
        return self

    @property
    def keeps_attention(self):
        """Whether ``keep_attention`` is on."""
        return self.blocks[0].attn.keep_attn

    def attention_maps(self):
        """Attention weights of the last forward, one (B, H, N, N) array per block."""
        maps = [block.attn.attn for block in self.blocks]
        if any(a is None for a in maps):
            raise RuntimeError("no attention maps kept: call model.keep_attention(), "
                               "then run model.forward(images)")
        return maps

    # -- state dicts in timm's layout ------------------------------------------

    def _timm_name(self, name):
        if name.startswith("norm.") and self.config.pool == "mean":
            return "fc_" + name  # timm normalizes after mean pooling as fc_norm
        return name

    def _export(self, name, array):
        if name == "patch_embed.proj.weight":
            array = self.patch_embed.weight_to_conv(array)  # (D, C, P, P)
        return to_host(array).copy()

    def _state_arrays(self):
        """(key, name, array) of every parameter's values and every buffer."""
        for name, p in self.named_parameters():
            yield self._timm_name(name), name, p.data
        for name, module, attribute in self.named_buffers():
            yield self._timm_name(name), name, getattr(module, attribute)

    def state_dict(self):
        """Host NumPy copies of every parameter and buffer under timm's names and
        layouts: ``patch_embed.proj.weight`` as a Conv2d weight (D, C, P, P), Linear
        weights (out, in), qkv stacked q, k, v; the final norm is ``fc_norm`` under
        mean pooling, as in timm; a hybrid's stem under ``patch_embed.backbone``."""
        return {key: self._export(name, a) for key, name, a in self._state_arrays()}

    def grads(self):
        """The accumulated gradients under the same keys and layouts as ``state_dict``."""
        return {self._timm_name(n): self._export(n, p.grad) for n, p in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy values in, after checking every key and shape; a ValueError lists
        each missing, unexpected or mis-shaped key. Values may be NumPy arrays,
        CuPy arrays or anything ``numpy.asarray`` takes (CPU torch tensors)."""
        arrays = {key: (name, a) for key, name, a in self._state_arrays()}
        missing = [k for k in arrays if k not in state]
        unexpected = [k for k in state if k not in arrays]
        misshaped = []
        for key, (name, a) in arrays.items():
            if key in state:
                expected = self._export(name, a).shape
                got = tuple(to_host(state[key]).shape)
                if got != expected:
                    misshaped.append(f"{key}: expected {expected}, got {got}")
        if missing or unexpected or misshaped:
            lines = ["state dict does not match the model:"]
            lines += [f"  missing key: {k}" for k in missing]
            lines += [f"  unexpected key: {k}" for k in unexpected]
            lines += [f"  wrong shape: {m}" for m in misshaped]
            raise ValueError("\n".join(lines))
        for key, (_, a) in arrays.items():
            a[...] = to_device(to_host(state[key]), a.dtype).reshape(a.shape)

    def save(self, path):
        """Write the config and the state dict to one ``.npz`` file (atomically)."""
        from .checkpoint import save_npz

        arrays = dict(self.state_dict())
        arrays["__config__"] = json.dumps(dataclasses.asdict(self.config))
        save_npz(path, arrays)

    def save_pretrained(self, path):
        """Write timm's layout: ``path`` (``.safetensors``) and a ``config.json`` beside
        it (``tinyvit.pretrained.save_pretrained``; needs the ``hub`` extra)."""
        from .pretrained import save_pretrained

        return save_pretrained(self, path)

    @classmethod
    def load(cls, path, dtype=None):
        """A model rebuilt from a file written by ``save``."""
        from .checkpoint import load_npz

        arrays = load_npz(path)
        if "__config__" not in arrays:
            raise ValueError(f"{path}: not a tinyvit model file (no __config__ entry)")
        config = ViTConfig(**json.loads(str(arrays.pop("__config__"))))
        model = cls(config, dtype=dtype)
        model.load_state_dict(arrays)
        return model

    # -- summary ---------------------------------------------------------------

    def summary(self, print_fn=print):
        """Print (and return) a table of layers, output shapes, parameter counts and
        forward FLOPs per image, like the torchsummary tables people print for ViT
        (B = batch). FLOPs count the matmuls and convolutions, 2 per multiply-add."""
        rows = self._summary_rows()
        width = max(len(r[0]) for r in rows) + 2
        rule = "-" * (width + 50)
        lines = [rule, f"{'Layer (type)':<{width}}{'Output shape':<22}{'Param #':>14}{'FLOPs':>14}",
                 rule]
        for name, shape, owner, flops in rows:
            shape_text = "[B, " + ", ".join(str(s) for s in shape) + "]"
            lines.append(f"{name:<{width}}{shape_text:<22}{_count(owner):>14,}{flops:>14,}")
        c, total = self.config, self.num_parameters()
        tokens = f"{c.num_patches} patches + 1 class token"
        source = f"of its {c.feature_size}x{c.feature_size} feature map" if c.stem else ""
        lines += [
            rule,
            f"Total params: {total:,}",
            f"Trainable params: {total:,}",
            f"Forward FLOPs per image: {self.flops_per_image():,}",
            f"Input: [B, {c.in_channels}, {c.image_size}, {c.image_size}], "
            f"patch_size {c.patch_size} {source}".rstrip() + f", {tokens}",
            rule,
        ]
        text = "\n".join(lines)
        print_fn(text)
        return text

    def flops_per_image(self):
        """Forward FLOPs of one image's matmuls and convolutions (2 per multiply-add)."""
        return sum(row[3] for row in self._summary_rows())

    def _summary_rows(self):
        """(name, output shape, parameter owner, forward FLOPs per image) per layer."""
        c = self.config
        N, D, K = c.num_patches + 1, c.embed_dim, c.num_classes
        hidden = int(D * c.mlp_ratio)
        rows, channels, size = [], c.in_channels, c.image_size
        if c.stem:
            stem = self.patch_embed.backbone
            for i, (out, k, stride) in enumerate(c.stem, start=1):
                size = stem_output_size(size, [(out, k, stride)], False)
                flops = 2 * channels * k * k * out * size * size
                rows += [(f"patch_embed.backbone.conv{i} (Conv2d {k}x{k}/{stride})",
                          (out, size, size), getattr(stem, f"conv{i}"), flops),
                         (f"patch_embed.backbone.norm{i} + ReLU", (out, size, size),
                          getattr(stem, f"norm{i}"), 0)]
                channels = out
            if c.stem_pool:
                size = stem_output_size(size, (), True)
                rows.append(("patch_embed.backbone.pool (MaxPool2d 3x3/2)", (channels, size, size),
                             None, 0))
        fan_in = channels * c.patch_size**2
        rows.append(("patch_embed.proj (Conv2d as Linear)", (N - 1, D), self.patch_embed.proj,
                     2 * (N - 1) * fan_in * D))
        rows.append(("cls_token + pos_embed", (N, D), (self.cls_token, self.pos_embed), 0))
        for i, block in enumerate(self.blocks):
            p = f"blocks.{i}"
            Q = 1 if isinstance(block, ClassAttentionBlock) else N  # rows after its attention
            rows += [
                (f"{p}.norm1 (LayerNorm)", (N, D), block.norm1, 0),
                (f"{p}.attn.qkv (Linear)", (N, 3 * D), block.attn.qkv, 2 * N * D * 3 * D),
                (f"{p}.attn.softmax ({c.num_heads} heads)", (c.num_heads, Q, N), None,
                 2 * 2 * Q * N * D),  # q k^T and A v, all heads
                (f"{p}.attn.proj (Linear)", (Q, D), block.attn.proj, 2 * Q * D * D),
                (f"{p}.norm2 (LayerNorm)", (Q, D), block.norm2, 0),
                (f"{p}.mlp.fc1 (Linear)", (Q, hidden), block.mlp.fc1, 2 * Q * D * hidden),
                (f"{p}.mlp.act (GELU)", (Q, hidden), None, 0),
                (f"{p}.mlp.fc2 (Linear)", (Q, D), block.mlp.fc2, 2 * Q * hidden * D),
            ]
        norm_name = "fc_norm" if c.pool == "mean" else "norm"
        rows.append((f"pool ({c.pool})", (D,), None, 0))
        rows.append((f"{norm_name} (LayerNorm)", (D,), self.norm, 0))
        R = c.representation_size
        if R:
            rows.append(("pre_logits (Linear + tanh)", (R,), self.pre_logits, 2 * D * R))
        rows.append(("head (Linear)", (K,), self.head, 2 * (R or D) * K))
        return rows


def _count(owner):
    """Parameters of a module, of a tuple of Parameters, or 0 for None."""
    if owner is None:
        return 0
    if isinstance(owner, tuple):
        return sum(p.data.size for p in owner)
    return owner.num_parameters()


# -- position embeddings at another image size ----------------------------------

CUBIC_A = -0.75  # the cubic convolution parameter of PyTorch's and OpenCV's bicubic


def _cubic_weights(t):
    """Keys' cubic convolution weights of the 4 samples at offsets -1, 0, 1, 2 from
    floor(x), for fractional positions t = x - floor(x) (PyTorch's upsample_bicubic2d):

        w(s) = ((a + 2)|s| - (a + 3)) s^2 + 1            for |s| <= 1
        w(s) = ((a|s| - 5a)|s| + 8a)|s| - 4a             for 1 < |s| < 2

    at s = t + 1, t, 1 - t, 2 - t. At t = 0 they are exactly (0, 1, 0, 0).
    t: (M,) -> (M, 4).
    """
    a = CUBIC_A

    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return xp.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def interpolation_matrix(old, new):
    """The (new, old) matrix W of 1-D bicubic resampling: resized = W @ values.

    As ``F.interpolate(mode="bicubic", align_corners=False)``: output sample o sits
    at input coordinate x = (o + 0.5) * old / new - 0.5 (pixel centres aligned,
    not corners), takes the 4 input samples floor(x) - 1 ... floor(x) + 2 with the
    weights of ``_cubic_weights``, and an index past either end is clamped to the
    edge (its weight added to the edge sample). Every row sums to 1; for
    new == old it is exactly the identity.
    """
    o = xp.arange(new, dtype=xp.float64)
    x = (o + 0.5) * (old / new) - 0.5  # (new,) input coordinates
    start = xp.floor(x)
    weights = _cubic_weights(x - start)  # (new, 4)
    index = xp.clip(start[:, None] + xp.arange(-1, 3), 0, old - 1)  # (new, 4) clamped taps
    hits = index[:, :, None] == xp.arange(old)  # (new, 4, old) one-hot
    return (weights[:, :, None] * hits).sum(axis=1)  # (new, old)


def _grid_shape(grid):
    return (grid, grid) if isinstance(grid, int) else tuple(grid)


def resize_pos_embed(pos_embed, old_grid, new_grid):
    """Resize position embeddings from one patch grid to another, on the active backend.

    The class token's row (first) is kept as is; the patch rows, seen as a
    (Gh, Gw) grid of D-vectors, are resampled channel by channel with separable
    bicubic interpolation:

        grid'[:, :, d] = Wh @ grid[:, :, d] @ Ww^T,   Wh (Gh', Gh), Ww (Gw', Gw)

    (``interpolation_matrix``). Bicubic, not bilinear, because it is what DeiT
    and timm use to fine-tune at a higher resolution, and it equals
    ``torch.nn.functional.interpolate(mode="bicubic", align_corners=False)``, so it
    can be checked against PyTorch (timm's ``resample_abs_pos_embed`` now defaults
    to antialias=True, PIL's a = -0.5 kernel, which differs slightly; the ViT
    paper's own code used bilinear, ``scipy.ndimage.zoom(order=1)``). Like any
    cubic it can overshoot the input range a little between samples. When the
    grid is unchanged W is the identity and the result equals the input exactly.

    Args:
        pos_embed: (1, 1 + Gh*Gw, D), class token first, patches in row-major order.
        old_grid, new_grid: patches per side, an int or (rows, cols).
    Returns:
        (1, 1 + Gh'*Gw', D), same dtype.
    """
    (gh, gw), (nh, nw) = _grid_shape(old_grid), _grid_shape(new_grid)
    if pos_embed.ndim != 3 or pos_embed.shape[:2] != (1, 1 + gh * gw):
        raise ValueError(
            f"resize_pos_embed: expected pos_embed of shape (1, 1 + {gh}*{gw}, D) = "
            f"(1, {1 + gh * gw}, D) for a {gh}x{gw} grid, got {tuple(pos_embed.shape)}"
        )
    D = pos_embed.shape[2]
    Wh = interpolation_matrix(gh, nh).astype(pos_embed.dtype)  # (nh, gh)
    Ww = interpolation_matrix(gw, nw).astype(pos_embed.dtype)  # (nw, gw)
    grid = pos_embed[0, 1:].reshape(gh, gw, D).transpose(2, 0, 1)  # (D, gh, gw)
    grid = Wh @ grid @ Ww.T  # (D, nh, nw)
    patches = grid.transpose(1, 2, 0).reshape(1, nh * nw, D)  # (1, nh*nw, D)
    return xp.concatenate([pos_embed[:, :1], patches], axis=1)  # (1, 1 + nh*nw, D)


def resize_image(model, image_size):
    """A new ViT for ``image_size`` x ``image_size`` images: the same config with
    the new image size, every weight copied, and ``pos_embed`` resized by
    ``resize_pos_embed`` (the class token's embedding kept). The patch size is
    unchanged, so the grid goes from image_size/P to the new image_size/P per side.
    The new model has the old one's dtype and train/eval mode."""
    config = dataclasses.replace(model.config, image_size=image_size)  # checks divisibility
    old_grid = model.config.feature_size // model.config.patch_size
    new_grid = config.feature_size // config.patch_size
    resized = ViT(config, dtype=model.pos_embed.data.dtype.type)
    state = model.state_dict()
    state["pos_embed"] = to_host(resize_pos_embed(model.pos_embed.data, old_grid, new_grid))
    resized.load_state_dict(state)
    return resized.train(model.training)
