"""GELU and LayerNorm compiled by Numba, where it is installed (``pip install -e ".[numba]"``):
the fast CPU tier's two kernels that NumPy's blocks leave furthest behind PyTorch's.

A NumPy block still makes one call, and one pass over the block, per operation:
twenty for GELU's formula. Compiled, each element (GELU) or row (LayerNorm) goes
through the whole formula once, in registers, and the rows are spread over the
cores by Numba's ``prange``. The formulas are the blocks' (``elementwise.py``):
GELU as ``max(x, 0) - |x| Phi(-|x|)`` by the same erfc polynomial, its derivative
``Phi(x) + x phi(x)``; LayerNorm's mean, variance, xhat, and its backward

    dx = rstd (g - mean(g) - xhat mean(g xhat)),   g = dy * gamma,

summed in float64 for every row. Compiled, each takes a quarter to a half of the
blocks' time (``benchmarks/compiled.py``, ``ops.py``; docs/design.md says why these two).

``cpu.GELU`` (float32; float64 keeps the exact erf) and ``cpu.LayerNorm`` call
these when ``compiled()`` says so: Numba is installed and neither
``set_compiled(False)`` nor ``TINYVIT_NUMBA=0`` turned it off. Each kernel runs on
``blocks.num_threads()`` threads, and gives the same bits whatever that count:
the column sums of LayerNorm's backward are taken per chunk of CHUNK_ROWS rows
and the chunks added in order. The threads are Numba's "workqueue" layer, whose
idle threads sleep (the OpenMP layer's threads spin, and took the cores from OpenBLAS's
products: docs/performance.md), one loop at a time, unless
``NUMBA_THREADING_LAYER`` says otherwise. The first call for each dtype compiles
(a few seconds, then cached on disk beside this file); the arrays are made
contiguous first, so that one layout is compiled.
"""

import functools
import importlib.util
import math
import os
import threading

from ..backend import xp
from ..nn.functional import INV_SQRT_2PI, SQRT_HALF
from .blocks import num_threads
from .elementwise import ERFC_P, ERFC_T
from .openblas import limit_spinning

INSTALLED = importlib.util.find_spec("numba") is not None  # imported at the first call

ENVIRONMENT_VARIABLE = "TINYVIT_NUMBA"  # "0": the NumPy blocks even where Numba is installed
CHUNK_ROWS = 64  # rows per partial column sum in LayerNorm's backward
_chosen = None  # set_compiled's choice, None: the environment's


def compiled():
    """Whether the kernels here run (Numba installed and not turned off)."""
    if not INSTALLED:
        return False
    if _chosen is not None:
        return _chosen
    setting = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip()
    if setting not in ("0", "1"):
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: expected 1 (compiled, where Numba is "
                         f"installed) or 0 (the NumPy blocks), got {setting!r}")
    return setting == "1"


def set_compiled(on):
    """Use the compiled kernels (True), the NumPy blocks (False), or what
    ``TINYVIT_NUMBA`` says (None)."""
    global _chosen
    if on not in (True, False, None):
        raise ValueError(f"set_compiled: expected True, False or None, got {on!r}")
    if on and not INSTALLED:
        raise ImportError('set_compiled(True) needs Numba: pip install -e ".[numba]"')
    _chosen = on


prange = range  # the loops' range: Numba's parallel one once Numba is imported
_launch = threading.Lock()  # one parallel loop at a time: the workqueue layer runs one


def _forget_launch():
    """In a forked child: a lock held by a parent's thread would never be released."""
    global _launch
    _launch = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_launch)


@functools.cache
def _numba():
    """Numba, imported, its threads set up, ``prange`` its own."""
    global prange
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:  # a user's choice of layer wins
        numba.config.THREADING_LAYER = "workqueue"
    prange = numba.prange
    limit_spinning()  # its threads, like the blocks', need the cores OpenBLAS's idle ones hold
    return numba


@functools.cache
def _compiled(function):
    return _numba().njit(parallel=True, fastmath=True, cache=True)(function)


def _launch_with_threads(function, *arrays):
    """``function(*arrays)``, compiled, on ``blocks.num_threads()`` of Numba's threads;
    an array not contiguous is copied first (the outputs, new, are)."""
    arrays = [xp.ascontiguousarray(a) if hasattr(a, "ndim") else a for a in arrays]
    numba = _numba()
    with _launch:
        numba.set_num_threads(min(num_threads(), numba.config.NUMBA_NUM_THREADS))
        _compiled(function)(*arrays)


# -- GELU ---------------------------------------------------------------------------------

P = ERFC_P * SQRT_HALF  # t = 1 / (1 + P |x|): erfc(|x| / sqrt 2) = exp(-x^2 / 2) t ERFC_T(t)
T0, T1, T2, T3, T4, T5 = ERFC_T
GAUSS_FLOOR = -32.0  # exp(-x^2 / 2) for |x| <= 8; beyond, 0 (it is below 1.3e-14)


