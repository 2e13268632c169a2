"""The math functions tinyvit's layers, loss, prediction and inspection share:
softmax and log-softmax over the last axis, erf, and the standard normal's CDF
and density (which GELU needs). Plain ``xp`` code, on whichever backend is active.
"""

import math

from .backend import xp

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SERIES_TERMS = 100  # enough for |z| <= 6 to float64 rounding; erf(6) = 1 - 2e-17


def softmax(s):
    """softmax(s)_j = exp(s_j - m) / sum_k exp(s_k - m) over the last axis.

    Any constant m per row gives the same result; m = the row's max keeps every
    exp in (0, 1], so nothing overflows and the largest term is exactly 1.
    """
    e = xp.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(s):
    """log softmax(s) = (s - m) - log sum_k exp(s_k - m) over the last axis, m the
    row's max: exact where log(softmax(s)) would take the log of an underflowed 0."""
    shifted = s - s.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


def erf(z):
    """erf(z), exact to float64 rounding, in z's dtype (NumPy has no erf).

    The series with positive terms (Abramowitz & Stegun 7.1.6)
        erf(z) = 2/sqrt(pi) exp(-z^2) sum_n 2^n z^(2n+1) / (1*3*...*(2n+1)),
    each term the previous times 2 z^2 / (2n+1), summed in float64. With no
    cancellation it is exact to rounding; 100 terms reach float64 precision for
    |z| <= 6, and beyond that erf(z) = sign(z) to float64 precision (z is
    clipped there).
    """
    z64 = xp.clip(z.astype(xp.float64), -6.0, 6.0)
    two_z2 = 2.0 * z64 * z64
    term, total = z64.copy(), z64.copy()
    for n in range(1, _SERIES_TERMS):
        term *= two_z2 / (2 * n + 1)
        total += term
    return xp.clip(_TWO_OVER_SQRT_PI * xp.exp(-z64 * z64) * total, -1.0, 1.0).astype(z.dtype)


def normal_cdf(x):
    """Phi(x) = P(Z <= x) for a standard normal Z = (1 + erf(x / sqrt 2)) / 2."""
    return 0.5 * (1.0 + erf(x * _SQRT_HALF))


def normal_pdf(x):
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the derivative of Phi."""
    return xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
