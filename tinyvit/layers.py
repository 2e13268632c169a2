"""The layers of a Vision Transformer, each with a hand-written forward and backward.

Contract (CS231n's, as classes):
- ``forward(x)`` computes the output and keeps in ``self.cache`` exactly what
  ``backward`` needs, and nothing more;
- ``backward(dout)`` takes that cache on its first line (each forward serves one
  backward: taking it clears it, so a backward may overwrite what it cached
  instead of allocating), returns ``dx`` and *accumulates* (``+=``) its parameter
  gradients into ``param.grad``; one ``zero_grad()`` resets them. Residual
  branches therefore add up by themselves.

Shape legend: B batch, N tokens (patches, plus 1 for the class token), D embed_dim,
H num_heads, Dh = D // H head dim, C channels, P patch_size, K classes.
"""

import math

from .backend import get_default_dtype, host_rng, on_cpu, to_device, xp


class Parameter:
    """A trainable array and the gradient accumulated into it.

    ``decay`` says whether AdamW's weight decay applies (weights of Linear layers
    only; not biases, norms, cls_token or pos_embed).
    """

    def __init__(self, data, decay=False):
        self.data = data
        self.grad = xp.zeros_like(data)
        self.decay = decay

    @property
    def shape(self):
        return self.data.shape


