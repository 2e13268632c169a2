"""The Vision Transformer (Dosovitskiy et al. 2020): its forward, backward,
parameters and state dict. Its config and presets are in ``config.py``.

    images (B, C, H, W)
      -> patch_embed                       (B, G^2, D)   G = H/P = W/P patches per side
      -> [cls_token; patches] + pos_embed  (B, N, D)     N = G^2 + 1 tokens
      -> dropout, depth x Block            (B, N, D)     cls pooling: the last block is a
                                                         ClassAttentionBlock, (B, 1, D)
      -> pool: class token or mean         (B, D)
      -> norm (LayerNorm), head (Linear)   (B, K)        K classes

(The legend of these letters heads ``docs/backprop.md``.)

Parameter names and layouts follow timm's VisionTransformer, so a state dict can
be compared key by key with PyTorch implementations (see ``state_dict``).
"""

from ..backend import float_dtype, host_rng, to_device, to_host, xp
from ..checks import check_gradient_shape, check_images
from ..nn.init import trunc_normal
from ..nn.layers import (
    Block,
    ClassAttentionBlock,
    Dropout,
    LayerNorm,
    Linear,
    PatchEmbed,
    PreLogits,
    seed_dropouts,
)
from ..nn.module import Module, Parameter
from .config import ViTConfig, preset_config
from .hybrid import ConvStem, HybridEmbed
from .summary import summary


def create_model(name, seed=0, dtype=None, **overrides):
    """A ViT from a named preset, with any config field overridden:
    ``create_model("mnist", depth=6, embed_dim=96)``. Its layers are the reference
    layers of ``tinyvit/nn``, the code a reader reads; ``tinyvit.fast.accelerate``
    swaps in the fast kernels (the trainer does)."""
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
        """Give every Dropout layer with p > 0 one generator seeded ``seed``, shared,
        of the kind its class draws from (``Dropout.generator``: a fresh one on the
        active backend for the reference, the GPU kernel's ``DeviceKeys`` reseeded in
        place; ``seed_dropouts``); ``seed`` is an int or a tuple such as (seed, step)."""
        if self._dropouts is None:
            self._dropouts = tuple(m for _, m in self.named_modules()
                                   if isinstance(m, Dropout) and m.p > 0)
        seed_dropouts(self._dropouts, seed)

    # -- forward and backward ------------------------------------------------

    def check_input(self, images):
        """Raise a ValueError naming what was expected and what came."""
        check_images(images, "ViT", self.config.in_channels, self.config.image_size)

    def check_gradient(self, dlogits):
        """Raise a ValueError unless dlogits has the last forward's logits' shape (B, K),
        before the backward takes the forward's cache."""
        if self.cache is None:
            return  # _take_cache says so
        logits = (self.cache[0], self.config.num_classes)  # (B, K)
        check_gradient_shape(dlogits, "ViT.backward", "dlogits", "the logits' shape", logits)

    def forward(self, images):
        self.check_input(images)
        x = self.patch_embed.forward(images)  # (B, G^2, D)
        B, _, D = x.shape
        cls = xp.broadcast_to(self.cls_token.data, (B, 1, D))
        x = xp.concatenate([cls, x], axis=1)  # (B, N, D)
        x += self.pos_embed.data
        x = self.pos_drop.forward(x)
        for block in self.blocks:
            x = block.forward(x)  # (B, N, D); the last block under cls pooling: (B, 1, D)
        self.cache = x.shape if self.training else None  # eval: no backward to serve
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
        (cls), or every patch token gets 1/G^2 of it (mean; G^2 = N - 1 patches). The class token
        and the position embedding are added to every image, so their gradients
        are sums over the batch; the patch rows go back through patch_embed."""
        self.check_gradient(dlogits)
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
        """Attention weights of the last forward, one (B, NH, N, N) array per block."""
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

    def summary(self, print_fn=print):
        """Print (and return) the table of ``tinyvit.models.summary.summary``."""
        return summary(self, print_fn)
