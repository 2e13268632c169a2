"""Datasets: find, download, check and read MNIST, Fashion-MNIST and CIFAR-10, then batch them.

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

Where the files come from, first match wins:

1. ``data_dir`` given to ``load_dataset`` (or, when it is None, the ``TINYVIT_DATA``
   environment variable): a folder holding the dataset folder (``mnist/``,
   ``fashion-mnist/``, ``cifar-10/``), the dataset folder itself, for CIFAR-10 also
   the ``cifar-10-batches-*`` folder itself, a folder holding the official tarball,
   or the tarball itself (unpacked into the cache). If the files are not there
   this is an error: it never falls back to downloading.
2. The cache: ``~/.cache/tinyvit/<dataset folder>`` (``TINYVIT_CACHE`` replaces
   ``~/.cache/tinyvit``).
3. A download from the official mirrors into the cache (``download=True``).

Loading gives host arrays: images uint8 (N, C, H, W) and labels int64 (N,).
``Batches`` moves them to the active backend once and serves normalized float
mini-batches from there.

Shapes: ``N`` examples, ``B`` batch, ``C`` channels, ``H``/``W`` image height/width.
"""

import gzip
import hashlib
import http.client
import os
import pickle
import shutil
import struct
import tarfile
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import backend
from .backend import to_device, xp
from .checkpoint import atomic_write

SPLITS = ("train", "test")
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32  # label byte + R, G, B planes
CHUNK_BYTES = 1 << 20  # read/hash/download in 1 MiB pieces
DIGEST_NAMES = {"sha256": "SHA-256", "md5": "MD5"}


class DatasetError(ValueError):
    """A dataset file (or an image given to classify) is missing, corrupted or
    not what it should be."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Archive:
    """An official tarball: where to get it and its published MD5."""

    url: str
    md5: str

    @property
    def filename(self):
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Layout:
    """One on-disk form of a dataset: its files per split and how to read them."""

    format: str  # "idx", "cifar-bin" or "cifar-py"
    subfolder: str  # where the files lie inside the dataset folder ("" = directly)
    splits: dict  # split -> file names
    archive: Archive | None = None  # the tarball that unpacks to `subfolder`


@dataclass(frozen=True)
class DatasetInfo:
    """Everything known about one dataset: its files, classes and pixel statistics."""

    name: str
    folder: str  # the dataset's folder under a data root or the cache
    classes: tuple  # class names, index = label
    mean: tuple  # per channel, training set, pixels in [0, 1]
    std: tuple
    image_shape: tuple  # (C, H, W)
    layouts: tuple  # accepted on-disk forms, the one downloads produce first
    sha256: dict = field(default_factory=dict)  # file name -> SHA-256 (files that have one)
    mirrors: tuple = ()  # base URLs that each serve every file of layouts[0]
    records_per_file: int = 0  # CIFAR: records in every batch file


def _idx_layout():
    return Layout(
        format="idx",
        subfolder="",
        splits={
            "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        },
    )


def _cifar_layout(format, subfolder, suffix, archive):
    return Layout(
        format=format,
        subfolder=subfolder,
        splits={
            "train": tuple(f"data_batch_{i}{suffix}" for i in range(1, 6)),
            "test": (f"test_batch{suffix}",),
        },
        archive=archive,
    )


DATASETS = {
    "mnist": DatasetInfo(
        name="mnist",
        folder="mnist",
        classes=tuple(str(digit) for digit in range(10)),
        mean=(0.1307,),
        std=(0.3081,),
        image_shape=(1, 28, 28),
        layouts=(_idx_layout(),),
        sha256={
            "train-images-idx3-ubyte.gz":
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "train-labels-idx1-ubyte.gz":
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "t10k-images-idx3-ubyte.gz":
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "t10k-labels-idx1-ubyte.gz":
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        },
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
    ),
    "fashion-mnist": DatasetInfo(
        name="fashion-mnist",
        folder="fashion-mnist",
        classes=(
            "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
        ),
        mean=(0.2860,),
        std=(0.3530,),
        image_shape=(1, 28, 28),
        layouts=(_idx_layout(),),
        sha256={
            "train-images-idx3-ubyte.gz":
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            "train-labels-idx1-ubyte.gz":
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            "t10k-images-idx3-ubyte.gz":
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            "t10k-labels-idx1-ubyte.gz":
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        },
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    ),
    "cifar10": DatasetInfo(
        name="cifar10",
        folder="cifar-10",
        classes=(
            "airplane", "automobile", "bird", "cat", "deer",
            "dog", "frog", "horse", "ship", "truck",
        ),
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        image_shape=(3, 32, 32),
        layouts=(
            _cifar_layout("cifar-bin", "cifar-10-batches-bin", ".bin", Archive(
                "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                "c32a1d4ab5d03f1284b67883e8d87530",
            )),
            _cifar_layout("cifar-py", "cifar-10-batches-py", "", Archive(
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
            )),
        ),
        sha256={  # binary version only: the python version has no published per-file sums
            "data_batch_1.bin": "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
            "data_batch_2.bin": "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
            "data_batch_3.bin": "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
            "data_batch_4.bin": "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
            "data_batch_5.bin": "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
            "test_batch.bin": "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
            "batches.meta.txt": "2ce042b1e0b48db4bb214408e6414ba18b2731c24af244f2d6c112fddf31af00",
        },
        records_per_file=10000,
    ),
}


def dataset_info(name):
    """The registry entry of ``name``: ``.classes``, ``.mean``, ``.std``, ``.image_shape``, ..."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return DATASETS[name]


