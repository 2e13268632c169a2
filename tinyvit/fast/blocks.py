"""Elementwise work in cache-sized blocks of rows, spread over the CPU's cores: the
one helper every elementwise kernel of the fast CPU tier runs on.

NumPy makes one pass over memory per operation: ``y = x * w + b`` reads x, writes
a temporary, reads it back, writes y. A kernel of ten operations on arrays larger
than the cache so costs ten passes over main memory. ``each_block`` runs the
whole chain on one block of rows at a time, a block small enough that it and its
temporaries stay in the core's L2 cache, so that the chain reads its inputs and
writes its outputs about once:

    def kernel(x, y):            # x, y: the same block of rows of each array
        xp.multiply(x, w, out=y)
        y += b

    each_block(kernel, x, y)     # kernel(x[rows], y[rows]) for every block of rows

The blocks are shared out over a pool of threads, one per core: NumPy's ufuncs
and BLAS calls release the GIL, so the threads run at the same time (and OpenBLAS's
own threads, idle between products, are told not to hold the cores: ``openblas.py``).
Each thread claims the next block not yet taken until none is left, the calling
thread from the start, the pool's as they wake: a thread that wakes late (a sleeping
thread can take a large part of a millisecond: docs/performance.md) or runs slower takes
fewer blocks, and no thread waits for a share given in advance to one still asleep.
The pool's threads run each call in a copy of the caller's context, so that NumPy's error
state (``backend.quiet_overflow``, which the training step sets) holds in them too.
A kernel writes its results into the blocks of preallocated outputs (``out=``,
``+=``); what it returns is collected in block order (a partial sum per block, say), so
that a sum over blocks adds up in the same order whatever the thread count.

How many threads: ``set_num_threads(n)``, else the environment variable
``TINYVIT_NUM_THREADS``, else the cores this process may run on
(``os.sched_getaffinity``), read at the first call (``set_num_threads(None)`` reads
them again). The worker processes of ``tinyvit.train.parallel``
start with one thread each, and under MPI each process takes its share of its
machine's cores (``tinyvit.train.distributed``). A process forked from one that
has started the pool starts a pool of its own when it first needs one.
"""

import contextvars
import itertools
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

from .openblas import limit_spinning
from .settings import EnvironmentSetting

ENVIRONMENT_VARIABLE = "TINYVIT_NUM_THREADS"
BLOCK_BYTES = 1 << 18  # 256 KiB of each array per block: a few arrays and temporaries fit L2

_chosen = None  # set_num_threads's count, None: the environment's or the cores'
_pool, _pool_size = None, 0
_pool_lock = threading.Lock()
_inside = threading.local()  # .busy while a thread runs blocks: an inner each_block runs serially


def available_cores():
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _positive(value, what):
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(value).strip() != str(count):
        raise ValueError(f"{what}: expected a whole number of threads >= 1, got {value!r}")
    return count


def num_threads():
    """The threads ``each_block`` spreads its blocks over."""
    return _chosen if _chosen is not None else from_environment()


def _read_environment():
    """``TINYVIT_NUM_THREADS`` (unset or empty: the cores available); a RuntimeWarning
    where it asks for more threads than the cores (they would take turns on them)."""
    setting = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if not setting.strip():
        return available_cores()
    count, cores = _positive(setting, ENVIRONMENT_VARIABLE), available_cores()
    if count > cores:
        warnings.warn(f"{ENVIRONMENT_VARIABLE}={count} is more than the {cores} CPU cores this "
                      f"process may run on: the threads take turns on them, and each kernel "
                      f"is slower than on {cores}", RuntimeWarning)
    return count


from_environment = EnvironmentSetting(_read_environment)  # read once (settings.py)


def set_num_threads(count):
    """Use ``count`` threads from now on (None: back to ``TINYVIT_NUM_THREADS`` or
    the cores available, read again), for the NumPy blocks and the compiled ones
    (``cpu_numba_*.py``) alike."""
    global _chosen
    if count is None:
        from_environment.read_again()  # a bad value is refused here, not by a kernel
    _chosen = None if count is None else _positive(count, "set_num_threads")


