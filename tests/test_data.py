"""Tests for tinyvit.data: file formats, validation errors, file lookup, downloads, Batches.

Every test writes its own small files under ``tmp_path``; downloads are served
from ``file://`` URLs. One test reads the real datasets when they are present
(``TINYVIT_DATA``, else ``shared/data`` next to the repository) and is skipped
otherwise.
"""

import dataclasses
import gzip
import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import MNIST_FILES, REAL_DATA, patch_info, sha256, write_idx
from tinyvit import backend as B
from tinyvit import data
from tinyvit.data import Batches, DatasetError, fetch, load_dataset, readers

CIFAR_RECORDS = 4  # records per batch file in the small CIFAR files written here


# --------------------------------------------------------------------------- helpers


def write_mnist(folder, split="train", n=5, seed=0):
    """Write one split of a small MNIST-like dataset; returns its (images, labels)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    images_file, labels_file = MNIST_FILES[split]
    write_idx(folder / images_file, images, 2051)
    write_idx(folder / labels_file, labels, 2049)
    return images, labels


def cifar_arrays(n, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def write_cifar_bin(path, images, labels):
    """Records of 1 label byte + R, G, B planes, as in the official binary version."""
    records = np.concatenate([labels[:, None], images.reshape(len(images), -1)], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(records.astype(np.uint8).tobytes())


def write_cifar_py(path, images, labels):
    """A pickled dict as in the official python version (bytes keys, list of labels)."""
    batch = {b"data": images.reshape(len(images), -1), b"labels": [int(v) for v in labels]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(batch, protocol=4))


def write_cifar(folder, version="bin", split="train"):
    """Write one split of a small CIFAR-10 in ``folder``; returns its (images, labels)."""
    names = data.DATASETS["cifar10"].layouts[0 if version == "bin" else 1].splits[split]
    write = write_cifar_bin if version == "bin" else write_cifar_py
    parts = [cifar_arrays(CIFAR_RECORDS, seed=i) for i in range(len(names))]
    for name, (images, labels) in zip(names, parts):
        write(folder / name, images, labels)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def make_tarball(path, files):
    """A .tar.gz holding ``files``: {member name: bytes}."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(content)
            tar.addfile(member, io.BytesIO(content))


