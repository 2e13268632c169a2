"""Checkpoints that survive a crash: one ``.npz`` file, written atomically.

A file is first written in full to a temporary name beside the target, flushed
to disk, then renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a crash or Ctrl-C mid-write leaves the previous checkpoint intact.

A training checkpoint holds: the model (state dict, timm layout) under
``model/<key>``, the optimizer's state under ``optim/<key>``, and a JSON ``meta``
entry (config, epoch, step, metrics history, ...). Random state needs no entry:
data order, augmentation and dropout are seeded from (seed, epoch, step).
"""

import json
import os
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .backend import to_host


@contextmanager
def atomic_write(path):
    """Yield a temporary binary file beside ``path``; when the block succeeds it is
    flushed to disk and renamed over ``path``, otherwise removed, so ``path`` is
    never half-written and keeps its old content on any error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                      delete=False)
    try:
        with out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(out.name, path)
    finally:
        Path(out.name).unlink(missing_ok=True)


ZIP_SIGNATURE = b"PK\x03\x04"  # how every .npz file starts: it is a zip archive


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or is not a tinyvit checkpoint."""


def save_npz(path, arrays):
    """Write ``{name: array or str}`` to ``path`` atomically."""
    host = {k: (np.array(v) if isinstance(v, str) else to_host(v)) for k, v in arrays.items()}
    with atomic_write(path) as f:
        np.savez(f, **host)
    return Path(path)


def load_npz(path):
    """Read a file written by ``save_npz`` into a dict (0-d string entries as str)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file: {path}")
    with open(path, "rb") as f:
        if f.read(4) != ZIP_SIGNATURE:
            raise CheckpointError(f"{path}: expected a .npz file (a zip archive), got a file that "
                                  "does not start with the zip signature")
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as data:
                # data[k] reads the entry at every access: once each
                arrays = {k: data[k] for k in data.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise CheckpointError(f"{path}: not a readable .npz checkpoint ({e})") from e
    return {k: (str(a) if a.dtype.kind == "U" else a) for k, a in arrays.items()}


def save_checkpoint(path, model, optimizer, meta):
    """Save model, optimizer state and ``meta`` (a JSON-able dict) to one file."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta"] = json.dumps(meta)
    return save_npz(path, arrays)


def load_checkpoint(path):
    """Return (model_state, optim_state, meta) from a file written by ``save_checkpoint``."""
    arrays = load_npz(path)
    if "meta" not in arrays:
        raise CheckpointError(f"{path}: not a tinyvit training checkpoint (no meta entry)")
    model_state = {k[6:]: v for k, v in arrays.items() if k.startswith("model/")}
    optim_state = {k[6:]: v for k, v in arrays.items() if k.startswith("optim/")}
    return model_state, optim_state, json.loads(arrays["meta"])