class Module:
    """Base class: parameter bookkeeping, train/eval mode, and the cache contract.

    Parameters and sub-modules are found by walking the instance's attributes in
    the order they were set (lists of modules are walked as ``name.0``, ``name.1``,
    ...), so a model's parameter names are its attribute paths, as in PyTorch.
    """

    def __init__(self):
        self.training = True
        self.cache = None
        self._flat = None

    def __call__(self, *args):
        return self.forward(*args)

    def forward(self, x):
        raise NotImplementedError

    def backward(self, dout):
        raise NotImplementedError

    def _take_cache(self):
        """The cache of the last forward, cleared here: a backward may overwrite
        it in place. A clear error if there is none (layers keep no cache in
        eval mode: inference needs no backward)."""
        cache, self.cache = self.cache, None
        if cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a forward before it "
                "(each training-mode forward serves one backward; eval mode keeps no cache)"
            )
        return cache

    # -- walking the tree ----------------------------------------------------

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_modules(self, prefix="", _seen=None):
        """Every module once, under its first path (a module shared by two parents
        — norm1 inside a Residual branch and the Block — keeps the Block's name)."""
        _seen = set() if _seen is None else _seen
        if id(self) in _seen:
            return
        _seen.add(id(self))
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, _seen)

    def named_parameters(self):
        for module_name, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Parameter):
                    yield (f"{module_name}.{name}" if module_name else name), value

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self):
        return sum(p.data.size for p in self.parameters())

    # -- modes and gradients -------------------------------------------------

    def train(self, mode=True):
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        if self._flat is not None:
            self._flat[1].fill(0)
        else:
            for p in self.parameters():
                p.grad.fill(0)

    def astype(self, dtype):
        """Convert every parameter (and its gradient) to ``dtype``, in place."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = p.grad.astype(dtype)
        self._flat = None
        return self

    def flat_parameters(self):
        """All parameters as views into one contiguous buffer, gradients into another.

        Returns ``(data, grad, decay)``: 1-D arrays of the total parameter count;
        ``decay`` is 1 where weight decay applies. Optimizers update these in a
        few whole-buffer operations instead of a loop over tensors. Packing
        re-points every ``Parameter.data`` and ``.grad`` to a view of the buffers.
        """
        if self._flat is None:
            params = self.parameters()
            dtype = params[0].data.dtype
            total = sum(p.data.size for p in params)
            data = xp.empty(total, dtype=dtype)
            grad = xp.empty(total, dtype=dtype)
            decay = xp.empty(total, dtype=dtype)
            offset = 0
            for p in params:
                end = offset + p.data.size
                data[offset:end] = p.data.ravel()
                grad[offset:end] = p.grad.ravel()
                decay[offset:end] = 1.0 if p.decay else 0.0
                p.data = data[offset:end].reshape(p.data.shape)
                p.grad = grad[offset:end].reshape(p.grad.shape)
                offset = end
            self._flat = (data, grad, decay)
        return self._flat


def trunc_normal(rng, shape, std=0.02, dtype=None):
    """Normal(0, std) values redrawn until inside [-2 std, 2 std] (timm's init).

    ``rng`` is a host generator (``backend.host_rng``): initial weights are drawn
    on the host, so a seed gives the same model on NumPy and on CuPy.
    """
    dtype = dtype or get_default_dtype()
    values = rng.standard_normal(shape, dtype=dtype)
    flat = values.reshape(-1)
    redraw = (abs(flat) > 2).nonzero()[0]
    while redraw.size:
        flat[redraw] = rng.standard_normal(redraw.size, dtype=dtype)
        redraw = redraw[abs(flat[redraw]) > 2]
    return to_device(values * dtype(std))


def _check_float(x, layer):
    if not xp.issubdtype(x.dtype, xp.floating):
        raise ValueError(f"{layer}: expected a float array, got dtype {x.dtype}")


BLOCK_ELEMENTS = 1 << 16  # 64K floats: few NumPy calls per block, its temporaries still in cache


def row_blocks(a):
    """Slices of rows of a 2-D array, each about BLOCK_ELEMENTS values, for
    elementwise formulas of many steps: on the CPU, running every step on one
    cache-sized block before the next block reads each value from memory once
    instead of once per step. A GPU gets one slice: the whole array.
    """
    rows = a.shape[0]
    step = max(1, BLOCK_ELEMENTS // max(1, a.shape[1])) if on_cpu() else rows
    return [slice(start, start + step) for start in range(0, rows, step)]


def row_sum(a, b=None):
    """sum over the last axis of a (or of a * b), kept as a length-1 axis: (..., D) -> (..., 1).

    einsum does these reductions in one pass, without the temporary a * b, and
    in NumPy runs them 2-3x faster than ``a.sum(axis=-1)``."""
    total = xp.einsum("...i->...", a) if b is None else xp.einsum("...i,...i->...", a, b)
    return total[..., None]


def column_sum(a, b=None):
    """sum of a (or of a * b) over every axis but the last: (..., D) -> (D,).

    On the CPU einsum sums in one pass. On a GPU, CuPy sums down the columns
    with a reduction whose D sums each read a strided column, slowly; there the
    sum is ones^T a instead, a matrix-vector product that reads whole rows."""
    a = a.reshape(-1, a.shape[-1])
    b = None if b is None else b.reshape(-1, b.shape[-1])
    if on_cpu():
        return xp.einsum("ij->j", a) if b is None else xp.einsum("ij,ij->j", a, b)
    if b is not None:
        a = a * b  # (M, D)
    return xp.ones(a.shape[0], dtype=a.dtype) @ a


# ---------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------


class Linear(Module):
    """y = x W^T + b over the last axis; W is stored (out, in) as in PyTorch.

    W starts truncated-normal (std 0.02) from the host generator ``rng`` (fresh
    entropy when None), b at zero.
    """

    def __init__(self, in_features, out_features, bias=True, rng=None, dtype=None):
        super().__init__()
        dtype = dtype or get_default_dtype()
        self.in_features, self.out_features = in_features, out_features
        weight = trunc_normal(rng or host_rng(None), (out_features, in_features), dtype=dtype)
        self.weight = Parameter(weight, decay=True)
        self.bias = Parameter(xp.zeros(out_features, dtype=dtype)) if bias else None

    def forward(self, x):
        # (..., in) -> (M, in) with M the product of the leading axes
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"Linear: expected last axis {self.in_features}, got input of shape {x.shape}"
            )
        x2 = x.reshape(-1, self.in_features)
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
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)  # (M, out)
        self.weight.grad += dout2.T @ x2
        if self.bias is not None:
            self.bias.grad += column_sum(dout2)
        dx = dout2 @ self.weight.data  # (M, in)
        return dx.reshape(*dout.shape[:-1], self.in_features)


# ---------------------------------------------------------------------------
# Patch embedding
# ---------------------------------------------------------------------------


class Patchify(Module):
    """Cut images into non-overlapping P x P patches and flatten each one.

    (B, C, H, W) -> (B, N, C*P*P) with N = (H/P)(W/P), patches in row-major order
    and each patch flattened in (C, P, P) order, so a Linear over it is exactly a
    Conv2d(C, D, kernel=stride=P) whose weight (D, C, P, P) is the Linear weight
    reshaped. A pure reshape/transpose: no arithmetic.
    """

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def forward(self, x):
        B, C, H, W = x.shape
        P = self.patch_size
        if H % P or W % P:
            raise ValueError(
                f"Patchify: image size {H}x{W} is not divisible by patch_size {P}"
            )
        gh, gw = H // P, W // P
        self.cache = x.shape
        x = x.reshape(B, C, gh, P, gw, P)  # (B, C, gh, P, gw, P)
        x = x.transpose(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, P, P)
        return x.reshape(B, gh * gw, C * P * P)  # (B, N, C*P*P)

    def backward(self, dout):
        """Patchify only moves entries, so its backward moves the gradients back:
        the exact inverse reshape/transpose, (B, N, C*P*P) -> (B, C, H, W)."""
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
            p.data[...] = to_device(rng.uniform(-bound, bound, p.shape))
        self.conv_shape = (embed_dim, in_channels, patch_size, patch_size)

    def forward(self, x):
        return self.proj.forward(self.patchify.forward(x))  # (B, N, D)

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
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis.

    eps = 1e-6 as in the ViT paper's reference code. Parameters are named
    ``weight`` (gamma) and ``bias`` (beta) as in PyTorch.
    """

    def __init__(self, dim, eps=1e-6, dtype=None):
        super().__init__()
        dtype = dtype or get_default_dtype()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(xp.ones(dim, dtype=dtype))
        self.bias = Parameter(xp.zeros(dim, dtype=dtype))

    def forward(self, x):
        mean = row_sum(x)
        mean *= 1.0 / self.dim  # (..., 1)
        xhat = x - mean  # (..., D), centered; normalized in place below
        var = row_sum(xhat, xhat)
        var *= 1.0 / self.dim
        var += self.eps
        rstd = xp.sqrt(var, out=var)
        xp.reciprocal(rstd, out=rstd)  # (..., 1)
        xhat *= rstd
        self.cache = (xhat, rstd) if self.training else None
        # training keeps xhat for the backward; in eval y reuses its memory
        y = xhat * self.weight.data if self.training else xp.multiply(xhat, self.weight.data, out=xhat)
        y += self.bias.data
        return y

    def backward(self, dout):
        """With xhat = (x - mu) * rstd, y = gamma * xhat + beta:
            dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy.
        Let g = dy * gamma (the gradient at xhat). xhat depends on x directly and
        through mu and rstd; d mu/dx_i = 1/D and d rstd/dx_i = -rstd^3 (x_i - mu)/D,
        which gives, per row,
            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
        """
        xhat, rstd = self._take_cache()
        D = self.dim
        self.weight.grad += column_sum(dout, xhat)
        self.bias.grad += column_sum(dout)
        g = dout * self.weight.data
        mean_g = row_sum(g)
        mean_g *= 1.0 / D
        mean_gx = row_sum(g, xhat)
        mean_gx *= 1.0 / D
        g -= mean_g
        xhat *= mean_gx  # xhat's last use: scaled in place, no temporary
        g -= xhat
        g *= rstd
        return g


# ---------------------------------------------------------------------------
# GELU
# ---------------------------------------------------------------------------

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SERIES_TERMS = 100  # enough for |z| <= 6 to float64 rounding; erf(6) = 1 - 2e-17
_AS_P = 0.3275911  # Abramowitz & Stegun 7.1.26
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_AS_HALF_A = tuple(0.5 * a for a in _AS_A)


def erf(z):
    """erf(z) in float64, exact to rounding (NumPy has no erf).

    The series with positive terms (Abramowitz & Stegun 7.1.6)
        erf(z) = 2/sqrt(pi) exp(-z^2) sum_n 2^n z^(2n+1) / (1*3*...*(2n+1)),
    each term the previous times 2 z^2 / (2n+1). With no cancellation it is exact
    to rounding; 100 terms reach float64 precision for |z| <= 6, and beyond that
    erf(z) = sign(z) to float64 precision (z is clipped there).
    """
    z = xp.clip(z, -6.0, 6.0)
    two_z2 = 2.0 * z * z
    term, total = z.copy(), z.copy()
    for n in range(1, _SERIES_TERMS):
        term *= two_z2 / (2 * n + 1)
        total += term
    return xp.clip(_TWO_OVER_SQRT_PI * xp.exp(-z * z) * total, -1.0, 1.0)


def normal_cdf_and_pdf(x):
    """(Phi(x), phi(x)): the standard normal CDF and density, which GELU needs.

    phi(x) = exp(-x^2/2) / sqrt(2 pi); Phi(x) = (1 + erf(x / sqrt 2)) / 2. float64
    uses the exact ``erf`` above; float32 (training) uses ``_abs_and_half_minus_tail``,
    then Phi(x) = 1/2 + sign(x) (1/2 - Phi(-|x|)).
    """
    if x.dtype == xp.float64:
        return 0.5 * (1.0 + erf(x * _SQRT_HALF)), xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    a, w, gauss = _abs_and_half_minus_tail(x)
    gauss *= _INV_SQRT_2PI
    return _cdf_from_half_minus_tail(x, w, out=a), gauss


def _abs_and_half_minus_tail(x):
    """(|x|, 1/2 - Phi(-|x|), exp(-x^2/2)) for float32 x, by A&S 7.1.26:
        Phi(-|x|) = erfc(|x|/sqrt2) / 2 = t (a1 + t (a2 + ... + t a5)) exp(-x^2/2) / 2,
        t = 1 / (1 + p |x| / sqrt2),
    absolute error below 1.5e-7 plus float32 rounding (measured below 5e-7; float32
    spacing near 1 is 6e-8). Multiplies and adds only, in place, no branch per
    element; the /2 is folded into the coefficients.
    """
    a = xp.abs(x)
    gauss = a * a
    gauss *= -0.5
    xp.exp(gauss, out=gauss)  # exp(-x^2/2)
    t = a * (_AS_P * _SQRT_HALF)
    t += 1.0
    xp.divide(1.0, t, out=t)  # t = 1/t (in float32 this ran 1.6x faster than xp.reciprocal)
    w = t * _AS_HALF_A[-1]  # Horner: w = t (a1/2 + t (a2/2 + ...))
    for c in reversed(_AS_HALF_A[:-1]):
        w += c
        w *= t
    w *= gauss  # Phi(-|x|)
    xp.subtract(0.5, w, out=w)
    return a, w, gauss


def _cdf_from_half_minus_tail(x, w, out):
    """Phi(x) = 1/2 + sign(x) w, w = 1/2 - Phi(-|x|) (Phi(0) = 1/2 as sign(0) = 0),
    written into ``out`` (which must not be w)."""
    xp.sign(x, out=out)
    out *= w
    out += 0.5
    return out


class GELU(Module):
    """y = x * Phi(x), Phi the standard normal CDF (the exact form, as torch.nn.GELU()).

    ``approximate="tanh"`` gives 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    In training mode the forward also computes the local derivative dy/dx and
    caches only that: one array, the same size as caching x, and the backward
    is one multiply. In eval mode it computes y alone and caches nothing.
    """

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        _check_float(x, "GELU")
        gelu = _gelu_tanh if self.approximate == "tanh" else _gelu_erf
        x2 = x.reshape(-1, x.shape[-1])  # (M, F)
        y = xp.empty_like(x2)
        dydx = xp.empty_like(x2) if self.training else None
        for rows in row_blocks(x2):
            gelu(x2[rows], y[rows], None if dydx is None else dydx[rows])
        self.cache = dydx
        return y.reshape(x.shape)

    def backward(self, dout):
        """Elementwise, so dx = dy * y'(x), with y'(x) cached by the forward:
            exact: y = x Phi(x)  =>  y' = Phi(x) + x phi(x),
                   phi(x) = exp(-x^2/2) / sqrt(2 pi) = Phi'(x);
            tanh:  y = x (1 + t) / 2, t = tanh(u), u = c (x + a x^3)
                   =>  y' = (1 + t)/2 + x (1 - t^2) c (1 + 3 a x^2) / 2.
        """
        dydx = self._take_cache().reshape(dout.shape)
        dydx *= dout  # in place: the cache serves one backward
        return dydx


def _gelu_erf(x, y, dydx):
    """y = x Phi(x) and, unless dydx is None, dydx = Phi(x) + x phi(x), written in place.

    float32 takes fewer passes over memory: with a = |x| and w = 1/2 - Phi(-a),
        x Phi(x) = x/2 + a w     (x >= 0: x - x Phi(-x);  x < 0: x Phi(x))
    and Phi(x) itself is needed only for the derivative.
    """
    if x.dtype == xp.float64:
        cdf, pdf = normal_cdf_and_pdf(x)
        xp.multiply(x, cdf, out=y)
        if dydx is not None:
            pdf *= x
            xp.add(pdf, cdf, out=dydx)
        return
    a, w, gauss = _abs_and_half_minus_tail(x)
    xp.multiply(x, 0.5, out=y)
    a *= w
    y += a
    if dydx is not None:
        _cdf_from_half_minus_tail(x, w, out=dydx)
        gauss *= x
        gauss *= _INV_SQRT_2PI  # x phi(x)
        dydx += gauss


def _gelu_tanh(x, y, dydx):
    """The tanh approximation and its derivative, written in place."""
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    x2 = x * x
    t = xp.tanh(c * x * (1.0 + a * x2))
    xp.multiply(0.5 * x, 1.0 + t, out=y)
    if dydx is not None:
        xp.add(0.5 * (1.0 + t), 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x2), out=dydx)


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