def patch_archive_md5(monkeypatch, tarball):
    """Make the registry expect ``tarball``'s MD5 for the CIFAR-10 binary archive."""
    info = data.DATASETS["cifar10"]
    md5 = hashlib.md5(Path(tarball).read_bytes()).hexdigest()
    bin_layout = dataclasses.replace(
        info.layouts[0], archive=dataclasses.replace(info.layouts[0].archive, md5=md5)
    )
    patch_info(monkeypatch, "cifar10", layouts=(bin_layout,) + info.layouts[1:])


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    """No test sees the user's TINYVIT_DATA or cache."""
    monkeypatch.delenv("TINYVIT_DATA", raising=False)
    monkeypatch.setenv("TINYVIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def small_cifar(monkeypatch):
    """CIFAR-10 batch files of CIFAR_RECORDS records instead of 10,000."""
    patch_info(monkeypatch, "cifar10", records_per_file=CIFAR_RECORDS)


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything tries to download."""
    def urlopen(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(fetch.urllib.request, "urlopen", urlopen)


# --------------------------------------------------------------------------- registry


def test_unknown_name_and_split_name_the_valid_ones():
    with pytest.raises(ValueError, match="valid names: mnist, fashion-mnist, cifar10"):
        load_dataset("imagenet", "train")
    with pytest.raises(ValueError, match="valid splits: train, test"):
        load_dataset("mnist", "val")


def test_dataset_info():
    mnist, fashion, cifar = (data.dataset_info(n) for n in ("mnist", "fashion-mnist", "cifar10"))
    assert mnist.classes == tuple("0123456789")
    assert (mnist.mean, mnist.std, mnist.image_shape) == ((0.1307,), (0.3081,), (1, 28, 28))
    assert fashion.classes[0] == "T-shirt/top" and fashion.classes[9] == "Ankle boot"
    assert (fashion.mean, fashion.std) == ((0.2860,), (0.3530,))
    assert cifar.classes[1] == "automobile" and len(cifar.classes) == 10
    assert cifar.mean == (0.4914, 0.4822, 0.4465) and cifar.std == (0.2470, 0.2435, 0.2616)
    assert cifar.image_shape == (3, 32, 32)


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("form", ["root", "dataset folder"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_idx_round_trip(tmp_path, no_network, form, split):
    images, labels = write_mnist(tmp_path / "mnist", split, n=7)
    data_dir = tmp_path if form == "root" else tmp_path / "mnist"
    x, y = load_dataset("mnist", split, data_dir, verify=False)
    assert x.shape == (7, 1, 28, 28) and x.dtype == np.uint8
    assert y.shape == (7,) and y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 0], images)
    np.testing.assert_array_equal(y, labels)


def test_idx_wrong_magic(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    images = np.zeros((5, 28, 28), np.uint8)
    write_idx(folder / "train-images-idx3-ubyte.gz", images, magic=2049)
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: bad IDX magic number: "
                                           "expected 2051, got 2049"):
        load_dataset("mnist", "train", folder, verify=False)


def test_idx_truncated(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((5, 28, 28), np.uint8), 2051,
              count=10)
    message = ("train-images-idx3-ubyte.gz: truncated: "
               "header says 10 items of 28x28 = 7840 bytes, file has 3920")
    with pytest.raises(DatasetError, match=message):
        load_dataset("mnist", "train", folder, verify=False)


def test_idx_labels_truncated(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(5, np.uint8), 2049, count=6)
    message = ("train-labels-idx1-ubyte.gz: truncated: "
               "header says 6 items of 1 byte = 6 bytes, file has 5")
    with pytest.raises(DatasetError, match=message):
        load_dataset("mnist", "train", folder, verify=False)


@pytest.mark.parametrize("damage", ["cut short", "flipped bytes", "not gzip"])
def test_idx_corrupted_gzip(tmp_path, damage):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    path = folder / "train-images-idx3-ubyte.gz"
    raw = bytearray(path.read_bytes())
    if damage == "cut short":
        raw = raw[: len(raw) // 2]
    elif damage == "flipped bytes":
        raw[20:60] = bytes(b ^ 0xFF for b in raw[20:60])
    else:
        raw = bytearray(b"plain text, no gzip header here")
    path.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: not a valid gzip file"):
        load_dataset("mnist", "train", folder, verify=False)


def test_idx_count_mismatch_names_both_files(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder, n=5)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(4, np.uint8), 2049)
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte.gz has 5 images but "
                                           r".*train-labels-idx1-ubyte.gz has 4 labels"):
        load_dataset("mnist", "train", folder, verify=False)


def test_idx_label_out_of_range(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder, n=5)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.array([0, 1, 12, 3, 4]), 2049)
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte.gz: label 12 at index 2 "
                                           r"is out of range 0..9"):
        load_dataset("mnist", "train", folder, verify=False)


def test_idx_wrong_image_size(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((5, 14, 14), np.uint8), 2051)
    with pytest.raises(DatasetError,
                       match=r"mnist images should be 1x28x28 \(C, H, W\), got 1x14x14"):
        load_dataset("mnist", "train", folder, verify=False)


# --------------------------------------------------------------------------- checksums


def test_sha256_mismatch_names_the_file_and_both_digests(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    path = folder / "train-images-idx3-ubyte.gz"
    expected = data.DATASETS["mnist"].sha256[path.name]
    with pytest.raises(DatasetError) as error:
        load_dataset("mnist", "train", folder)
    message = str(error.value)
    assert message == (
        f"{path}: SHA-256 mismatch: expected {expected}, got {sha256(path)}; the file is "
        "corrupted or not the official one: put the official file in its place (or delete it "
        "and leave out --data-dir and TINYVIT_DATA: the official file is downloaded into the "
        "cache) (from Python, load_dataset(..., verify=False) reads it anyway)")


def test_a_corrupted_file_in_the_cache_is_downloaded_again_once_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYVIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "mnist"
    write_mnist(folder)
    with pytest.raises(DatasetError, match="the file is corrupted or not the official one: "
                                           "delete it and run again to download the official "
                                           r"file \(from Python"):
        load_dataset("mnist", "train", download=False)


def test_unpacked_files_are_named_beside_the_missing_gz(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    for path in folder.glob("*.gz"):
        path.with_suffix("").write_bytes(gzip.decompress(path.read_bytes()))
        path.unlink()
    with pytest.raises(DatasetError, match=r"missing in .*: train-images-idx3-ubyte.gz, "
                                           r"train-labels-idx1-ubyte.gz \(found "
                                           r"train-images-idx3-ubyte, train-labels-idx1-ubyte "
                                           r"unpacked: tinyvit reads the official .gz files, "
                                           r"whose checksums it knows\)"):
        load_dataset("mnist", "train", folder)


def test_another_datasets_official_file_is_named(tmp_path, monkeypatch):
    """MNIST's and Fashion-MNIST's files share their names: the one found is named."""
    folder = tmp_path / "mnist"
    write_mnist(folder)
    path = folder / "train-images-idx3-ubyte.gz"
    patch_info(monkeypatch, "mnist", sha256={**data.DATASETS["mnist"].sha256,
                                             path.name: sha256(path)})
    with pytest.raises(DatasetError) as error:
        load_dataset("fashion-mnist", "train", folder)
    assert str(error.value) == (f"{path}: the official mnist file, not fashion-mnist's: point "
                                "--data-dir at the folder of the fashion-mnist files")


def test_sha256_match_passes(tmp_path, monkeypatch):
    folder = tmp_path / "mnist"
    images, _ = write_mnist(folder)
    sums = {name: sha256(folder / name) for name in MNIST_FILES["train"]}
    patch_info(monkeypatch, "mnist", sha256=sums)
    x, _ = load_dataset("mnist", "train", folder, verify=True)
    np.testing.assert_array_equal(x[:, 0], images)


# --------------------------------------------------------------------------- finding files


def test_missing_file_in_explicit_dir_names_folder_and_file(tmp_path, no_network):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError) as error:
        load_dataset("mnist", "train", tmp_path)
    message = str(error.value)
    assert str(tmp_path) in message
    assert f"missing in {folder}: train-labels-idx1-ubyte.gz" in message
    assert "train-images-idx3-ubyte.gz" not in message


def test_explicit_dir_that_does_not_exist(tmp_path, no_network):
    with pytest.raises(DatasetError,
                       match=f"the data folder {tmp_path / 'nowhere'} does not exist"):
        load_dataset("mnist", "test", tmp_path / "nowhere")


def test_env_var_is_used_and_does_not_fall_back(tmp_path, monkeypatch, no_network):
    _, labels = write_mnist(tmp_path / "data" / "mnist", "test")
    monkeypatch.setenv("TINYVIT_DATA", str(tmp_path / "data"))
    _, y = load_dataset("mnist", "test", verify=False)
    np.testing.assert_array_equal(y, labels)
    with pytest.raises(DatasetError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset("fashion-mnist", "test", verify=False)


def test_cache_is_used(tmp_path, no_network):
    _, labels = write_mnist(tmp_path / "cache" / "fashion-mnist", "test")
    _, y = load_dataset("fashion-mnist", "test", verify=False)
    np.testing.assert_array_equal(y, labels)


def test_no_download_when_disabled(tmp_path, no_network):
    with pytest.raises(DatasetError, match="not in the cache .* and download=False"):
        load_dataset("mnist", "test", download=False)


# --------------------------------------------------------------------------- downloads


def mirror_with_test_split(tmp_path, monkeypatch, mirror_names):
    """Serve the MNIST test split from file:// mirrors; only the mirror "good" has the files."""
    images, labels = write_mnist(tmp_path / "good", "test")
    sums = {name: sha256(tmp_path / "good" / name) for name in MNIST_FILES["test"]}
    mirrors = tuple((tmp_path / name).as_uri() + "/" for name in mirror_names)
    patch_info(monkeypatch, "mnist", sha256=sums, mirrors=mirrors)
    return images, labels


def test_download_tries_the_next_mirror(tmp_path, monkeypatch):
    images, labels = mirror_with_test_split(tmp_path, monkeypatch, ["missing", "good"])
    x, y = load_dataset("mnist", "test")
    np.testing.assert_array_equal(x[:, 0], images)
    np.testing.assert_array_equal(y, labels)
    cache = tmp_path / "cache" / "mnist"
    assert sorted(p.name for p in cache.iterdir()) == sorted(MNIST_FILES["test"])


def test_download_failure_names_every_url_and_the_way_out(tmp_path, monkeypatch):
    mirror_with_test_split(tmp_path, monkeypatch, ["missing", "also-missing"])
    with pytest.raises(DatasetError) as error:
        load_dataset("mnist", "test")
    message = str(error.value)
    for name in ("missing", "also-missing"):
        assert (tmp_path / name).as_uri() + "/t10k-images-idx3-ubyte.gz" in message
    assert "--data-dir" in message and "TINYVIT_DATA" in message


def test_download_with_wrong_checksum_leaves_nothing(tmp_path, monkeypatch):
    mirror_with_test_split(tmp_path, monkeypatch, ["bad"])
    write_mnist(tmp_path / "bad", "test", seed=1)  # different bytes than the registry expects
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        load_dataset("mnist", "test")
    assert list((tmp_path / "cache" / "mnist").iterdir()) == []


# --------------------------------------------------------------------------- CIFAR-10 binary


@pytest.mark.parametrize("form", ["root", "dataset folder", "batches folder"])
def test_cifar_bin_round_trip(tmp_path, small_cifar, no_network, form):
    batches = tmp_path / "cifar-10" / "cifar-10-batches-bin"
    images, labels = write_cifar(batches, "bin", "train")
    data_dir = {"root": tmp_path, "dataset folder": tmp_path / "cifar-10",
                "batches folder": batches}[form]
    x, y = load_dataset("cifar10", "train", data_dir, verify=False)
    assert x.shape == (5 * CIFAR_RECORDS, 3, 32, 32) and x.dtype == np.uint8
    assert y.shape == (5 * CIFAR_RECORDS,) and y.dtype == np.int64
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)