# --------------------------------------------------------------------------- loading


def load_dataset(name, split, data_dir=None, download=True, verify=True):
    """Read one split of a dataset as host arrays.

    Args:
        name: "mnist", "fashion-mnist" or "cifar10".
        split: "train" or "test".
        data_dir: where the files are (see the module docstring for the accepted
            forms); None means ``$TINYVIT_DATA``, else the cache, else a download.
        download: whether a dataset missing from the cache may be downloaded.
        verify: check each file's SHA-256 (and a tarball's MD5) before reading it.
            Structure checks (magic numbers, sizes, labels) always run, and
            downloads are always checked.

    Returns:
        images: (N, C, H, W) uint8 numpy array.
        labels: (N,) int64 numpy array.

    Raises:
        ValueError: unknown name or split.
        DatasetError: files missing, corrupted, or not the official ones.
    """
    info = dataset_info(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    layout, folder = _locate(info, split, data_dir, download, verify)
    paths = [folder / filename for filename in layout.splits[split]]
    if verify:
        for path in paths:
            if path.name in info.sha256:
                _check_digest(path, "sha256", info.sha256[path.name])
    return _read_split(info, layout, paths)


def _read_split(info, layout, paths):
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


# --------------------------------------------------------------------------- checksums


def file_digest(path, algorithm="sha256"):
    """Hex digest of a file, read in chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _check_digest(path, algorithm, expected):
    got = file_digest(path, algorithm)
    if got != expected:
        raise DatasetError(
            f"{path}: {DIGEST_NAMES[algorithm]} mismatch: expected {expected}, got {got}; "
            f"the file is corrupted or not the official one (delete it, or pass verify=False "
            f"to read it anyway)"
        )


# --------------------------------------------------------------------------- finding files


def cache_dir(info):
    """Where downloads and unpacked tarballs of a dataset go."""
    root = os.environ.get("TINYVIT_CACHE") or Path.home() / ".cache" / "tinyvit"
    return Path(root).expanduser() / info.folder


def _locate(info, split, data_dir, download, verify):
    """(layout, folder) holding the split's files: data_dir, $TINYVIT_DATA, cache, download."""
    if data_dir is None:
        data_dir = os.environ.get("TINYVIT_DATA") or None
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        found = _search(info, split, data_dir, verify)
        if found is None:
            raise _missing_error(info, split, data_dir)
        return found
    cache = cache_dir(info)
    found = _search(info, split, cache, verify)
    if found is not None:
        return found
    if not download:
        raise DatasetError(
            f"{info.name} {split}: not in the cache {cache} and download=False; "
            f"point at a local copy with --data-dir or the TINYVIT_DATA environment variable"
        )
    _download(info, split, cache)
    return _search(info, split, cache, verify)


def _search(info, split, root, verify):
    """Find the split's files under ``root``, unpacking a tarball if that is what is there."""
    for layout, folder in _candidate_folders(info, root):
        if all((folder / filename).is_file() for filename in layout.splits[split]):
            return layout, folder
    tarballs = _candidate_tarballs(info, root)
    if tarballs:
        layout, tarball = tarballs[0]
        return layout, _unpack(info, layout, tarball, split, verify)
    return None


def _candidate_folders(info, root):
    """(layout, folder) pairs where files may lie, for every form ``root`` may take."""
    for dataset_folder in (root / info.folder, root):
        for layout in info.layouts:
            for folder in dict.fromkeys((dataset_folder / layout.subfolder, dataset_folder)):
                yield layout, folder


def _candidate_tarballs(info, root):
    """(layout, tarball) pairs: ``root`` itself, or official tarballs lying in it."""
    archives = {layout.archive.filename: layout for layout in info.layouts if layout.archive}
    if root.is_file():
        if root.name not in archives:
            expected = f"a folder or one of {', '.join(archives)}" if archives else "a folder"
            raise DatasetError(f"{root} is a file; {info.name} expects {expected}")
        return [(archives[root.name], root)]
    return [
        (layout, dataset_folder / filename)
        for dataset_folder in (root / info.folder, root)
        for filename, layout in archives.items()
        if (dataset_folder / filename).is_file()
    ]


def _missing_error(info, split, data_dir):
    """A DatasetError naming the folder and the files missing from the closest match."""
    if not data_dir.exists():
        return DatasetError(f"{info.name} {split}: the data folder {data_dir} does not exist")

    def present(candidate):
        layout, folder = candidate
        return sum((folder / filename).is_file() for filename in layout.splits[split])

    layout, folder = max(_candidate_folders(info, data_dir), key=present)
    missing = [f for f in layout.splits[split] if not (folder / f).is_file()]
    message = (
        f"{info.name} {split}: {data_dir} does not hold the files; "
        f"missing in {folder}: {', '.join(missing)}"
    )
    archives = [layout.archive.filename for layout in info.layouts if layout.archive]
    if archives:
        message += f" (an official tarball also works: {', '.join(archives)})"
    return DatasetError(message)


# --------------------------------------------------------------------------- tarballs


def _unpack(info, layout, tarball, split, verify):
    """Unpack an official tarball into the cache; the folder now holding the split."""
    if verify:
        _check_digest(tarball, "md5", layout.archive.md5)
    destination = cache_dir(info)
    extract_tarball(tarball, destination)
    folder = destination / layout.subfolder
    missing = [f for f in layout.splits[split] if not (folder / f).is_file()]
    if missing:
        raise DatasetError(f"{tarball}: has no {layout.subfolder}/ {', '.join(missing)}")
    return folder


def extract_tarball(tarball, destination):
    """Extract the regular files of a tarball under ``destination``, refusing unsafe members.

    A member with an absolute path or a ``..`` could write outside ``destination``,
    and a link or device has no place in a dataset: both are errors. Each file is
    written to a temporary name and renamed when complete, so an interrupted
    extraction never leaves a truncated file under its real name.
    """
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(tarball, member)
            for member in tqdm(members, desc=f"extracting {Path(tarball).name}", unit="file"):
                if member.isfile():
                    _extract_member(tar, member, destination)
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DatasetError(
            f"{tarball}: not a valid tar.gz file (corrupted or truncated): {e}"
        ) from e


def _check_member(tarball, member):
    parts = Path(member.name).parts
    if Path(member.name).is_absolute() or ".." in parts:
        raise DatasetError(
            f"{tarball}: refusing member {member.name!r}: it points outside the folder"
        )
    if not (member.isfile() or member.isdir()):
        raise DatasetError(
            f"{tarball}: refusing member {member.name!r}: not a regular file or folder"
        )


def _extract_member(tar, member, destination):
    target = destination / member.name
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(target) as out:
        shutil.copyfileobj(tar.extractfile(member), out, CHUNK_BYTES)


# --------------------------------------------------------------------------- downloads


def _download(info, split, destination):
    """Download what the split needs into ``destination`` (the cache)."""
    destination.mkdir(parents=True, exist_ok=True)
    layout = info.layouts[0]
    if info.mirrors:
        for filename in layout.splits[split]:
            if not (destination / filename).is_file():
                urls = [mirror + filename for mirror in info.mirrors]
                download_file(urls, destination / filename, "sha256", info.sha256[filename])
    else:
        archive = layout.archive
        download_file([archive.url], destination / archive.filename, "md5", archive.md5)


def download_file(urls, target, algorithm, expected):
    """Fetch ``target`` from the first URL that serves it with the expected digest.

    The bytes go to a temporary file next to ``target``, renamed only once the
    digest matches, so ``target`` is either absent or complete and correct.
    """
    failures = []
    for url in urls:
        try:
            _download_one(url, Path(target), algorithm, expected)
            return
        except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
            failures.append(f"  {url}: {e}")
    raise DatasetError(
        f"could not download {Path(target).name}; tried:\n" + "\n".join(failures)
        + "\nIf you have the files, point at their folder with --data-dir "
        "or the TINYVIT_DATA environment variable."
    )


def _download_one(url, target, algorithm, expected):
    digest = hashlib.new(algorithm)
    with atomic_write(target) as out, urllib.request.urlopen(url, timeout=60) as response:
        size = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=size, unit="B", unit_scale=True, desc=target.name) as bar:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        if digest.hexdigest() != expected:
            raise DatasetError(
                f"{DIGEST_NAMES[algorithm]} mismatch: expected {expected}, "
                f"got {digest.hexdigest()}"
            )


