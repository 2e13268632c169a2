"""GELU, LayerNorm and the softmax compiled by Numba, where it is installed
(``pip install -e ".[numba]"``): the fast CPU tier's kernels that NumPy's blocks
leave furthest behind PyTorch's.

A NumPy block still makes one call, and one pass over the block, per operation:
twenty for GELU's formula. Compiled, each element (GELU) or row (LayerNorm, softmax)
goes through the whole formula once, in registers. The formulas are the blocks'
(``elementwise.py``): GELU as ``max(x, 0) - |x| Phi(-|x|)`` by the same erfc
polynomial, in float32, its derivative ``Phi(x) + x phi(x)``; LayerNorm's mean,
variance, xhat, and its backward

    dx = rstd (g - mean(g) - xhat mean(g xhat)),   g = dy * gamma,

summed in float64 for every row; the softmax ``exp(s - c) / sum exp(s - c)`` (float32,
its shift c NumPy's) and its backward ``dS = A (dA - sum_j dA_j A_j)``.
Compiled, each takes a quarter to a half of the blocks' time (``benchmarks/compiled.py``,
``ops.py``; docs/design.md says why these).

``cpu.GELU`` (float32; float64 keeps the exact erf) and ``cpu.LayerNorm`` call
these when ``compiled()`` says so: Numba is installed and neither
``set_compiled(False)`` nor ``TINYVIT_NUMBA=0`` turned it off. Every loop is compiled
for the calling thread, the GIL released, and runs on one block of rows at a time on
the blocks' threads (``blocks.each_block``), as the NumPy formulas do: GELU and
LayerNorm per block of their rows, the softmax and its backward inside the
attention's blocks (``cpu_attention.py``). Numba's own parallel loops (``prange``)
are not used: starting one cost 0.07-0.2 ms of waking Numba's threads, where a
LayerNorm of benchmark config A's takes 0.015 ms on one thread (docs/performance.md).
The results are the same bits whatever the thread count: LayerNorm's column sums are
taken per block and the blocks' added in order. The loops are vectorized 16 float32
lanes wide where the processor has AVX-512 (``_allow_512_bit_vectors``). The first
call for each dtype compiles (a few seconds, then cached on disk beside this file);
the arrays are made contiguous first, so that one layout is compiled.
"""

import functools
import importlib.util
import math
import os
import threading

from ..backend import xp
from ..nn.functional import INV_SQRT_2PI, SQRT_HALF
from .blocks import each_block
from .elementwise import (
    ERFC_P,
    ERFC_T,
    PHI_NEAR,
    PHI_NEAR_EDGE,
    softmax_backward_inplace,
    softmax_inplace,
    softmax_shift,
)

INSTALLED = importlib.util.find_spec("numba") is not None  # imported at the first call

ENVIRONMENT_VARIABLE = "TINYVIT_NUMBA"  # "0": the NumPy blocks even where Numba is installed
_chosen = None  # set_compiled's choice, None: the environment's


def compiled():
    """Whether the kernels here run (Numba installed, its compiler on, and not turned off)."""
    if not INSTALLED or jit_disabled():
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
    if on and jit_disabled():
        raise ValueError("set_compiled(True) needs Numba's compiler, which NUMBA_DISABLE_JIT "
                         f"turns off (it is {os.environ['NUMBA_DISABLE_JIT']!r})")
    _chosen = on


def jit_disabled():
    """Whether ``NUMBA_DISABLE_JIT`` turns Numba's compiler off, read as Numba reads it
    (a whole number, not 0; anything else is ignored): Numba then runs its functions as
    Python, where these loops' intrinsics cannot run, so the NumPy blocks run instead."""
    try:
        return int(os.environ.get("NUMBA_DISABLE_JIT", "0")) != 0
    except ValueError:
        return False


# -- exp in float32 ----------------------------------------------------------------------