def test_cifar_bin_plane_order(tmp_path, small_cifar):
    """Byte 1 of a record is the top-left red pixel, byte 1025 the top-left green one."""
    records = np.zeros((CIFAR_RECORDS, 3073), np.uint8)
    records[:, 0] = 7
    records[:, 1], records[:, 1 + 1024], records[:, 1 + 2048 + 33] = 10, 20, 30
    (tmp_path / "test_batch.bin").write_bytes(records.tobytes())
    x, y = load_dataset("cifar10", "test", tmp_path, verify=False)
    assert (x[0, 0, 0, 0], x[0, 1, 0, 0], x[0, 2, 1, 1], y[0]) == (10, 20, 30, 7)
    assert x.sum() == CIFAR_RECORDS * 60


def test_cifar_bin_not_whole_records(tmp_path, small_cifar):
    (tmp_path / "test_batch.bin").write_bytes(bytes(3073 * CIFAR_RECORDS - 5))
    with pytest.raises(DatasetError, match="test_batch.bin: 12287 bytes is not a whole number "
                                           "of 3073-byte records"):
        load_dataset("cifar10", "test", tmp_path, verify=False)


def test_cifar_bin_needs_10000_records(tmp_path):
    write_cifar_bin(tmp_path / "test_batch.bin", *cifar_arrays(3, seed=0))
    with pytest.raises(DatasetError, match="test_batch.bin: expected 10000 records, file has 3"):
        load_dataset("cifar10", "test", tmp_path, verify=False)


