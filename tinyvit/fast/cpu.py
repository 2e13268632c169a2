"""The fast tier on the CPU: NumPy kernels of the layers whose elementwise work
dominates a step once the matmuls run at OpenBLAS's speed.

Each class subclasses its reference layer (``tinyvit/nn/layers.py``,
``tinyvit/nn/conv.py``), keeps its parameters and contract, and overrides only
what it does faster: ``forward`` and ``backward``, the two methods that hold
attention's softmax, or, for Linear, the sum over rows. What makes each faster:

- all: fewer passes over memory. NumPy runs one pass per operation, so a formula
  of many steps reads and writes its arrays once per step; in-place operations
  (``out=``, ``+=``) save the allocation and page faults of every temporary.
- ``row_sum`` and ``column_sum``: einsum reduces in one pass, without the
  temporary of a product, faster than ``.sum(axis=-1)``.
- ``GELU``: float32 by Abramowitz & Stegun 7.1.26 (multiplies and adds, no erf),
  the derivative computed in the forward and cached instead of x, in row blocks
  of 64K values whose temporaries stay in the CPU's cache.
- ``LayerNorm``: normalized in place; the backward overwrites its cache.
- ``Attention``: q scaled instead of the scores, a contiguous copy of k^T for the
  batched matmul, softmax shifted by one global max instead of a max per row.
- ``Conv2d``: the im2col columns formed a block of images at a time, each block
  multiplied while it is still in the cache, channels-last where that makes
  their rows longer.

``tests/test_fast.py`` checks every class here against its reference;
docs/performance.md has what each change measured.

Shapes as in the reference layers (the legend heads ``docs/backprop.md``): M rows,
NH heads, Q query rows, Dh head dim, F filters, U = C*kh*kw the values of one
im2col column, and B' the images of one block of a Conv2d's batch.
"""


from ..backend import xp
from ..checks import check_float, check_images
from ..nn import conv, layers
from ..nn.functional import INV_SQRT_2PI, SQRT_HALF, normal_cdf, normal_pdf, standardize_backward


class FastKernel:
    """The mark of a layer of the fast tier (``Module.tier``), mixed into every kernel."""

    tier = "fast"


def row_sum(a, b=None):
    """sum over the last axis of a (or of a * b), kept as a length-1 axis: (..., D) -> (..., 1)."""
    total = xp.einsum("...i->...", a) if b is None else xp.einsum("...i,...i->...", a, b)
    return total[..., None]


def column_sum(a, b=None):
    """sum of a (or of a * b) over every axis but the last: (..., D) -> (D,)."""
    a = a.reshape(-1, a.shape[-1])
    if b is None:
        return xp.einsum("ij->j", a)
    return xp.einsum("ij,ij->j", a, b.reshape(-1, b.shape[-1]))


# ---------------------------------------------------------------------------
# Linear, LayerNorm
# ---------------------------------------------------------------------------


class Linear(FastKernel, layers.Linear):
    """The reference Linear with its bias gradient summed by einsum."""

    column_sum = staticmethod(column_sum)


class LayerNorm(FastKernel, layers.LayerNorm):
    """The reference LayerNorm in place: xhat is formed in the centered copy of x,
    and the backward overwrites the cached xhat (each forward serves one backward)."""

    column_sum = staticmethod(column_sum)

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
        y = xp.multiply(xhat, self.weight.data, out=None if self.training else xhat)
        y += self.bias.data
        return y

    def backward(self, dout):
        xhat, rstd = self._take_cache()
        self.weight.grad += self.column_sum(dout, xhat)
        self.bias.grad += self.column_sum(dout)
        g = dout * self.weight.data
        mean_g = row_sum(g)
        mean_g *= 1.0 / self.dim
        mean_gx = row_sum(g, xhat)
        mean_gx *= 1.0 / self.dim
        g -= mean_g
        xhat *= mean_gx  # xhat's last use: scaled in place, no temporary
        g -= xhat
        g *= rstd
        return g


# ---------------------------------------------------------------------------
# GELU
# ---------------------------------------------------------------------------

_AS_P = 0.3275911  # Abramowitz & Stegun 7.1.26
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_AS_HALF_A = tuple(0.5 * a for a in _AS_A)


