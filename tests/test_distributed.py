"""Data parallelism across processes under MPI (tinyvit/train/distributed.py): N
processes train the model that one process trains at the same global batch, one
of them writes, and a process that is stopped or dies stops them all.

The tests marked ``mpi`` start ``mpiexec -n 2`` (the MPICH wheel, which the
``test`` extra installs with mpi4py) on ``tests/mpi_fit.py`` and are skipped
where mpiexec or mpi4py is missing; the others run anywhere.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import train_mnist
from conftest import REAL_DATA, gone, randn
from tinyvit.backend import cupy_available, default_dtype, using_backend
from tinyvit.nn.conv import BatchNorm2d, SyncBatchNorm2d
from tinyvit.train import TrainConfig
from tinyvit.train.distributed import LaunchError, check_launch
from tinyvit.train.gradients import rows


def _mpiexec():
    beside = Path(sys.executable).with_name("mpiexec")  # the virtual environment's
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return found


MPIEXEC = _mpiexec()
mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec and mpi4py (the mpi extra)")
FIT = str(Path(__file__).with_name("mpi_fit.py"))
HYBRID = '{"embed_dim": 16, "depth": 1, "num_heads": 2, "stem": [[4, 3, 2], [8, 3, 2]], ' \
         '"patch_size": 1}'


# Open MPI's mpiexec refuses to run as root without these (MPICH's ignores them)
OPEN_MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launch(processes, *args, **popen):
    """``tests/mpi_fit.py`` with ``args``: in this interpreter (processes=1) or
    under ``mpiexec -n processes``."""
    command = [sys.executable, FIT, *map(str, args)]
    if processes > 1:
        command = [MPIEXEC, "-n", str(processes), *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parent, env={**os.environ, **OPEN_MPI_AS_ROOT},
                            **popen)


def run(processes, *args):
    """Run to the end; returns (exit status, stdout)."""
    process = launch(processes, *args)
    out, err = process.communicate(timeout=300)
    return process.returncode, out + err


def weights(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files if k.startswith("model/")}


# ------------------------------------------------------------------ anywhere


@pytest.mark.parametrize("n, size", [(32, 2), (7, 3), (96, 5), (4, 4)])
def test_rows_split_a_batch_in_order_within_one_of_each_other(n, size):
    shares = [rows(n, r, size) for r in range(size)]
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(hi == lo for (_, hi), (lo, _) in zip(shares, shares[1:]))
    sizes = [hi - lo for lo, hi in shares]
    assert max(sizes) - min(sizes) <= 1


class ThreadSum:
    """``sum_over_processes`` for threads standing in for processes: each thread's
    array replaced by the sum over all of them, as an Allreduce does."""

    def __init__(self, parties):
        self.barrier, self.arrays = threading.Barrier(parties), {}

    def __call__(self, array):
        self.arrays[threading.get_ident()] = array.copy()
        self.barrier.wait()
        total = sum(self.arrays.values())
        self.barrier.wait()  # every thread has read them before the next call writes
        array[...] = total
        return array


def test_sync_batchnorm_over_shares_of_a_batch_is_batchnorm_over_the_batch():
    """Uneven shares (3 and 5 images): outputs, input gradients and running averages
    equal one BatchNorm2d's over the batch; parameter gradients sum to its own."""
    with using_backend("numpy"), default_dtype("float64"):
        x, dout = randn(8, 3, 4, 5, seed=0), randn(8, 3, 4, 5, seed=1)
        whole = BatchNorm2d(3)
        whole.weight.data[:] = [0.5, 1.5, -2.0]
        y, dx = whole.forward(x), whole.backward(dout)
        shares = [(0, 3), (3, 8)]
        total = ThreadSum(len(shares))
        parts = []
        for _ in shares:
            part = BatchNorm2d(3)
            part.weight.data[:] = whole.weight.data
            part.__class__, part.sum_over_processes = SyncBatchNorm2d, total
            parts.append(part)
        results = [None] * len(shares)

        def process(r, lo, hi):
            results[r] = (parts[r].forward(x[lo:hi]), parts[r].backward(dout[lo:hi]))

        threads = [threading.Thread(target=process, args=(r, lo, hi))
                   for r, (lo, hi) in enumerate(shares)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    np.testing.assert_allclose(np.concatenate([r[0] for r in results]), y, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.concatenate([r[1] for r in results]), dx, rtol=0, atol=1e-13)
    for name in ("weight", "bias"):
        summed = sum(getattr(p, name).grad for p in parts)
        np.testing.assert_allclose(summed, getattr(whole, name).grad, rtol=1e-13)
    for part in parts:
        np.testing.assert_allclose(part.running_mean, whole.running_mean, rtol=1e-13)
        np.testing.assert_allclose(part.running_var, whole.running_var, rtol=1e-13)


@pytest.mark.parametrize("changes, size, message", [
    (dict(batch_size=32), 3, "a batch of 32 images does not divide among 3 processes: give a "
                             "--batch-size that 3 divides (e.g. 30)"),
    (dict(workers=2), 2, "--workers 2 under mpiexec: the 2 processes share each batch already; "
                         "leave --workers out"),
])
def test_a_run_that_cannot_split_says_what_to_change(changes, size, message):
    with pytest.raises(LaunchError) as error:
        check_launch(TrainConfig(**changes), size)
    assert str(error.value) == message
    check_launch(TrainConfig(batch_size=30), 3)  # divides: no error


def test_a_resumed_run_that_cannot_split_says_how_many_processes_can():
    with pytest.raises(LaunchError) as error:
        check_launch(TrainConfig(batch_size=64), 3, resumed=True)
    assert str(error.value) == ("the run resumed has a batch of 64 images, which does not divide "
                                "among 3 processes: resume with mpiexec -n N, N one of 2, 4, 8, "
                                "16, 32, 64 (or without mpiexec)")


def test_under_mpiexec_without_mpi4py_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails
    assert train_mnist.main(["--epochs", "1"]) == 2
    assert capsys.readouterr().err == ("train_mnist.py: error: launched by mpiexec as 2 "
                                       "processes, but mpi4py is not installed: "
                                       "pip install -e \".[mpi]\"\n")


# ------------------------------------------------------------------ under mpiexec


@mpi
@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 1e-6)])
@pytest.mark.parametrize("model", ["vit", "hybrid"])
def test_two_processes_train_the_one_process_model(stripes, tmp_path, model, dtype, tolerance):
    """Six SGD steps at the global batch of 32 (16 images per process), with random
    shifts; the hybrid's stem has BatchNorm. (SGD, not AdamW: AdamW divides each
    gradient by its own running scale, so for the key bias, whose exact gradient is
    zero, it makes rounding a step of the learning rate, whichever order the sums
    ran in. docs/design.md has more.)"""
    settings = [f"dtype={dtype}", "steps=6"] + ([f"model_overrides={HYBRID}"]
                                                if model == "hybrid" else [])
    one_rc, one_out = run(1, stripes, tmp_path / "one", *settings)
    two_rc, two_out = run(2, stripes, tmp_path / "two", *settings)
    assert (one_rc, two_rc) == (130, 130), two_out
    one, two = weights(tmp_path / "one/last.npz"), weights(tmp_path / "two/last.npz")
    assert one.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=tolerance, atol=tolerance,
                                   err_msg=name)