# ---------------------------------------------------------------------------
# Multi-head self-attention
# ---------------------------------------------------------------------------


def softmax(scores):
    """Softmax over the last axis, computed in place in ``scores`` and returned.

    softmax(s) = exp(s - c) / sum exp(s - c) for any constant c per row. The
    usual c, the row's max, keeps every exp in (0, 1]; one global c = max(s) is
    just as safe whenever all scores lie within 80 of it (exp(-80) ~ 2e-35 is
    still a normal float32, so no row underflows to zeros), and on the CPU one
    reduction over the array costs far less than one per short row. The check
    needs the value on the host, so on a GPU the row max is always used.
    """
    top = scores.max()
    if on_cpu() and float(top - scores.min()) < 80.0:
        scores -= top
    else:
        scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= row_sum(scores)
    return scores


class Attention(Module):
    """Multi-head self-attention with a fused qkv projection.

    qkv = x W_qkv^T + b (one Linear(D, 3D), q, k, v stacked in that order), split
    into H heads; A = softmax(q k^T / sqrt(Dh)) per head; attention dropout on A;
    out = A v, heads concatenated, then the output projection. All heads run in
    single batched matmuls over (B, H). With ``keep_attn`` set, ``self.attn`` keeps
    the attention weights of the last forward (before dropout) for inspection;
    off by default, as in inference they would outlive the forward (L * B*H*N^2 values).

    ``queries = Q`` computes the output of the first Q tokens only, (B, N, D) ->
    (B, Q, D): those tokens still attend to all N keys and values, but the other
    rows of q, of the attention weights and of the output are never formed. The
    ViT's last block under class-token pooling uses Q = 1 (only the class token's
    output reaches the head). Keeping the maps for inspection computes all rows.
    """

    def __init__(self, dim, num_heads, qkv_bias=True, attn_dropout=0.0, proj_dropout=0.0, rng=None, dtype=None,
                 queries=None):
        """``rng``: host generator for the initial weights; ``queries``: see above (None: all tokens)."""
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f"Attention: embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias, rng=rng, dtype=dtype)
        self.attn_drop = Dropout(attn_dropout)
        self.proj = Linear(dim, dim, rng=rng, dtype=dtype)
        self.proj_drop = Dropout(proj_dropout)
        self.keep_attn, self.attn = False, None
        self.queries = queries

    def query_rows(self, N):
        """How many of N tokens the forward computes outputs for: ``queries``, or
        all N when it is None or the maps are kept for inspection."""
        return N if self.queries is None or self.keep_attn else min(self.queries, N)

    def forward(self, x):
        B, N, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        Q = self.query_rows(N)
        qkv = self.qkv.forward(x)  # (B, N, 3D)
        q, k, v = qkv.reshape(B, N, 3, H, Dh).transpose(2, 0, 3, 1, 4)  # each (B, H, N, Dh)
        q = q[:, :, :Q] * self.scale  # (B, H, Q, Dh); scaling q (Q*Dh values) is cheaper than the scores (Q*N)
        # k^T copied into its own memory, freed right after the matmul: k is a strided
        # view into qkv, and the batched matmul by a contiguous k^T ran 1.1-1.3x
        # faster, copy included
        attn = softmax(q @ xp.ascontiguousarray(k.transpose(0, 1, 3, 2)))  # (B, H, Q, N)
        self.attn = attn if self.keep_attn else None
        attn_d = self.attn_drop.forward(attn)
        ctx = attn_d @ v  # (B, H, Q, Dh)
        self.cache = (q, k, v, attn, attn_d) if self.training else None
        del qkv, q, k, v, attn, attn_d  # in eval nothing else holds them: freed here, not at return
        ctx = ctx.transpose(0, 2, 1, 3).reshape(B, Q, D)  # (B, Q, H*Dh)
        return self.proj_drop.forward(self.proj.forward(ctx))

    def backward(self, dout):
        """Walks the forward in reverse. With qs = q / sqrt(Dh), S = qs k^T,
        A = softmax(S), Ad = dropout(A), ctx = Ad v:
            dAd = dctx v^T,  dv = Ad^T dctx                      (matmul rule)
            dA = dropout backward of dAd (the same mask)
            softmax, row by row: dA/dS = diag(A) - A A^T, applied without forming it:
                dS = A * (dA - sum_j dA_j A_j)                   (one row reduction)
            dqs = dS k,  dq = dqs / sqrt(Dh),  dk = dS^T qs
        and dq, dk, dv are stacked back into the fused qkv layout. With Q < N
        queries, q has Q rows: the rows of dq past Q are 0 (those q rows were
        never used), while dk and dv still get every token's row.
        """
        q, k, v, attn, attn_d = self._take_cache()
        B, H, Q, Dh = q.shape
        N = k.shape[2]
        dctx = self.proj.backward(self.proj_drop.backward(dout))  # (B, Q, D)
        dctx = dctx.reshape(B, Q, H, Dh).transpose(0, 2, 1, 3)  # (B, H, Q, Dh)
        dqkv = xp.empty((3, B, H, N, Dh), dtype=dout.dtype)
        dattn = dctx @ v.transpose(0, 1, 3, 2)  # (B, H, Q, N)
        xp.matmul(attn_d.transpose(0, 1, 3, 2), dctx, out=dqkv[2])  # dv
        dscores = self.attn_drop.backward(dattn)
        dscores -= row_sum(dscores, attn)
        dscores *= attn
        xp.multiply(dscores @ k, self.scale, out=dqkv[0, :, :, :Q])  # dq
        dqkv[0, :, :, Q:] = 0
        xp.matmul(dscores.transpose(0, 1, 3, 2), q, out=dqkv[1])  # dk
        dqkv = dqkv.transpose(1, 3, 0, 2, 4).reshape(B, N, 3 * H * Dh)  # (B, N, 3D)
        return self.qkv.backward(dqkv)


