"""Files written whole or not at all (tinyvit/files.py): an error or a full disk
mid-write leaves the previous file as it was and no temporary file behind."""

import errno
import os

import pytest

from tinyvit.files import NoSpaceError, atomic_write


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "last.npz"
    path.write_bytes(b"before")
    with pytest.raises(RuntimeError, match="stopped"):
        with atomic_write(path) as f:
            f.write(b"half")
            raise RuntimeError("stopped")
    assert path.read_bytes() == b"before"
    assert [p.name for p in tmp_path.iterdir()] == ["last.npz"]


def test_a_full_disk_names_the_file_and_the_space_it_needs(tmp_path):
    path = tmp_path / "last.npz"
    path.write_bytes(b"before")
    with pytest.raises(NoSpaceError) as raised:
        with atomic_write(path, size=3_400_000) as f:
            f.write(b"x" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
    error = raised.value
    assert (error.path, error.needed, error.errno) == (path, 3_400_000, errno.ENOSPC)
    assert str(error).startswith(f"no space left on the device for {path}: it needs about "
                                 "3.4 MB, ")
    assert str(error).endswith(" MB free there")
    assert path.read_bytes() == b"before"
    assert [p.name for p in tmp_path.iterdir()] == ["last.npz"]


def test_without_a_size_the_bytes_written_are_what_it_needs(tmp_path):
    with pytest.raises(NoSpaceError, match="it needs about 0.5 MB"):
        with atomic_write(tmp_path / "curves.png") as f:
            f.write(b"x" * 500_000)
            raise OSError(errno.EDQUOT, "Disk quota exceeded")


def test_a_file_written_whole_has_the_permissions_of_a_new_file(tmp_path):
    """As open() would make it (0666 less the umask), not a temporary file's 0600."""
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "model.npz") as f:
            f.write(b"weights")
    finally:
        os.umask(umask)
    assert (tmp_path / "model.npz").stat().st_mode & 0o777 == 0o644