@mpi
@pytest.mark.parametrize("setting", [None, "", " "])
def test_each_process_takes_its_share_of_the_cores_unless_told_otherwise(setting):
    """Two processes on one machine: each its half of the cores for the fast kernels'
    threads, where TINYVIT_NUM_THREADS is unset or empty."""
    environment = {**os.environ, **OPEN_MPI_AS_ROOT}
    environment.pop("TINYVIT_NUM_THREADS", None)
    if setting is not None:
        environment["TINYVIT_NUM_THREADS"] = setting
    script = ("import os\n"
              "from tinyvit.train.distributed import Communicator\n"
              "from tinyvit.fast import blocks\n"
              "Communicator()\n"
              "os.write(1, f'{blocks.num_threads()}\\n'.encode())\n")  # one write: lines whole
    out = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], env=environment,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert out.split() == [str(share)] * 2


@mpi
@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="CuPy with a CUDA GPU not available")
def test_two_processes_on_one_gpu_train_the_one_process_model(stripes, tmp_path):
    """On CuPy: each process takes the GPU of its rank on the machine (modulo the
    GPUs: here both share one, so the sums go through host memory, not NCCL)."""
    settings = ["backend=cupy", "steps=6", f"model_overrides={HYBRID}"]
    assert run(1, stripes, tmp_path / "one", *settings)[0] == 130
    rc, out = run(2, stripes, tmp_path / "two", *settings)
    assert rc == 130, out
    one, two = weights(tmp_path / "one/last.npz"), weights(tmp_path / "two/last.npz")
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-12, atol=1e-12, err_msg=name)