def row_blocks(a, block_elements):
    """Slices of rows of a 2-D array, each about ``block_elements`` values (None:
    one slice of every row). For elementwise formulas of many steps: running
    every step on one cache-sized block before the next block reads each value
    from memory once instead of once per step.
    """
    rows = a.shape[0]
    step = rows if block_elements is None else max(1, block_elements // max(1, a.shape[1]))
    return [slice(start, start + step) for start in range(0, rows, step)]


class GELU(FastKernel, layers.GELU):
    """y = x Phi(x) and its derivative in one forward, row block by row block.

    The forward also computes dy/dx in training mode and caches only that (one
    array, the size of x), so the backward is one multiply; in eval mode it
    computes y alone. float32 uses A&S 7.1.26 for Phi (absolute error below
    1.5e-7 plus rounding), float64 the exact erf.
    """

    block_elements = 1 << 16  # 64K values: few NumPy calls per block, its temporaries in cache

    def forward(self, x):
        check_float(x, "GELU")
        gelu = _gelu_tanh if self.approximate == "tanh" else _gelu_erf
        x2 = x.reshape(-1, x.shape[-1])  # (M, last axis)
        y = xp.empty_like(x2)
        dydx = xp.empty_like(x2) if self.training else None
        for rows in row_blocks(x2, self.block_elements):
            gelu(x2[rows], y[rows], None if dydx is None else dydx[rows])
        self.cache = dydx
        return y.reshape(x.shape)

    def backward(self, dout):
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
        cdf = normal_cdf(x)
        xp.multiply(x, cdf, out=y)
        if dydx is not None:
            xp.add(cdf, x * normal_pdf(x), out=dydx)
        return
    a, w, gauss = _abs_and_half_minus_tail(x)
    xp.multiply(x, 0.5, out=y)
    a *= w
    y += a
    if dydx is not None:
        _cdf_from_half_minus_tail(x, w, out=dydx)
        gauss *= x
        gauss *= INV_SQRT_2PI  # x phi(x)
        dydx += gauss


def _abs_and_half_minus_tail(x):
    """(|x|, 1/2 - Phi(-|x|), exp(-x^2/2)) for float32 x, by A&S 7.1.26:
        Phi(-|x|) = erfc(|x|/sqrt2) / 2 = t (a1 + t (a2 + ... + t a5)) exp(-x^2/2) / 2,
        t = 1 / (1 + p |x| / sqrt2),
    absolute error below 1.5e-7 plus float32 rounding (float32 spacing near 1 is
    6e-8; tests/test_fast.py holds the whole GELU within 5e-7). Multiplies and adds
    only, in place, no branch per element; the /2 is folded into the coefficients.
    """
    a = xp.abs(x)
    gauss = a * a
    gauss *= -0.5
    xp.exp(gauss, out=gauss)  # exp(-x^2/2)
    t = a * (_AS_P * SQRT_HALF)
    t += 1.0
    xp.divide(1.0, t, out=t)  # t = 1/t (in float32, faster than xp.reciprocal)
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


def _gelu_tanh(x, y, dydx):
    """The tanh approximation and its derivative, written in place."""
    c, a = layers.TANH_C, layers.TANH_A
    x2 = x * x
    t = xp.tanh(c * x * (1.0 + a * x2))
    xp.multiply(0.5 * x, 1.0 + t, out=y)
    if dydx is not None:
        xp.add(0.5 * (1.0 + t), 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x2), out=dydx)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def softmax_inplace(scores):
    """Softmax over the last axis, computed in place in ``scores`` and returned.

    softmax(s) = exp(s - c) / sum exp(s - c) for any constant c per row. The
    reference's c, the row's max, keeps every exp in (0, 1]; one global c = max(s)
    is just as safe whenever all scores lie within 80 of it (exp(-80) ~ 2e-35 is
    still a normal float32, so no row underflows to zeros), and one reduction over
    the array costs far less than one per short row. Otherwise the row max is used.
    """
    top = scores.max()
    if float(top - scores.min()) < 80.0:
        scores -= top
    else:
        scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= row_sum(scores)
    return scores


class FastAttentionCore(FastKernel):
    """``attend`` and ``attend_backward`` of the reference attention, faster: q is
    scaled by 1/sqrt(Dh) before the matmul (Q*Dh values, not the Q*N scores), k^T
    is copied into its own memory (the batched matmul by a contiguous k^T is
    faster, copy included), the softmax is ``softmax_inplace``, and the backward
    works in place."""

    def attend(self, q, k, v):
        qs = q * self.scale  # (B, NH, Q, Dh)
        A = softmax_inplace(qs @ xp.ascontiguousarray(k.transpose(0, 1, 3, 2)))  # (B, NH, Q, N)
        self.attn = A if self.keep_attn else None
        Ad = self.attn_drop.forward(A)
        self.cache = (qs, k, v, A, Ad) if self.training else None
        return Ad @ v  # (B, NH, Q, Dh)

    def attend_backward(self, dctx):
        qs, k, v, A, Ad = self._take_cache()
        dAd = dctx @ v.transpose(0, 1, 3, 2)  # (B, NH, Q, N)
        dv = Ad.transpose(0, 1, 3, 2) @ dctx  # (B, NH, N, Dh)
        dS = self.attn_drop.backward(dAd)
        dS -= row_sum(dS, A)
        dS *= A
        dq = dS @ k  # (B, NH, Q, Dh)
        dq *= self.scale
        dk = dS.transpose(0, 1, 3, 2) @ qs  # (B, NH, N, Dh): qs = q / sqrt(Dh) already
        return dq, dk, dv