def test_cifar_bin_label_out_of_range(tmp_path, small_cifar):
    images, labels = cifar_arrays(CIFAR_RECORDS, seed=0)
    labels[3] = 10
    write_cifar_bin(tmp_path / "test_batch.bin", images, labels)
    with pytest.raises(DatasetError,
                       match="test_batch.bin: label 10 at index 3 is out of range 0..9"):
        load_dataset("cifar10", "test", tmp_path, verify=False)


def test_cifar_bin_sha256_checked(tmp_path, small_cifar):
    write_cifar(tmp_path, "bin", "test")
    with pytest.raises(DatasetError, match="test_batch.bin: SHA-256 mismatch: expected 8e2eb146"):
        load_dataset("cifar10", "test", tmp_path)


# -------------------------------------------------------------------------- CIFAR-10 python version


@pytest.mark.parametrize("form", ["dataset folder", "batches folder"])
def test_cifar_py_round_trip(tmp_path, small_cifar, form):
    batches = tmp_path / "cifar-10-batches-py"
    images, labels = write_cifar(batches, "py", "train")
    x, y = load_dataset("cifar10", "train", tmp_path if form == "dataset folder" else batches)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int64


def test_cifar_py_wrong_structure(tmp_path, small_cifar):
    batch = {b"data": np.zeros((CIFAR_RECORDS, 1024), np.uint8), b"labels": [0] * CIFAR_RECORDS}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(batch, protocol=4))
    with pytest.raises(DatasetError, match=r"test_batch: b'data' should be a \(4, 3072\) "
                                           r"uint8 array, got \(4, 1024\) uint8"):
        load_dataset("cifar10", "test", tmp_path)


