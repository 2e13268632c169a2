"""Checkpoints and model files: ``.npz`` files written whole or not at all.

A training checkpoint holds the model (state dict, timm layout) under
``model/<key>``, the optimizer's state under ``optim/<key>``, and a JSON ``meta``
entry (the run's config, the model's config, epoch, step, metrics history, ...).
Random state needs no entry: data order, augmentation and dropout are seeded
from (seed, epoch, step). A model file (``save_model``) holds the state dict and
the model's config under ``__config__``.

Every file is written through ``tinyvit.files.atomic_write``: a crash, a Ctrl-C
or a full disk mid-write leaves the previous file intact.
"""

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np  # host-side file reading only

from ..backend import to_host
from ..data import dataset_info
from ..files import atomic_write
from ..models import ViT, ViTConfig, preset_config

ZIP_SIGNATURE = b"PK\x03\x04"  # how every .npz file starts: it is a zip archive
NPZ_ENTRY_BYTES = 256  # a zip header and a .npy header per entry, about


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or is not a tinyvit checkpoint."""


def save_npz(path, arrays):
    """Write ``{name: array or str}`` to ``path`` atomically (uncompressed)."""
    host = {k: (np.array(v) if isinstance(v, str) else to_host(v)) for k, v in arrays.items()}
    size = sum(a.nbytes + NPZ_ENTRY_BYTES for a in host.values())
    with atomic_write(path, size) as f:
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


# -- model files ----------------------------------------------------------------------


def save_model(model, path):
    """Write a model's config and state dict to one ``.npz`` file."""
    arrays = dict(model.state_dict())
    arrays["__config__"] = json.dumps(dataclasses.asdict(model.config))
    return save_npz(path, arrays)


def load_model(path, dtype=None):
    """The ViT (of reference layers) of a file written by ``save_model``."""
    arrays = load_npz(path)
    if "__config__" not in arrays:
        raise CheckpointError(f"{path}: not a tinyvit model file (no __config__ entry)")
    model = ViT(ViTConfig(**json.loads(arrays.pop("__config__"))), dtype=dtype)
    model.load_state_dict(arrays)
    return model


# -- training checkpoints ----------------------------------------------------------------


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


def saved_model_config(meta):
    """The ViTConfig a training checkpoint's model was built with: its
    ``model_config``, or, in a checkpoint written before that was saved, the run's
    preset for its dataset with the run's overrides."""
    if "model_config" in meta:
        return ViTConfig(**meta["model_config"])
    run = meta["config"]
    fields = {**dataset_info(run["dataset"]).model_fields(), **run["model_overrides"]}
    return preset_config(run["model"], **fields)
