"""The fast tier on the CPU: NumPy kernels of the layers whose elementwise work
dominates a step once the matmuls run at OpenBLAS's speed.

Each class subclasses its reference layer (``tinyvit/nn/layers.py``,
``tinyvit/nn/conv.py``, ``tinyvit/nn/optim.py``), keeps its parameters and
contract, and overrides only what it does faster. What makes each faster:

- every elementwise kernel runs its whole formula on one cache-sized block of rows
  before the next (``blocks.each_block``), the blocks spread over the cores, so a
  chain of operations reads and writes memory about once instead of once per
  operation; results go into preallocated arrays (``out=``), and the formulas of
  a block live in ``elementwise.py``;
- ``GELU``: float32 by its own erfc polynomial (``elementwise.ERFC_T``), the
  derivative computed in the forward and cached instead of x; in ``MLP`` fc1's
  bias is added inside GELU's blocks;
- ``LayerNorm``: normalized in place; in ``Block`` the residual add that precedes
  norm2 and the gradient the skip connections add are done inside its blocks;
- ``Attention`` (``cpu_attention.py``): per block of images, the scores, their
  softmax and A v one after the other while the scores are in the cache (and back),
  the scale folded into k^T's copy and the softmax's backward, A v written where
  ``merge_heads`` wants it, the gradients of q, k and v straight into dqkv; in eval each
  block's weights in an array of its own, the batch's never written;
- ``Dropout``, ``AdamW``: the mask and the update in blocks;
- ``Linear``: the bias added by MKL's product as it writes (``mkl.py``), its gradient summed
  by a matrix-vector product (``Conv2d``: ``cpu_conv.py``).
Where Numba is installed, GELU and the attention's softmax (float32), LayerNorm and the
softmax's backward run compiled loops (``cpu_numba_gelu.py``, ``cpu_numba_norm.py``,
``cpu_numba_softmax.py``): the blocks' formulas, but for GELU's derivative near 0, a series
of its own, and LayerNorm's row sums, taken in float64.

``tests/test_fast.py`` checks every class here against its reference;
docs/performance.md has what each change measured.

Shapes as in the reference layers (the legend heads ``docs/backprop.md``): M rows, D
features.
"""

import math

from ..backend import xp
from ..checks import check_float
from ..nn import conv, layers, optim
from . import cpu_numba, cpu_numba_gelu, cpu_numba_norm, mkl
from .blocks import each_block
from .cpu_attention import Attention, ClassAttention
from .cpu_conv import Conv2d
from .elementwise import bias_sum, gelu_erf, gelu_tanh, row_sum
from .kernel import FastKernel


def rows_of(a):
    """a (..., D) as a 2-D (M, D) view (or copy, if its layout needs one); 0-d a as (1, 1)."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1] if a.ndim else 1)


# ---------------------------------------------------------------------------
# Linear, LayerNorm
# ---------------------------------------------------------------------------


class Linear(FastKernel, layers.Linear):
    """The reference Linear with its products by MKL where ``mkl.enabled()`` (else
    NumPy's), the bias added inside MKL's product, its gradient summed by one
    matrix-vector product, and ``project``: its forward with the bias it is given (none:
    for a kernel that adds the bias itself)."""

    column_sum = staticmethod(bias_sum)

    def forward(self, x):
        return self.project(x, None if self.bias is None else self.bias.data)

    def project(self, x, bias=None):
        """x W^T (+ bias, where given), (..., in) -> (..., out), cached as ``forward`` caches."""
        self.check_input(x)
        x2 = x.reshape(-1, self.in_features)  # (M, in)
        self.cache = x2 if self.training else None
        return product(x2, self.weight.data.T, bias).reshape(*x.shape[:-1], self.out_features)

    def backward(self, dout):
        """The reference's: dW = dy^T x, db = dy summed over rows, dx = dy W."""
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)  # (M, out)
        self.weight.grad += product(dout2.T, x2)
        if self.bias is not None:
            self.bias.grad += self.column_sum(dout2)
        return product(dout2, self.weight.data).reshape(*dout.shape[:-1], self.in_features)


def product(a, b, bias=None):
    """a @ b (+ bias on every row), by MKL where it is enabled."""
    return (mkl.matmul if mkl.enabled() else mkl.numpy_matmul)(a, b, bias)


