"""The attention's softmax and its backward compiled by Numba (``cpu_numba.py`` says
when they run), on one block of the attention's (b, NH, Q, N) arrays on the calling
thread (``cpu_attention.py`` runs the blocks): ``exp(s - c) / sum exp(s - c)`` row by
row in float32, its shift c NumPy's, and ``dS = A (dA - sum_j dA_j A_j)``."""

from ..backend import xp
from . import cpu_numba
from .cpu_numba import ONE, ZERO, F, check_shapes, compile_for_block
from .elementwise import softmax_backward_inplace, softmax_inplace, softmax_shift

LOWEST_EXPONENT = F(-87.0)  # exp_nonpositive's domain ends here: exp(-87) = 1.6e-38, normal


def takes_block(*arrays):
    """Whether ``softmax_block`` and ``softmax_backward_block`` compile for these
    arrays: ``cpu_numba.compiled()`` says so, and they are C-contiguous float32 or
    float64 (the backward; the forward float32 alone, as its exp) of one dtype, not
    empty."""
    return (cpu_numba.compiled() and arrays[0].dtype in (xp.float32, xp.float64)
            and arrays[0].size > 0
            and all(a.dtype == arrays[0].dtype and a.flags.c_contiguous for a in arrays))


def _softmax(S, shift):
    """S <- exp(S - c) / sum exp(S - c), row by row, c the row's shift, in float32
    (exp by ``exp_nonpositive``, its argument held at -87 or above)."""
    R, N = S.shape
    for r in range(R):
        total = ZERO
        for j in range(N):
            e = cpu_numba.exp_nonpositive(max(S[r, j] - shift[r, 0], LOWEST_EXPONENT))
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
    compile_for_block(_softmax)(rows, shift)
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
    compile_for_block(_softmax_backward)(A.reshape(-1, N), dA.reshape(-1, N), A.dtype.type(scale))
    return dA
