"""The layers of a Vision Transformer, each in its plainest correct form: the
reference tier.

Each layer is a class with ``forward`` and ``backward`` (the contract is in
``tinyvit/nn/module.py``); each backward walks its forward in reverse and derives
its math in its docstring. This is the code to read, and the code that runs in
a model built from it: the fast tier (``tinyvit/fast/``) computes the same
functions faster, is tested equal to this one, and runs only in a model given
to ``tinyvit.fast.accelerate``.

Shape legend (the whole legend heads ``docs/backprop.md``): B batch, C channels,
H x W an image's height and width, P patch_size, G patches per side (G^2 patches;
Patchify alone takes gh = H/P rows by gw = W/P columns of them), N = G^2 + 1
tokens (the patches and the class token), D embed_dim, NH num_heads,
Dh = D // NH head dim, Q the query rows of attention (N, or 1 in ClassAttention),
Dm the MLP's hidden width, R representation_size, M the rows a Linear sees (the
product of its input's leading axes).
"""

import math

from ..backend import float_dtype, host_rng, xp
from ..backend import rng as device_rng
from ..checks import check_array, check_float, check_gradient_shape
from .functional import (
    column_sum,
    normal_cdf,
    normal_pdf,
    softmax,
    softmax_backward,
    standardize,
    standardize_backward,
)
from .init import trunc_normal, uniform
from .module import Module, Parameter, Sequential

# ---------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------


class Linear(Module):
    """y = x W^T + b over the last axis; W is stored (out, in) as in PyTorch.

    W starts truncated-normal (std 0.02) from the host generator ``rng`` (fresh
    entropy when None), b at zero.
    """

    column_sum = staticmethod(column_sum)  # the bias gradient's sum over rows

    def __init__(self, in_features, out_features, bias=True, rng=None, dtype=None):
        super().__init__()
        dtype = float_dtype(dtype)
        self.in_features, self.out_features = in_features, out_features
        weight = trunc_normal(rng or host_rng(None), (out_features, in_features), dtype=dtype)
        self.weight = Parameter(weight, decay=True)
        self.bias = Parameter(xp.zeros(out_features, dtype=dtype)) if bias else None

    def check_input(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Linear: expected last axis {self.in_features}, got input of shape {x.shape}"
            )

    def check_gradient(self, dout):
        """A ValueError unless dout is the output's shape, (..., out) over the input's M
        rows, before the backward takes the cache."""
        if self.cache is None:
            return  # _take_cache says so
        rows = len(self.cache)  # M
        check_array(dout, "Linear.backward", f"dout, an array of shape (..., {self.out_features})")
        if dout.shape[-1:] != (self.out_features,) or dout.size != rows * self.out_features:
            raise ValueError(f"Linear.backward: expected dout of the output's shape, (..., "
                             f"{self.out_features}) over the input's {rows} rows, got "
                             f"{tuple(dout.shape)}")

    def forward(self, x):
        self.check_input(x)
        x2 = x.reshape(-1, self.in_features)  # (M, in), M the product of the leading axes
        y = x2 @ self.weight.data.T  # (M, out)
        if self.bias is not None:
            y += self.bias.data
        self.cache = x2 if self.training else None
        return y.reshape(*x.shape[:-1], self.out_features)

    def backward(self, dout):
        """y_mj = sum_i x_mi W_ji + b_j, so by the chain rule
            dW_ji = sum_m dy_mj x_mi   -> dW = dy^T x        (out, in)
            db_j  = sum_m dy_mj        -> db = dy summed over rows
            dx_mi = sum_j dy_mj W_ji   -> dx = dy W           (M, in)
        """
        self.check_gradient(dout)
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)  # (M, out)
        self.weight.grad += dout2.T @ x2
        if self.bias is not None:
            self.bias.grad += self.column_sum(dout2)
        dx = dout2 @ self.weight.data  # (M, in)
        return dx.reshape(*dout.shape[:-1], self.in_features)