class LayerNorm(FastKernel, layers.LayerNorm):
    """The reference LayerNorm in row blocks: per block the mean, xhat (in its own
    array, the cache), rstd and y; the backward overwrites the cached xhat (each
    forward serves one backward). ``forward_residual`` and ``backward_residual`` take
    the residual add before it and the skip's gradient after it into the same blocks.
    """

    def forward(self, x):
        return self.forward_residual(x)[1]

    def compiled_for(self, x):
        """Whether ``cpu_numba_norm``'s loops take x: float32 or float64, the parameters'
        dtype."""
        return (x.dtype in (xp.float32, xp.float64) and x.dtype == self.weight.data.dtype
                and cpu_numba.compiled())

    def forward_residual(self, x, r=None):
        """(s, y): s = x + r (x itself when r is None) and y = LayerNorm(s)."""
        check_float(x, "LayerNorm")
        self.check_input(x)
        if self.compiled_for(x):
            s, xhat, rstd, y = cpu_numba_norm.layer_norm(
                rows_of(x), None if r is None else rows_of(r), self.weight.data,
                self.bias.data, self.eps, keep=self.training)
            self.cache = (xhat, rstd) if self.training else None
            return s.reshape(x.shape), y.reshape(x.shape)
        s = x if r is None else xp.empty(x.shape, dtype=x.dtype)
        xhat = xp.empty(x.shape, dtype=x.dtype)
        # gamma xhat + beta: promoted as the reference's (a float32 x, float64 parameters)
        y = xp.empty(x.shape, dtype=xp.result_type(x, self.weight.data, self.bias.data))
        rstd = xp.empty((*x.shape[:-1], 1), dtype=x.dtype)
        w, b, inv_d = self.weight.data, self.bias.data, 1.0 / self.dim

        def normalize(x, r, s, xhat, rstd, y):  # one block of rows
            if r is not None:
                xp.add(x, r, out=s)
            mean = row_sum(s)
            mean *= inv_d
            xp.subtract(s, mean, out=xhat)
            xp.multiply(row_sum(xhat, xhat), inv_d, out=rstd)
            rstd += self.eps
            xp.sqrt(rstd, out=rstd)
            xp.divide(1.0, rstd, out=rstd)
            xhat *= rstd
            xp.multiply(xhat, w, out=y)
            y += b

        arrays = [rows_of(a) for a in (x, s, xhat, rstd, y)]
        if r is None:
            each_block(lambda x, s, xhat, rstd, y: normalize(x, None, s, xhat, rstd, y), *arrays)
        else:
            each_block(normalize, arrays[0], rows_of(r), *arrays[1:])
        self.cache = (xhat, rstd) if self.training else None
        return s, y

    def backward(self, dout):
        return self.backward_residual(dout)

    def backward_residual(self, dout, dskip=None):
        """dx, plus ``dskip`` (the gradient a skip connection adds) when given."""
        xhat, rstd = self._take_cache()
        if self.compiled_for(dout) and self.compiled_for(xhat):  # xhat: the forward's route
            dx, dgamma, dbeta = cpu_numba_norm.layer_norm_backward(
                rows_of(dout), rows_of(xhat), rows_of(rstd), self.weight.data,
                None if dskip is None else rows_of(dskip))
            self.weight.grad += dgamma
            self.bias.grad += dbeta
            return dx.reshape(dout.shape)
        dx = xp.empty(dout.shape, dtype=dout.dtype)
        w, inv_d = self.weight.data, 1.0 / self.dim

        def gradient(dout, xhat, rstd, dx, dskip=None):  # one block of rows
            sums = (self.column_sum(dout, xhat), self.column_sum(dout))  # dgamma's, dbeta's
            xp.multiply(dout, w, out=dx)  # g, the gradient at xhat
            mean_g = row_sum(dx)
            mean_g *= inv_d
            mean_gx = row_sum(dx, xhat)
            mean_gx *= inv_d
            dx -= mean_g
            xhat *= mean_gx  # xhat's last use: scaled in place, no temporary
            dx -= xhat
            dx *= rstd
            if dskip is not None:
                dx += dskip
            return sums

        arrays = [rows_of(a) for a in (dout, xhat, rstd, dx)]
        if dskip is not None:
            arrays.append(rows_of(dskip))
        for dgamma, dbeta in each_block(gradient, *arrays):
            self.weight.grad += dgamma
            self.bias.grad += dbeta
        return dx


# ---------------------------------------------------------------------------
# GELU, MLP, Dropout
# ---------------------------------------------------------------------------


