"""Files written whole or not at all.

Every file tinyvit writes (checkpoints, model files, metrics, pictures, unpacked
and downloaded datasets) goes through ``atomic_write``: the bytes go to a
temporary file beside the target, are flushed to disk, and the temporary file is
renamed over the target (``os.replace`` is atomic on POSIX and Windows). A crash,
a Ctrl-C or a full disk mid-write therefore leaves the previous file as it was.
"""

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or a full quota


class NoSpaceError(OSError):
    """A file could not be written for want of disk space; the file that was there
    before is intact and the temporary one removed. ``advice`` ends the message
    with what to do next."""

    def __init__(self, path, needed, free, advice=None):
        self.path, self.needed, self.free = Path(path), needed, free
        message = (f"no space left on the device for {self.path}: it needs about "
                   f"{megabytes(needed)}, {megabytes(free)} free there")
        super().__init__(errno.ENOSPC, f"{message}; {advice}" if advice else message)

    def __str__(self):
        return self.strerror


def _new_file_mode():
    """The permissions of a new file: read and write for all, less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def megabytes(size):
    """A byte count as "1.7 MB"."""
    return f"{size / 1e6:.1f} MB"


@contextmanager
def atomic_write(path, size=None):
    """Yield a temporary binary file beside ``path``; when the block succeeds it is
    flushed to disk and renamed over ``path``, otherwise removed, so ``path`` is
    never half-written and keeps its old content on any error.

    A full disk raises ``NoSpaceError`` naming ``path`` and the space it needs:
    ``size`` bytes when the caller knows the file's size, else what was written
    before the disk filled."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                      delete=False)
    try:
        with out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(out.name, _new_file_mode())  # as open() would make it, not tempfile's 0600
        os.replace(out.name, path)
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise
        temporary = Path(out.name)
        written = temporary.stat().st_size if temporary.exists() else 0
        temporary.unlink(missing_ok=True)  # before measuring what is free
        raise NoSpaceError(path, max(size or 0, written), shutil.disk_usage(path.parent).free
                           ) from error
    finally:
        Path(out.name).unlink(missing_ok=True)
