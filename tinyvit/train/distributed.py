"""Data parallelism across processes, on one machine or many: MPI, through mpi4py.

    mpiexec -n 4 python train_mnist.py --data-dir ../shared/data

Every process that ``mpiexec`` starts runs the same program: it reads the same
data, builds the same model from the same seed and draws the same global batch
of B images (the shuffling and the augmentation come from the (seed, epoch,
step) stream). Then process r, over its rows [lo_r, hi_r) of the batch:
  1. runs forward, loss and backward, the loss weighted by its share
     s_r = (hi_r - lo_r) / B, so that its gradient g_r is its rows' part of the
     batch's gradient g = sum_r g_r (``gradients.py``);
  2. sums g over the processes in place: one Allreduce of the flat gradient
     buffer (``Communicator.sum``), after which every process holds g;
  3. steps its optimizer with g, as every other process does: the weights stay
     the same everywhere without ever being sent.
A second, small Allreduce sums the loss (sum_r s_r L_r, the batch's mean) and
the processes' requests to stop; the logits of the batch are gathered for the
accuracy. A BatchNorm layer becomes ``SyncBatchNorm2d``, which normalizes with
the whole batch's statistics, so a run with N processes computes, up to the
order of float sums, what one process computes at the same global batch. The
dropout masks are the exception: each process draws its own (seeded with its
rank), so a model with dropout trains as well but not identically.

Process 0 alone writes the checkpoints, the metrics and the pictures, prints and
shows the progress bar. Ctrl-C (mpiexec passes SIGINT to every process) or
SIGINT or SIGTERM sent to any one process only raises a flag, which travels in
the small Allreduce: at the same step every process stops (``StopRequested``),
and process 0 saves ``last.npz``. A process that dies cannot take part in the
next Allreduce; mpiexec notices its end and stops the others ("BAD TERMINATION
OF ONE OF YOUR APPLICATION PROCESSES", MPICH's mpiexec says). A process that
meets an error ends them all (``Communicator.abort``): train_mnist.py does so;
a program of your own that calls ``fit`` under mpiexec can run as
``python -m mpi4py program.py``, whose runner does the same.

The processes on one machine share its cores: each limits its BLAS threads to
its part of them (unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS says otherwise),
and the fast CPU kernels' threads too (unless TINYVIT_NUM_THREADS says otherwise).
With a GPU per process, each process takes the GPU of its rank on its machine,
and the device arrays are summed by NCCL (``NCCLSum``), GPU to GPU, never
through host memory; processes that share a GPU (NCCL refuses two ranks on one
device), or a CuPy without NCCL, sum through host memory by MPI.
"""

import functools
import math
import os

import numpy as np  # host-side buffers for MPI

from ..backend import address, nccl, to_host, xp
from ..fast import blocks
from ..nn.conv import BatchNorm2d, SyncBatchNorm2d
from ..nn.loss import SoftmaxCrossEntropy
from .gradients import loss_and_gradients, rows, share_seed
from .signals import Stop