class OneProcessWorld:
    """mpi4py's COMM_WORLD of a run of one process, for the collectives NCCLSum uses."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def bcast(self, value, root):
        return value


class RecordingNCCL:
    """cupy.cuda.nccl's names that NCCLSum uses, recording its calls."""

    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0

    def __init__(self):
        self.calls = []
        test = self

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                test.calls.append(("communicator", size, unique_id, rank))

            def allReduce(self, *args):
                test.calls.append(("allReduce", *args))

        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self):
        return b"id of process 0"


def test_nccl_sums_the_buffer_in_place_on_the_current_stream(monkeypatch):
    """The host side of NCCLSum, its GPU stood in for: one Allreduce of the whole
    buffer onto itself, its dtype named, on the current stream's handle."""
    from types import SimpleNamespace

    import tinyvit.train.distributed as distributed

    stream = SimpleNamespace(ptr=1234)
    monkeypatch.setattr(distributed, "xp", SimpleNamespace(cuda=SimpleNamespace(
        get_current_stream=lambda: stream)))
    nccl = RecordingNCCL()
    device_sum = distributed.NCCLSum(OneProcessWorld(), nccl)
    grad = np.zeros(10, np.float32)
    assert device_sum(grad) is grad
    pointer = grad.ctypes.data
    assert nccl.calls == [("communicator", 1, b"id of process 0", 0),
                          ("allReduce", pointer, pointer, 10, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                           1234)]
    with pytest.raises(ValueError, match=r"^NCCLSum: expected a contiguous float32 or float64 "
                                         r"array, got float64 strided shape \(5,\)$"):
        device_sum(np.zeros(10)[::2])


def test_device_arrays_go_to_nccl_and_host_arrays_to_mpi():
    """Once the processes have a GPU each, the gradient buffer and BatchNorm's sums
    (device arrays) go to NCCL; the loss and stop flags (host arrays) to MPI."""
    from types import SimpleNamespace

    from tinyvit.train.distributed import Communicator

    summed = []
    comm = object.__new__(Communicator)  # its collectives, without starting MPI
    comm.MPI = SimpleNamespace(IN_PLACE="in place", SUM="sum")
    comm.world = SimpleNamespace(Allreduce=lambda *args, op: summed.append(("mpi", op)))
    comm.device_sum = lambda array: summed.append(("nccl", array)) or array
    on_device = SimpleNamespace(shape=(3,))  # stands for a CuPy array
    assert comm.sum(on_device) is on_device
    comm.sum(np.zeros(2))
    assert summed == [("nccl", on_device), ("mpi", "sum")]


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="CuPy with a CUDA GPU not available")
def test_nccl_sums_on_the_gpu():
    """CuPy's NCCL, a run of one process: the sum of one buffer is the buffer."""
    from tinyvit import backend as B
    from tinyvit.train.distributed import NCCLSum

    with using_backend("cupy"):
        if B.nccl() is None:
            pytest.skip("this CuPy came without NCCL")
        device_sum = NCCLSum(OneProcessWorld(), B.nccl())
        for dtype in ("float32", "float64"):
            grad = B.rng(0).standard_normal(1000).astype(dtype)
            before = grad.copy()
            assert device_sum(grad) is grad
            np.testing.assert_array_equal(B.to_host(grad), B.to_host(before))