class Attention(FastAttentionCore, layers.Attention):
    pass


class ClassAttention(FastAttentionCore, layers.ClassAttention):
    pass


# ---------------------------------------------------------------------------
# Conv2d
# ---------------------------------------------------------------------------


class Conv2d(FastKernel, conv.Conv2d):
    """The reference Conv2d with its columns formed one block of images at a time,
    in whichever layout gives them longer rows.

    Blocks. The reference forms all the columns, then multiplies: at a stem's
    sizes they are tens of MB, so the product reads them back from memory. Here
    each block of images holds about ``block_bytes`` of columns, formed and
    multiplied while it is still in the cache. The cache keeps the padded input,
    not the columns (kh*kw / stride^2 times smaller), and the backward forms each
    block's columns again.

    Layout. Forming the columns copies, and col2im adds back, rows of values that
    are contiguous in both arrays, and NumPy pays a fixed cost per row:
    - channels-first, as the reference: the padded input (C, B, Hp, Wp), the
      columns (U, B'*Ho*Wo) for a block of B' images, rows of Wo pixels;
    - channels-last: the padded input (B, Hp, Wp, C), the columns (B'*Ho*Wo, U)
      with U in (kh, kw, C) order, rows of C channels (kw*C when forming them).
    Each call takes channels-last when C >= Wo: 32 channels on a 14x14 input at
    stride 2 (rows of 7 pixels) run channels-last, 3 channels on 32x32 at
    stride 1 channels-first. Channels-last, the products are the reference's
    transposed, with the columns and the upstream gradient as rows, (B'*Ho*Wo, U)
    and dy (B'*Ho*Wo, F): out = cols W2^T, dW2 = dy^T cols, dcols = dy W2.
    """

    block_bytes = 1 << 20

    def image_blocks(self, batch, columns_per_image):
        """Slices of the batch, each holding about ``block_bytes`` of columns."""
        step = max(1, self.block_bytes // columns_per_image)
        return [slice(start, start + step) for start in range(0, batch, step)]

    def forward(self, x):
        check_images(x, "Conv2d", self.in_channels)
        conv.check_fits(x, self.kernel_size, self.padding, "Conv2d")
        channels_last = self.channels_last(x)
        w2, rstd = self.weight_matrix()  # (F, U), U in (C, kh, kw) order
        if channels_last:
            y, xpad = self.forward_channels_last(x, w2)
        else:
            y, xpad = self.forward_channels_first(x, w2)
        self.cache = (channels_last, xpad, w2, rstd) if self.training else None
        return y

    def channels_last(self, x):
        """Whether x (B, C, H, W) runs channels-last: C >= Wo."""
        (kw, pw, sw), W = (self.kernel_size[1], self.padding[1], self.stride[1]), x.shape[3]
        return self.in_channels >= (W + 2 * pw - kw) // sw + 1

    def backward(self, dout):
        channels_last, xpad, w2, rstd = self._take_cache()
        if channels_last:
            dx, dw2 = self.backward_channels_last(dout, xpad, w2)
        else:
            dx, dw2 = self.backward_channels_first(dout, xpad, w2)
        if rstd is not None:
            dw2 = standardize_backward(dw2, w2, rstd, 1)
        self.weight.grad += dw2.reshape(self.weight.shape)
        return dx

    # channels-first: (C, B, Hp, Wp), columns (U, B'*Ho*Wo)

    def forward_channels_first(self, x, w2):
        xpad = conv.pad_spatial(x.transpose(1, 0, 2, 3), self.padding)  # (C, B, Hp, Wp)
        # (C, B, kh, kw, Ho, Wo), a view
        windows = conv.sliding_windows(xpad, self.kernel_size, self.stride)
        C, B, kh, kw, Ho, Wo = windows.shape
        y = xp.empty((B, self.out_channels, Ho, Wo), dtype=x.dtype)
        for images in self.image_blocks(B, windows[:, 0].nbytes):
            out = w2 @ conv.im2col(windows[:, images])  # (F, B'*Ho*Wo)
            if self.bias is not None:
                out += self.bias.data[:, None]
            y[images] = out.reshape(self.out_channels, -1, Ho, Wo).transpose(1, 0, 2, 3)
        return y, xpad

    def backward_channels_first(self, dout, xpad, w2):
        windows = conv.sliding_windows(xpad, self.kernel_size, self.stride)
        C, B, kh, kw, Ho, Wo = windows.shape
        dw2, dxpad = xp.zeros_like(w2), xp.zeros_like(xpad)
        for images in self.image_blocks(B, windows[:, 0].nbytes):
            cols = conv.im2col(windows[:, images])  # (U, B'*Ho*Wo), formed again
            dy = xp.ascontiguousarray(dout[images].transpose(1, 0, 2, 3))
            dy = dy.reshape(self.out_channels, -1)  # (F, B'*Ho*Wo)
            if self.bias is not None:
                self.bias.grad += dy.sum(axis=1)
            dw2 += dy @ cols.T
            dcols = w2.T @ dy  # (U, B'*Ho*Wo)
            dwindows = dcols.reshape(C, kh, kw, -1, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
            conv.col2im(dwindows, dxpad[:, images], self.stride)
        dx = conv.unpad_spatial(dxpad, self.padding).transpose(1, 0, 2, 3)  # (B, C, H, W)
        return xp.ascontiguousarray(dx), dw2

    # channels-last: (B, Hp, Wp, C), columns (B'*Ho*Wo, U) with U in (kh, kw, C) order

    def forward_channels_last(self, x, w2):
        B, C, H, W = x.shape
        (kh, kw), (ph, pw), F = self.kernel_size, self.padding, self.out_channels
        xpad = xp.zeros((B, H + 2 * ph, W + 2 * pw, C), dtype=x.dtype)  # (B, Hp, Wp, C)
        windows = self.windows_channels_last(xpad)  # (B, Ho, Wo, kh, kw, C), a view
        Ho, Wo = windows.shape[1:3]
        w2 = _kernel_channels_last(w2, C, kh, kw)
        y = xp.empty((B, F, Ho * Wo), dtype=x.dtype)
        for images in self.image_blocks(B, windows[0].nbytes):
            xpad[images, ph : ph + H, pw : pw + W] = x[images].transpose(0, 2, 3, 1)
            out = windows[images].reshape(-1, kh * kw * C) @ w2.T  # (B'*Ho*Wo, F)
            if self.bias is not None:
                out += self.bias.data
            y[images] = out.reshape(-1, Ho * Wo, F).transpose(0, 2, 1)
        return y.reshape(B, F, Ho, Wo), xpad

    def backward_channels_last(self, dout, xpad, w2):
        B, F, Ho, Wo = dout.shape
        (kh, kw), (ph, pw), C = self.kernel_size, self.padding, self.in_channels
        windows = self.windows_channels_last(xpad)
        Hp, Wp = xpad.shape[1:3]
        w2 = _kernel_channels_last(w2, C, kh, kw)
        dw2 = xp.zeros_like(w2)
        dx = xp.empty((B, C, Hp - 2 * ph, Wp - 2 * pw), dtype=dout.dtype)
        for images in self.image_blocks(B, windows[0].nbytes):
            cols = windows[images].reshape(-1, kh * kw * C)  # (B'*Ho*Wo, U), formed again
            dy = dout[images].reshape(-1, F, Ho * Wo).transpose(0, 2, 1)
            dy = xp.ascontiguousarray(dy).reshape(-1, F)  # (B'*Ho*Wo, F)
            if self.bias is not None:
                self.bias.grad += dy.sum(axis=0)
            dw2 += dy.T @ cols
            dcols = (dy @ w2).reshape(-1, Ho, Wo, kh, kw, C)
            dxpad = xp.zeros((len(dcols), Hp, Wp, C), dtype=dout.dtype)
            # col2im on (B', C, ...) views, so each added row is C contiguous channels
            conv.col2im(dcols.transpose(0, 5, 3, 4, 1, 2), dxpad.transpose(0, 3, 1, 2),
                        self.stride)
            dx[images] = dxpad[:, ph : Hp - ph, pw : Wp - pw].transpose(0, 3, 1, 2)
        dw2 = dw2.reshape(F, kh * kw, C).transpose(0, 2, 1)  # back to U in (C, kh, kw) order
        return dx, dw2.reshape(F, -1)

    def windows_channels_last(self, xpad):
        """xpad (B, Hp, Wp, C) -> its windows (B, Ho, Wo, kh, kw, C), a view."""
        windows = conv.sliding_windows(xpad.transpose(0, 3, 1, 2), self.kernel_size, self.stride)
        return windows.transpose(0, 4, 5, 2, 3, 1)  # from (B, C, kh, kw, Ho, Wo)


def _kernel_channels_last(w2, C, kh, kw):
    """W2 (F, U) with U in (C, kh, kw) order -> (F, U) in (kh, kw, C) order, a copy."""
    F = len(w2)
    return xp.ascontiguousarray(w2.reshape(F, C, kh * kw).transpose(0, 2, 1)).reshape(F, -1)


KERNELS = {
    layers.Linear: Linear,
    layers.LayerNorm: LayerNorm,
    layers.GELU: GELU,
    layers.Attention: Attention,
    layers.ClassAttention: ClassAttention,
    conv.Conv2d: Conv2d,
}