# --------------------------------------------------------------------------- batches


def normalize(x, mean, std):
    """(x - mean) / std per channel, the input the models see: x (B, C, H, W) floats
    in [0, 1] on the active backend; mean, std C values each (``dataset_info``)."""
    shape = (1, len(mean), 1, 1)
    mean = to_device(np.asarray(mean).reshape(shape), dtype=x.dtype)
    std = to_device(np.asarray(std).reshape(shape), dtype=x.dtype)
    return (x - mean) / std


def linear_interpolation_matrix(old, new):
    """The (new, old) matrix W of 1-D linear resampling: resized = W @ values.

    As ``F.interpolate(mode="bilinear", align_corners=False)`` without antialias:
    output sample o sits at input coordinate x = (o + 0.5) * old / new - 0.5
    (pixel centres aligned), clamped to [0, old - 1], and mixes the samples
    floor(x) and floor(x) + 1 with weights 1 - t and t, t = x - floor(x). Every
    row sums to 1; for new == old it is the identity.
    """
    x = xp.clip((xp.arange(new, dtype=xp.float64) + 0.5) * (old / new) - 0.5, 0, old - 1)
    low = xp.floor(x).astype(xp.int64)  # (new,)
    high = xp.minimum(low + 1, old - 1)
    t = x - low
    rows = xp.arange(new)
    W = xp.zeros((new, old))
    W[rows, low] += 1 - t  # each row's two taps (one when x is the last sample: t = 0)
    W[rows, high] += t
    return W


