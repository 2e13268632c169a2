"""The GPU tier's matrix products: cuBLAS called directly, so that a CUDA graph can capture them.

CuPy's own matmul goes through its cuBLAS wrapper, which refuses every call while a
stream is being captured into a CUDA graph (``graphs.py``). cuBLAS itself can be
captured (its kernels read their arguments when they are queued) once a handle has
its stream and a workspace of its own. So the GPU tier multiplies through this
file: ``matmul`` for row-major arrays, as NumPy's, and ``gemm``, the one call
into the library (``cublas<S|D>gemmStridedBatched``, through ctypes).

cuBLAS is column-major: it reads a buffer of a row-major (r, c) matrix as the
column-major (c, r) matrix, its transpose. So C = op(a) op(b), row-major, is
asked for as its transpose, C^T = op(b)^T op(a)^T: b comes first, a second, and
each operand's leading dimension is the length of its stored rows.

Without a GPU, ``tests/test_cuda_sources.py`` runs the GPU layers with ``gemm``
replaced by a NumPy model of cuBLAS's column-major contract (``cuda_mirrors.py``),
and this binding over a stand-in libcublas compiled for the CPU
(``tests/fake_cublas.c``), which checks the C types and the order of the calls.
"""

import ctypes
import functools
import math
import os
from pathlib import Path

from ..backend import address, unpooled_bytes, xp

WORKSPACE_BYTES = 32 * 1024 * 1024  # what cuBLAS asks for on Hopper GPUs; enough before
DEFAULT_MATH, TF32_MATH = 0, 3  # cublasMath_t: full float32, or TF32 tensor cores (CUPY_TF32=1)


def matmul(a, b, transpose_a=False, transpose_b=False, out=None):
    """op(a) @ op(b) for C-contiguous arrays, op a transpose of the last two axes where
    asked: a (..., m, k) or, transposed, (..., k, m); b (..., k, n) or (..., n, k),
    with a's leading axes, or none (one matrix for every batch). Returns a new
    (..., m, n) array, or adds the product into ``out``, a C-contiguous (..., m, n)
    array of a's dtype (a gradient accumulating), and returns it."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous) or a.dtype != b.dtype:
        raise ValueError(f"matmul: expected C-contiguous arrays of one dtype, got {a.dtype} "
                         f"{a.shape} and {b.dtype} {b.shape}")
    m, k = a.shape[-1:-3:-1] if transpose_a else a.shape[-2:]
    n, k_b = b.shape[-2:] if transpose_b else b.shape[-1:-3:-1]
    batch = a.shape[:-2]
    if k != k_b or b.shape[:-2] not in (batch, ()):
        raise ValueError(f"matmul: cannot multiply {a.shape}{'^T' * transpose_a} by "
                         f"{b.shape}{'^T' * transpose_b}")
    shape = (*batch, m, n)
    beta = 0.0 if out is None else 1.0
    if out is None:
        out = xp.empty(shape, dtype=a.dtype)
    elif out.shape != shape or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise ValueError(f"matmul: out must be C-contiguous {shape} of {a.dtype}, got "
                         f"{out.dtype} {out.shape}")
    gemm(transpose_b, transpose_a, n, m, k,  # C^T (n, m) = op(b)^T (n, k) op(a)^T (k, m)
         1.0, b, max(1, b.shape[-1]), n * k if b.ndim > 2 else 0,
         a, max(1, a.shape[-1]), m * k,
         beta, out, max(1, n), m * n, math.prod(batch))
    return out


def gemm(transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
         stride_c, batch):
    """cuBLAS's strided batched GEMM, column-major: for each of ``batch`` matrices,
    C = alpha op(A) op(B) + beta C, with op(A) (m, k), op(B) (k, n), C (m, n), each
    matrix ``stride_*`` values after the one before it in its array, and op a
    transpose where ``transa``/``transb`` say so. Queued on CuPy's current stream."""
    current_handle().gemm(transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b,
                          beta, C, ldc, stride_c, batch)