# ---------------------------------------------------------------------------
# Patch embedding
# ---------------------------------------------------------------------------


class Patchify(Module):
    """Cut images into non-overlapping P x P patches and flatten each one.

    (B, C, H, W) -> (B, gh*gw, C*P*P), gh = H/P rows and gw = W/P columns of
    patches (G^2 for a square image), in row-major order, each patch flattened in
    (C, P, P) order, so a Linear over it is exactly a Conv2d(C, D, kernel=stride=P)
    whose weight (D, C, P, P) is the Linear weight reshaped. A pure
    reshape/transpose: no arithmetic.
    """

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def forward(self, x):
        B, C, H, W = x.shape
        P = self.patch_size
        if H % P or W % P:
            raise ValueError(f"Patchify: image size {H}x{W} is not divisible by patch_size {P}")
        gh, gw = H // P, W // P
        self.cache = x.shape
        x = x.reshape(B, C, gh, P, gw, P)  # (B, C, gh, P, gw, P)
        x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, P, P)
        return x.reshape(B, gh * gw, C * P * P)  # (B, gh*gw, C*P*P)

    def backward(self, dout):
        """Patchify only moves entries, so its backward moves the gradients back:
        the exact inverse reshape/transpose, (B, gh*gw, C*P*P) -> (B, C, H, W)."""
        B, C, H, W = self._take_cache()
        P = self.patch_size
        gh, gw = H // P, W // P
        dx = dout.reshape(B, gh, gw, C, P, P)
        dx = dx.transpose(0, 3, 1, 4, 2, 5)  # (B, C, gh, P, gw, P)
        return dx.reshape(B, C, H, W)


class PatchEmbed(Module):
    """Patchify + Linear(C*P*P, D): a Conv2d with kernel = stride = patch_size.

    Initialized as PyTorch initializes a Conv2d (timm keeps that for the patch
    embedding): weight and bias uniform in +-1/sqrt(C*P*P).
    """

    def __init__(self, patch_size, in_channels, embed_dim, rng=None, dtype=None):
        super().__init__()
        rng = rng or host_rng(None)
        fan_in = in_channels * patch_size**2
        self.patchify = Patchify(patch_size)
        self.proj = Linear(fan_in, embed_dim, rng=rng, dtype=dtype)
        bound = 1.0 / math.sqrt(fan_in)
        for p in (self.proj.weight, self.proj.bias):
            p.data[...] = uniform(rng, bound, p.shape, p.data.dtype)
        self.conv_shape = (embed_dim, in_channels, patch_size, patch_size)

    def forward(self, x):
        return self.proj.forward(self.patchify.forward(x))  # (B, gh*gw, D)

    def backward(self, dout):
        return self.patchify.backward(self.proj.backward(dout))

    def weight_to_conv(self, weight):
        """Linear layout (D, C*P*P) -> Conv2d layout (D, C, P, P)."""
        return weight.reshape(self.conv_shape)

    def weight_from_conv(self, weight):
        """Conv2d layout (D, C, P, P) -> Linear layout (D, C*P*P)."""
        return weight.reshape(self.conv_shape[0], -1)


# ---------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------