# ---------------------------------------------------------------------------
# MLP, residual, encoder block
# ---------------------------------------------------------------------------


class Sequential(Module):
    """Layers applied in order; backward applies their backwards in reverse."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dout):
        for layer in reversed(self.layers):
            dout = layer.backward(dout)
        return dout


class MLP(Sequential):
    """fc1 (D -> mlp_ratio*D), GELU, dropout, fc2 (-> D), dropout."""

    def __init__(self, dim, hidden_dim, dropout=0.0, rng=None, dtype=None):
        self.fc1 = Linear(dim, hidden_dim, rng=rng, dtype=dtype)
        self.act = GELU()
        self.drop1 = Dropout(dropout)
        self.fc2 = Linear(hidden_dim, dim, rng=rng, dtype=dtype)
        self.drop2 = Dropout(dropout)
        super().__init__(self.fc1, self.act, self.drop1, self.fc2, self.drop2)


class Residual(Module):
    """y = x + f(x) for a branch f of layers, over (B, N, D) tokens. A branch that
    keeps only the first Q tokens (an Attention with ``queries``) gives
    y = x[:, :Q] + f(x), of shape (B, Q, D)."""

    def __init__(self, *branch):
        super().__init__()
        self.branch = Sequential(*branch)

    def forward(self, x):
        out = self.branch.forward(x)  # (B, Q, D), Q = N unless the branch keeps fewer tokens
        self.cache = True
        return x[:, : out.shape[1]] + out

    def backward(self, dout):
        """dy/dx = I + df/dx, so dx = dout + f's backward of dout: the gradient
        flows through the skip connection unchanged and adds to the branch's.
        With Q < N tokens kept, the skip carries dout to the first Q rows only."""
        self._take_cache()
        dx = self.branch.backward(dout)  # (B, N, D)
        if dx.shape == dout.shape:
            return dout + dx
        dx[:, : dout.shape[1]] += dout  # dx is the branch's new array, larger than dout
        return dx


class Block(Module):
    """Pre-norm Transformer encoder block (ViT, eqs. 2-3):
        x = x + Attention(LayerNorm(x));  x = x + MLP(LayerNorm(x)).
    With ``queries = Q`` (see Attention) the block outputs the first Q tokens
    only: (B, N, D) -> (B, Q, D), and its MLP runs on those Q tokens.
    """

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=True, dropout=0.0, attn_dropout=0.0, rng=None, dtype=None,
                 queries=None):
        super().__init__()
        self.norm1 = LayerNorm(dim, dtype=dtype)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_dropout, dropout, rng=rng, dtype=dtype, queries=queries)
        self.norm2 = LayerNorm(dim, dtype=dtype)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout, rng=rng, dtype=dtype)
        self.residuals = [Residual(self.norm1, self.attn), Residual(self.norm2, self.mlp)]

    def forward(self, x):
        for residual in self.residuals:
            x = residual.forward(x)  # (B, N, D), or (B, Q, D) after the attention with queries = Q
        return x

    def backward(self, dout):
        for residual in reversed(self.residuals):
            dout = residual.backward(dout)
        return dout
