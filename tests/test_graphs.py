"""CUDA graphs (tinyvit/fast/graphs.py): a captured training step trains as the step
itself, and a run that cannot be captured says why before it starts.

On a GPU the step is captured and replayed; on NumPy ``Captured`` runs the same
function on its copied inputs, so the same test checks the trainer's split of a
step into the host's part and the device's. Without a GPU, the GPU classes' launches
of two steps (their kernels mirrored on NumPy, as tests/test_cuda_sources.py runs
them) are compared: a replayed graph repeats the first step's arguments, so every
step must pass the same ones, whatever its learning rate and dropout seed.
"""

import numpy as np
import pytest
from test_cuda_sources import as_gpu, mirrored_kernel

import cuda_mirrors
from conftest import randn
from tinyvit import backend as B
from tinyvit.fast import compile as cuda
from tinyvit.fast import cublas, gpu
from tinyvit.fast.graphs import Captured
from tinyvit.models import ViT
from tinyvit.train import TrainConfig
from tinyvit.train.step import Trainer, check_one_process

MODEL = dict(image_size=8, patch_size=4, in_channels=1, num_classes=3, embed_dim=8, depth=2,
             num_heads=2, dropout=0.1)


def trainer(backend, captured, model):
    config = TrainConfig(backend=backend, lr=1e-2, clip_grad=1.0, label_smoothing=0.1,
                         cuda_graph=captured and backend == "cupy")
    step = Trainer(config, ViT(**{**MODEL, **model}, seed=0))
    if captured and backend == "numpy":
        step.update = Captured(step.device_step)  # on NumPy the same path, nothing captured
    return step


MODELS = pytest.mark.parametrize("model", [
    {},  # the attention in one kernel
    {"attn_dropout": 0.1},  # the attention through cuBLAS, with dropout
    {"stem": ((4, 3, 2),), "patch_size": 1},  # a hybrid: Conv2d and BatchNorm2d
], ids=["vit", "attention-dropout", "hybrid"])


@MODELS
def test_a_captured_step_trains_as_the_step_itself(backend, model):
    """Batches of 8 (captured at the third) then of 5 (a second graph): each step's
    loss, correct count and gradient norm, and the weights after, are the plain
    step's; the learning rate and the dropout masks change from step to step."""
    plain, captured = (trainer(backend, c, model) for c in (False, True))
    sizes = [8] * 6 + [5] * 4
    for step, size in enumerate(sizes):
        x, y = randn(size, 1, 8, 8, seed=step), B.to_device(np.arange(size) % 3)
        lr = 1e-2 * (step + 1) / len(sizes)
        ours, theirs = (t.step(x, y, lr, (0, 0, step)) for t in (captured, plain))
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(B.to_host(a), B.to_host(b), rtol=1e-12)
    np.testing.assert_allclose(B.to_host(captured.model.flat_parameters()[0]),
                               B.to_host(plain.model.flat_parameters()[0]), rtol=1e-10)
    if backend == "cupy":
        assert captured.update.captured == 2


def test_captured_copies_its_inputs_and_its_outputs(backend):
    """The function sees arrays of the graph's own, the caller gets copies of its
    outputs: a later call changes neither what was passed nor what was returned."""
    seen = []

    def double(x):
        seen.append(x)
        return (x * 2,)

    twice = Captured(double, warmup=1)
    x = randn(3, 4)
    results = [twice(x + i)[0] for i in range(4)]
    assert all(s is seen[0] for s in seen) and seen[0] is not x
    for i, result in enumerate(results):
        np.testing.assert_array_equal(B.to_host(result), B.to_host((x + i) * 2))


def test_a_run_that_cannot_be_captured_says_why():
    with pytest.raises(ValueError, match="cuda_graph needs backend 'cupy', got 'numpy'"):
        TrainConfig(cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph needs optimizer 'adamw', got 'sgd'"):
        TrainConfig(cuda_graph=True, backend="cupy", optimizer="sgd")
    with pytest.raises(ValueError, match="cuda_graph needs tier 'fast', got 'reference'"):
        TrainConfig(cuda_graph=True, backend="cupy", tier="reference")
    with pytest.raises(ValueError, match="runs in one process, got 2 under mpiexec"):
        check_one_process(2)


@MODELS
def test_every_step_launches_the_same_kernels_with_the_same_scalars(monkeypatch, model):
    """The GPU classes' device step on NumPy, twice, with another learning rate, seed
    and batch: the same kernels and GEMMs in the same order, with the same grids and
    the same arguments but for the arrays' values (the learning rate and the dropout
    seed are read from device memory, not passed)."""
    launches = []

    def recorded(name, function, dtype):
        run = mirrored_kernel(name, function, dtype)

        def launch(grid, block, args, shared_mem=0):
            launches.append((function, grid, block, shared_mem, described(args)))
            run(grid, block, args, shared_mem)
        return launch

    def gemm(*args):
        launches.append(("gemm", described(args)))
        cuda_mirrors.gemm(*args)

    monkeypatch.setattr(cuda, "kernel", recorded)
    monkeypatch.setattr(cublas, "gemm", gemm)
    with B.using_backend("numpy"), B.default_dtype("float64"):
        config = TrainConfig(tier="reference", lr=1e-2, clip_grad=1.0, label_smoothing=0.1)
        step = Trainer(config, as_gpu(ViT(**{**MODEL, **model}, seed=0)))
        step.criterion.__class__, step.optimizer.__class__ = gpu.SoftmaxCrossEntropy, gpu.AdamW
        steps = []
        for i, lr in enumerate((1e-3, 7e-3)):
            launches.clear()
            step.step(randn(8, 1, 8, 8, seed=i), np.arange(8) % 3, lr, (0, 0, i))
            steps.append(list(launches))
    assert len(steps[0]) > 40 and steps[0] == steps[1]


def described(args):
    """A launch's arguments as a replay repeats them: an array by its shape and dtype
    (a graph keeps its memory, not its values), a scalar by its type and value."""
    return tuple((a.shape, a.dtype.str) if isinstance(a, np.ndarray) else (type(a), a)
                 for a in args)