class LayerNorm(Module):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis.

    eps = 1e-6 as in the ViT paper's reference code. Parameters are named
    ``weight`` (gamma) and ``bias`` (beta) as in PyTorch. The cache is the
    normalized input xhat and the reciprocal standard deviation rstd: what the
    backward reads, no more.
    """

    column_sum = staticmethod(column_sum)  # gamma's and beta's gradients: sums over rows

    def __init__(self, dim, eps=1e-6, dtype=None):
        super().__init__()
        dtype = float_dtype(dtype)
        self.dim, self.eps = dim, eps
        self.weight = Parameter(xp.ones(dim, dtype=dtype))
        self.bias = Parameter(xp.zeros(dim, dtype=dtype))

    def check_input(self, x):
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"LayerNorm: expected last axis {self.dim}, got input of shape "
                             f"{x.shape}")

    def check_gradient(self, dout):
        """A ValueError unless dout is the output's shape, before the backward takes the
        cache (a smaller one would broadcast against xhat into a wrong gradient)."""
        if self.cache is None:
            return  # _take_cache says so
        shape = self.cache[0].shape  # xhat's, the output's
        check_gradient_shape(dout, "LayerNorm.backward", "dout", "the output's shape", shape)

    def forward(self, x):
        self.check_input(x)
        xhat, rstd, _, _ = standardize(x, -1, self.eps)  # (..., D) and (..., 1)
        self.cache = (xhat, rstd) if self.training else None
        return self.weight.data * xhat + self.bias.data

    def backward(self, dout):
        """With xhat = (x - mean) * rstd and y = gamma * xhat + beta:
            dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy.
        Let g = dy * gamma, the gradient at xhat. xhat depends on x_i directly and
        through mean and rstd: d mean/dx_i = 1/D, d rstd/dx_i = -rstd^3 (x_i - mean)/D.
        Summing the three paths, per row,
            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
        """
        self.check_gradient(dout)
        xhat, rstd = self._take_cache()
        self.weight.grad += self.column_sum(dout, xhat)
        self.bias.grad += self.column_sum(dout)
        g = dout * self.weight.data  # (..., D)
        return standardize_backward(g, xhat, rstd, -1)


# ---------------------------------------------------------------------------
# GELU
# ---------------------------------------------------------------------------

TANH_C, TANH_A = math.sqrt(2.0 / math.pi), 0.044715  # GELU's tanh form: c and a


class GELU(Module):
    """y = x * Phi(x), Phi the standard normal CDF (the exact form, as torch.nn.GELU()).

    ``approximate="tanh"`` gives y = x (1 + tanh(c (x + a x^3))) / 2 with
    c = sqrt(2/pi), a = 0.044715. The cache is the input x.
    """

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        check_float(x, "GELU")
        self.cache = x if self.training else None
        if self.approximate == "tanh":
            return 0.5 * x * (1.0 + xp.tanh(TANH_C * (x + TANH_A * x**3)))
        return x * normal_cdf(x)

    def backward(self, dout):
        """Elementwise, so dx = dy * y'(x):
            exact: y = x Phi(x)  =>  y' = Phi(x) + x phi(x),  phi = Phi' the density;
            tanh:  y = x (1 + t) / 2, t = tanh(u), u = c (x + a x^3)
                   =>  y' = (1 + t) / 2 + x (1 - t^2) c (1 + 3 a x^2) / 2.
        """
        x = self._take_cache()
        if self.approximate == "tanh":
            t = xp.tanh(TANH_C * (x + TANH_A * x**3))
            du_dx = TANH_C * (1.0 + 3.0 * TANH_A * x * x)
            return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx)
        return dout * (normal_cdf(x) + x * normal_pdf(x))


class Tanh(Module):
    """y = tanh(x); the cache is y, since y' = 1 - tanh(x)^2 = 1 - y^2."""

    def forward(self, x):
        y = xp.tanh(x)
        self.cache = y if self.training else None
        return y

    def backward(self, dout):
        y = self._take_cache()
        return dout * (1.0 - y * y)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


