"""Checkpoints and model files: ``.npz`` files written whole or not at all, read
as files that may come from anyone.

A training checkpoint holds the model (state dict, timm layout) under
``model/<key>``, the optimizer's state under ``optim/<key>``, and a JSON ``meta``
entry (the run's config, the model's config, epoch, step, metrics history, ...).
Random state needs no entry: data order, augmentation and dropout are seeded
from (seed, epoch, step). A model file (``save_model``) holds the state dict and
the model's config under ``__config__``.

Every file is written through ``tinyvit.files.atomic_write``: a crash, a Ctrl-C
or a full disk mid-write leaves the previous file intact.

Reading goes through ``npz.open_npz``, which reads no array before the whole file
has been checked (its docstring lists the checks); then the configs in the text
entries are checked, field by field, and the arrays the model config asks for
against the headers (``names.check_rules``), no other array. Only then are the
arrays read (the weights checked finite) and a model built. Every error is a
CheckpointError of one line naming the file, what is wrong, what was expected and
what came.
"""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np  # host-side file reading only

from ..backend import to_host
from ..data import dataset_info
from ..files import atomic_write
from ..models import ViT, ViTConfig, preset_config
from ..nn.optim import SGD, AdamW
from .fields import check_json_fields
from .formats import CheckpointError, Unsupported, one_line
from .names import Rule, check_depth, check_rules, tinyvit_shapes
from .npz import open_npz

NPZ_ENTRY_BYTES = 256  # a zip header and a .npy header per entry, about
OPTIMIZERS = {"adamw": AdamW, "sgd": SGD}  # TrainConfig.optimizer -> its class (its _buffers)


def save_npz(path, arrays):
    """Write ``{name: array or str}`` to ``path`` atomically (uncompressed)."""
    host = {k: (np.array(v) if isinstance(v, str) else to_host(v)) for k, v in arrays.items()}
    size = sum(a.nbytes + NPZ_ENTRY_BYTES for a in host.values())
    with atomic_write(path, size) as f:
        np.savez(f, **host)
    return Path(path)