# the variables that mpiexec sets in each process it starts, (size, rank), by MPICH's
# launcher and by Open MPI's
_LAUNCHERS = (("PMI_SIZE", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"))
_THREAD_SETTINGS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


class LaunchError(RuntimeError):
    """A run that cannot start as it was launched; the message says what to change."""


class StopRequested(KeyboardInterrupt):
    """Every process of the run stops at this step: one of them was asked to."""


def launched():
    """(rank, size) of this process as mpiexec started it, read from its
    environment (no MPI needed); (0, 1) outside mpiexec."""
    for size, rank in _LAUNCHERS:
        if size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


MOST_DIVISORS = 6  # numbers of processes suggested for a resumed run


def check_launch(config, size, resumed=False):
    """A LaunchError unless a run of ``config`` can run as ``size`` processes: each
    is one worker, and each batch splits evenly among them. A ``resumed`` run keeps its
    batch, so the advice is then a number of processes."""
    if config.workers > 1:
        raise LaunchError(f"--workers {config.workers} under mpiexec: the {size} processes "
                          "share each batch already; leave --workers out")
    B = config.batch_size
    if B % size == 0:
        return
    if resumed:
        divisors = [n for n in range(2, B + 1) if B % n == 0][:MOST_DIVISORS]
        raise LaunchError(f"the run resumed has a batch of {B} images, which does not divide "
                          f"among {size} processes: resume with mpiexec -n N, N one of "
                          f"{', '.join(map(str, divisors))} (or without mpiexec)")
    raise LaunchError(f"a batch of {B} images does not divide among {size} processes: give a "
                      f"--batch-size that {size} divides (e.g. {B // size * size or size})")


@functools.cache
def communicator():
    """This process's ``Communicator``: one per process, made at the first call."""
    return Communicator()


class Communicator:
    """The collectives data parallelism needs, over mpi4py's COMM_WORLD; making one
    starts MPI and sets this process's share of its machine's cores."""

    def __init__(self):
        try:
            from mpi4py import MPI
            from threadpoolctl import threadpool_limits
        except ImportError as missing:
            raise LaunchError(f"launched by mpiexec as {launched()[1]} processes, but "
                              f"{missing.name} is not installed: pip install -e \".[mpi]\"") \
                from None
        self.MPI, self.world = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        local = self.world.Split_type(MPI.COMM_TYPE_SHARED)  # the processes that share one memory
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        share = max(1, blocks.available_cores() // self.local_size)
        if not any(name in os.environ for name in _THREAD_SETTINGS):
            threadpool_limits(share)
        if not os.environ.get(blocks.ENVIRONMENT_VARIABLE, "").strip():  # unset or empty
            blocks.set_num_threads(share)  # the fast CPU kernels' threads
        self.device_sum = None  # NCCLSum, once each process has a GPU of its own

    def use_local_gpu(self):
        """On CuPy: make this process's GPU the one of its rank on its machine; where
        each process has a GPU of its own and CuPy has NCCL, sum on the GPUs."""
        gpus = xp.cuda.runtime.getDeviceCount()
        xp.cuda.Device(self.local_rank % gpus).use()
        binding = nccl()
        own_gpu = binding is not None and self.local_size <= gpus
        if self.world.allreduce(own_gpu, op=self.MPI.LAND):  # every process, or none
            self.device_sum = NCCLSum(self.world, binding)

    def sum(self, array):
        """``array`` replaced, in place, by its sum over the processes; returns it."""
        if self.device_sum is not None and not isinstance(array, np.ndarray):
            return self.device_sum(array)
        host = to_host(array)  # ``array`` itself on NumPy
        self.world.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        if host is not array:
            array[...] = xp.asarray(host)
        return array

    def gather_rows(self, part, n):
        """The (n, ...) array of every process's ``part``, rows [lo_r, hi_r) of it
        from process r (the split of ``rows``)."""
        part = np.ascontiguousarray(to_host(part))
        whole = np.empty((n, *part.shape[1:]), dtype=part.dtype)
        width = math.prod(part.shape[1:])  # values per row
        counts = [(hi - lo) * width for lo, hi in (rows(n, r, self.size)
                                                   for r in range(self.size))]
        self.world.Allgatherv(part, [whole, counts])
        return xp.asarray(whole)

    def barrier(self):
        """Wait until every process has called it."""
        self.world.Barrier()

    def broadcast(self, value):
        """Process 0's ``value`` (any picklable object), in every process."""
        return self.world.bcast(value, root=0)

    def abort(self, code):
        """End every process of the run with exit status ``code``: on an error in one
        process, the others may be waiting for it in a collective that never ends."""
        self.world.Abort(code)


class NCCLSum:
    """Sums of device arrays over the processes by NCCL's Allreduce (CuPy's
    ``cupy.cuda.nccl``), on the GPUs and over their links. Process 0 draws the
    communicator's id, and MPI hands it to the others; the sum runs on the current
    stream, in order with the kernels before and after it."""

    DTYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}

    def __init__(self, world, binding):
        self.nccl = binding  # cupy.cuda.nccl
        rank, size = world.Get_rank(), world.Get_size()
        unique_id = world.bcast(binding.get_unique_id() if rank == 0 else None, root=0)
        self.comm = binding.NcclCommunicator(size, unique_id, rank)

    def __call__(self, array):
        """``array`` (a contiguous device array) replaced, in place, by its sum."""
        if not array.flags.c_contiguous or array.dtype.name not in self.DTYPES:
            raise ValueError(f"NCCLSum: expected a contiguous float32 or float64 array, got "
                             f"{array.dtype} {'' if array.flags.c_contiguous else 'strided '}"
                             f"shape {array.shape}")
        dtype = getattr(self.nccl, self.DTYPES[array.dtype.name])
        self.comm.allReduce(address(array), address(array), array.size, dtype,
                            self.nccl.NCCL_SUM, xp.cuda.get_current_stream().ptr)
        return array


def synchronize_batchnorm(model, comm):
    """Every BatchNorm2d of ``model`` (the GPU kernel's too, which takes its
    statistics in one process) made a SyncBatchNorm2d over the processes of
    ``comm`` (a Communicator)."""
    for _, module in model.named_modules():
        if isinstance(module, BatchNorm2d) and not isinstance(module, SyncBatchNorm2d):
            module.__class__ = SyncBatchNorm2d
            module.sum_over_processes = comm.sum


class MPIParallel:
    """This process's part of a data-parallel run, with the interface of the
    worker processes (``parallel.DataParallel``): the trainer and ``evaluate`` run
    either the same way.

        with MPIParallel(model, communicator()) as parallel:
            loss, logits = parallel.gradients(x, targets, seed)  # the batch's gradient
            logits = parallel.forward(x)                         # inference

    ``x`` is the whole batch, the same in every process; each computes its rows.
    Inside ``with``, SIGINT and SIGTERM ask every process to stop (the flag of
    ``stop``, a ``signals.Stop``; one of its own when none is given): the next
    ``gradients`` or ``forward`` raises StopRequested (a KeyboardInterrupt) in all
    of them, and leaving ``with`` waits for all.
    """

    def __init__(self, model, comm, stop=None):
        self.model, self.comm = model, comm
        _, self.grad, _ = model.flat_parameters()
        self.criterion = SoftmaxCrossEntropy()  # targets come as distributions
        synchronize_batchnorm(model, comm)
        self.stop, self._own_stop = stop or Stop(), stop is None

    def __enter__(self):
        if self._own_stop:
            self.stop.__enter__()
        return self

    def __exit__(self, exc_type, *exc):
        if self._own_stop:
            self.stop.__exit__(exc_type, *exc)
        if exc_type is None or exc_type is StopRequested:  # every process is here: leave
            self.comm.barrier()  # together, once the first has written its files

    @property
    def stop_requested(self):
        return self.stop.requested is not None

    def _rows(self, n):
        if n < self.comm.size:
            raise ValueError(f"a batch of {n} images cannot be split over {self.comm.size} "
                             "processes: each needs at least one")
        return rows(n, self.comm.rank, self.comm.size)

    def gradients(self, x, targets, seed=0):
        """Loss (mean over the batch) and logits of ``x`` (B, C, H, W) against
        ``targets`` (B, K) distributions; the batch's gradient of that loss is left
        in the model's flat gradient buffer, the same in every process."""
        n = len(x)
        lo, hi = self._rows(n)
        share = (hi - lo) / n
        loss, logits = loss_and_gradients(self.model, self.criterion, x[lo:hi], targets[lo:hi],
                                          share_seed(seed, self.comm.rank), share)
        self.comm.sum(self.grad)
        loss, stops = self.comm.sum(np.array([float(loss) * share, self.stop_requested]))
        self._stop_if(stops)
        return loss, self.comm.gather_rows(logits, n)

    def forward(self, x):
        """Logits of ``x`` in inference mode (no dropout, no caches). A batch of
        fewer images than processes (the last of a test set) leaves some without
        rows: they run nothing and send none."""
        n = len(x)
        lo, hi = rows(n, self.comm.rank, self.comm.size)
        if hi > lo:
            logits = self.model.forward(x[lo:hi])
        else:
            head = self.model.head
            logits = xp.empty((0, head.out_features), dtype=head.weight.data.dtype)
        self._stop_if(self.comm.sum(np.array([self.stop_requested], dtype=float))[0])
        return self.comm.gather_rows(logits, n)

    def eval(self):
        """For ``train.evaluate``, which takes a model."""
        self.model.eval()
        return self

    def _stop_if(self, stops):
        if stops:
            raise StopRequested