@mpi
def test_the_first_process_alone_writes_and_prints(stripes, tmp_path):
    """The 100 test images in batches of 33: the last batch, of 1 image, leaves
    process 1 without rows."""
    rc, out = run(2, stripes, tmp_path / "run", "eval_batch_size=33")
    assert rc == 0, out
    writes = [line for line in out.splitlines() if " by process " in line]
    # two epochs: last.npz and metrics.json after each (best.npz is a copy of last.npz)
    assert sorted(writes) == ["save_checkpoint by process 0"] * 2 + \
        ["write_metrics by process 0"] * 2
    assert out.count("epoch 1: train loss") == 1
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "best.npz", "confusion.png", "curves.png", "last.npz", "metrics.json"]


@mpi
@pytest.mark.skipif(not (REAL_DATA / "mnist").is_dir(), reason=f"no MNIST under {REAL_DATA}")
def test_a_batch_that_does_not_divide_is_one_line_and_leaves_nothing(tmp_path):
    out = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "train_mnist.py", "--data-dir",
                          str(REAL_DATA), "--batch-size", "33", "--train-subset", "66",
                          "--out", str(tmp_path / "run")],
                         cwd=Path(__file__).parents[1], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr == ("train_mnist.py: error: a batch of 33 images does not divide among 2 "
                          "processes: give a --batch-size that 2 divides (e.g. 32)\n")
    assert not (tmp_path / "run").exists()


def pids(process, count):
    """The pids that ``count`` processes of mpi_fit.py print first (mpiexec may put
    two processes' lines on one)."""
    text = ""
    while len(found := dict(re.findall(r"pid of process (\d+): (\d+)", text))) < count:
        line = process.stdout.readline()
        assert line, "the run ended before its processes started"
        text += line
    return {int(rank): int(pid) for rank, pid in found.items()}


@mpi
def test_a_signal_to_one_process_stops_all_at_one_step_and_the_run_resumes(stripes, tmp_path):
    """SIGTERM to process 1: both stop at the same step, process 0 saves last.npz;
    resumed by one process, the run ends with the weights of an uninterrupted one."""
    process = launch(2, stripes, tmp_path / "run", "epochs=30")
    ranks = pids(process, 2)
    while "save_checkpoint" not in process.stdout.readline():  # the first epoch ended
        pass
    os.kill(ranks[1], signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, out + err
    assert out.count("interrupted: saved") == 1 and gone(ranks[0]) and gone(ranks[1])

    rc, out = run(1, stripes, tmp_path / "whole", "epochs=30")
    assert rc == 0, out
    rc, out = run(1, stripes, tmp_path / "run", "resume=" + str(tmp_path / "run/last.npz"))
    assert rc == 0, out
    resumed, whole = weights(tmp_path / "run/last.npz"), weights(tmp_path / "whole/last.npz")
    for name in whole:
        np.testing.assert_allclose(resumed[name], whole[name], rtol=1e-12, atol=1e-12,
                                   err_msg=name)


@mpi
def test_a_run_of_one_process_resumes_in_two(stripes, tmp_path):
    """Stopped by one process after six steps, resumed by two: the run ends with the
    weights of an uninterrupted one-process run."""
    assert run(1, stripes, tmp_path / "run", "steps=6")[0] == 130
    rc, out = run(2, stripes, tmp_path / "run", "resume=" + str(tmp_path / "run/last.npz"))
    assert rc == 0, out
    assert run(1, stripes, tmp_path / "whole")[0] == 0
    resumed, whole = weights(tmp_path / "run/last.npz"), weights(tmp_path / "whole/last.npz")
    for name in whole:
        np.testing.assert_allclose(resumed[name], whole[name], rtol=1e-12, atol=1e-12,
                                   err_msg=name)


@mpi
def test_a_killed_process_ends_the_run_with_none_left(stripes, tmp_path):
    process = launch(2, stripes, tmp_path / "run", "epochs=30", start_new_session=True)
    ranks = pids(process, 2)
    while "save_checkpoint" not in process.stdout.readline():  # the first epoch ended
        pass
    os.kill(ranks[1], signal.SIGKILL)
    out, err = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in out + err  # mpiexec's
    assert gone(ranks[0])
    assert gone(process.pid, group=True)  # nothing left of the run, mpiexec's helpers neither