def current_handle():
    """The handle of the current GPU, queuing on CuPy's current stream."""
    blas = handle(xp.cuda.Device().id)
    blas.use_stream(xp.cuda.get_current_stream().ptr)
    return blas


@functools.cache
def handle(device):
    """The handle of GPU number ``device`` (made while it is the current one)."""
    return Handle(library())


def library():
    """libcublas as CuPy loaded it: on Linux the file the process has mapped, elsewhere
    the library of CUDA's major version by its name."""
    xp.cuda.device.get_cublas_handle()  # CuPy opens libcublas for its own handle
    major = xp.cuda.runtime.runtimeGetVersion() // 1000
    maps = Path("/proc/self/maps")
    path = mapped_cublas(maps.read_text().splitlines(), major) if maps.exists() else None
    if path is None:
        path = f"cublas64_{major}.dll" if os.name == "nt" else f"libcublas.so.{major}"
    return bind(ctypes.CDLL(path))


def mapped_cublas(maps, major):
    """The path of libcublas among the lines of /proc/self/maps, or None: the one of
    CUDA's ``major`` version where another is mapped too (another library's, say a
    PyTorch built for another CUDA)."""
    paths = sorted({line.split()[-1] for line in maps if "/libcublas.so" in line})
    ours = [path for path in paths if path.endswith(f".so.{major}")]
    return (ours or paths or [None])[0]


def bind(lib):
    """``lib`` with the C types of the functions called here, as cuBLAS declares them."""
    int_, ll, ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    for name in ("cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
        getattr(lib, name).argtypes = [ptr, int_, int_, int_, int_, int_, ptr, ptr, int_, ll, ptr,
                                       int_, ll, ptr, ptr, int_, ll, int_]
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ptr)]
    lib.cublasSetStream_v2.argtypes = [ptr, ptr]
    lib.cublasSetWorkspace_v2.argtypes = [ptr, ptr, ctypes.c_size_t]
    lib.cublasSetMathMode.argtypes = [ptr, int_]
    return lib


def check(status, function):
    if status != 0:  # CUBLAS_STATUS_SUCCESS
        raise RuntimeError(f"cuBLAS {function} failed with status {status} (cublasStatus_t)")


class Handle:
    """A cuBLAS handle of tinyvit's own (CuPy's keeps being CuPy's), with a workspace
    of its own, so that no call allocates: a captured graph keeps using it."""

    def __init__(self, lib):
        self.lib, self.handle, self.stream = lib, ctypes.c_void_p(), None
        check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "Create")
        tf32 = int(os.environ.get("CUPY_TF32", "0")) > 0  # read as CuPy reads it for its matmuls
        check(lib.cublasSetMathMode(self.handle, TF32_MATH if tf32 else DEFAULT_MATH),
              "SetMathMode")
        self.workspace = unpooled_bytes(WORKSPACE_BYTES)  # lives as long as the handle

    def use_stream(self, stream):
        """Queue the next calls on ``stream`` (a pointer; 0 the default stream). Setting
        a stream gives cuBLAS back its default workspace, so ours is set again."""
        if stream == self.stream:
            return
        check(self.lib.cublasSetStream_v2(self.handle, stream or None), "SetStream")
        check(self.lib.cublasSetWorkspace_v2(self.handle, address(self.workspace),
                                             WORKSPACE_BYTES), "SetWorkspace")
        self.stream = stream

    def gemm(self, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C,
             ldc, stride_c, batch):
        """``gemm``'s call, on this handle."""
        single = A.dtype == xp.float32
        T = ctypes.c_float if single else ctypes.c_double
        function = getattr(self.lib, f"cublas{'S' if single else 'D'}gemmStridedBatched")
        alpha, beta = T(alpha), T(beta)  # read when cuBLAS queues its kernel
        check(function(self.handle, int(transa), int(transb), m, n, k, ctypes.addressof(alpha),
                       address(A), lda, stride_a, address(B), ldb, stride_b,
                       ctypes.addressof(beta), address(C), ldc, stride_c, batch),
              "gemmStridedBatched")
