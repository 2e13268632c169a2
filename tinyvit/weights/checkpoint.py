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

Reading (``open_npz``) reads no array before the whole file has been checked:

1. the zip directory: every member a ``.npy`` array, stored or deflated, within
   the file, all of them unpacking to at most ``MAX_INFLATION`` times the file's
   size (plus ``SMALL_BYTES``), so that a deflate bomb is refused unread;
2. every member's ``.npy`` header: its shape and dtype must make exactly the
   member's unpacked size, so that a header claiming terabytes is refused;
3. the text entries (``meta``, ``__config__``): at most ``MAX_TEXT_CHARS``
   characters of JSON; the configs in them, every field's name and type, then
   every value;
4. the arrays the model config asks for: every name, dtype and shape against
   the headers (``names.check_rules``), no other array.

Then the arrays are read, and a model is built. Every error is a CheckpointError
of one line naming the file, what is wrong, what was expected and what came.
"""

import contextlib
import dataclasses
import json
import math
import zipfile
import zlib
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

ZIP_SIGNATURE = b"PK\x03\x04"  # how every .npz file starts: it is a zip archive
NPZ_ENTRY_BYTES = 256  # a zip header and a .npy header per entry, about
MAX_INFLATION = 20  # float weights deflate to about 0.9 of their size; zeros to 1/1000
SMALL_BYTES = 1 << 20  # what any file may unpack to, whatever its size
MAX_TEXT_CHARS = 1_000_000  # a meta or config entry (a long run's meta is some 100,000)
NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what numpy.savez(_compressed) writes
READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)
OPTIMIZERS = {"adamw": AdamW, "sgd": SGD}  # TrainConfig.optimizer -> its class (its _buffers)


def save_npz(path, arrays):
    """Write ``{name: array or str}`` to ``path`` atomically (uncompressed)."""
    host = {k: (np.array(v) if isinstance(v, str) else to_host(v)) for k, v in arrays.items()}
    size = sum(a.nbytes + NPZ_ENTRY_BYTES for a in host.values())
    with atomic_write(path, size) as f:
        np.savez(f, **host)
    return Path(path)


# -- reading .npz files ------------------------------------------------------------------


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
    return config, {name: npz.read(name) for name in entries}


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
        raise CheckpointError(f"{npz.path}: not a tinyvit training checkpoint, expected a meta "
                              f"entry, got entries {sorted(npz.entries)[:5]}")
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
    model_state = {k: npz.read("model/" + k) for k in model}
    optim_state = {k: npz.read("optim/" + k) for k in optim} if optimizer else {}
    return Checkpoint(meta, config, model_config, model_state, optim_state)


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