def _get_pool(workers):
    """A pool of at least ``workers`` threads (the calling thread is one more). The
    first one also makes OpenBLAS's idle threads yield the cores sooner (``openblas.py``)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            limit_spinning()
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="tinyvit-blocks")
            _pool_size = workers
        return _pool


def _forget_pool():
    """In a forked child: the parent's threads do not exist here."""
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def row_blocks(rows, row_bytes, block_bytes=BLOCK_BYTES):
    """Slices of ``rows`` rows of ``row_bytes`` bytes each, at most about ``block_bytes``
    each (at least one row): as many as that needs, of sizes within one row of each
    other, so that threads given the same number of blocks get the same rows (128
    images in blocks of at most 111 were 111 and 17: one thread did six sevenths of
    the work)."""
    count = -(-rows // max(1, block_bytes // max(1, row_bytes)))  # blocks of at most that
    bounds = [rows * i // count for i in range(count + 1)] if count else []
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


def each_block(kernel, *arrays, block_bytes=BLOCK_BYTES):
    """``kernel(a[rows], b[rows], ...)`` for every block of rows (the first axis) of the
    arrays, spread over ``num_threads()`` threads; returns what each call returned, in
    block order. The arrays must share their first axis; a block holds about
    ``block_bytes`` of the widest one. If a call raises, the blocks not yet begun are
    skipped (their rows of the outputs stay unwritten) and the first exception raised
    (the first in time, where threads run blocks side by side) is raised here, once no
    block is running; so is a KeyboardInterrupt that comes while this waits for them.
    """
    rows = len(arrays[0])
    for a in arrays[1:]:
        if len(a) != rows:
            raise ValueError(f"each_block: every array needs {rows} rows, as the first; "
                             f"got shapes {[tuple(b.shape) for b in arrays]}")
    row_bytes = max(a[:1].nbytes for a in arrays) if rows else 1
    blocks = row_blocks(rows, row_bytes, block_bytes)
    threads = 1 if getattr(_inside, "busy", False) else min(num_threads(), len(blocks))
    if threads <= 1:
        return [kernel(*(a[rows] for a in arrays)) for rows in blocks]
    claims = _Claims(kernel, arrays, blocks)
    pool = _get_pool(threads - 1)
    context = contextvars.copy_context()  # the caller's: NumPy's errstate (quiet_overflow)
    for _ in range(threads - 1):
        try:
            pool.submit(context.copy().run, claims.run)
        except RuntimeError:  # the pool shut down (resized by another thread, or at exit)
            break  # the calling thread claims the blocks no other thread takes
    claims.run()  # the calling thread starts at once; the others join as they wake
    return claims.results()


class _Claims:
    """The blocks of one ``each_block`` call, each claimed by the first thread to ask:
    a thread that wakes late, or runs slower, takes fewer blocks, and none waits for a
    share it was given in advance. ``next`` on an ``itertools.count`` is one step under
    the GIL, so no two threads take the same block; a block's result lands at its
    index, so the order does not depend on which thread ran it."""

    def __init__(self, kernel, arrays, blocks):
        self.kernel, self.arrays, self.blocks = kernel, arrays, blocks
        self.next_block, self.finished = itertools.count(), itertools.count(1)
        self.outcomes = [None] * len(blocks)
        self.failed = None  # the first exception a block raised
        self.all_finished = threading.Event()

    def run(self):
        outer, _inside.busy = getattr(_inside, "busy", False), True
        try:
            while (i := next(self.next_block)) < len(self.blocks):
                if self.failed is None:  # after a failure the blocks left are only counted
                    try:
                        rows = self.blocks[i]
                        self.outcomes[i] = self.kernel(*(a[rows] for a in self.arrays))
                    except BaseException as error:  # re-raised by results(), in the caller
                        self.fail(error)
                if next(self.finished) == len(self.blocks):
                    self.all_finished.set()
        finally:
            _inside.busy = outer

    def fail(self, error):
        self.failed = error if self.failed is None else self.failed

    def results(self):
        """What the blocks' calls returned, in block order, once all have finished; the
        first exception raised, if one was. An interrupt (Ctrl-C) while waiting stops
        the blocks not yet begun, and is raised once the begun ones end."""
        while not self.all_finished.is_set():
            try:
                self.all_finished.wait()
            except BaseException as interrupt:
                self.fail(interrupt)
        outcomes, error = self.outcomes, self.failed
        # a thread waking now finds no block and holds nothing of this call's
        self.kernel = self.arrays = self.outcomes = self.failed = None
        if error is None:
            return outcomes
        try:
            raise error
        finally:
            error = None  # the traceback holds this frame: no cycle back to the exception