def config_from_json(path, where, cls, values):
    """``cls(**values)`` (a config dataclass) for ``values`` read from the file at
    ``path``: every field's name and type checked first, then its value."""
    check_json_fields(path, where, cls, values, CheckpointError)
    try:
        return cls(**values)
    except (TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(f"{path}: {where} is not valid, {one_line(e)}") from e


def float_headers(entries):
    """``entries`` (name -> Entry) as ``names.check_rules`` takes them: a float
    array's Entry as it is, any other an ``Unsupported``."""
    return {name: entry if entry.dtype.kind == "f" else Unsupported(str(entry.dtype), entry.shape)
            for name, entry in entries.items()}


def check_state(path, kind, config, entries):
    """A CheckpointError unless ``entries`` (name -> Entry) are the state dict of
    ``ViT(config)``: every name there, none else, each float and of its shape."""
    check_depth(path, kind, config.depth, entries, CheckpointError)
    parameters, buffers = tinyvit_shapes(config)
    rules = [Rule(key, (key,), (shape,)) for key, shape in {**parameters, **buffers}.items()]
    check_rules(path, kind, dataclasses.asdict(config), float_headers(entries), rules,
                error=CheckpointError)


def read_finite(npz, prefix, names):
    """``{name: array}``, the entry ``prefix + name`` of an open file for each of
    ``names``, each finite: one NaN or inf among the weights makes every output NaN.
    A run saves none (it stops where its loss or gradient is not finite), but a file
    may come from anyone; a CheckpointError names the first entry that is not."""
    arrays = {name: npz.read(prefix + name) for name in names}
    for name, array in arrays.items():
        nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
        if nan or inf:
            raise CheckpointError(f"{npz.path}: entry {prefix + name!r} is not finite, expected "
                                  f"finite weights, got {nan:,} NaN and {inf:,} infinite of its "
                                  f"{array.size:,} values")
    return arrays


# -- model files ----------------------------------------------------------------------


def save_model(model, path):
    """Write a model's config and state dict to one ``.npz`` file."""
    arrays = dict(model.state_dict())
    arrays["__config__"] = json.dumps(dataclasses.asdict(model.config))
    return save_npz(path, arrays)


def read_model_file(npz):
    """(ViTConfig, state dict) of an open model file, its config and every header
    checked before the arrays are read."""
    if "__config__" not in npz.entries:
        raise CheckpointError(f"{npz.path}: not a tinyvit model file, expected a __config__ "
                              f"entry, got entries {sorted(npz.entries)[:5]}")
    config = config_from_json(npz.path, "__config__", ViTConfig, npz.json("__config__"))
    entries = {name: entry for name, entry in npz.entries.items() if name != "__config__"}
    check_state(npz.path, "tinyvit", config, entries)
    return config, read_finite(npz, "", entries)


def load_model(path, dtype=None):
    """The ViT (of reference layers) of a file written by ``save_model``."""
    with open_npz(path) as npz:
        config, state = read_model_file(npz)
    model = ViT(config, dtype=dtype)
    model.load_state_dict(state)
    return model


# -- training checkpoints ----------------------------------------------------------------


def save_checkpoint(path, model, optimizer, meta):
    """Save model, optimizer state and ``meta`` (a JSON-able dict) to one file."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta"] = json.dumps(meta)
    return save_npz(path, arrays)


@dataclasses.dataclass
class Checkpoint:
    """A training checkpoint, read and checked."""

    meta: dict  # the run's config, the model's config, where the run stands
    config: object  # the run's config: what ``run_config`` made of meta's, else meta's dict
    model_config: ViTConfig
    model_state: dict  # timm's names -> host arrays
    optim_state: dict  # the optimizer's ``state_dict``; {} when not read


def read_meta(npz, run_config=None):
    """(meta, run config) of an open training checkpoint: its meta a JSON object
    with a ``config`` object, which ``run_config(path, values)``, when given, checks
    and makes the run's config (``tinyvit.train`` passes its own: this floor does
    not know the trainer's TrainConfig)."""
    if "meta" not in npz.entries:
        kind = ("a tinyvit model file (weights and the model's config, no run: train from "
                "it with --init)"
                if "__config__" in npz.entries else
                f"entries {sorted(npz.entries)[:5]}")
        raise CheckpointError(f"{npz.path}: not a tinyvit training checkpoint, expected a meta "
                              f"entry (the run: its dataset and where it stands), got {kind}")
    meta = npz.json("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        got = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{npz.path}: meta is not a training checkpoint's, expected an "
                              f"object with a config object, got {got}")
    return meta, (run_config(npz.path, meta["config"]) if run_config else meta["config"])


def _model_config(path, meta):
    """The checked ViTConfig of a checkpoint's meta (``saved_model_config``)."""
    if "model_config" in meta:
        check_json_fields(path, "meta model_config", ViTConfig, meta["model_config"],
                          CheckpointError)
    else:
        run = meta["config"]
        for name, kind in (("dataset", str), ("model", str), ("model_overrides", dict)):
            if not isinstance(run.get(name), kind):
                raise CheckpointError(f"{path}: meta config.{name} has the wrong type, expected "
                                      f"{kind.__name__}, got {run.get(name)!r}")
        check_json_fields(path, "meta config.model_overrides", ViTConfig, run["model_overrides"],
                          CheckpointError)
    try:
        return saved_model_config(meta)
    except (TypeError, ValueError, OverflowError) as e:
        raise CheckpointError(f"{path}: the model config in meta is not valid, "
                              f"{one_line(e)}") from e


def _describe_state(state):
    return ", ".join(f"optim/{k} {shape} {kind}" for k, (shape, kind) in sorted(state.items()))


def _number_kind(dtype):
    return {"i": "int", "u": "int", "f": "float"}.get(dtype.kind, str(dtype))


def _check_optimizer(path, name, parameters, entries):
    """A CheckpointError unless ``entries`` are the state of optimizer ``name`` over
    ``parameters`` values: its step count ``t``, an integer, and a float buffer of
    that length for each of its ``_buffers``."""
    if name not in OPTIMIZERS:
        raise CheckpointError(f"{path}: meta config.optimizer is not known, expected one of "
                              f"{sorted(OPTIMIZERS)}, got {name!r}")
    expected = {"t": ((), "int"), **{k: ((parameters,), "float")
                                      for k in OPTIMIZERS[name]._buffers}}
    got = {k: (entry.shape, _number_kind(entry.dtype)) for k, entry in entries.items()}
    if got != expected:
        raise CheckpointError(f"{path}: the optimizer state is not {name}'s over {parameters:,} "
                              f"parameters, expected {_describe_state(expected)}, got "
                              f"{_describe_state(got) or 'none'}")


def _group(entries, prefix):
    return {name[len(prefix):]: entry for name, entry in entries.items()
            if name.startswith(prefix)}


def read_training_checkpoint(npz, run_config=None, optimizer=True):
    """The ``Checkpoint`` of an open training checkpoint: its meta, run config (see
    ``read_meta``) and model config checked, then every array's header against
    them, and only then the arrays read. ``optimizer``: read the optimizer's state
    too, checked against the run's optimizer and the model's parameters."""
    meta, config = read_meta(npz, run_config)
    model_config = _model_config(npz.path, meta)
    unknown = [n for n in npz.entries if n != "meta" and not n.startswith(("model/", "optim/"))]
    if unknown:
        raise CheckpointError(f"{npz.path}: entry {unknown[0]!r} is not a checkpoint's, expected "
                              "meta, model/... and optim/... entries")
    model, optim = _group(npz.entries, "model/"), _group(npz.entries, "optim/")
    check_state(npz.path, "tinyvit-checkpoint", model_config, model)
    if optimizer:
        parameters = sum(map(math.prod, tinyvit_shapes(model_config)[0].values()))
        _check_optimizer(npz.path, meta["config"].get("optimizer", "adamw"), parameters, optim)
    model_state = read_finite(npz, "model/", model)
    optim_state = {k: npz.read("optim/" + k) for k in optim} if optimizer else {}
    return Checkpoint(meta, config, model_config, model_state, optim_state)


def is_training_checkpoint(path):
    """Whether the ``.npz`` file at ``path`` is a training checkpoint (it has a meta
    entry); False for any other file, or one that is not a readable ``.npz``."""
    try:
        with open_npz(path) as npz:
            return "meta" in npz.entries
    except (CheckpointError, OSError, ValueError):
        return False


def read_checkpoint(path, run_config=None, optimizer=True):
    """The ``Checkpoint`` of a file written by ``save_checkpoint``
    (``read_training_checkpoint``)."""
    with open_npz(path) as npz:
        return read_training_checkpoint(npz, run_config, optimizer)


def load_checkpoint(path):
    """Return (model_state, optim_state, meta) from a file written by ``save_checkpoint``
    (``read_checkpoint``: everything checked before an array is read)."""
    checkpoint = read_checkpoint(path)
    return checkpoint.model_state, checkpoint.optim_state, checkpoint.meta


def saved_model_config(meta):
    """The ViTConfig a training checkpoint's model was built with: its
    ``model_config``, or, in a checkpoint written before that was saved, the run's
    preset for its dataset with the run's overrides."""
    if "model_config" in meta:
        return ViTConfig(**meta["model_config"])
    run = meta["config"]
    fields = {**dataset_info(run["dataset"]).model_fields(), **run["model_overrides"]}
    return preset_config(run["model"], **fields)