class Dropout(Module):
    """Inverted dropout: in training, zero each entry with probability p and scale
    the rest by 1/(1-p), so eval mode is the identity. The mask comes from an
    explicit generator on the active backend (``backend.rng``), never global
    random state: pass ``rng=`` here, or let the model give one generator to all
    its Dropout layers (``ViT.seed_dropout``).
    """

    generator = staticmethod(device_rng)  # what seed_dropout makes for it from a seed

    def __init__(self, p=0.0, rng=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p, self.rng = p, rng

    def forward(self, x):
        if not self.training or self.p == 0.0:
            self.cache = 1.0
            return x
        if self.rng is None:
            raise RuntimeError(
                f"Dropout(p={self.p}) has no random generator: pass rng=backend.rng(seed) "
                "or call model.seed_dropout(seed)"
            )
        keep = self.rng.random(x.shape, dtype=x.dtype) >= self.p
        mask = keep * x.dtype.type(1.0 / (1.0 - self.p))  # 0 or 1/(1-p)
        self.cache = mask
        return x * mask

    def backward(self, dout):
        """y = x * mask, mask fixed by the forward, so dx = dy * mask (the same
        mask, reused: never redrawn)."""
        mask = self._take_cache()
        return dout if isinstance(mask, float) else dout * mask


def seed_dropouts(dropouts, seed):
    """Give each Dropout layer of ``dropouts`` the generator its class makes from
    ``seed`` (an int or a tuple such as (seed, step); ``Dropout.generator``), one
    shared by the layers of each kind."""
    generators = {}
    for layer in dropouts:
        make = layer.generator
        if make not in generators:
            generators[make] = make(seed)
        layer.rng = generators[make]


# ---------------------------------------------------------------------------
# Multi-head self-attention
# ---------------------------------------------------------------------------


def split_heads(qkv, num_heads):
    """(B, N, 3D) -> q, k, v, each (B, NH, N, Dh): the fused projection's output
    stacked q, k, v along the last axis, each split into NH heads."""
    B, N, D3 = qkv.shape
    Dh = D3 // (3 * num_heads)
    return qkv.reshape(B, N, 3, num_heads, Dh).transpose(2, 0, 3, 1, 4)


def merge_heads(ctx):
    """(B, NH, N, Dh) -> (B, N, NH*Dh): the heads side by side again."""
    B, NH, N, Dh = ctx.shape
    return ctx.transpose(0, 2, 1, 3).reshape(B, N, NH * Dh)


class Attention(Module):
    """Multi-head self-attention with a fused qkv projection.

    qkv = x W_qkv^T + b (one Linear(D, 3D), q, k, v stacked in that order), split
    into NH heads; A = softmax(q k^T / sqrt(Dh)) per head; attention dropout on A;
    ctx = A v, heads concatenated, then the output projection. All heads run in
    single batched matmuls over (B, NH). With ``keep_attn`` set, ``self.attn`` keeps
    the attention weights of the last forward (before dropout) for inspection;
    off by default, as in inference they would outlive the forward (B*NH*N^2 values
    per block).
    """

    def __init__(self, dim, num_heads, qkv_bias=True, attn_dropout=0.0, proj_dropout=0.0,
                 rng=None, dtype=None):
        """``rng``: host generator for the initial weights."""
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(
                f"Attention: embed_dim {dim} is not divisible by num_heads {num_heads}"
            )
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias, rng=rng, dtype=dtype)
        self.attn_drop = Dropout(attn_dropout)
        self.proj = Linear(dim, dim, rng=rng, dtype=dtype)
        self.proj_drop = Dropout(proj_dropout)
        self.keep_attn, self.attn = False, None

    def check_input(self, x):
        D = self.num_heads * self.head_dim
        if x.ndim != 3 or x.shape[-1] != D:
            raise ValueError(f"{type(self).__name__}: expected input (B, N, {D}), got shape "
                             f"{x.shape}")

    def forward(self, x):
        self.check_input(x)
        q, k, v = split_heads(self.qkv.forward(x), self.num_heads)  # each (B, NH, N, Dh)
        ctx = self.attend(q, k, v)  # (B, NH, N, Dh)
        return self.proj_drop.forward(self.proj.forward(merge_heads(ctx)))  # (B, N, D)

    def backward(self, dout):
        dctx = self.proj.backward(self.proj_drop.backward(dout))  # (B, N, D)
        dq, dk, dv = self.attend_backward(split_heads_grad(dctx, self.num_heads))
        return self.qkv.backward(merge_qkv_grads(dq, dk, dv))  # (B, N, D)

    def attend(self, q, k, v):
        """The heads' attention: q (B, NH, Q, Dh) attends to k, v (B, NH, N, Dh).
            S = q k^T / sqrt(Dh)   (B, NH, Q, N)
            A = softmax(S)         over the keys, row by row
            Ad = dropout(A)
            ctx = Ad v             (B, NH, Q, Dh)
        """
        A = softmax(q @ k.transpose(0, 1, 3, 2) * self.scale)  # (B, NH, Q, N)
        self.attn = A if self.keep_attn else None
        Ad = self.attn_drop.forward(A)
        self.cache = (q, k, v, A, Ad) if self.training else None
        return Ad @ v  # (B, NH, Q, Dh)

    def attend_backward(self, dctx):
        """``attend`` in reverse:
            dAd = dctx v^T,  dv = Ad^T dctx                       (matmul rule)
            dA = dropout's backward of dAd (the same mask)
            softmax, row by row: dA/dS = diag(A) - A A^T, applied without forming it:
                dS = A * (dA - sum_j dA_j A_j)
            dq = dS k / sqrt(Dh),  dk = dS^T q / sqrt(Dh)
        """
        q, k, v, A, Ad = self._take_cache()
        dAd = dctx @ v.transpose(0, 1, 3, 2)  # (B, NH, Q, N)
        dv = Ad.transpose(0, 1, 3, 2) @ dctx  # (B, NH, N, Dh)
        dA = self.attn_drop.backward(dAd)
        dS = softmax_backward(A, dA)  # (B, NH, Q, N)
        dq = dS @ k * self.scale  # (B, NH, Q, Dh)
        dk = dS.transpose(0, 1, 3, 2) @ q * self.scale  # (B, NH, N, Dh)
        return dq, dk, dv


