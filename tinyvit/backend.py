"""The one array backend: NumPy by default, CuPy on a GPU.

Every other module does ``from .backend import xp`` and writes ``xp.exp(x)``;
``xp`` forwards to whichever array module is active, so switching backend is
one call (``tinyvit.set_backend("cupy")``) or one environment variable
(``TINYVIT_BACKEND=cupy``, in any case, read where the backend is first needed:
see ``_module``). This is the only file that imports numpy or cupy by name for
array work.

Also here: moving arrays between host and device, a seeded random generator on
the active backend, and the default float dtype (float32 for training, float64
for gradient checks).
"""

import os
from contextlib import contextmanager, nullcontext

import numpy

BACKENDS = ("numpy", "cupy")
ENVIRONMENT_VARIABLE = "TINYVIT_BACKEND"

_active = None  # numpy or cupy; None until set_backend or the first use (_module) sets it
_default_dtype = numpy.float32


class _ArrayModule:
    """Forwards attribute access to the active array module (numpy or cupy)."""

    def __getattr__(self, name):
        return getattr(_active or _module(), name)  # on every xp.f: _module() until one is set

    def __repr__(self):
        return f"<tinyvit array module: {get_backend()}>"


xp = _ArrayModule()


class BackendError(RuntimeError):
    """The backend asked for cannot run here: CuPy is missing, or CUDA sees no GPU."""


def _module():
    """The active array module. Until ``set_backend`` chooses one, the first call
    takes the one ``TINYVIT_BACKEND`` names: read at first use, not at import, so
    that a backend chosen in code (a command's ``--backend``) wins over the
    variable, and a bad value is an error where the backend is needed, not a
    traceback of ``import tinyvit``."""
    if _active is None:
        name = environment_backend()
        try:
            set_backend(name)
        except BackendError as error:  # named: it comes from the environment
            raise BackendError(f"{ENVIRONMENT_VARIABLE}={name!r}: {error}") from None
    return _active


def environment_backend():
    """The backend ``TINYVIT_BACKEND`` names, in any case ("NumPy", "CUPY"): numpy where
    it is unset or empty; a ValueError naming the variable, its value and the accepted
    ones otherwise."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    name = value.lower() or "numpy"
    if name not in BACKENDS:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: expected {' or '.join(BACKENDS)} (in any "
                         f"case), got {value!r}")
    return name


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendError(
            "backend 'cupy' needs CuPy: install it with `pip install tinyvit[gpu]` "
            "(or the cupy-cudaXXx wheel matching your CUDA)"
        ) from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDA driver missing or broken
        raise BackendError(f"backend 'cupy' needs a CUDA GPU, but CUDA says: {e}") from e
    if count == 0:
        raise BackendError("backend 'cupy' needs a CUDA GPU, but none was found")
    return cupy


def set_backend(name):
    """Make ``name`` ("numpy" or "cupy") the active array backend."""
    global _active
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    _active = numpy if name == "numpy" else _import_cupy()


def get_backend():
    """Name of the active backend: "numpy" or "cupy"."""
    return _module().__name__


def on_cpu():
    """True when the active backend is NumPy (arrays live on the host)."""
    return _module() is numpy


def cupy_available():
    """True when CuPy imports and sees at least one GPU."""
    try:
        _import_cupy()
    except BackendError:
        return False
    return True


@contextmanager
def using_backend(name):
    """Run a block under another backend, then restore the previous one (or none
    chosen yet: ``TINYVIT_BACKEND`` is then read where the backend is next needed)."""
    global _active
    previous = _active
    set_backend(name)
    try:
        yield
    finally:
        _active = previous


def set_default_dtype(dtype):
    """Float dtype new parameters and data get: float32 (training) or float64 (checks)."""
    global _default_dtype
    _default_dtype = float_dtype(dtype)


def get_default_dtype():
    return _default_dtype


def float_dtype(dtype=None):
    """The float type to build with: ``dtype`` (a name such as "float64", or a type)
    checked to be float32 or float64, or the default dtype when it is None."""
    if dtype is None:
        return _default_dtype
    checked = numpy.dtype(dtype)
    if checked not in (numpy.float32, numpy.float64):
        raise ValueError(f"dtype must be float32 or float64, got {checked}")
    return checked.type


@contextmanager
def default_dtype(dtype):
    """Run a block with another default float dtype."""
    previous = _default_dtype
    set_default_dtype(dtype)
    try:
        yield
    finally:
        set_default_dtype(previous)


def to_device(a, dtype=None):
    """An array on the active backend (a no-op for one already there)."""
    return _module().asarray(a, dtype=dtype)


def to_host(a):
    """A NumPy array on the host (a no-op for one already there)."""
    if isinstance(a, numpy.ndarray):
        return a
    if hasattr(a, "get"):  # a cupy array
        return a.get()
    return numpy.asarray(a)


def unpooled_bytes(nbytes):
    """A uint8 array of ``nbytes`` in memory of its own: on a GPU allocated directly
    (cudaMalloc), not from whichever memory pool is active (a CUDA graph's private
    one, which may go before the array does), and freed with the array."""
    if on_cpu():
        return numpy.empty(nbytes, dtype=numpy.uint8)
    cupy = _module()
    memory = cupy.cuda.MemoryPointer(cupy.cuda.Memory(nbytes), 0)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=memory)


def nccl():
    """CuPy's NCCL binding (``cupy.cuda.nccl``: sums across GPUs), or None on NumPy or
    where CuPy came without NCCL."""
    if on_cpu():
        return None
    from cupy.cuda import nccl as binding

    return binding if binding.available else None


def write(a, values):
    """Copy host ``values`` (a sequence or NumPy array of a's shape) into the array
    ``a`` in place; on a GPU queued on the current stream, the host not waiting. Not
    inside a captured CUDA graph, which refuses copies from the host: write before."""
    if on_cpu():
        a[...] = values
    else:
        a.set(numpy.ascontiguousarray(values, dtype=a.dtype).reshape(a.shape))


def address(a):
    """The address of an array's first value, in host or device memory (for a C call)."""
    return a.ctypes.data if isinstance(a, numpy.ndarray) else a.data.ptr


def copied(a):
    """A copy of an array of the active backend; anything else (a number) as it is: what a
    caller keeps of a value it hands to code that may change it in place."""
    return a.copy() if is_array(a) else a


def is_array(a):
    """True for an ndarray of the active backend."""
    return isinstance(a, _module().ndarray)


def rng(seed):
    """A seeded random generator on the active backend.

    ``seed`` is an int or a tuple of ints (e.g. ``(seed, step)``): both backends
    turn it into a generator state through NumPy's SeedSequence. Code uses only
    what the two share: ``random(size, dtype)``, ``standard_normal(size, dtype)``,
    ``integers(low, high, size)`` and ``permutation(n)``.
    """
    return _module().random.default_rng(seed)


def host_rng(seed):
    """A seeded NumPy generator on the host, whatever the backend (for weight init
    and data order, so a seed means the same thing on NumPy and on CuPy)."""
    return numpy.random.default_rng(seed)


def quiet_overflow():
    """A context in which NumPy does not warn of overflow or invalid values (inf,
    nan): for the training step, where the divergence check reports them in one line
    instead. CuPy never warns, so there it does nothing."""
    return numpy.errstate(over="ignore", invalid="ignore") if on_cpu() else nullcontext()


def synchronize():
    """Wait for the GPU to finish queued work (for timing); a no-op on NumPy."""
    if not on_cpu():
        _module().cuda.get_current_stream().synchronize()