class RunsAShellCommand:
    """Unpickling this calls os.system(command)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_unpickler_refuses_code(tmp_path, small_cifar):
    marker = tmp_path / "it-ran"
    evil = pickle.dumps({b"data": RunsAShellCommand(f"touch {marker}"), b"labels": []}, protocol=4)
    with pytest.raises(pickle.UnpicklingError,
                       match=r"refusing to load global (posix|os|nt)\.system"):
        readers.RestrictedUnpickler(io.BytesIO(evil), encoding="bytes").load()
    (tmp_path / "test_batch").write_bytes(evil)
    with pytest.raises(DatasetError,
                       match=r"test_batch: cannot unpickle: refusing to load global .*system"):
        load_dataset("cifar10", "test", tmp_path)
    assert not marker.exists()


def test_unpickler_reads_numpy_arrays():
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    loaded = readers.RestrictedUnpickler(io.BytesIO(pickle.dumps({b"a": array})),
                                      encoding="bytes").load()
    np.testing.assert_array_equal(loaded[b"a"], array)


# --------------------------------------------------------------------------- tarballs


def cifar_bin_tarball(path, split="test"):
    """A small cifar-10-binary.tar.gz with the official member layout."""
    staging = path.parent / "staging"
    images, labels = write_cifar(staging, "bin", split)
    names = data.DATASETS["cifar10"].layouts[0].splits[split]
    make_tarball(path, {f"cifar-10-batches-bin/{n}": (staging / n).read_bytes() for n in names})
    return images, labels


@pytest.mark.parametrize("form", ["tarball", "folder holding it", "root holding it"])
def test_cifar_tarball(tmp_path, small_cifar, no_network, monkeypatch, form):
    tarball = tmp_path / "downloads" / "cifar-10" / "cifar-10-binary.tar.gz"
    tarball.parent.mkdir(parents=True)
    images, labels = cifar_bin_tarball(tarball)
    patch_archive_md5(monkeypatch, tarball)
    # the small batch files have no registered SHA-256
    patch_info(monkeypatch, "cifar10", sha256={})
    data_dir = {"tarball": tarball, "folder holding it": tarball.parent,
                "root holding it": tmp_path / "downloads"}[form]
    x, y = load_dataset("cifar10", "test", data_dir)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    assert (tmp_path / "cache" / "cifar-10" / "cifar-10-batches-bin" / "test_batch.bin").is_file()


def test_cifar_python_tarball(tmp_path, small_cifar):
    staging = tmp_path / "staging"
    images, labels = write_cifar(staging, "py", "test")
    tarball = tmp_path / "cifar-10-python.tar.gz"
    make_tarball(tarball, {"cifar-10-batches-py/test_batch": (staging / "test_batch").read_bytes()})
    x, y = load_dataset("cifar10", "test", tarball, verify=False)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)


def test_cifar_tarball_md5_checked(tmp_path, small_cifar):
    tarball = tmp_path / "cifar-10-binary.tar.gz"
    cifar_bin_tarball(tarball)
    with pytest.raises(DatasetError, match="cifar-10-binary.tar.gz: MD5 mismatch: "
                                           "expected c32a1d4ab5d03f1284b67883e8d87530"):
        load_dataset("cifar10", "test", tarball)


@pytest.mark.parametrize("member", ["../escaped.bin", "/tmp/absolute.bin"])
def test_cifar_tarball_refuses_unsafe_members(tmp_path, small_cifar, member):
    tarball = tmp_path / "data" / "cifar-10-binary.tar.gz"
    tarball.parent.mkdir()
    make_tarball(tarball, {member: b"x", "cifar-10-batches-bin/test_batch.bin": b"y"})
    with pytest.raises(DatasetError, match=f"refusing member '{member}'"):
        load_dataset("cifar10", "test", tarball, verify=False)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [tarball]  # nothing was written


def test_cifar_corrupted_tarball(tmp_path, small_cifar):
    tarball = tmp_path / "cifar-10-binary.tar.gz"
    cifar_bin_tarball(tarball)
    tarball.write_bytes(tarball.read_bytes()[:200])
    with pytest.raises(DatasetError, match="cifar-10-binary.tar.gz: not a valid tar.gz file"):
        load_dataset("cifar10", "test", tarball, verify=False)


def test_unknown_file_as_data_dir(tmp_path):
    path = tmp_path / "cifar.tgz"
    path.write_bytes(b"")
    with pytest.raises(DatasetError, match="cifar.tgz is a file; cifar10 expects a folder "
                                           "or one of cifar-10-binary.tar.gz"):
        load_dataset("cifar10", "test", path)


# --------------------------------------------------------------------------- Batches


def small_images(n=10, channels=3, size=4):
    """(n, C, size, size) uint8 images whose every pixel of channel c in image i is 10*i + c."""
    values = 10 * np.arange(n)[:, None] + np.arange(channels)[None, :]  # (n, C)
    images = np.broadcast_to(values[:, :, None, None], (n, channels, size, size))
    return images.astype(np.uint8), np.arange(n) % 10


MEAN, STD = (0.5, 0.25, 0.125), (0.5, 0.2, 0.1)


def test_batches_shapes_and_dtypes(backend):
    images, labels = small_images()
    batches = Batches(images, labels, 4, mean=MEAN, std=STD)
    assert len(batches) == 3
    out = list(batches.epoch(0))
    assert [x.shape for x, _ in out] == [(4, 3, 4, 4), (4, 3, 4, 4), (2, 3, 4, 4)]
    for x, y in out:
        assert B.is_array(x) and B.is_array(y)
        assert x.dtype == np.float64 and y.dtype == np.int64  # the fixture's default dtype
    np.testing.assert_array_equal(np.concatenate([B.to_host(y) for _, y in out]), labels)


def test_batches_default_float32():
    images, labels = small_images()
    with B.default_dtype("float32"):
        batches = Batches(images, labels, 4, mean=MEAN, std=STD)
    x, _ = next(batches.epoch(0))
    assert x.dtype == np.float32


def test_batches_drop_last(backend):
    images, labels = small_images(n=10)
    batches = Batches(images, labels, 4, mean=MEAN, std=STD, drop_last=True)
    assert len(batches) == 2
    assert [len(y) for _, y in batches.epoch(0)] == [4, 4]
    assert len(Batches(images, labels, 5, mean=MEAN, std=STD, drop_last=True)) == 2


def test_batches_normalize(backend):
    images, labels = small_images()
    x, _ = next(Batches(images, labels, 10, mean=MEAN, std=STD).epoch(0))
    x = B.to_host(x)
    for i in (0, 3, 9):
        for c in range(3):
            expected = ((10 * i + c) / 255 - MEAN[c]) / STD[c]
            np.testing.assert_allclose(x[i, c], expected, rtol=1e-12, atol=1e-12)


def test_batches_shuffle_depends_only_on_seed_and_epoch(backend):
    images, labels = small_images(n=50)
    labels = np.arange(50)

    def epoch_labels(seed, epoch):
        batches = Batches(images, labels, 8, mean=MEAN, std=STD, shuffle=True, seed=seed)
        return np.concatenate([B.to_host(y) for _, y in batches.epoch(epoch)])

    first = epoch_labels(seed=0, epoch=0)
    np.testing.assert_array_equal(first, np.random.default_rng((0, 0)).permutation(50))
    np.testing.assert_array_equal(epoch_labels(seed=0, epoch=0), first)
    assert not np.array_equal(epoch_labels(seed=0, epoch=1), first)
    assert not np.array_equal(epoch_labels(seed=1, epoch=0), first)
    np.testing.assert_array_equal(np.sort(epoch_labels(seed=0, epoch=1)), labels)


def add_noise(x, rng):
    """An augmentation that depends on its generator."""
    return x + rng.random(x.shape, dtype=x.dtype)


@pytest.mark.parametrize("start", [0, 2, 6, 7])
def test_batches_resume_gives_the_tail_of_the_epoch(backend, start):
    images, labels = small_images(n=50)
    batches = Batches(images, labels, 8, mean=MEAN, std=STD, shuffle=True, seed=3,
                      augment=add_noise)
    full = [(B.to_host(x), B.to_host(y)) for x, y in batches.epoch(5)]
    tail = [(B.to_host(x), B.to_host(y)) for x, y in batches.epoch(5, start=start)]
    assert len(full) == 7 and len(tail) == 7 - start
    for (x_full, y_full), (x_tail, y_tail) in zip(full[start:], tail):
        np.testing.assert_array_equal(x_tail, x_full)
        np.testing.assert_array_equal(y_tail, y_full)


def test_batches_start_out_of_range():
    images, labels = small_images()
    batches = Batches(images, labels, 4, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match=r"start should be in 0..3, got 4"):
        next(batches.epoch(0, start=4))


def test_batches_augment_gets_a_generator_and_unnormalized_input(backend):
    images, labels = small_images()
    calls = []

    def invert(x, rng):
        calls.append((B.to_host(x).copy(), rng))
        return 1 - x

    batches = Batches(images, labels, 5, mean=MEAN, std=STD, augment=invert)
    x, _ = next(batches.epoch(0))
    seen, rng = calls[0]
    assert isinstance(rng, B.xp.random.Generator)
    np.testing.assert_allclose(seen[1, 2], (10 + 2) / 255, rtol=1e-12)
    np.testing.assert_allclose(B.to_host(x)[1, 2], (1 - 12 / 255 - MEAN[2]) / STD[2], rtol=1e-12)
    assert len(list(batches.epoch(0))) == 2 and len(calls) == 3


def test_batches_check_their_inputs():
    images, labels = small_images()
    with pytest.raises(ValueError, match="images should be \\(N, C, H, W\\) uint8"):
        Batches(images.astype(np.float32), labels, 4, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="images have 3 channels but mean has 1 values"):
        Batches(images, labels, 4, mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match="10 images but labels have shape \\(9,\\)"):
        Batches(images, labels[:9], 4, mean=MEAN, std=STD)
    assert len(Batches(images, labels, 4, mean=MEAN, std=STD, num_classes=labels.max() + 1)) == 3
    with pytest.raises(ValueError, match=f"labels must be in \\[0, 2\\] for 3 classes, got "
                                         f"labels in \\[0, {labels.max()}\\]"):
        Batches(images, labels, 4, mean=MEAN, std=STD, num_classes=3)


# --------------------------------------------------------------------------- real data


def read_sha256sums(folder):
    lines = (folder / "SHA256SUMS").read_text().split("\n")
    return {name.lstrip("*"): digest
            for digest, name in (line.split() for line in lines if line.strip())}


@pytest.mark.slow
@pytest.mark.skipif(not (REAL_DATA / "mnist").is_dir(), reason=f"no MNIST under {REAL_DATA}")
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_mnist_like(name):
    folder = REAL_DATA / data.DATASETS[name].folder
    if not folder.is_dir():
        pytest.skip(f"no {folder}")
    assert read_sha256sums(folder) == data.DATASETS[name].sha256
    x, y = load_dataset(name, "test", REAL_DATA, download=False, verify=True)
    assert x.shape == (10000, 1, 28, 28) and x.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.int64
    assert np.array_equal(np.unique(y), np.arange(10))


@pytest.mark.slow
@pytest.mark.skipif(not (REAL_DATA / "cifar-10").is_dir(), reason=f"no CIFAR-10 under {REAL_DATA}")
def test_real_cifar10():
    folder = REAL_DATA / "cifar-10" / "cifar-10-batches-bin"
    info = data.DATASETS["cifar10"]
    assert read_sha256sums(folder) == info.sha256
    assert tuple((folder / "batches.meta.txt").read_text().split()) == info.classes
    x, y = load_dataset("cifar10", "test", REAL_DATA, download=False, verify=True)
    assert x.shape == (10000, 3, 32, 32) and x.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.int64
    assert np.array_equal(np.bincount(y), np.full(10, 1000))
