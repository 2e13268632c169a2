"""The math tinyvit's layers, loss, prediction and inspection share: softmax and
log-softmax over the last axis; erf and the standard normal's CDF and density
(which GELU needs); sums over rows; and the standardization (x - mean) / std that
LayerNorm, BatchNorm2d, GroupNorm and weight standardization all apply, with its
backward. Plain ``xp`` code, on whichever backend is active.
"""

import math

from ..backend import xp

SQRT_HALF = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def softmax(s):
    """softmax(s)_j = exp(s_j - m) / sum_k exp(s_k - m) over the last axis.

    Any constant m per row gives the same result; m = the row's max keeps every
    exp in (0, 1], so nothing overflows and the largest term is exactly 1.
    """
    e = xp.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(A, dA):
    """The backward of A = softmax(S) over the last axis: dS from dA, A kept from the
    forward. Row by row, dA_j/dS_k = A_j (delta_jk - A_k), the Jacobian
    diag(A) - A^T A, applied without forming it:

        dS_k = sum_j dA_j A_j (delta_jk - A_k) = A_k (dA_k - sum_j dA_j A_j),

    so each row of dS sums to zero.
    """
    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))


def log_softmax(s):
    """log softmax(s) = (s - m) - log sum_k exp(s_k - m) over the last axis, m the
    row's max: exact where log(softmax(s)) would take the log of an underflowed 0."""
    shifted = s - s.max(axis=-1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))


# -- erf ------------------------------------------------------------------------------

# W. J. Cody's rational approximations ("Rational Chebyshev approximations for the
# error function", Math. Comp. 23, 1969; his CALERF, which C libraries follow), each
# (numerator, denominator) with the coefficients of the highest power first.
ERF_NEAR_ZERO = (  # erf(y) = y p(y^2) / q(y^2) for |y| <= 0.5
    (1.85777706184603153e-1, 3.16112374387056560e0, 1.13864154151050156e2,
     3.77485237685302021e2, 3.20937758913846947e3),
    (1.0, 2.36012909523441209e1, 2.44024637934444173e2, 1.28261652607737228e3,
     2.84423683343917062e3),
)
ERFC_MIDDLE = (  # erfc(y) = exp(-y^2) p(y) / q(y) for 0.5 < y <= 4
    (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e0,
     6.61191906371416295e1, 2.98635138197400131e2, 8.81952221241769090e2,
     1.71204761263407058e3, 2.05107837782607147e3, 1.23033935479799725e3),
    (1.0, 1.57449261107098347e1, 1.17693950891312499e2, 5.37181101862009858e2,
     1.62138957456669019e3, 3.29079923573345963e3, 4.36261909014324716e3,
     3.43936767414372164e3, 1.23033935480374942e3),
)
ERFC_TAIL = (  # erfc(y) = exp(-y^2) / y (1/sqrt(pi) - t p(t) / q(t)), t = 1/y^2, for y > 4
    (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
     1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4),
    (1.0, 2.56852019228982242e0, 1.87295284992346725e0, 5.27905102951428412e-1,
     6.05183413124413191e-2, 2.33520497626869185e-3),
)
ERF_ONE = 6.0  # erf(y) = 1 to float64 precision from here on: erfc(6) = 2e-17


def rational(coefficients, x):
    """p(x) / q(x) for (p, q) = ``coefficients``, each polynomial by Horner's rule."""
    p, q = (_horner(c, x) for c in coefficients)
    return p / q


def _horner(c, x):
    """c[0] x^n + c[1] x^(n-1) + ... + c[n], n >= 1."""
    total = x * c[0]
    total += c[1]
    for a in c[2:]:
        total *= x
        total += a
    return total


def erf(z):
    """erf(z) for a float array z (NumPy has no erf): exact to rounding in float64,
    within a few units in the last place in float32.

    W. J. Cody's rational approximations on three ranges of y = |z|, each evaluated
    on the entries in its range alone (``ERF_NEAR_ZERO``, ``ERFC_MIDDLE``,
    ``ERFC_TAIL``): erf itself near 0, where 1 - erfc would lose its digits, and
    erf = 1 - erfc beyond; erf(-z) = -erf(z). float16 is computed in float32 and
    rounded back: the rationals' polynomials pass float16's largest number, 65504.
    """
    if z.dtype == xp.float16:
        return erf(z.astype(xp.float32)).astype(xp.float16)
    y = xp.abs(z)
    out = xp.where(y >= ERF_ONE, 1.0, y)  # 1 there, NaN stays NaN, the rest set below
    near, middle = y <= 0.5, (y > 0.5) & (y <= 4.0)
    tail = (y > 4.0) & (y < ERF_ONE)
    yn = y[near]
    out[near] = yn * rational(ERF_NEAR_ZERO, yn * yn)
    ym = y[middle]
    out[middle] = 1.0 - xp.exp(-ym * ym) * rational(ERFC_MIDDLE, ym)
    yt = y[tail]
    t = 1.0 / (yt * yt)
    out[tail] = 1.0 - xp.exp(-yt * yt) / yt * (INV_SQRT_PI - t * rational(ERFC_TAIL, t))
    return xp.copysign(out, z, out=out)


def normal_cdf(x):
    """Phi(x) = P(Z <= x) for a standard normal Z = (1 + erf(x / sqrt 2)) / 2."""
    return 0.5 * (1.0 + erf(x * SQRT_HALF))


def normal_pdf(x):
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the derivative of Phi."""
    return xp.exp(-0.5 * x * x) * INV_SQRT_2PI


# -- sums and standardization -----------------------------------------------------------


def column_sum(a, b=None):
    """The sum of a (or of a * b) over every axis but the last: (..., D) -> (D,).
    A bias's gradient is one: it is added to every row."""
    product = a if b is None else a * b
    return product.reshape(-1, product.shape[-1]).sum(axis=0)


def standardize(x, axes, eps, average=None):
    """xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps), with the mean and the
    biased variance var over ``axes``, kept as length-1 axes. ``average(a)``
    takes those means (``mean_over(axes)`` unless given: SyncBatchNorm2d's also
    adds up the other processes' values).

    Returns (xhat, rstd, mean, var): the backward needs xhat and rstd, BatchNorm's
    running averages the mean and var.
    """
    average = average or mean_over(axes)
    mean = average(x)
    centered = x - mean
    var = average(centered * centered)
    rstd = 1.0 / xp.sqrt(var + eps)
    return centered * rstd, rstd, mean, var


def standardize_backward(g, xhat, rstd, axes, average=None):
    """The backward of ``standardize``: dx for g = dL/dxhat, with n values over ``axes``
    (and ``average`` the forward's).

    xhat_i depends on x_k directly and through mean and rstd, with
    d mean/dx_k = 1/n and d rstd/dx_k = -rstd^3 (x_k - mean) / n; summing the
    three paths, exactly for any eps,

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  means over ``axes``.
    """
    average = average or mean_over(axes)
    return rstd * (g - average(g) - xhat * average(g * xhat))


def mean_over(axes):
    """a -> its mean over ``axes``, kept as length-1 axes."""
    return lambda a: a.mean(axis=axes, keepdims=True)
