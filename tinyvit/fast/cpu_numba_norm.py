"""LayerNorm and its backward compiled by Numba (``cpu_numba.py`` says when they run),
row by row, a block of rows at a time on the blocks' threads: the residual add
s = x + r where there is one, the mean and the variance, xhat and y = xhat gamma + beta
in one pass; and back

    dx = rstd (g - mean(g) - xhat mean(g xhat)),   g = dy * gamma,

plus the skip's gradient where there is one. Every row's sums are taken in float64;
the column sums dgamma, dbeta per block, the blocks' added in order, so the results
are the same bits whatever the thread count."""

import math

from ..backend import xp
from .blocks import each_block
from .cpu_numba import check_shapes, compile_for_block


def _layer_norm(x, r, w, b, eps, s, xhat, rstd, y):
    """s = x + r (r and s None: no residual add, s is x), xhat = (s - mean) rstd (None:
    not kept), y = xhat w + b, row by row: the mean and the variance summed in float64,
    the rest in x's dtype. Numba compiles one loop for each pattern of None arguments,
    with the tests on them decided there: no branch is left in the loops."""
    M, D = x.shape
    cast = x.dtype.type
    for m in range(M):
        mean = 0.0
        for j in range(D):
            v = x[m, j] + r[m, j] if r is not None else x[m, j]
            if r is not None:
                s[m, j] = v
            mean += v
        mu = cast(mean / D)
        var = 0.0
        for j in range(D):
            c = (s[m, j] if r is not None else x[m, j]) - mu
            var += c * c
        inv = cast(1.0 / math.sqrt(var / D + eps))
        rstd[m, 0] = inv
        for j in range(D):
            h = ((s[m, j] if r is not None else x[m, j]) - mu) * inv
            if xhat is not None:
                xhat[m, j] = h
            y[m, j] = h * w[j] + b[j]


def layer_norm(x, r, weight, bias, eps, keep):
    """(s, xhat or None, rstd, y) for (M, D) x and r (None: s is x); xhat is kept for
    the backward if keep."""
    add = r is not None
    x = xp.ascontiguousarray(x)
    r = xp.ascontiguousarray(r) if add else x  # each_block takes arrays: x stands in for r
    M, D = x.shape
    check_shapes("layer_norm", r=(r, (M, D)), weight=(weight, (D,)), bias=(bias, (D,)))
    s = xp.empty(x.shape, dtype=x.dtype) if add else x
    xhat = xp.empty(x.shape if keep else (len(x), 0), dtype=x.dtype)  # (M, 0): not written
    y = xp.empty(x.shape, dtype=x.dtype)
    rstd = xp.empty((len(x), 1), dtype=x.dtype)
    w, b = xp.ascontiguousarray(weight), xp.ascontiguousarray(bias)
    kernel = compile_for_block(_layer_norm)

    def normalize(x, r, s, xhat, rstd, y):  # one block of rows
        kernel(x, r if add else None, w, b, eps, s if add else None, xhat if keep else None,
               rstd, y)

    each_block(normalize, x, r, s, xhat, rstd, y)
    return s, (xhat if keep else None), rstd, y


def _layer_norm_backward(dout, xhat, rstd, w, dskip, dx, dgamma, dbeta):
    """dx row by row (plus dskip, None: none), its two means summed in float64, the rest
    in dout's dtype; dgamma, dbeta (D,): the block's column sums, in float64."""
    M, D = dout.shape
    cast = dout.dtype.type
    for m in range(M):
        mean_g, mean_gx = 0.0, 0.0
        for j in range(D):
            g = dout[m, j] * w[j]
            dx[m, j] = g  # kept, rounded: recomputed, fastmath would fuse it into g - mg
            mean_g += g
            mean_gx += g * xhat[m, j]
            dgamma[j] += dout[m, j] * xhat[m, j]
            dbeta[j] += dout[m, j]
        mg, mgx = cast(mean_g / D), cast(mean_gx / D)
        for j in range(D):
            v = (dx[m, j] - mg - xhat[m, j] * mgx) * rstd[m, 0]
            dx[m, j] = v + dskip[m, j] if dskip is not None else v


def layer_norm_backward(dout, xhat, rstd, weight, dskip):
    """(dx, dgamma, dbeta) for (M, D) dout; dskip (M, D) or None is added to dx. The
    column sums are taken per block and the blocks' added in order."""
    add = dskip is not None
    dout, xhat, rstd = (xp.ascontiguousarray(a) for a in (dout, xhat, rstd))
    dskip = xp.ascontiguousarray(dskip) if add else dout
    M, D = xhat.shape  # the forward's
    check_shapes("layer_norm_backward", dout=(dout, (M, D)), rstd=(rstd, (M, 1)),
                 weight=(weight, (D,)), dskip=(dskip, (M, D)))
    dx = xp.empty(dout.shape, dtype=dout.dtype)
    w, kernel = xp.ascontiguousarray(weight), compile_for_block(_layer_norm_backward)

    def gradient(dout, xhat, rstd, dskip, dx):  # one block of rows: its column sums
        dgamma, dbeta = (xp.zeros(dout.shape[1], dtype=xp.float64) for _ in range(2))
        kernel(dout, xhat, rstd, w, dskip if add else None, dx, dgamma, dbeta)
        return dgamma, dbeta

    dgamma, dbeta = (xp.zeros(dout.shape[1], dtype=xp.float64) for _ in range(2))
    for block_dgamma, block_dbeta in each_block(gradient, dout, xhat, rstd, dskip, dx):
        dgamma += block_dgamma  # in block order: the same bits on any thread count
        dbeta += block_dbeta
    return dx, dgamma.astype(dout.dtype), dbeta.astype(dout.dtype)
