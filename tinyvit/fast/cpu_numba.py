"""Numba for the fast CPU tier, where it is installed (``pip install -e ".[numba]"``):
whether its compiled kernels run, and what they share: exp in float32 as vector code, and
how a loop is compiled.

The kernels are the fast CPU tier's that NumPy's blocks leave furthest behind PyTorch's,
one file per family: GELU (``cpu_numba_gelu.py``), LayerNorm and its backward
(``cpu_numba_norm.py``), the attention's softmax and its backward
(``cpu_numba_softmax.py``). A NumPy block still makes one call, and one pass over the
block, per operation: twenty for GELU's formula. Compiled, each element (GELU) or row
(LayerNorm, softmax) goes through the whole formula once, in registers. The formulas are
the blocks' (``elementwise.py``). Compiled, GELU and LayerNorm take a quarter to a half of
the blocks' time, the softmax about four fifths (``benchmarks/compiled.py``, ``ops.py``;
docs/design.md says why these).

``cpu.GELU`` (float32; float64 keeps the exact erf), ``cpu.LayerNorm`` and the attention
(``cpu_attention.py``) call them when ``compiled()`` says so: Numba is installed and
neither ``set_compiled(False)`` nor ``TINYVIT_NUMBA=0`` turned it off. Every loop is
compiled for the calling thread, the GIL released (``compile_for_block``), and runs on
one block of rows at a time on the blocks' threads (``blocks.each_block``), as the NumPy
formulas do: GELU and LayerNorm per block of their rows, the softmax and its backward
inside the attention's blocks. Numba's own parallel loops (``prange``) are not used:
starting one cost 0.07-0.2 ms of waking Numba's threads, where a LayerNorm of benchmark
config A's takes 0.015 ms on one thread (docs/performance.md). The loops are vectorized
16 float32 lanes wide where the processor has AVX-512 (``_allow_512_bit_vectors``). The
first call for each dtype compiles (a few seconds, then cached on disk beside the
kernel's file); the arrays are made contiguous first, so that one layout is compiled.
"""

import functools
import importlib.util
import math
import os
import threading

import numpy as np  # the loops' scalars: they run on the CPU

from .settings import EnvironmentSetting

INSTALLED = importlib.util.find_spec("numba") is not None  # imported at the first call

ENVIRONMENT_VARIABLE = "TINYVIT_NUMBA"  # "0": the NumPy blocks even where Numba is installed
_chosen = None  # set_compiled's choice, None: the environment's


def compiled():
    """Whether the kernels here run (Numba installed, its compiler on, and not turned off)."""
    return _chosen if _chosen is not None else from_environment()


def _read_environment():
    """Whether ``TINYVIT_NUMBA`` is not 0 (unset or empty: 1), Numba installed and its
    compiler on. A bad value is refused with or without Numba."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    setting = value.strip() or "1"
    if setting not in ("0", "1"):
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: expected 1 (compiled, where Numba is "
                         f"installed) or 0 (the NumPy blocks), got {value!r}")
    return setting == "1" and INSTALLED and not jit_disabled()


from_environment = EnvironmentSetting(_read_environment)  # read once (settings.py)


def set_compiled(on):
    """Use the compiled kernels (True), the NumPy blocks (False), or what
    ``TINYVIT_NUMBA`` says (None, read again)."""
    global _chosen
    if not any(on is choice for choice in (True, False, None)):  # 1 and 1.0 are not True
        raise ValueError(f"set_compiled: expected True, False or None, got {on!r}")
    if on and not INSTALLED:
        raise ImportError('set_compiled(True) needs Numba: pip install -e ".[numba]"')
    if on and jit_disabled():
        raise ValueError("set_compiled(True) needs Numba's compiler, which NUMBA_DISABLE_JIT "
                         f"turns off (it is {os.environ['NUMBA_DISABLE_JIT']!r})")
    if on is None:
        from_environment.read_again()  # a bad value is refused here, not by a kernel
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

F, I32 = np.float32, np.int32  # not through xp, which would choose the backend at import
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
    a loop calling it compiles to vector instructions (compiled in place by ``_numba``:
    the kernels' files call it as ``cpu_numba.exp_nonpositive``, an attribute Numba reads
    when it compiles them, so that they get the compiled function, not this one)."""
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
def compile_for_block(function):
    """``function`` compiled to run on the calling thread, the GIL released: for one
    block of ``blocks.each_block``, whose threads run the blocks side by side; a
    division by 0 gives inf or nan, as NumPy's does (a row of nan stays nan)."""
    return _numba().njit(nogil=True, fastmath=True, cache=True, error_model="numpy")(function)