F, I32 = xp.float32, xp.int32  # numpy's: the loops run on the CPU
LOG2E = F(1 / math.log(2))
LN2_HI, LN2_LO = F(0.693145751953125), F(math.log(2) - 0.693145751953125)  # ln 2 = HI + LO
HALF, ONE, ZERO = F(0.5), F(1.0), F(0.0)
# e^r for |r| <= ln 2 / 2 by a polynomial of degree 6 (lowest power first), 1 + r P(r), P fitted
# to (e^r - 1) / r by weighted least squares iterated towards the minimax of the relative error
# (Lawson): 2.0e-9 in exact arithmetic, so the float32 rounding of its evaluation is all that
# is left (1e-7), as with the eight terms of the series it replaced, in one multiply-add fewer.
EXP_R = (1.0, 1.0000000327099992, 0.49999994107685664, 0.16666428578704784,
         0.04166801766494323, 0.008374388705166365, 0.0013843381983537598)
E0, E1, E2, E3, E4, E5, E6 = (F(c) for c in EXP_R)


def exp2_int(n):
    """2^n, float32, for a whole number n in [-126, 127]: what ``_exp2_bits``, which
    replaces it once Numba is imported, computes."""
    return F(2.0**n)


def _exp2_bits(numba):
    """``exp2_int`` compiled: the float32 whose exponent field is n + 127 and whose
    fraction is 0, built from its bits, an integer add, shift and reinterpretation
    that vectorize (``math.ldexp`` is a library call per element)."""
    from llvmlite import ir

    @numba.extending.intrinsic
    def exp2_bits(typingctx, n):
        def codegen(context, builder, signature, args):
            int32 = ir.IntType(32)
            field = builder.add(args[0], ir.Constant(int32, 127))
            return builder.bitcast(builder.shl(field, ir.Constant(int32, 23)), ir.FloatType())
        return numba.float32(numba.int32), codegen

    return exp2_bits


def exp_nonpositive(g):
    """exp(g) for float32 g in [-87, 0], as 2^n e^r: n = g / ln 2 rounded, r = g -
    n ln 2 in [-0.35, 0.35] (ln 2 in two parts, so that r is exact), e^r by ``EXP_R``'s
    polynomial (relative error 1e-7), 2^n from its bits: no library call, so
    a loop calling it compiles to vector instructions (compiled in place by ``_numba``)."""
    n = I32(g * LOG2E - HALF)  # rounds: g * LOG2E <= 0, and int() truncates
    r = (g - F(n) * LN2_HI) - F(n) * LN2_LO
    e_r = E0 + r * (E1 + r * (E2 + r * (E3 + r * (E4 + r * (E5 + r * E6)))))
    return e_r * exp2_int(n)


# -- Numba -------------------------------------------------------------------------------


_numba_ready = None  # Numba, once _numba has set it up
_setting_up = threading.Lock()  # threads whose first kernel comes at once set it up once


def _numba():
    """Numba, imported, ``exp2_int`` and ``exp_nonpositive`` compiled."""
    global _numba_ready, exp2_int, exp_nonpositive
    with _setting_up:
        if _numba_ready is None:
            import numba
            import numba.extending

            _allow_512_bit_vectors(numba)
            exp2_int = _exp2_bits(numba)
            exp_nonpositive = numba.njit(fastmath=True, cache=True)(exp_nonpositive)
            _numba_ready = numba
    return _numba_ready


def _allow_512_bit_vectors(numba):
    """Let LLVM vectorize with AVX-512's 512-bit registers where the processor has them.

    LLVM's tuning for Intel's AVX-512 processors prefers 256-bit vectors ("prefer-256-bit",
    against the clock slowdown of the first AVX-512 chips), so a loop of 16 float32 lanes ran
    as two halves: turned off, the compiled GELU took about half the time on an Intel Xeon
    (docs/performance.md); AMD's Zen 4 is tuned for 512-bit vectors already.
    Numba's processor features are one setting for the whole process, fixed when its CPU
    target is made, at the first ``@njit`` (anyone's): Numba code decorated afterwards is
    built the same way. Where the target was made before (by the user's code or a library
    imported earlier), or ``NUMBA_CPU_FEATURES``/``NUMBA_CPU_NAME`` set the features, they
    are left as they are, and these loops run 256 bits wide."""
    from numba.core.codegen import get_host_cpu_features
    from numba.core.registry import cpu_target

    made = "_toplevel_target_context" in vars(cpu_target)  # its cached property, once made
    features = get_host_cpu_features()  # "+avx2,+avx512f,..." (or "-avx512f")
    if not made and numba.config.CPU_FEATURES is None and numba.config.CPU_NAME is None \
            and "+avx512f" in features.split(","):
        numba.config.CPU_FEATURES = features + ",-prefer-256-bit"


