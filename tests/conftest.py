"""Shared fixtures and helpers of the test suite.

Fixtures: ``backend`` runs a test once per array backend (the CuPy run is marked
``gpu`` and skipped unless CuPy imports and sees a GPU, so the same test body
checks both backends); ``tier`` runs it once per tier of layers: the test passes
what it builds through ``tier(...)``, which returns it as built (the reference
layers) or with the fast kernels of the active backend; ``stripes`` writes a small
synthetic dataset in MNIST's official file layout; ``workbook`` is a test's own copy of
a new workbook of ``python -m tinyvit.learn``, written once.

Helpers, imported by the test files with ``from conftest import ...``: random
arrays and parameter jitter (from ``tinyvit.gradcheck``), the official dataset
files' folder (``REAL_DATA``), a script loaded as a module, IDX files, the
synthetic stripes and a tiny training config.
"""

import dataclasses
import gzip
import hashlib
import importlib.util
import os
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit import data, fast
from tinyvit.gradcheck import jitter, randn  # noqa: F401  (the tests import them from here)
from tinyvit.learn import __main__ as learn
from tinyvit.train import TrainConfig

_HAS_GPU = B.cupy_available()

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
TINY_MODEL = {"embed_dim": 16, "depth": 1, "num_heads": 2}


@pytest.fixture(autouse=True)
def kernel_settings_read_again():
    """After each test, once monkeypatch has put the environment back (an autouse
    fixture is set up first, so torn down last), the fast CPU kernels read their
    variables again: a test's TINYVIT_NUMBA=0 does not outlive it."""
    yield
    fast.check_environment()


@pytest.fixture(
    params=[
        "numpy",
        pytest.param(
            "cupy",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not _HAS_GPU, reason="CuPy with a CUDA GPU not available"),
            ],
        ),
    ]
)
def backend(request):
    """Activate one backend for the test, float64 by default, and restore after."""
    with B.using_backend(request.param), B.default_dtype("float64"):
        yield request.param


@pytest.fixture(params=["reference", "fast"])
def tier(request):
    """``tier(module)``: the module as built, or with its fast kernels."""
    return fast.accelerate if request.param == "fast" else (lambda module: module)


# --------------------------------------------------------------------------- dataset files


# the official dataset files: $TINYVIT_DATA, else shared/data beside the repository
REAL_DATA = Path(os.environ.get("TINYVIT_DATA")
                 or Path(__file__).resolve().parents[2] / "shared" / "data")


def output_shape(layer, x):
    """The shape of ``layer``'s output for ``x``, from an eval-mode forward, which
    changes no state (BatchNorm's running averages included)."""
    layer.eval()
    shape = layer.forward(x).shape
    layer.train()
    return shape


def load_script(path):
    """A script (benchmarks/*.py, train_mnist.py) loaded as a module, by its path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_idx(path, array, magic, count=None):
    """Write ``array`` as a gzip'd IDX file; ``count`` overrides the header's item count."""
    shape = list(array.shape)
    if count is not None:
        shape[0] = count
    header = struct.pack(f">{1 + len(shape)}I", magic, *shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def patch_info(monkeypatch, name, **changes):
    """Replace fields of a dataset's registry entry for the duration of a test."""
    info = dataclasses.replace(data.DATASETS[name], **changes)
    monkeypatch.setitem(data.DATASETS, name, info)
    return info


def stripe_images(labels, seed):
    """(N, 28, 28) uint8: noise, plus in every 7x7 patch a bright column ``label % 7``
    (and a bright row 0 for labels 7-9), so every patch token tells the class."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 60, size=(len(labels), 28, 28))
    for i, k in enumerate(labels):
        images[i, :, int(k) % 7 :: 7] = 255
        if k >= 7:
            images[i, ::7, :] = 255
    return images.astype(np.uint8)


def write_stripes(data_dir):
    """The synthetic dataset in MNIST's official file layout under ``data_dir``/mnist:
    320 training and 100 test images of ``stripe_images``. Returns the mnist folder."""
    folder = data_dir / "mnist"
    for split, n, seed in (("train", 320, 0), ("test", 100, 1)):
        labels = np.random.default_rng(seed).integers(0, 10, n)
        images_file, labels_file = MNIST_FILES[split]
        write_idx(folder / images_file, stripe_images(labels, seed), 2051)
        write_idx(folder / labels_file, labels, 2049)
    return folder


def register_stripes(monkeypatch, folder, cache):
    """The files of ``folder`` registered as 'mnist' (their checksums), and the cache at
    ``cache``, for the duration of a test."""
    patch_info(monkeypatch, "mnist", sha256={f.name: sha256(f) for f in folder.iterdir()})
    monkeypatch.setenv("TINYVIT_CACHE", str(cache))


@pytest.fixture
def stripes(tmp_path, monkeypatch):
    """``write_stripes``'s dataset, registered as 'mnist'. Returns the data folder."""
    folder = write_stripes(tmp_path / "data")
    register_stripes(monkeypatch, folder, tmp_path / "cache")
    return folder.parent


@pytest.fixture(scope="session")
def new_workbook(tmp_path_factory):
    """A new workbook (``python -m tinyvit.learn start``), written once, whose training
    exercise reads ``write_stripes``'s files in the folder beside it. Tests change a
    workbook: they take ``workbook``, a copy."""
    root = tmp_path_factory.mktemp("new_workbook")
    write_stripes(root / "data")
    folder = root / "workbook"
    assert learn.main(["start", str(folder), "--data-dir", str(root / "data")]) == 0
    return folder


@pytest.fixture
def workbook(tmp_path, monkeypatch, new_workbook):
    """A copy of ``new_workbook`` for this test, the synthetic files it reads registered."""
    register_stripes(monkeypatch, new_workbook.parent / "data" / "mnist", tmp_path / "cache")
    return Path(shutil.copytree(new_workbook, tmp_path / "workbook"))


def tiny_config(data_dir, out_dir, **changes):
    """A TrainConfig of a one-block ViT that learns the stripes in a few epochs."""
    return TrainConfig(**{
        "data_dir": str(data_dir), "out_dir": str(out_dir), "model_overrides": TINY_MODEL,
        "epochs": 2, "batch_size": 32, "eval_batch_size": 50, "log_every": 3, "lr": 1e-2,
        "warmup_epochs": 0.5, "max_shift": 0, **changes,
    })


def gone(pid, group=False, within=30.0):
    """True once no process ``pid`` (or none of process group ``pid``) runs, waiting
    up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            (os.killpg if group else os.kill)(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
