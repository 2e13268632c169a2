"""One run per folder: the lock a run holds on its ``--out`` folder while it runs.

Two runs writing into one folder would mix their checkpoints: ``last.npz`` of one,
``best.npz`` of the other, both saying they wrote them. So a run holds
``<out>/run.lock`` from before its first write to its exit:

- The lock is the operating system's (``fcntl.flock``, advisory, exclusive): the
  kernel releases it when the process ends however it ends, kill -9 included, so
  a lock is never left held by a process that is gone.
- The file holds the holder's process id, host and command, for the message a
  second run stops with. A run that ends normally removes it; a file found
  unlocked still naming a process means that process ended without removing it
  (killed, or its machine went down): the new run takes it over and says so.
- Under mpiexec the primary process alone holds it: one lock for the run.
"""

import fcntl
import os
import socket
import sys
from pathlib import Path

LOCK_NAME = "run.lock"


class FolderInUse(RuntimeError):
    """Another run holds the folder; the message names it and what to do."""


class RunLock:
    """``with RunLock(folder):`` holds ``folder/run.lock`` inside the block.

    ``taken_over`` is the line to print when the lock was left by a run that
    ended without releasing it (else None)."""

    def __init__(self, folder):
        self.path = Path(folder) / LOCK_NAME
        self.file, self.taken_over, self.made = None, None, []

    def __enter__(self):
        folder = self.path.parent  # the folders made here, removed again if left empty
        self.made = [p for p in (folder, *folder.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while self.file is None:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(f)
                f.close()
                raise FolderInUse(f"{self.path.parent} is in use by another run ({holder}): "
                                  "wait for it to end, or give this one another --out") from None
            if _same_file(f, self.path):  # not a file the last holder removed meanwhile
                self.file = f
            else:
                f.close()
        left = _read(self.file)
        if left:
            self.taken_over = (f"{self.path}: taken over from a run that ended without "
                               f"releasing it ({left})")
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"process {os.getpid()} on {socket.gethostname()}: "
                        f"{' '.join(sys.argv)}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)  # before the lock goes: no one locks a removed file
        self.file.close()
        self.file = None
        for folder in self.made:  # deepest first: a run that could not start leaves nothing
            if any(folder.iterdir()):
                break
            folder.rmdir()


def _read(f):
    f.seek(0)
    return f.read().strip()


def _same_file(f, path):
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