def split_heads_grad(dctx, num_heads):
    """The inverse of ``merge_heads``: (B, N, NH*Dh) -> (B, NH, N, Dh)."""
    B, N, D = dctx.shape
    return dctx.reshape(B, N, num_heads, D // num_heads).transpose(0, 2, 1, 3)


def merge_qkv_grads(dq, dk, dv):
    """The inverse of ``split_heads``: dq, dk, dv (B, NH, N, Dh) -> dqkv (B, N, 3D)."""
    B, NH, N, Dh = dk.shape
    return xp.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, N, 3 * NH * Dh)


class ClassAttention(Attention):
    """Attention that computes the output of the class token (token 0) alone:
    (B, N, D) -> (B, 1, D). Its query attends to all N keys and values, as in
    ``Attention``; the other tokens' queries, attention rows and outputs are never
    formed (CaiT's "class attention"). The ViT uses it in its last block under
    class-token pooling, where only the class token's output reaches the head.

    With ``keep_attn`` set, ``self.attn`` holds every token's attention weights
    (B, NH, N, N), computed for inspection; the output is still the class token's.
    """

    def forward(self, x):
        self.check_input(x)
        q, k, v = split_heads(self.qkv.forward(x), self.num_heads)  # each (B, NH, N, Dh)
        ctx = self.attend(q[:, :, :1], k, v)  # (B, NH, 1, Dh)
        if self.keep_attn:
            self.attn = softmax(q @ k.transpose(0, 1, 3, 2) * self.scale)  # (B, NH, N, N)
        return self.proj_drop.forward(self.proj.forward(merge_heads(ctx)))  # (B, 1, D)

    def backward(self, dout):
        """As ``Attention.backward``; the queries of tokens 1..N-1 were not used, so
        their rows of dq are 0, while every token's k and v rows get a gradient."""
        dctx = self.proj.backward(self.proj_drop.backward(dout))  # (B, 1, D)
        dq_cls, dk, dv = self.attend_backward(split_heads_grad(dctx, self.num_heads))
        dq = xp.zeros_like(dk)  # (B, NH, N, Dh)
        dq[:, :, :1] = dq_cls
        return self.qkv.backward(merge_qkv_grads(dq, dk, dv))  # (B, N, D)


