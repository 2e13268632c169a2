"""Data parallelism on the CPU: each batch split over worker processes.

Why: at the sizes tinyvit trains on a laptop, most of a NumPy training step is
elementwise work (LayerNorm, GELU, softmax, bias, residual) that NumPy runs on
one core, and small matmuls that OpenBLAS's second thread speeds up little. Two
processes with one BLAS thread and half of the batch each keep two cores busy all
the time (docs/performance.md has the figures).

How: every worker holds a replica of the model; the weights, the batch and the
results travel through shared memory, the commands through a pipe. For one
training step the parent writes the current weights, the images and their
target distributions, and worker w, over its rows [lo_w, hi_w) of the batch:
  1. copies the weights into its replica,
  2. runs forward, loss and backward, the loss weighted by its share B_w / B,
  3. writes its logits and its gradient g_w back.
The loss is a mean over the batch, L = sum_w (B_w / B) L_w with L_w the mean
over worker w's B_w rows, so with that weight (``gradients.py``) its gradient
is sum_w g_w: the parent forms that in its own model's gradient buffer and steps
its optimizer as in a single process. Inference splits the batch the same way,
forward only.
A BatchNorm stem normalizes each worker's share by that share's statistics (as
data-parallel PyTorch does without SyncBatchNorm); each worker updates the
running averages from the same values, and the parent keeps their mean, which
every worker reads back with the weights at the next command.

Each worker builds its replica of the model with the parent's code: the fast
kernels when the parent's model has them (``tinyvit.fast.accelerate``), else the
reference layers. A run with W workers is exactly reproducible with W workers. Against one
process each step's gradient differs only by float rounding (the sums run in
another order), and over a run those differences grow as any rounding does.
NumPy only: worker processes share host memory, and a GPU runs one process.
"""

import math
import multiprocessing
import os
import signal
import time
import traceback

from ..allocator import keep_freed_memory
from ..backend import default_dtype, on_cpu, quiet_overflow, xp
from ..fast import accelerate, cpu_numba, mkl
from ..fast.blocks import ENVIRONMENT_VARIABLE, available_cores
from ..models import ViT
from ..nn.loss import SoftmaxCrossEntropy
from .gradients import loss_and_gradients, rows, share_seed

MAX_AUTO_WORKERS = 4  # the gain was measured on 2 cores only: more small shares are untested