class GELU(FastKernel, layers.GELU):
    """y = x Phi(x) and its derivative in one forward, in row blocks.

    The forward also computes dy/dx in training mode and caches only that (one
    array, the size of x), so the backward is one multiply; in eval mode it
    computes y alone. ``forward(u, b)`` adds a bias b first (fc1's, in ``MLP``).
    """

    def forward(self, x, bias=None):
        check_float(x, "GELU")
        if (self.approximate != "tanh" and x.dtype == xp.float32 and cpu_numba.compiled()
                and (bias is None or (x.ndim and bias.shape == x.shape[-1:]))):  # else NumPy's
            y, dydx = cpu_numba_gelu.gelu(rows_of(x), bias, self.training)
            self.cache = None if dydx is None else dydx.reshape(x.shape)
            return y.reshape(x.shape)
        gelu = gelu_tanh if self.approximate == "tanh" else gelu_erf
        y = xp.empty(x.shape, dtype=x.dtype)
        dydx = xp.empty(x.shape, dtype=x.dtype) if self.training else None

        def activate(x, y, dydx=None):  # one block of rows
            gelu(x if bias is None else x + bias, y, dydx)  # x + bias: the block's, in cache

        arrays = [rows_of(a) for a in (x, y) + ((dydx,) if self.training else ())]
        each_block(activate, *arrays)
        self.cache = dydx
        return y

    def backward(self, dout):
        dydx = self._take_cache()
        if getattr(dout, "shape", None) != dydx.shape or dout.dtype != dydx.dtype:
            return dout * dydx  # a number, another shape or dtype: as the reference's
        each_block(_scale_in_place, rows_of(dydx), rows_of(dout))
        return dydx  # the cache, scaled in place: it serves one backward


def _scale_in_place(a, b):
    a *= b


class MLP(FastKernel, layers.MLP):
    """The reference MLP with fc1's bias added inside the GELU's row blocks."""

    def forward(self, x):
        if self.fc1.bias is None:
            h = self.act.forward(self.fc1.forward(x))
        else:
            h = self.act.forward(self.fc1.project(x), self.fc1.bias.data)  # (..., Dm)
        return self.drop2.forward(self.fc2.forward(self.drop1.forward(h)))


class Dropout(FastKernel, layers.Dropout):
    """The reference Dropout, its uniform draws the same (one call of the generator,
    so the masks are the reference's), the mask and the product in row blocks."""

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return super().forward(x)
        if self.rng is None:
            return super().forward(x)  # the reference's error
        mask = self.rng.random(x.shape, dtype=x.dtype)  # uniform draws, the mask in place below
        y = xp.empty(x.shape, dtype=x.dtype)
        p, scale = self.p, x.dtype.type(1.0 / (1.0 - self.p))

        def drop(u, x, y):  # one block of rows
            xp.multiply(u >= p, scale, out=u)  # 0 or 1/(1-p)
            xp.multiply(x, u, out=y)

        each_block(drop, rows_of(mask), rows_of(x), rows_of(y))
        self.cache = mask
        return y

    def backward(self, dout):
        mask = self._take_cache()
        if isinstance(mask, float):
            return dout
        dx = xp.empty(dout.shape, dtype=dout.dtype)
        each_block(lambda d, m, dx: xp.multiply(d, m, out=dx),
                   rows_of(dout), rows_of(mask), rows_of(dx))
        return dx


# ---------------------------------------------------------------------------
# Encoder block
# ---------------------------------------------------------------------------


class Block(FastKernel, layers.Block):
    """The reference Block with the residual add of the attention branch inside
    norm2's blocks, and the skips' gradients added inside the LayerNorms' backward."""

    def forward(self, x):
        h, u = self.norm2.forward_residual(x, self.attn.forward(self.norm1.forward(x)))
        return h + self.mlp.forward(u)  # (B, N, D)

    def backward(self, dout):
        dh = self.norm2.backward_residual(self.mlp.backward(dout), dout)  # dout + the branch's
        return self.norm1.backward_residual(self.attn.backward(dh), dh)


# ---------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------


class AdamW(FastKernel, optim.AdamW):
    """The reference AdamW's update, the same operations in the same order, in
    blocks of the flat buffers."""

    def update(self):
        b1, b2, lr, eps = self.beta1, self.beta2, self.step_lr, self.eps
        decay_rate, rstd_correction = lr * self.weight_decay, 1 / math.sqrt(1 - b2**self.t)
        step = lr / (1 - b1**self.t)

        def adamw(p, g, decay, m, v):  # one block of the flat buffers
            s = decay * p
            s *= decay_rate
            p -= s  # decoupled weight decay
            m *= b1
            m += (1 - b1) * g
            v *= b2
            xp.multiply(g, g, out=s)
            s *= 1 - b2
            v += s
            xp.sqrt(v, out=s)
            s *= rstd_correction
            s += eps
            xp.divide(m, s, out=s)
            s *= step
            p -= s

        each_block(adamw, self.data, self.grad, self.decay, self.m, self.v)


KERNELS = {
    layers.Linear: Linear,
    layers.LayerNorm: LayerNorm,
    layers.GELU: GELU,
    layers.MLP: MLP,
    layers.Dropout: Dropout,
    layers.Block: Block,
    layers.Attention: Attention,
    layers.ClassAttention: ClassAttention,
    optim.AdamW: AdamW,
    conv.Conv2d: Conv2d,
}
