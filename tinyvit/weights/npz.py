"""Reading a ``.npz`` file that may come from anyone: no array is read before the
whole file has been checked.

1. the zip directory: every member a ``.npy`` array, stored or deflated, within
   the file, all of them unpacking to at most ``MAX_INFLATION`` times the file's
   size (plus ``SMALL_BYTES``), so that a deflate bomb is refused unread;
2. every member's ``.npy`` header: its shape and dtype must make exactly the
   member's unpacked size, so that a header claiming terabytes is refused, and
   no member may hold Python objects (they would be unpickled);
3. a text entry (``text``, ``json``): at most ``MAX_TEXT_CHARS`` characters.

Every error is a CheckpointError of one line naming the file, what is wrong,
what was expected and what came.
"""

import contextlib
import dataclasses
import json
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np  # host-side file reading only

from .formats import CheckpointError, one_line

ZIP_SIGNATURE = b"PK\x03\x04"  # how every .npz file starts: it is a zip archive
MAX_INFLATION = 20  # float weights deflate to about 0.9 of their size; zeros to 1/1000
SMALL_BYTES = 1 << 20  # what any file may unpack to, whatever its size
MAX_TEXT_CHARS = 1_000_000  # a meta or config entry (a long run's meta is some 100,000)
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what numpy.savez(_compressed) writes
READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One array of a ``.npz`` file as its headers declare it, before it is read."""

    name: str  # the member's name without ".npy"
    shape: tuple
    dtype: np.dtype
    member: zipfile.ZipInfo


class NpzFile:
    """An open ``.npz`` file whose ``entries`` (name -> Entry) were checked when it
    was opened; ``read``, ``text`` and ``json`` read one entry each."""

    def __init__(self, path, archive):
        self.path, self._archive = path, archive
        self.size = path.stat().st_size
        members = archive.infolist()
        for member in members:
            self._check_member(member)
        self._check_inflation(members)
        self.entries = {}
        for member in members:
            entry = self._entry(member)
            if entry.name in self.entries:
                raise CheckpointError(f"{path}: entry {entry.name!r} is there twice, expected "
                                      "one entry of each name")
            self.entries[entry.name] = entry

    def _check_member(self, member):
        """The zip directory's word on a member: a .npy file, not encrypted, stored or
        deflated, within the file."""
        name, where = member.filename, f"{self.path}: member {member.filename!r}"
        if not name.endswith(".npy"):
            raise CheckpointError(f"{where} is not an array, expected .npy members (what "
                                  f"numpy.savez writes), got {name!r}")
        if member.flag_bits & 0x1:
            raise CheckpointError(f"{where} is encrypted, expected plain members")
        if member.compress_type not in COMPRESSIONS:
            raise CheckpointError(f"{where} is compressed by zip method {member.compress_type}, "
                                  "expected stored or deflated (what numpy.savez writes)")
        if member.header_offset + member.compress_size > self.size:
            raise CheckpointError(f"{where} runs past the end of the file, expected at most "
                                  f"{self.size:,} bytes, got {member.compress_size:,} bytes at "
                                  f"offset {member.header_offset:,}")

    def _check_inflation(self, members):
        """All members together unpack to at most MAX_INFLATION times the file's size
        (and SMALL_BYTES more): more is a deflate bomb, or members sharing data."""
        total, limit = sum(m.file_size for m in members), MAX_INFLATION * self.size + SMALL_BYTES
        if total > limit:
            worst = max(members, key=lambda m: m.file_size / max(m.compress_size, 1))
            raise CheckpointError(
                f"{self.path}: the members unpack to too much (a zip bomb?), expected at most "
                f"{limit:,} bytes ({MAX_INFLATION} times the file's {self.size:,} and "
                f"{SMALL_BYTES:,} more), got {total:,} ({worst.filename!r} unpacks "
                f"{worst.compress_size:,} bytes to {worst.file_size:,})")

    def _entry(self, member):
        """The Entry of a member, its .npy header read and checked against its size."""
        where = f"{self.path}: entry {member.filename[:-4]!r}"
        shape, dtype, header = self._header(member, where)
        if dtype.hasobject:
            raise CheckpointError(f"{where} holds Python objects, expected numbers or text "
                                  f"(objects would be unpickled), got dtype {dtype}")
        if min(shape, default=0) < 0:
            raise CheckpointError(f"{where} has a negative size, expected sizes of at least 0, "
                                  f"got shape {shape}")
        declared = header + math.prod(shape) * dtype.itemsize
        if declared != member.file_size:
            raise CheckpointError(f"{where} is not a whole array, expected {declared:,} bytes "
                                  f"for its header's {dtype} array of shape {shape}, got "
                                  f"{member.file_size:,}")
        return Entry(member.filename[:-4], shape, dtype, member)

    def _header(self, member, where):
        """(shape, dtype, the header's length in bytes) of a member's .npy header."""
        try:
            with self._archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                if version in NPY_HEADERS:
                    shape, _, dtype = NPY_HEADERS[version](stream)
                    return shape, dtype, stream.tell()
        except READ_ERRORS as e:
            raise CheckpointError(f"{where} is not a readable .npy array, expected a .npy "
                                  f"header, got {one_line(e)}") from e
        raise CheckpointError(f"{where} is a .npy file of version {version}, expected one of "
                              f"{sorted(NPY_HEADERS)}")

    def read(self, name):
        """The array of entry ``name``."""
        entry = self.entries[name]
        try:
            with self._archive.open(entry.member) as stream:
                return np.lib.format.read_array(stream, allow_pickle=False)
        except READ_ERRORS as e:
            raise CheckpointError(f"{self.path}: entry {name!r} is not readable, expected "
                                  f"{math.prod(entry.shape) * entry.dtype.itemsize:,} bytes of "
                                  f"{entry.dtype}, got {one_line(e)}") from e

    def text(self, name):
        """The string of a text entry (a 0-d array of unicode)."""
        entry, where = self.entries[name], f"{self.path}: entry {name!r}"
        if entry.dtype.kind != "U" or entry.shape != ():
            raise CheckpointError(f"{where} is not text, expected a string, got a {entry.dtype} "
                                  f"array of shape {entry.shape}")
        if entry.dtype.itemsize // 4 > MAX_TEXT_CHARS:
            raise CheckpointError(f"{where} is too long, expected at most {MAX_TEXT_CHARS:,} "
                                  f"characters, got {entry.dtype.itemsize // 4:,}")
        return str(self.read(name))

    def json(self, name):
        """The JSON value of a text entry."""
        text = self.text(name)
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise CheckpointError(f"{self.path}: entry {name!r} is not valid JSON, expected a "
                                  f"JSON object, got {one_line(e) or type(e).__name__}") from e


@contextlib.contextmanager
def open_npz(path):
    """The checked NpzFile of ``path``; a FileNotFoundError when there is no such
    file, a CheckpointError when it is not a whole .npz file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != ZIP_SIGNATURE:
            raise CheckpointError(f"{path}: expected a .npz file (a zip archive), got a file that "
                                  "does not start with the zip signature")
        f.seek(0)
        try:
            archive = zipfile.ZipFile(f)
        except READ_ERRORS as e:
            raise CheckpointError(f"{path}: not a readable .npz checkpoint, expected a whole zip "
                                  f"archive, got a damaged or truncated one ({one_line(e)})") from e
        with archive:
            yield NpzFile(path, archive)