# what a worker's environment must say when it starts: NumPy, and one BLAS thread and one
# thread for the fast kernels' blocks (each worker computes on one core)
_WORKER_ENV = {"TINYVIT_BACKEND": "numpy", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", ENVIRONMENT_VARIABLE: "1"}


def worker_environment():
    """``_WORKER_ENV`` and the parent's choice of compiled kernels and of MKL, which a
    spawned worker would otherwise read again from the environment (``set_compiled`` and
    ``set_enabled`` in the parent's code would be lost)."""
    return {**_WORKER_ENV, cpu_numba.ENVIRONMENT_VARIABLE: str(int(cpu_numba.compiled())),
            mkl.ENVIRONMENT_VARIABLE: str(int(mkl.enabled()))}


def auto_workers(backend="numpy"):
    """The default worker count: one per core on NumPy (at most MAX_AUTO_WORKERS),
    a single process on a GPU."""
    return min(available_cores(), MAX_AUTO_WORKERS) if backend == "numpy" else 1


class WorkerDied(RuntimeError):
    """A worker process ended in the middle of a command (killed, out of memory): the
    step it was part of did not happen."""


class DataParallel:
    """Worker processes that compute a model's gradients and logits on shares of
    a batch. Use as a context manager (it starts and stops the processes):

        with DataParallel(model, workers=2, max_batch=500) as parallel:
            loss, logits = parallel.gradients(x, targets)   # grads in model's buffer
            logits = parallel.forward(x)                    # inference

    ``model`` stays the parent's: its weights are what the workers compute with
    (read at every call), its gradient buffer is where ``gradients`` writes.
    """

    def __init__(self, model, workers, max_batch):
        if not on_cpu():
            raise ValueError("DataParallel needs the NumPy backend (its workers share host "
                             "memory); on a GPU train with workers=1")
        if workers < 2:
            raise ValueError(f"DataParallel: expected at least 2 workers, got {workers}")
        self.workers, self.max_batch = workers, max_batch
        self.data, self.grad, _ = model.flat_parameters()
        self.buffers = model.flat_buffers()  # BatchNorm's running averages, if any
        config = model.config
        self.fast = any(m.tier == "fast" for _, m in model.named_modules())  # the workers' too
        # a fresh interpreter: no forked BLAS threads
        context = multiprocessing.get_context("spawn")
        shapes = {
            "weights": (self.data.size,),
            "grads": (workers, self.data.size),
            "images": (max_batch, config.in_channels, config.image_size, config.image_size),
            "targets": (max_batch, config.num_classes),
            "logits": (max_batch, config.num_classes),
            "buffers": (self.buffers.size,),
            "worker_buffers": (workers, self.buffers.size),
        }
        dtype = self.data.dtype.str
        raw = {name: context.RawArray("b", math.prod(shape) * self.data.itemsize)
               for name, shape in shapes.items()}
        self.shared = {name: _view(raw[name], shape, dtype) for name, shape in shapes.items()}
        self.pipes, self.processes, self._worker_ends = [], [], []
        for rank in range(workers):
            parent_end, worker_end = context.Pipe()
            args = (rank, config, dtype, self.fast,
                    {name: (raw[name], shapes[name], dtype) for name in shapes}, worker_end)
            self.pipes.append(parent_end)
            self._worker_ends.append(worker_end)
            self.processes.append(context.Process(target=_worker, args=args, daemon=True,
                                                  name=f"tinyvit-worker-{rank}"))

    def __enter__(self):
        environment = worker_environment()
        saved = {k: os.environ.get(k) for k in environment}
        os.environ.update(environment)  # a spawned worker inherits the environment at start
        try:
            for process in self.processes:
                process.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        for end in self._worker_ends:
            end.close()  # the worker holds it now; so a worker's exit reads as EOF here
        return self

    def __exit__(self, *exc):
        for pipe, process in zip(self.pipes, self.processes):
            if process.is_alive():
                try:
                    pipe.send(None)  # stop after the command in hand, if any
                except (BrokenPipeError, OSError):
                    pass
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join()

    def shards(self, n):
        """Rows [lo, hi) of a batch of n for each worker, sizes within 1 of each other."""
        return [rows(n, w, self.workers) for w in range(self.workers)]

    def gradients(self, x, targets, seed=0):
        """Loss (mean over the batch) and logits of ``x`` (B, C, H, W) against
        ``targets`` (B, K) distributions; the gradient of that loss is left in the
        model's flat gradient buffer. ``seed`` seeds the dropout masks (worker w
        uses (seed, w))."""
        n = len(x)
        self.shared["targets"][:n] = targets
        self.grad.fill(0)
        loss = 0.0
        averages = xp.zeros_like(self.buffers)
        for rank, lo, hi, worker_loss in self._run("train", x, seed):
            share = (hi - lo) / n  # the worker's gradient is its share's part already
            self.grad += self.shared["grads"][rank]
            loss += share * worker_loss
            averages += share * self.shared["worker_buffers"][rank]
        # each worker updated the running averages with its share's statistics: their mean
        self.buffers[...] = averages
        return loss, self.shared["logits"][:n].copy()

    def forward(self, x):
        """Logits of ``x`` in inference mode (no dropout, no caches)."""
        self._run("eval", x)
        return self.shared["logits"][: len(x)].copy()

    def eval(self):
        """For ``train.evaluate``, which takes a model: ``forward`` is always inference."""
        return self

    def _run(self, mode, x, seed=0):
        """Send one command to every worker with rows to do; wait for all replies.
        Returns (rank, lo, hi, reply) per worker that ran."""
        n = len(x)
        if not 1 <= n <= self.max_batch:
            raise ValueError(
                f"DataParallel: expected a batch of 1 to {self.max_batch} images, got {n}"
            )
        self.shared["images"][:n] = x
        self.shared["weights"][...] = self.data  # the weights the optimizer wrote last
        self.shared["buffers"][...] = self.buffers
        shards = [(rank, lo, hi) for rank, (lo, hi) in enumerate(self.shards(n)) if hi > lo]
        try:
            for rank, lo, hi in shards:
                self.pipes[rank].send((mode, lo, hi, n, seed))
            # all, so none is left unread
            replies = [self.pipes[rank].recv() for rank, _, _ in shards]
        except (EOFError, OSError):  # a worker gone: end of file, broken pipe or reset connection
            raise WorkerDied(
                f"tinyvit worker process exited unexpectedly: {self._exited()}") from None
        for (rank, _, _), (status, value) in zip(shards, replies):
            if status == "error":
                raise RuntimeError(f"tinyvit worker {rank} failed:\n{value}")
        return [(rank, lo, hi, value) for (rank, lo, hi), (_, value) in zip(shards, replies)]

    def _exited(self, wait=2.0):
        """The workers that have exited, with their exit codes. A worker's end of the pipe
        closes as it exits, a moment before the system reports it gone: up to ``wait``
        seconds for that, and a tenth of a second more for others killed with it (all of
        them, by one ``kill``)."""
        deadline = time.monotonic() + wait
        while not any(not p.is_alive() for p in self.processes):
            if time.monotonic() > deadline:
                return "none has ended, but one closed its end of the pipe"
            time.sleep(0.01)
        time.sleep(0.1)
        gone = [p for p in self.processes if not p.is_alive()]
        return ", ".join(f"{p.name} (exit code {p.exitcode})" for p in gone)


def _view(raw, shape, dtype):
    """A NumPy array over a shared buffer."""
    return xp.frombuffer(raw, dtype=dtype).reshape(shape)


def _worker(rank, config, dtype, fast, arrays, pipe):
    """A worker's loop: one command per message until None."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # for the parent, which saves the run and
        signal.signal(sig, signal.SIG_IGN)     # then stops its workers
    keep_freed_memory()  # this process is tinyvit's own: reuse freed arrays' pages
    shared = {name: _view(*spec) for name, spec in arrays.items()}
    with default_dtype(dtype):
        model = ViT(config)  # its weights are overwritten from shared memory at every command
    if fast:  # the parent's code
        accelerate(model)
    weights, grad, _ = model.flat_parameters()
    buffers = model.flat_buffers()
    criterion = SoftmaxCrossEntropy()  # targets come as distributions, label smoothing applied
    while (command := _receive(pipe)) is not None:
        mode, lo, hi, n, seed = command
        try:
            weights[...] = shared["weights"]
            buffers[...] = shared["buffers"]
            x = shared["images"][lo:hi]
            if mode == "eval":
                if model.training:  # switching walks every module: only when the mode changes
                    model.eval()
                shared["logits"][lo:hi] = model.forward(x)
                pipe.send(("ok", None))
                continue
            with quiet_overflow():  # as Trainer.step: the divergence check reports it
                loss, logits = loss_and_gradients(model, criterion, x, shared["targets"][lo:hi],
                                                  share_seed(seed, rank), (hi - lo) / n)
            shared["grads"][rank] = grad
            shared["worker_buffers"][rank] = buffers
            shared["logits"][lo:hi] = logits
            pipe.send(("ok", float(loss)))
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone: so is the run
            return
        except Exception:
            pipe.send(("error", traceback.format_exc()))


def _receive(pipe):
    """The parent's next command; None to stop, also when the parent is gone (killed:
    its end of the pipe closed without a word)."""
    try:
        return pipe.recv()
    except (EOFError, ConnectionResetError):
        return None
