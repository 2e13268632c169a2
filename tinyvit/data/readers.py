"""Reading the official dataset files into host arrays.

File formats
------------
IDX (MNIST, Fashion-MNIST), each file gzip'd. A big-endian int32 header, then
uint8 data::

    images: magic 2051, count N, rows H, cols W, then N*H*W pixel bytes (0 = background)
    labels: magic 2049, count N,                 then N label bytes (0..9)

CIFAR-10 "binary version" (``cifar-10-batches-bin/``): ``data_batch_1.bin`` ..
``data_batch_5.bin`` (train) and ``test_batch.bin`` (test), each 10,000 records of
3,073 bytes: one label byte, then 3,072 pixel bytes, which are three 32x32
row-major planes (red, green, blue). ``batches.meta.txt`` has the class names.

CIFAR-10 "python version" (``cifar-10-batches-py/``): the same batches without the
``.bin``, each a pickled dict with ``b"data"`` (10000, 3072) uint8 (same plane
order) and ``b"labels"`` (a list of ints). Pickles can run arbitrary code when
loaded, so they are read with an unpickler that only accepts NumPy's array
reconstruction (``RestrictedUnpickler``).
"""

import gzip
import pickle
import struct
import zlib

import numpy as np  # host-side file reading only

from .datasets import DatasetError

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions


IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension


CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32  # label byte + R, G, B planes


def read_split(info, layout, paths):
    """Read and concatenate the files of one split; check the image shape."""
    num_classes = len(info.classes)
    if layout.format == "idx":
        parts = [read_idx_pair(*paths, num_classes)]
    else:
        read = read_cifar_bin if layout.format == "cifar-bin" else read_cifar_py
        parts = [read(path, info.records_per_file) for path in paths]
    images = np.concatenate([images for images, _ in parts])  # (N, C, H, W)
    labels = np.concatenate([labels for _, labels in parts]).astype(np.int64)  # (N,)
    if images.shape[1:] != info.image_shape:
        raise DatasetError(
            f"{paths[0]}: {info.name} images should be {_shape_str(info.image_shape)} (C, H, W), "
            f"got {_shape_str(images.shape[1:])}"
        )
    return images, labels


def read_idx(path, magic):
    """The uint8 array stored in a gzip'd IDX file whose magic number must be ``magic``."""
    data = _gunzip(path)
    ndim = magic & 0xFF
    header_bytes = 4 * (1 + ndim)
    if len(data) < header_bytes:
        raise DatasetError(
            f"{path}: truncated: {len(data)} bytes, less than the {header_bytes}-byte IDX header"
        )
    got_magic, *shape = struct.unpack(f">{1 + ndim}I", data[:header_bytes])
    if got_magic != magic:
        raise DatasetError(f"{path}: bad IDX magic number: expected {magic}, got {got_magic}")
    expected, actual = int(np.prod(shape)), len(data) - header_bytes
    if actual != expected:
        item = _shape_str(shape[1:]) if ndim > 1 else "1 byte"
        problem = "truncated" if actual < expected else "too long"
        raise DatasetError(
            f"{path}: {problem}: header says {shape[0]} items of {item} = {expected} bytes, "
            f"file has {actual}"
        )
    return np.frombuffer(data, np.uint8, offset=header_bytes).reshape(shape)


def read_idx_pair(images_path, labels_path, num_classes):
    """Images (N, 1, H, W) and labels (N,) from an IDX images file and its labels file."""
    images = read_idx(images_path, IDX_IMAGES_MAGIC)  # (N, H, W)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)  # (N,)
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    _check_labels(labels, num_classes, labels_path)
    return images[:, None], labels  # (N, 1, H, W)


def read_cifar_bin(path, records):
    """Images (records, 3, 32, 32) and labels from one CIFAR-10 binary batch file."""
    raw = np.fromfile(path, np.uint8)
    if raw.size % CIFAR_RECORD_BYTES:
        raise DatasetError(
            f"{path}: {raw.size} bytes is not a whole number of {CIFAR_RECORD_BYTES}-byte records "
            f"(1 label byte + 3072 pixel bytes)"
        )
    rows = raw.reshape(-1, CIFAR_RECORD_BYTES)
    if len(rows) != records:
        raise DatasetError(f"{path}: expected {records} records, file has {len(rows)}")
    _check_labels(rows[:, 0], 10, path)
    return rows[:, 1:].reshape(records, 3, 32, 32), rows[:, 0]


def read_cifar_py(path, records):
    """Images (records, 3, 32, 32) and labels from one CIFAR-10 python-version batch.

    These files have no published SHA-256, so ``verify`` cannot check them one by
    one: only the tarball's MD5 is checked, when they come from the tarball.
    Here the structure is checked instead: a dict with ``b"data"``, a
    (records, 3072) uint8 array, and ``b"labels"``, ``records`` ints in 0..9.
    """
    with open(path, "rb") as f:
        try:
            batch = RestrictedUnpickler(f, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError) as e:
            raise DatasetError(f"{path}: cannot unpickle: {e}") from e
    if not isinstance(batch, dict) or not {b"data", b"labels"} <= batch.keys():
        raise DatasetError(f"{path}: expected a dict with keys b'data' and b'labels'")
    data = batch[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape != (records, 3072):
        got = f"{data.shape} {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{path}: b'data' should be a ({records}, 3072) uint8 array, got {got}")
    labels = np.asarray(batch[b"labels"])
    if labels.shape != (records,) or labels.dtype.kind not in "iu":
        raise DatasetError(
            f"{path}: b'labels' should be {records} ints, got {labels.shape} {labels.dtype}"
        )
    _check_labels(labels, 10, path)
    return data.reshape(records, 3, 32, 32), labels


def _numpy_reconstruct():
    """NumPy's array-unpickling helper (``numpy._core`` in NumPy 2, ``numpy.core`` before)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds NumPy arrays and nothing else that could run code.

    A pickle names the functions to call while loading ("globals"); a hostile
    one names ``os.system``. CIFAR-10 batches need only these four.
    """

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct(),
        ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct(),
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            allowed = ", ".join(f"{m}.{n}" for m, n in self.ALLOWED)
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}; allowed: {allowed}"
            )
        return self.ALLOWED[module, name]


def _gunzip(path):
    """The decompressed bytes of a gzip file, or a DatasetError naming it."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"{path}: not a valid gzip file (corrupted or truncated): {e}") from e


def _check_labels(labels, num_classes, path):
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = bad[0]
        raise DatasetError(
            f"{path}: label {labels[i]} at index {i} is out of range 0..{num_classes - 1} "
            f"({bad.size} bad labels)"
        )


def _shape_str(shape):
    return "x".join(str(n) for n in shape)
