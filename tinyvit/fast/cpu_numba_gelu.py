"""GELU compiled by Numba (``cpu_numba.py`` says when it runs): y = GELU(u + bias) as
``max(x, 0) - |x| Phi(-|x|)`` by the erfc polynomial of the blocks
(``elementwise.gelu_erf``), in float32, and in training its derivative
``Phi(x) + x phi(x)`` beside it, for the backward; each element through the whole
formula once, a block of rows at a time on the blocks' threads."""

import math

from ..backend import xp
from ..nn.functional import INV_SQRT_2PI, SQRT_HALF
from . import cpu_numba
from .blocks import each_block
from .cpu_numba import HALF, ONE, ZERO, F, check_shapes, compile_for_block
from .elementwise import ERFC_P, ERFC_T, PHI_NEAR, PHI_NEAR_EDGE

P = F(ERFC_P * SQRT_HALF)  # t = 1 / (1 + P |x|): erfc(|x| / sqrt 2) = exp(-x^2 / 2) t ERFC_T(t)
T0, T1, T2, T3, T4, T5 = (F(c / 2) for c in ERFC_T)  # halved: Phi(-|x|) = erfc(|x| / sqrt 2) / 2
GAUSS_EDGE = F(8.0)  # exp(-x^2 / 2) for |x| <= 8; beyond, 0 (it is below 1.3e-14)
INV_SQRT_2PI_32 = F(INV_SQRT_2PI)
Q0, Q1, Q2, Q3, Q4, Q5, Q6 = (F(c) for c in PHI_NEAR)  # (Phi(x) - 1/2) / x, in x^2 / 2
NEAR = F(PHI_NEAR_EDGE)


def _gelu(u, bias, y, dydx):
    """y = GELU(u + bias) and, unless dydx is None, dydx = GELU'(u + bias), for (M, D)
    float32 arrays, in float32 (dydx None: Numba compiles a loop without the derivative),
    by ``elementwise.gelu_erf``'s formulas."""
    M, D = u.shape
    for m in range(M):
        for j in range(D):
            x = u[m, j] + bias[j]
            a = min(abs(x), GAUSS_EDGE)  # gauss and tail are 0 beyond: no inf * 0
            h = HALF * a * a  # x^2 / 2, capped
            gauss = cpu_numba.exp_nonpositive(-h) if abs(x) <= GAUSS_EDGE else ZERO  # exp(-x^2 / 2)
            t = ONE / (ONE + P * a)
            tail = gauss * t * (T0 + t * (T1 + t * (T2 + t * (T3 + t * (T4 + t * T5)))))
            y[m, j] = max(x, ZERO) - a * tail  # tail = Phi(-|x|)
            if dydx is not None:  # 1/2 + sign(x) (Phi(|x|) - 1/2 + |x| phi(x))
                near = a * (Q0 + h * (Q1 + h * (Q2 + h * (Q3 + h * (Q4 + h * (Q5 + h * Q6))))))
                lift = near if a <= NEAR else HALF - tail
                dydx[m, j] = HALF + math.copysign(lift + a * gauss * INV_SQRT_2PI_32, x)


def gelu(u, bias, train):
    """(y, dydx or None) of float32 u (M, D) plus bias (D,) or None."""
    u = xp.ascontiguousarray(u)
    M, D = u.shape
    y = xp.empty(u.shape, dtype=u.dtype)
    dydx = xp.empty(u.shape, dtype=u.dtype) if train else None
    bias = xp.zeros(D, dtype=u.dtype) if bias is None else xp.ascontiguousarray(bias)
    check_shapes("gelu", bias=(bias, (D,)))
    kernel = compile_for_block(_gelu)

    def activate(u, y, dydx=None):  # one block of rows
        kernel(u, bias, y, dydx)

    each_block(activate, u, *((y,) if dydx is None else (y, dydx)))
    return y, dydx