def _gelu(u, bias, y, dydx, train):
    """y = GELU(u + bias) and, if train, dydx = GELU'(u + bias), for (M, D) arrays,
    in float64. exp(g) = exp(g / 256)^256: six terms of its series near 0 (relative
    error 1e-10), squared eight times, so that the loop calls no function and
    compiles to vector instructions."""
    M, D = u.shape
    for m in prange(M):
        for j in range(D):
            x = float(u[m, j]) + float(bias[j])
            a = abs(x)
            g = -0.5 * x * x
            w = max(g, GAUSS_FLOOR) / 256.0
            gauss = 1 + w * (1 + w * (1 / 2 + w * (1 / 6 + w * (1 / 24 + w * (1 / 120 + w / 720)))))
            for _ in range(8):
                gauss *= gauss  # exp(-x^2 / 2)
            gauss = gauss if g >= GAUSS_FLOOR else 0.0
            t = 1.0 / (1.0 + P * a)
            tail = 0.5 * gauss * t * (T0 + t * (T1 + t * (T2 + t * (T3 + t * (T4 + t * T5)))))
            y[m, j] = max(x, 0.0) - (a * tail if tail > 0.0 else 0.0)  # tail = Phi(-|x|)
            if train:  # Phi(x) + x phi(x)
                dydx[m, j] = 0.5 + math.copysign(0.5 - tail, x) + x * gauss * INV_SQRT_2PI


def gelu(u, bias, train):
    """(y, dydx or None) of float32 u (M, D) plus bias (D,) or None."""
    y = xp.empty(u.shape, dtype=u.dtype)
    dydx = xp.empty(u.shape if train else (0, 0), dtype=u.dtype)
    bias = xp.zeros(u.shape[1], dtype=u.dtype) if bias is None else bias
    _launch_with_threads(_gelu, u, bias, y, dydx, train)
    return y, (dydx if train else None)


# -- LayerNorm ----------------------------------------------------------------------------


def _layer_norm(x, r, add, w, b, eps, s, xhat, keep, rstd, y):
    """s = x + r (if add), xhat = (s - mean) rstd (kept if keep), y = xhat w + b, row
    by row."""
    M, D = x.shape
    for m in prange(M):
        mean = 0.0
        for j in range(D):
            v = x[m, j] + r[m, j] if add else x[m, j]
            if add:
                s[m, j] = v
            mean += v
        mean /= D
        var = 0.0
        for j in range(D):
            c = s[m, j] - mean
            var += c * c
        inv = 1.0 / math.sqrt(var / D + eps)
        rstd[m, 0] = inv
        for j in range(D):
            h = (s[m, j] - mean) * inv
            if keep:
                xhat[m, j] = h
            y[m, j] = h * w[j] + b[j]


def layer_norm(x, r, weight, bias, eps, keep):
    """(s, xhat or None, rstd, y) for (M, D) x and r (None: s is x); xhat is kept for
    the backward if keep."""
    add = r is not None
    s = xp.empty(x.shape, dtype=x.dtype) if add else x
    xhat = xp.empty(x.shape if keep else (0, 0), dtype=x.dtype)
    y = xp.empty(x.shape, dtype=x.dtype)
    rstd = xp.empty((len(x), 1), dtype=x.dtype)
    _launch_with_threads(_layer_norm, x, r if add else x, add, weight, bias, eps, s, xhat, keep,
                         rstd, y)
    return s, (xhat if keep else None), rstd, y


def _layer_norm_backward(dout, xhat, rstd, w, dskip, add, dx, dgamma, dbeta):
    """dx row by row (plus dskip, if add); dgamma, dbeta: (chunks, D) partial sums."""
    M, D = dout.shape
    for c in prange(dgamma.shape[0]):
        for m in range(c * CHUNK_ROWS, min(M, (c + 1) * CHUNK_ROWS)):
            mean_g, mean_gx = 0.0, 0.0
            for j in range(D):
                g = dout[m, j] * w[j]
                mean_g += g
                mean_gx += g * xhat[m, j]
                dgamma[c, j] += dout[m, j] * xhat[m, j]
                dbeta[c, j] += dout[m, j]
            mean_g /= D
            mean_gx /= D
            for j in range(D):
                v = (dout[m, j] * w[j] - mean_g - xhat[m, j] * mean_gx) * rstd[m, 0]
                dx[m, j] = v + dskip[m, j] if add else v


def layer_norm_backward(dout, xhat, rstd, weight, dskip):
    """(dx, dgamma, dbeta) for (M, D) dout; dskip (M, D) or None is added to dx."""
    chunks = -(-len(dout) // CHUNK_ROWS)
    dgamma = xp.zeros((chunks, dout.shape[1]), dtype=xp.float64)
    dbeta = xp.zeros((chunks, dout.shape[1]), dtype=xp.float64)
    dx = xp.empty(dout.shape, dtype=dout.dtype)
    add = dskip is not None
    _launch_with_threads(_layer_norm_backward, dout, xhat, rstd, weight,
                         dskip if add else dout, add, dx, dgamma, dbeta)
    return dx, dgamma.sum(axis=0).astype(dout.dtype), dbeta.sum(axis=0).astype(dout.dtype)
