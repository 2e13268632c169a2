"""Data parallelism over worker processes (tinyvit/train/parallel.py): the workers' gradient
is the one-process gradient, inference matches, and failures get clear errors.

NumPy only: the workers share host memory. Each test starts real processes
(about a second each), so the model is tiny.
"""

import os

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.fast import accelerate, cpu_numba, mkl
from tinyvit.fast.blocks import available_cores
from tinyvit.models import ViT
from tinyvit.nn.loss import SoftmaxCrossEntropy
from tinyvit.train.parallel import MAX_AUTO_WORKERS, DataParallel, auto_workers

SMALL = dict(image_size=8, patch_size=4, in_channels=1, num_classes=5, embed_dim=8, depth=2,
             num_heads=2, mlp_ratio=2)


@pytest.fixture
def float64():
    with B.using_backend("numpy"), B.default_dtype("float64"):
        yield


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 8, 8)), rng.integers(0, 5, n)


@pytest.mark.parametrize("workers, n", [(2, 7), (3, 8)])  # uneven shares: 3+4 and 2+3+3
@pytest.mark.parametrize("tier", ["reference", "fast"])
def test_gradients_equal_the_one_process_gradients(float64, tier, workers, n):
    """The workers build their replicas in the parent's tier."""
    model = ViT(dropout=0.0, **SMALL)
    if tier == "fast":
        accelerate(model)
    criterion = SoftmaxCrossEntropy(label_smoothing=0.1)
    x, y = batch(n)
    logits = model.forward(x)
    loss = float(criterion.forward(logits, y))
    model.zero_grad()
    model.backward(criterion.backward())
    expected = model.flat_parameters()[1].copy()
    model.zero_grad()
    with DataParallel(model, workers, max_batch=8) as parallel:
        assert parallel.fast == (tier == "fast")
        parallel_loss, parallel_logits = parallel.gradients(x, criterion.targets(y, 5, x.dtype))
    np.testing.assert_allclose(model.flat_parameters()[1], expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(parallel_logits, logits, rtol=1e-12, atol=1e-15)
    assert parallel_loss == pytest.approx(loss, rel=1e-13)


def test_inference_follows_the_weights_and_leaves_idle_workers_out(float64):
    model = ViT(**SMALL).eval()
    x, _ = batch(3)
    with DataParallel(model, 2, max_batch=4) as parallel:
        np.testing.assert_allclose(parallel.forward(x), model.forward(x), rtol=1e-12)
        model.flat_parameters()[0][:] *= 0.5  # as an optimizer step would: in place
        np.testing.assert_allclose(parallel.forward(x), model.forward(x), rtol=1e-12)
        # one image for two workers: worker 0 has no rows and gets no command
        assert parallel.shards(1) == [(0, 0), (0, 1)]
        np.testing.assert_allclose(parallel.forward(x[:1]), model.forward(x[:1]), rtol=1e-12)


def test_workers_switch_between_training_and_inference_modes(float64):
    model = ViT(dropout=0.3, **SMALL)  # dropout: training-mode logits differ from inference's
    criterion = SoftmaxCrossEntropy()
    x, y = batch(4)
    targets = criterion.targets(y, 5, x.dtype)
    with DataParallel(model, 2, max_batch=4) as parallel:
        _, train_logits = parallel.gradients(x, targets, seed=3)
        eval_logits = parallel.forward(x)
        _, train_again = parallel.gradients(x, targets, seed=3)
    np.testing.assert_allclose(eval_logits, model.eval().forward(x), rtol=1e-12)
    np.testing.assert_array_equal(train_again, train_logits)  # back in training mode, same masks
    assert np.abs(train_logits - eval_logits).max() > 1e-3


def test_a_batch_larger_than_the_shared_buffers_is_named(float64):
    model = ViT(**SMALL)
    with DataParallel(model, 2, max_batch=4) as parallel:
        with pytest.raises(ValueError, match="expected a batch of 1 to 4 images, got 5"):
            parallel.forward(batch(5)[0])


@pytest.mark.parametrize("reaped", [True, False])
def test_a_worker_that_dies_is_named(float64, reaped):
    """Named with its exit code, also when the parent reads its closed pipe before the
    system has reported the process gone."""
    model = ViT(**SMALL)
    with DataParallel(model, 2, max_batch=4) as parallel:
        parallel.processes[1].kill()
        if reaped:
            parallel.processes[1].join()
        with pytest.raises(RuntimeError, match=r"worker process exited unexpectedly: "
                                               r"tinyvit-worker-1 \(exit code -9\)$"):
            parallel.forward(batch(4)[0])


def test_workers_killed_together_are_each_named(float64):
    model = ViT(**SMALL)
    with DataParallel(model, 2, max_batch=4) as parallel:
        for process in parallel.processes:
            process.kill()
        with pytest.raises(RuntimeError, match=r"worker process exited unexpectedly: "
                                               r"tinyvit-worker-0 \(exit code -9\), "
                                               r"tinyvit-worker-1 \(exit code -9\)$"):
            parallel.forward(batch(4)[0])


def test_an_error_inside_a_worker_comes_back_with_its_traceback(float64):
    # dropout: so the workers seed generators, and a bad seed fails
    model = ViT(dropout=0.1, **SMALL)
    with DataParallel(model, 2, max_batch=4) as parallel:
        x, _ = batch(4)
        with pytest.raises(RuntimeError, match="(?s)tinyvit worker 0 failed:.*Traceback"):
            parallel.gradients(x, np.full((4, 5), np.nan), seed="not a seed")


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc")
def test_the_workers_start_with_the_parents_choice_of_kernels(float64, monkeypatch):
    """set_compiled(False) and set_enabled(False) in the parent's code, nothing in its
    environment: the spawned workers start told the same (TINYVIT_NUMBA=0, TINYVIT_MKL=0),
    and the parent's environment is as it was."""
    for variable in (cpu_numba.ENVIRONMENT_VARIABLE, mkl.ENVIRONMENT_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    cpu_numba.set_compiled(False)
    mkl.set_enabled(False)
    try:
        with DataParallel(accelerate(ViT(**SMALL)), 2, max_batch=4) as parallel:
            parallel.forward(batch(4)[0])  # the workers are running their own code now
            for process in parallel.processes:
                with open(f"/proc/{process.pid}/environ", "rb") as f:
                    environment = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                                       if b"=" in item)
                assert environment[b"TINYVIT_NUMBA"] == b"0"
                assert environment[b"TINYVIT_MKL"] == b"0"
    finally:
        cpu_numba.set_compiled(None)
        mkl.set_enabled(None)
    assert "TINYVIT_NUMBA" not in os.environ and "TINYVIT_MKL" not in os.environ


def test_worker_counts():
    with pytest.raises(ValueError, match="expected at least 2 workers, got 1"):
        DataParallel(ViT(**SMALL), 1, max_batch=4)
    assert auto_workers("cupy") == 1
    assert auto_workers("numpy") == min(available_cores(), MAX_AUTO_WORKERS)