def check_shapes(kernel, **arrays):
    """Raise ValueError unless every array has its shape (``name=(array, shape)``): the
    compiled loops index without bounds checks, so an array of another shape would be
    read or written past its end."""
    for name, (a, shape) in arrays.items():
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{kernel}: {name} must have shape {tuple(shape)} (as its "
                             f"input's), got {tuple(a.shape)}")


@functools.cache
def _compiled(function):
    """``function`` compiled to run on the calling thread, the GIL released: for one
    block of ``blocks.each_block``, whose threads run the blocks side by side; a
    division by 0 gives inf or nan, as NumPy's does (a row of nan stays nan)."""
    return _numba().njit(nogil=True, fastmath=True, cache=True, error_model="numpy")(function)


# -- GELU ---------------------------------------------------------------------------------

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
            gauss = exp_nonpositive(-h) if abs(x) <= GAUSS_EDGE else ZERO  # exp(-x^2 / 2)
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
    kernel = _compiled(_gelu)

    def activate(u, y, dydx=None):  # one block of rows
        kernel(u, bias, y, dydx)

    each_block(activate, u, *((y,) if dydx is None else (y, dydx)))
    return y, dydx


# -- LayerNorm ----------------------------------------------------------------------------


def _layer_norm(x, r, add, w, b, eps, s, xhat, keep, rstd, y):
    """s = x + r (if add), xhat = (s - mean) rstd (kept if keep), y = xhat w + b, row
    by row: the mean and the variance summed in float64, the rest in x's dtype."""
    M, D = x.shape
    cast = x.dtype.type
    for m in range(M):
        mean = 0.0
        for j in range(D):
            v = x[m, j] + r[m, j] if add else x[m, j]
            if add:
                s[m, j] = v
            mean += v
        mu = cast(mean / D)
        var = 0.0
        for j in range(D):
            c = s[m, j] - mu
            var += c * c
        inv = cast(1.0 / math.sqrt(var / D + eps))
        rstd[m, 0] = inv
        for j in range(D):
            h = (s[m, j] - mu) * inv
            if keep:
                xhat[m, j] = h
            y[m, j] = h * w[j] + b[j]


def layer_norm(x, r, weight, bias, eps, keep):
    """(s, xhat or None, rstd, y) for (M, D) x and r (None: s is x); xhat is kept for
    the backward if keep."""
    add = r is not None
    # without r the loop gets x as s, which it types as an array it may write: so a
    # read-only x (a memory-mapped file's, say) is copied
    x = xp.require(x, requirements="C" if add else "CW")
    r = xp.ascontiguousarray(r) if add else x
    M, D = x.shape
    check_shapes("layer_norm", r=(r, (M, D)), weight=(weight, (D,)), bias=(bias, (D,)))
    s = xp.empty(x.shape, dtype=x.dtype) if add else x
    xhat = xp.empty(x.shape if keep else (len(x), 0), dtype=x.dtype)  # (M, 0): not written
    y = xp.empty(x.shape, dtype=x.dtype)
    rstd = xp.empty((len(x), 1), dtype=x.dtype)
    w, b, kernel = xp.ascontiguousarray(weight), xp.ascontiguousarray(bias), _compiled(_layer_norm)

    def normalize(x, r, s, xhat, rstd, y):  # one block of rows
        kernel(x, r, add, w, b, eps, s, xhat, keep, rstd, y)

    each_block(normalize, x, r, s, xhat, rstd, y)
    return s, (xhat if keep else None), rstd, y


def _layer_norm_backward(dout, xhat, rstd, w, dskip, add, dx, dgamma, dbeta):
    """dx row by row (plus dskip, if add), its two means summed in float64, the rest in
    dout's dtype; dgamma, dbeta (D,): the block's column sums, in float64."""
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
            dx[m, j] = v + dskip[m, j] if add else v


