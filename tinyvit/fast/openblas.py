"""OpenBLAS's idle threads told to sleep sooner, so that the blocks' threads get the cores.

After each product, OpenBLAS's worker threads wait for the next one by spinning, for
2^28 processor cycles (about 0.1 s) before they sleep. A training step alternates
products with elementwise work that ``blocks.each_block`` spreads over the same cores,
so for most of a step a spinning OpenBLAS thread holds a core that a block thread is
waiting for, and the blocks run as if on one core fewer (docs/performance.md measures
it: GELU's forward, the attention and the encoder block's backward each took 1.2 to
2 times as long).

``limit_spinning`` shortens that wait to 2^SPIN_LOG2_CYCLES cycles (about 0.5 ms at
2 GHz, still longer than the gap between back-to-back products) in the OpenBLAS that
this process has loaded. OpenBLAS reads the wait from ``OPENBLAS_THREAD_TIMEOUT`` when
it starts its threads, so this sets that variable (unless the user has), has OpenBLAS
read its variables again and stops its threads, as OpenBLAS itself does before a fork;
its next product starts them again, with the new wait. Where no OpenBLAS with those
functions is loaded (NumPy with MKL or Accelerate, a system other than Linux), nothing
changes. ``blocks`` calls it when it first starts threads of its own, from the
thread that runs tinyvit's products; it is meant to run while no other thread is
inside OpenBLAS.
"""

import ctypes
import os

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"  # log2 of the cycles an idle thread spins
SPIN_LOG2_CYCLES = 20
_done = False


def loaded_openblas():
    """The OpenBLAS libraries this process has loaded (paths, from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "openblas" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("lib") and ".so" in p)


def limit_spinning():
    """Shorten the spin of every loaded OpenBLAS's idle threads (once per process);
    returns the libraries changed."""
    global _done
    if _done:
        return []
    _done = True
    os.environ.setdefault(VARIABLE, str(SPIN_LOG2_CYCLES))
    changed = []
    for path in loaded_openblas():
        library = ctypes.CDLL(path)
        if hasattr(library, "openblas_read_env") and hasattr(library, "blas_thread_shutdown_"):
            library.openblas_read_env()  # the variable, read again
            library.blas_thread_shutdown_()  # restarted by the next product, with the new wait
            changed.append(path)
    return changed


def thread_timeout(path):
    """The log2 spin cycles the OpenBLAS at ``path`` uses for its next threads (0: its
    default, 28)."""
    return ctypes.CDLL(path).openblas_thread_timeout()