def resize_images(x, size):
    """(B, C, H, W) -> (B, C, size, size) by bilinear interpolation, on the active
    backend and vectorized over the batch: each image channel X becomes
    Wh X Ww^T with the matrices of ``linear_interpolation_matrix``."""
    _, _, H, W = x.shape
    Wh = linear_interpolation_matrix(H, size).astype(x.dtype)  # (size, H)
    Ww = linear_interpolation_matrix(W, size).astype(x.dtype)  # (size, W)
    return Wh @ x @ Ww.T  # (B, C, size, size)


class Batches:
    """Normalized mini-batches on the active backend, reproducible per (seed, epoch).

    The uint8 images and int64 labels move to the device once. For epoch ``e``
    the order is ``backend.host_rng((seed, e)).permutation(N)`` when
    ``shuffle``, else 0..N-1, so it depends on nothing but ``(seed, e)``: resuming
    at batch ``start`` gives exactly the batches a full epoch would have given.

    Each batch: gather the images on the device, scale to [0, 1] in the default
    float dtype (read when the Batches is made), resize them to ``image_size``
    if given (``resize_images``), apply
    ``augment(x, backend.rng((seed, epoch, batch_index)))`` if given, then
    normalize each channel: ``(x - mean) / std``.

    Args:
        images: (N, C, H, W) uint8, host or device.
        labels: (N,) ints.
        batch_size: examples per batch.
        mean, std: C values each, in [0, 1] pixel units (``dataset_info(name).mean``).
        shuffle: a new order each epoch.
        drop_last: leave out the final batch when it is short.
        seed: with the epoch, seeds the order and the augmentation.
        augment: ``f(x, rng) -> x`` on (B, C, H, W) floats in [0, 1], or None.
        image_size: the side the images are resized to (None: as they are).
    """

    def __init__(self, images, labels, batch_size, *, mean, std, shuffle=False,
                 drop_last=False, seed=0, augment=None, image_size=None):
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(
                f"images should be (N, C, H, W) uint8, got {images.shape} {images.dtype}"
            )
        if labels.shape != images.shape[:1]:
            raise ValueError(f"{images.shape[0]} images but labels have shape {labels.shape}")
        if batch_size < 1:
            raise ValueError(f"batch_size should be at least 1, got {batch_size}")
        channels = images.shape[1]
        if len(mean) != channels or len(std) != channels:
            raise ValueError(
                f"images have {channels} channels but mean has {len(mean)} values "
                f"and std {len(std)}"
            )
        self.images = to_device(images)  # (N, C, H, W) uint8
        self.labels = to_device(labels, dtype=xp.int64)  # (N,)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.augment = seed, augment
        self.dtype = backend.get_default_dtype()
        self.mean, self.std = mean, std
        self.image_size = image_size

    def __len__(self):
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch):
        """The example indices of an epoch, in the order it visits them (host array)."""
        n = len(self.labels)
        if self.shuffle:
            return backend.host_rng((self.seed, epoch)).permutation(n)
        return np.arange(n)

    def epoch(self, epoch, start=0):
        """Yield ``(x, y)`` for batches ``start``, ``start + 1``, ... of ``epoch``.

        x: (B, C, H, W) floats, normalized. y: (B,) int64. Both on the active backend.
        """
        if not 0 <= start <= len(self):
            raise ValueError(f"start should be in 0..{len(self)}, got {start}")
        order = to_device(self.order(epoch))  # (N,)
        for b in range(start, len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]  # (B,)
            x = self.images[index].astype(self.dtype)  # (B, C, H, W) in 0..255
            x *= 1 / 255
            if self.image_size is not None and x.shape[-2:] != (self.image_size,) * 2:
                x = resize_images(x, self.image_size)
            if self.augment is not None:
                x = self.augment(x, backend.rng((self.seed, epoch, b)))
            yield normalize(x, self.mean, self.std), self.labels[index]