def layer_norm_backward(dout, xhat, rstd, weight, dskip):
    """(dx, dgamma, dbeta) for (M, D) dout; dskip (M, D) or None is added to dx. The
    column sums are taken per block and the blocks' added in order."""
    add = dskip is not None
    dout, xhat, rstd = (xp.ascontiguousarray(a) for a in (dout, xhat, rstd))
    dskip = xp.ascontiguousarray(dskip) if add else dout
    M, D = dout.shape
    check_shapes("layer_norm_backward", xhat=(xhat, (M, D)), rstd=(rstd, (M, 1)),
                 weight=(weight, (D,)), dskip=(dskip, (M, D)))
    dx = xp.empty(dout.shape, dtype=dout.dtype)
    w, kernel = xp.ascontiguousarray(weight), _compiled(_layer_norm_backward)

    def gradient(dout, xhat, rstd, dskip, dx):  # one block of rows: its column sums
        dgamma, dbeta = (xp.zeros(dout.shape[1], dtype=xp.float64) for _ in range(2))
        kernel(dout, xhat, rstd, w, dskip, add, dx, dgamma, dbeta)
        return dgamma, dbeta

    dgamma, dbeta = (xp.zeros(dout.shape[1], dtype=xp.float64) for _ in range(2))
    for block_dgamma, block_dbeta in each_block(gradient, dout, xhat, rstd, dskip, dx):
        dgamma += block_dgamma  # in block order: the same bits on any thread count
        dbeta += block_dbeta
    return dx, dgamma.astype(dout.dtype), dbeta.astype(dout.dtype)


# -- softmax and its backward, on one block of the attention's -----------------------------

LOWEST_EXPONENT = F(-87.0)  # exp_nonpositive's domain ends here: exp(-87) = 1.6e-38, normal


def takes_block(*arrays):
    """Whether ``softmax_block`` and ``softmax_backward_block`` compile for these
    arrays: compiled() says so, and they are C-contiguous float32 or float64 (the
    backward; the forward float32 alone, as its exp) of one dtype, not empty."""
    return (compiled() and arrays[0].dtype in (xp.float32, xp.float64) and arrays[0].size > 0
            and all(a.dtype == arrays[0].dtype and a.flags.c_contiguous for a in arrays))


def _softmax(S, shift):
    """S <- exp(S - c) / sum exp(S - c), row by row, c the row's shift, in float32
    (exp by ``exp_nonpositive``, its argument held at -87 or above)."""
    R, N = S.shape
    for r in range(R):
        total = ZERO
        for j in range(N):
            e = exp_nonpositive(max(S[r, j] - shift[r, 0], LOWEST_EXPONENT))
            S[r, j] = e
            total += e
        inverse = ONE / total
        for j in range(N):
            S[r, j] *= inverse


def softmax_block(S):
    """``elementwise.softmax_inplace`` for one block of the attention's (b, NH, Q, N)
    scores, on the calling thread, written into S: compiled for float32 where
    ``takes_block`` says so, else in NumPy. The shift c is NumPy's
    (``softmax_shift``: its max over the block is vector code, the compiled loop's
    over a row was not)."""
    if not (takes_block(S) and S.dtype == xp.float32):
        return softmax_inplace(S)
    rows = S.reshape(-1, S.shape[-1])
    shift = softmax_shift(rows)
    shift = shift if shift.ndim else xp.full((len(rows), 1), shift, dtype=S.dtype)
    _compiled(_softmax)(rows, shift)
    return S


def _softmax_backward(A, dA, scale):
    """dA <- scale A (dA - sum_j dA_j A_j), row by row, the sum in A's dtype (in
    float64, converting every element, it took a fifth longer)."""
    R, N = A.shape
    zero = A.dtype.type(0.0)
    for r in range(R):
        total = zero
        for j in range(N):
            total += dA[r, j] * A[r, j]
        for j in range(N):
            dA[r, j] = scale * A[r, j] * (dA[r, j] - total)


def softmax_backward_block(A, dA, scale=1.0):
    """``elementwise.softmax_backward_inplace`` for one block of the attention's
    (b, NH, Q, N) arrays, on the calling thread, dS (times ``scale``) written into dA:
    compiled where ``takes_block`` says so, else in NumPy."""
    if not takes_block(A, dA):
        return softmax_backward_inplace(A, dA, scale)
    check_shapes("softmax_backward_block", dA=(dA, A.shape))
    N = A.shape[-1]
    _compiled(_softmax_backward)(A.reshape(-1, N), dA.reshape(-1, N), A.dtype.type(scale))
    return dA
