"""Finding, downloading and verifying dataset files.

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
``Batches`` (``batches.py``) moves them to the active backend once and serves
normalized float mini-batches from there.
"""

import gzip
import hashlib
import http.client
import os
import shutil
import tarfile
import urllib.request
import zlib
from pathlib import Path

from tqdm import tqdm

from ..files import atomic_write
from .datasets import DATASETS, SPLITS, DatasetError, dataset_info
from .readers import read_split

CHUNK_BYTES = 1 << 20  # read/hash/download in 1 MiB pieces


DIGEST_NAMES = {"sha256": "SHA-256", "md5": "MD5"}


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
                _check_digest(path, "sha256", info.sha256[path.name], info.name,
                              downloads=folder.is_relative_to(cache_dir(info)))
    return read_split(info, layout, paths)


def file_digest(path, algorithm="sha256"):
    """Hex digest of a file, read in chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _check_digest(path, algorithm, expected, dataset, downloads=True):
    """A DatasetError unless the file's digest is ``expected``; it says what to do: in
    the cache (``downloads``), delete the file and a run downloads it again; in a folder
    of the user's, put the official file there, unless it is another dataset's."""
    got = file_digest(path, algorithm)
    if got != expected:
        other = [info.name for info in DATASETS.values() if got in info.sha256.values()]
        if other:  # MNIST's and Fashion-MNIST's files have the same names
            raise DatasetError(f"{path}: the official {other[0]} file, not {dataset}'s: "
                               f"point --data-dir at the folder of the {dataset} files")
        fix = ("delete it and run again to download the official file" if downloads else
               "put the official file in its place (or delete it and leave out --data-dir "
               "and TINYVIT_DATA: the official file is downloaded into the cache)")
        raise DatasetError(
            f"{path}: {DIGEST_NAMES[algorithm]} mismatch: expected {expected}, got {got}; "
            f"the file is corrupted or not the official one: {fix} (from Python, "
            "load_dataset(..., verify=False) reads it anyway)"
        )


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

    def unpacked(folder, filename):  # a .gz file's contents lying there in its place
        return filename.endswith(".gz") and (folder / filename.removesuffix(".gz")).is_file()

    def present(candidate):  # the files there, unpacked ones too
        layout, folder = candidate
        return sum((folder / filename).is_file() or unpacked(folder, filename)
                   for filename in layout.splits[split])

    layout, folder = max(_candidate_folders(info, data_dir), key=present)
    missing = [f for f in layout.splits[split] if not (folder / f).is_file()]
    message = (
        f"{info.name} {split}: {data_dir} does not hold the files; "
        f"missing in {folder}: {', '.join(missing)}"
    )
    found = [f.removesuffix(".gz") for f in missing if unpacked(folder, f)]
    if found:
        message += (f" (found {', '.join(found)} unpacked: tinyvit reads the official .gz "
                    "files, whose checksums it knows)")
    archives = [layout.archive.filename for layout in info.layouts if layout.archive]
    if archives:
        message += f" (an official tarball also works: {', '.join(archives)})"
    return DatasetError(message)


def _unpack(info, layout, tarball, split, verify):
    """Unpack an official tarball into the cache; the folder now holding the split."""
    if verify:
        _check_digest(tarball, "md5", layout.archive.md5, info.name)
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
