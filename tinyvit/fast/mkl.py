"""The fast CPU tier's Linear products by Intel MKL's gemm, where the ``mkl`` package
is installed (``pip install -e ".[mkl]"``) and the processor is Intel's.

A Linear's three products (x W^T forward, with its bias, dy^T x and dy W backward)
are most of a training step. On an Intel Xeon, NumPy's OpenBLAS ran config C's at
166-214 GFLOP/s and PyTorch's MKL at 229-270 (docs/performance.md). MKL is loaded from the
``mkl`` wheel by ``ctypes`` and asked for its sequential layer: one thread per call,
no OpenMP runtime of its own (whose idle threads would spin on the cores, as
OpenBLAS's did: ``openblas.py``), nothing to break in a forked child. ``matmul``
splits the rows of the product over ``blocks.num_threads()`` threads, each calling
gemm on its share (ctypes releases the GIL during the call). MKL picks its kernel by
the rows it is given, so a product of a few hundred rows can differ in its last bits
with the thread count.

``cpu.Linear`` calls ``matmul`` when ``enabled()`` says so: MKL is installed, and
``TINYVIT_MKL`` is 1, or unset on an Intel processor (on AMD's, MKL ran PyTorch's
products at half OpenBLAS's speed: docs/performance.md). ``set_enabled`` chooses in
code. float32 and float64 operands that are each a row-major matrix or the
transpose of one (the layouts a Linear makes) go to MKL; others to NumPy.
"""

import ctypes
import functools
import importlib.metadata
import os
import platform

from ..backend import xp
from .blocks import each_block, num_threads
from .settings import EnvironmentSetting

ENVIRONMENT_VARIABLE = "TINYVIT_MKL"  # "1": MKL where installed, "0": OpenBLAS; unset: on Intel
SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL, for MKL_Set_Threading_Layer
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's constants
# Products of fewer multiply-adds stay with NumPy's: split over the threads, MKL's took
# 1.15-2x OpenBLAS's time on config A's (2176 x 64 by 64 x 192, 27 million).
MIN_MULTIPLY_ADDS = 1 << 26
_chosen = None  # set_enabled's choice, None: the environment's
_library = None


@functools.cache
def library_path():
    """The path of MKL's single dynamic library (mkl_rt) in the installed ``mkl``
    package, or None."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.split(".")[0] in ("libmkl_rt", "mkl_rt"):
            return str(file.locate())
    return None


@functools.cache
def intel_processor():
    """Whether the processor's maker is Intel: /proc/cpuinfo's vendor_id (Linux), else
    ``platform.processor()`` (Windows names the vendor there)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in cpuinfo)
    except OSError:
        return "GenuineIntel" in platform.processor()


def enabled():
    """Whether ``cpu.Linear`` multiplies by MKL (installed, and chosen or on Intel)."""
    return _chosen if _chosen is not None else from_environment()


def _read_environment():
    """What ``TINYVIT_MKL`` (unset or empty: MKL on Intel), MKL's presence and the
    processor say."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    setting = value.strip()
    if setting not in ("", "0", "1"):
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: expected 1 (MKL's products, where it is "
                         f"installed) or 0 (NumPy's), got {value!r}")
    if setting == "0" or library_path() is None:
        return False
    return setting == "1" or intel_processor()


from_environment = EnvironmentSetting(_read_environment)  # read once (settings.py)


def set_enabled(on):
    """Use MKL (True), NumPy's BLAS (False), or what ``TINYVIT_MKL`` and the processor
    say (None, read again)."""
    global _chosen
    if not any(on is choice for choice in (True, False, None)):
        raise ValueError(f"set_enabled: expected True, False or None, got {on!r}")
    if on and library_path() is None:
        raise ImportError('set_enabled(True) needs MKL: pip install -e ".[mkl]"')
    if on is None:
        from_environment.read_again()  # a bad value is refused here, not by a kernel
    _chosen = on


def _gemm(dtype):
    """MKL's cblas_sgemm or cblas_dgemm, loaded (once) with its sequential layer."""
    global _library
    if _library is None:
        library = ctypes.CDLL(library_path())
        library.MKL_Set_Threading_Layer(SEQUENTIAL)
        for name, real in (("cblas_sgemm", ctypes.c_float), ("cblas_dgemm", ctypes.c_double)):
            function = getattr(library, name)
            function.argtypes = ([ctypes.c_int] * 6 + [real, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_int, real, ctypes.c_void_p,
                                 ctypes.c_int])
            function.restype = None
        _library = library
    return _library.cblas_sgemm if dtype == xp.float32 else _library.cblas_dgemm


def layout(a):
    """(CBLAS's transpose flag, leading dimension) of 2-D a as a row-major matrix (unit
    step along its rows) or the transpose of one (unit step down its columns), else None
    (also for steps that are not whole elements, as in a field of a record array)."""
    if any(step % a.itemsize for step in a.strides):
        return None
    step0, step1 = (step // a.itemsize for step in a.strides)
    if step1 == 1 and step0 >= max(1, a.shape[1]):
        return NO_TRANS, step0
    if step0 == 1 and step1 >= max(1, a.shape[0]):
        return TRANS, step1
    return None


def takes(a, b):
    """Whether ``matmul`` gives a @ b to MKL: 2-D, one dtype of float32 or float64, at
    least MIN_MULTIPLY_ADDS, each in a layout gemm reads."""
    return (a.ndim == b.ndim == 2 and a.dtype == b.dtype and a.dtype in (xp.float32, xp.float64)
            and a.shape[0] * a.shape[1] * b.shape[1] >= MIN_MULTIPLY_ADDS
            and layout(a) is not None and layout(b) is not None)


def matmul(a, b, bias=None):
    """a @ b, (M, K) @ (K, N) -> (M, N), plus ``bias`` (N,) on every row where given, by
    MKL where ``takes`` says so (the rows of the product shared out over
    ``blocks.num_threads()`` threads), else by NumPy. MKL's threads each write the bias
    into their rows first and have gemm add the product to it (beta = 1), which saves
    a pass over the output; the sums may then round differently in their last bit from
    adding the bias afterwards."""
    if not takes(a, b):
        return numpy_matmul(a, b, bias)
    out = xp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    gemm = _gemm(a.dtype)
    (trans_b, ldb), N, K = layout(b), b.shape[1], a.shape[1]
    beta = 0.0 if bias is None else 1.0

    def rows(a, out):  # one thread's share: out = a @ b (+ bias)
        trans_a, lda = layout(a)
        if bias is not None:
            out[...] = bias
        gemm(ROW_MAJOR, trans_a, trans_b, len(a), N, K, 1.0, a.ctypes.data, lda,
             b.ctypes.data, ldb, beta, out.ctypes.data, N)

    share = -(-len(a) // num_threads())  # rows per thread
    each_block(rows, a, out, block_bytes=share * max(a[:1].nbytes, out[:1].nbytes))
    return out


def numpy_matmul(a, b, bias=None):
    """a @ b (+ bias on every row) by NumPy."""
    out = a @ b
    if bias is not None:
        out += bias
    return out