# ---------------------------------------------------------------------------
# MLP, residual, encoder block
# ---------------------------------------------------------------------------


class MLP(Sequential):
    """fc1 (D -> Dm, the hidden width), GELU, dropout, fc2 (Dm -> D), dropout."""

    def __init__(self, dim, hidden_dim, dropout=0.0, rng=None, dtype=None):
        self.fc1 = Linear(dim, hidden_dim, rng=rng, dtype=dtype)
        self.act = GELU()
        self.drop1 = Dropout(dropout)
        self.fc2 = Linear(hidden_dim, dim, rng=rng, dtype=dtype)
        self.drop2 = Dropout(dropout)
        super().__init__(self.fc1, self.act, self.drop1, self.fc2, self.drop2)


class Residual(Module):
    """y = x + f(x) for a branch f of layers."""

    def __init__(self, *branch):
        super().__init__()
        self.branch = Sequential(*branch)

    def forward(self, x):
        return x + self.branch.forward(x)

    def backward(self, dout):
        """dy/dx = I + df/dx, so dx = dout + f's backward of dout: the gradient
        flows through the skip connection unchanged and adds to the branch's."""
        return dout + self.branch.backward(dout)


class Block(Module):
    """Pre-norm Transformer encoder block (ViT, eqs. 2-3):
        x = x + Attention(LayerNorm(x));  x = x + MLP(LayerNorm(x)).
    """

    attention = Attention  # the class of its attention layer

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, dropout=0.0, attn_dropout=0.0,
                 rng=None, dtype=None, eps=1e-6):
        super().__init__()
        self.norm1 = LayerNorm(dim, eps, dtype=dtype)
        self.attn = self.attention(dim, num_heads, qkv_bias, attn_dropout, dropout,
                                   rng=rng, dtype=dtype)
        self.norm2 = LayerNorm(dim, eps, dtype=dtype)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout, rng=rng, dtype=dtype)
        self.attn_residual = Residual(self.norm1, self.attn)
        self.mlp_residual = Residual(self.norm2, self.mlp)

    def forward(self, x):
        return self.mlp_residual.forward(self.attn_residual.forward(x))  # (B, N, D)

    def backward(self, dout):
        return self.attn_residual.backward(self.mlp_residual.backward(dout))


class ClassAttentionBlock(Block):
    """The encoder block for the class token alone: (B, N, D) -> (B, 1, D).

        cls = x_0 + ClassAttention(LayerNorm(x));  cls = cls + MLP(LayerNorm(cls))

    equals row 0 of ``Block``'s output, with the same parameters and names; the
    other N - 1 rows are never formed. The ViT's last block under class-token
    pooling, whose other rows would never reach the head.
    """

    attention = ClassAttention

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.attn_residual  # its skip adds all N tokens; forward writes out token 0's

    def forward(self, x):
        cls = x[:, :1] + self.attn.forward(self.norm1.forward(x))  # (B, 1, D)
        return self.mlp_residual.forward(cls)  # (B, 1, D)

    def backward(self, dout):
        """The skip carries dcls to token 0 alone; through the keys and values the
        attention gives every token of x its gradient."""
        dcls = self.mlp_residual.backward(dout)  # (B, 1, D)
        dx = self.norm1.backward(self.attn.backward(dcls))  # (B, N, D)
        dx[:, :1] += dcls
        return dx


class PreLogits(Sequential):
    """The representation layer of the ViT paper's pre-training head:
    tanh(fc(x)), fc a Linear(D, R) (timm's ``pre_logits.fc``)."""

    def __init__(self, dim, representation_size, rng=None, dtype=None):
        self.fc = Linear(dim, representation_size, rng=rng, dtype=dtype)
        self.act = Tanh()
        super().__init__(self.fc, self.act)
