"""The formulas the fast CPU kernels run on one block of rows (``blocks.each_block``):
sums along rows, a float32 erf, GELU and its derivative, and the softmax in place;
and the bias gradient's sum down the columns, for a whole layer. Each writes into the
arrays it is given (``out=``, ``+=``) so that a block's temporaries are few and stay in
the cache.

Shapes: a block is (m, D), m of the rows and D the last axis, or (b, ...) for the
attention's blocks of b images.
"""

from ..backend import xp
from ..nn.functional import INV_SQRT_2PI, SQRT_HALF, normal_cdf, normal_pdf
from ..nn.layers import TANH_A, TANH_C


def row_sum(a, b=None):
    """sum over the last axis of a (or of a * b), kept as a length-1 axis: (..., D) -> (..., 1)."""
    total = xp.einsum("...i->...", a) if b is None else xp.einsum("...i,...i->...", a, b)
    return total[..., None]


def bias_sum(a):
    """sum of a over every axis but the last, as one matrix-vector product:
    ones (M,) @ a (M, D), on OpenBLAS's threads. For a whole layer's gradient (not a
    block's), where NumPy's own sums down the columns of a wide array ran at a fifth
    of the product's speed (docs/performance.md)."""
    a = a.reshape(-1, a.shape[-1])
    return xp.ones(len(a), dtype=a.dtype) @ a


# -- erf in float32 ---------------------------------------------------------------------

# erfc(z) = exp(-z^2) t P(t), t = 1 / (1 + ERFC_P z), for z >= 0: the form of Abramowitz &
# Stegun 7.1.26 with one degree more, its coefficients (lowest power first) fitted to
# math.erfc by weighted least squares iterated towards the minimax (Lawson) on [0, 10]:
# absolute error 8.3e-9 in exact arithmetic, below float32's rounding near 1 (6e-8 apart).
ERFC_P = 0.39
ERFC_T = (0.23532515, 0.09138885, 0.64955831, -0.63539893, 0.88666354, -0.22753692)
# erf(z) = z P(z^2) for |z| <= 1, fitted the same way to math.erf(z) / z: relative error
# 1.2e-9. Near 0, 1 - erfc(z) would be left with erfc's rounding (0.9 in float32 is 6e-8
# from its neighbours), which the erf of a small z is much smaller than.
ERF_NEAR = (1.128379165727, -0.3761262582361, 0.1128358514015, -0.02685381152487,
            0.005188326800554, -8.010184927251e-4, 7.853829594439e-5)
# The same series for the normal CDF: Phi(x) - 1/2 = erf(x / sqrt 2) / 2 = x P(x^2 / 2), for
# |x| <= PHI_NEAR_EDGE (erf's |z| <= 1); the compiled GELU's derivative uses it near 0.
PHI_NEAR = tuple(0.5 * SQRT_HALF * c for c in ERF_NEAR)
PHI_NEAR_EDGE = 1 / SQRT_HALF
# Beyond this |x|, exp(-x^2 / 2) and Phi(-|x|) are 0 in float32: |x| is capped there where it
# multiplies them, so that x = inf gives inf * 0 nowhere.
GAUSS_ZERO_EDGE = 16.0


def _horner(x, coefficients):
    """c0 + x (c1 + ... + x c_n), written in a new array."""
    total = x * coefficients[-1]
    for c in reversed(coefficients[1:-1]):
        total += c
        total *= x
    total += coefficients[0]
    return total


def erfc_nonnegative(a, gauss, scale=1.0):
    """erfc(scale a) for a >= 0, given gauss = exp(-(scale a)^2): ``ERFC_T``'s
    polynomial in t = 1 / (1 + p scale a), multiplies and adds and one division."""
    t = a * (ERFC_P * scale)
    t += 1.0
    xp.divide(1.0, t, out=t)
    tail = _horner(t, ERFC_T)
    tail *= t
    tail *= gauss
    return tail


def erf32(z):
    """erf(z) for float32 z, within 1.5e-7 of math.erf over the whole float32 range,
    about two float32 spacings near 1 (tests/test_fast.py measures it): z P(z^2) for
    |z| <= 1, else sign(z) (1 - erfc(|z|)) by the erfc that GELU uses."""
    a = xp.abs(z)
    with xp.errstate(over="ignore", invalid="ignore"):  # large |z|: near is not used there
        z2 = z * z  # inf beyond 1.8e19, and exp(-inf) = 0 below
        near = _horner(z2, ERF_NEAR)
        near *= z
    xp.negative(z2, out=z2)
    gauss = xp.exp(z2, out=z2)  # exp(-z^2)
    erf = erfc_nonnegative(a, gauss)
    xp.subtract(1.0, erf, out=erf)
    xp.copysign(erf, z, out=erf)
    xp.copyto(erf, near, where=a <= 1.0)
    return erf


# -- GELU -------------------------------------------------------------------------------


def gelu_erf(x, y, dydx):
    """y = x Phi(x) and, unless dydx is None, dydx = Phi(x) + x phi(x), written in place.

    float32 by ``erfc_nonnegative``, with a = |x| and tail = Phi(-a) = erfc(a / sqrt 2) / 2:
        x Phi(x) = max(x, 0) - a tail          (x >= 0: x - x Phi(-x);  x < 0: x Phi(x))
        Phi(x) + x phi(x) = 1/2 + sign(x) (1/2 - tail + a phi(a)),
    a capped at ``GAUSS_ZERO_EDGE`` where it multiplies tail or phi. float64 by the exact erf.
    """
    if x.dtype == xp.float64:
        cdf = normal_cdf(x)
        xp.multiply(x, cdf, out=y)
        if dydx is not None:
            xp.add(cdf, x * normal_pdf(x), out=dydx)
        return
    a = xp.abs(x)
    with xp.errstate(over="ignore"):  # inf beyond 1.8e19, and exp(-inf) = 0 below
        gauss = a * a
    gauss *= -0.5
    xp.exp(gauss, out=gauss)  # exp(-x^2/2)
    tail = erfc_nonnegative(a, gauss, SQRT_HALF)
    tail *= 0.5  # Phi(-a)
    xp.minimum(a, GAUSS_ZERO_EDGE, out=a)  # gauss and tail are 0 beyond: no inf * 0
    if dydx is not None:
        xp.subtract(0.5, tail, out=dydx)
        gauss *= a
        gauss *= INV_SQRT_2PI  # a phi(a)
        dydx += gauss
        dydx *= xp.sign(x, out=gauss)
        dydx += 0.5
    xp.maximum(x, 0.0, out=y)
    a *= tail
    y -= a


def gelu_tanh(x, y, dydx):
    """The tanh approximation and its derivative, written in place."""
    x2 = x * x
    t = xp.tanh(TANH_C * x * (1.0 + TANH_A * x2))
    xp.multiply(0.5 * x, 1.0 + t, out=y)
    if dydx is not None:
        xp.add(0.5 * (1.0 + t), 0.5 * x * (1.0 - t * t) * TANH_C * (1.0 + 3.0 * TANH_A * x2),
               out=dydx)


# -- softmax ----------------------------------------------------------------------------


def softmax_shift(scores):
    """The constant c of each row's softmax(s) = exp(s - c) / sum exp(s - c), which
    any c leaves unchanged: one for the block, or one per row, (..., 1).

    The reference's c, the row's max, keeps every exp in (0, 1]; one c = max(s) over the
    block is just as safe whenever all its scores lie within 80 of it (exp(-80) ~
    2e-35 is still a normal float32, so no row underflows to zeros), and one
    reduction over the block costs far less than one per short row. Otherwise the
    row max is used.
    """
    top = scores.max()
    if float(top - scores.min()) < 80.0:
        return top
    return scores.max(axis=-1, keepdims=True)


def softmax_inplace(scores):
    """Softmax over the last axis, computed in place in ``scores`` and returned."""
    scores -= softmax_shift(scores)
    xp.exp(scores, out=scores)
    total = row_sum(scores)
    xp.divide(1.0, total, out=total)
    scores *= total
    return scores


def softmax_backward_inplace(A, dA, scale=1.0):
    """dS = scale * A * (dA - sum_j dA_j A_j) over the last axis, written into dA."""
    dA -= row_sum(dA, A)
    dA *= A
    if scale != 1.0:
        dA *= scale
    return dA

