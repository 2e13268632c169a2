"""Pre-trained ViT weights in, tinyvit models out.

    model = load_pretrained("vit-base-patch16-224/")   # a Hugging Face folder
    model = load_pretrained("ViT-B_16.npz", num_classes=10, head="zero")  # to fine-tune
    save_pretrained(model, "out/model.safetensors")    # timm's layout, + out/config.json

``read_pretrained`` tells a file's format from the file (``names.py`` maps every
format's tensors to tinyvit's names, ``fields.py`` reads the config it tells),
``load_pretrained`` builds a ``ViT`` of its reference layers holding the weights,
and ``save_pretrained`` writes timm's layout, which PyTorch loads with
``load_state_dict``. Nothing is unpickled: a ``pytorch_model.bin`` (or ``.pt``,
``.pth``) is refused.

A file may come from anyone: ``.npz`` files are read by ``npz.open_npz``,
which checks every header against the file's size before it reads an array, a
``.safetensors`` file's header is checked so by the safetensors package, and a
config, from the file or a ``config.json`` (at most ``MAX_CONFIG_BYTES``), is
checked field by field and then against the tensors' shapes before a model is
built. Every error is one line naming the file.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np  # host-side file reading only

from ..files import atomic_write
from ..models import PRESETS, ViT, ViTConfig
from .adapt import adapt_state
from .checkpoint import float_headers, read_model_file, read_training_checkpoint
from .fields import (
    JAX_SOURCES,
    TIMM_SOURCES,
    check_json_fields,
    hf_fields,
    jax_fields,
    require_given,
    require_shapes,
    timm_fields_from_json,
    timm_fields_from_shapes,
)
from .formats import FORMATS, PICKLE_SUFFIXES, PretrainedError, one_line, widen
from .names import apply_rules, check_depth, check_rules, hf_rules, jax_rules, timm_rules
from .npz import open_npz
from .safetensors_file import read_safetensors, safetensors_package

HEAD_MODES = ("auto", "load", "fresh", "zero")
METADATA_KEY = "tinyvit_config"  # save_pretrained's config, in the .safetensors metadata
MAX_CONFIG_BYTES = 1 << 20  # a config.json beside the weights (a hub's is some 1,000 bytes)

# what a config.json's values of another type than expected raise in the readers of fields.py
CONFIG_ERRORS = (TypeError, AttributeError, KeyError, IndexError, ZeroDivisionError,
                 OverflowError)


# fields fixed by the checkpoint's tensors: an override must agree with the file
ARCHITECTURE = ("patch_size", "in_channels", "embed_dim", "depth", "num_heads", "mlp_ratio",
                "qkv_bias")


@dataclasses.dataclass
class Pretrained:
    """A checkpoint read into tinyvit's terms, before a model is built."""

    path: Path
    format: str  # a key of FORMATS
    fields: dict  # the ViTConfig fields the file determines (num_heads may be absent)
    state: dict  # tinyvit (timm) names -> host float arrays; no head.* without a classifier
    notes: list  # what was ignored or inferred, one line each

    @property
    def dtype(self):
        """The widest float dtype of the state (float32 or float64)."""
        return np.result_type(*self.state.values()).type

    def config(self, **overrides):
        """The ViTConfig of the file with ``overrides``: fields of the architecture
        (``ARCHITECTURE``) cannot change, except to fill in one the file does not tell."""
        names = {f.name for f in dataclasses.fields(ViTConfig)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; fields: {sorted(names)}")
        clashes = [f"{k}={overrides[k]!r} (the file has {self.fields[k]!r})" for k in ARCHITECTURE
                   if k in overrides and k in self.fields and overrides[k] != self.fields[k]]
        if clashes:
            raise PretrainedError(f"{self.path}: cannot change the architecture of the weights: "
                                  f"{', '.join(clashes)}")
        fields = {**self.fields, **overrides}
        require_given(self.path, fields)
        try:
            return ViTConfig(**fields)
        except ValueError as e:
            raise PretrainedError(f"{self.path}: not a valid config, {e}") from e

    def build(self, head="auto", dtype=None, seed=0, log=None, **overrides):
        """A ViT of ``self.config(**overrides)`` holding the file's weights; see
        ``load_pretrained``."""
        if head not in HEAD_MODES:
            raise ValueError(f"head must be one of {HEAD_MODES}, got {head!r}")
        config = self.config(**overrides)
        model = ViT(config, seed=seed, dtype=dtype)
        state, notes = adapt_state(self, model, head)
        model.load_state_dict(state)
        for line in self.notes + notes if log else ():
            log(line)
        return model


def _json(path):
    """The JSON object of a config.json of at most MAX_CONFIG_BYTES."""
    return _json_object(path, Path(path).stat().st_size, Path(path).read_text)


def _json_object(where, size, text):
    """The JSON object of the config ``text()`` of ``size`` bytes (read only when at most
    MAX_CONFIG_BYTES), or a PretrainedError naming ``where``."""
    if size > MAX_CONFIG_BYTES:
        raise PretrainedError(f"{where}: too large for a config, expected at most "
                              f"{MAX_CONFIG_BYTES:,} bytes, got {size:,}")
    try:
        config = json.loads(text())
    except (OSError, ValueError, RecursionError) as e:
        raise PretrainedError(f"{where}: not a readable JSON file ({one_line(e)})") from e
    if not isinstance(config, dict):
        raise PretrainedError(f"{where}: not a config, expected a JSON object, got "
                              f"{type(config).__name__}")
    return config


def _config_fields(path, read, config):
    """The ViTConfig fields ``read`` takes from a config.json, of the right types."""
    try:
        fields = read(config)
    except CONFIG_ERRORS as e:
        raise PretrainedError(f"{path}: a value of the config is not of its type, expected "
                              f"the numbers, strings and lists of a ViT config, got "
                              f"{type(e).__name__}: {one_line(e)}") from e
    check_json_fields(path, "config", ViTConfig, fields)
    return fields


def _is_hf(tensors):
    return any(name.startswith(("vit.embeddings.", "embeddings.")) for name in tensors)


def _read_hf(path, tensors, config_path):
    if not config_path.is_file():
        raise PretrainedError(f"{path}: Hugging Face ViT weights need the config.json of their "
                              f"folder, expected {config_path}")
    config = _json(config_path)
    fields = _config_fields(config_path, lambda c: hf_fields(c, config_path), config)
    check_depth(path, "hf", fields["depth"], tensors)
    prefix = "vit." if any(name.startswith("vit.") for name in tensors) else ""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise PretrainedError(f"{config_path}: architectures has the wrong type, expected a list "
                              f"of names, got {str(architectures)[:40]}")
    has_head = ("ViTForImageClassification" in architectures
                or any(name.startswith("classifier.") for name in tensors))
    pooler = tuple(n for n in tensors if n.startswith(prefix + "pooler."))
    state = apply_rules(path, "hf", fields, tensors, hf_rules(fields, prefix, has_head), pooler)
    notes = [f"{path}: {FORMATS['hf']} ({', '.join(architectures) or 'no architectures named'})"]
    if pooler:
        notes.append(f"ignored {', '.join(pooler)}: the pooler of ViTModel, which the "
                     "classifier does not use")
    return Pretrained(path, "hf", fields, state, notes)


def _read_timm(path, tensors, metadata, config_path):
    fields = timm_fields_from_shapes(tensors)
    notes = [f"{path}: {FORMATS['timm']}"]
    if METADATA_KEY in metadata:  # save_pretrained's own: a config.json beside may be another's
        config = _metadata_config(path, metadata[METADATA_KEY])
        fields.update(_config_fields(path, timm_fields_from_json, config))
        notes.append(f"config from the file's metadata ({METADATA_KEY})")
    elif config_path.is_file():
        config = _json(config_path)
        if "architecture" in config or "tinyvit_config" in config:
            fields.update(_config_fields(config_path, timm_fields_from_json, config))
            notes.append(f"config from {config_path} ({config.get('architecture', 'tinyvit')})")
        else:
            notes.append(f"ignored {config_path}: not a timm config (no 'architecture')")
    else:
        notes.append("config inferred from tensor shapes (no config.json beside the file)")
    fields.setdefault("representation_size", 0)
    if not fields.get("num_classes"):  # timm's num_classes=0: a model without head
        fields.pop("num_classes", None)
    require_shapes(path, fields, TIMM_SOURCES)
    check_depth(path, "timm", fields["depth"], tensors)
    has_head = any(name.startswith("head.") for name in tensors) or fields.get("num_classes", 0) > 0
    state = apply_rules(path, "timm", fields, tensors, timm_rules(fields, has_head))
    return Pretrained(path, "timm", fields, state, notes)


def _metadata_config(path, text):
    """``{"tinyvit_config": fields}`` from the JSON text ``save_pretrained`` wrote in the
    file's metadata, checked as a config.json is."""
    where = f"{path} ({METADATA_KEY} in its metadata)"
    return {"tinyvit_config": _json_object(where, len(text.encode()), lambda: text)}


def _read_safetensors_file(path):
    tensors, metadata = read_safetensors(path)
    config_path = path.parent / "config.json"
    if _is_hf(tensors):
        return _read_hf(path, tensors, config_path)
    return _read_timm(path, tensors, metadata, config_path)


def _read_npz(path):
    with open_npz(path) as npz:
        if "__config__" in npz.entries:
            config, state = read_model_file(npz)
            return _from_tinyvit(path, "tinyvit", config, state)
        if "meta" in npz.entries:
            checkpoint = read_training_checkpoint(npz, optimizer=False)
            return _from_tinyvit(path, "tinyvit-checkpoint", checkpoint.model_config,
                                 checkpoint.model_state)
        if any("/" in name for name in npz.entries):
            return _read_jax(path, npz)
    raise PretrainedError(f"{path}: expected a tinyvit model file (__config__ entry), a tinyvit "
                          "training checkpoint (meta entry) or a JAX checkpoint (names with '/'), "
                          f"got entries {sorted(npz.entries)[:5]}")


def _read_jax(path, npz):
    """The paper's JAX file: the config its headers' shapes tell, every header checked
    against it, then the arrays read and mapped."""
    headers = float_headers(npz.entries)
    fields = jax_fields(headers)
    require_shapes(path, fields, JAX_SOURCES)
    has_head = any(name.startswith("head/") for name in headers)
    rules = jax_rules(fields, has_head)
    check_rules(path, "jax", fields, headers, rules)
    tensors = {name: widen(npz.read(name)) for name in headers}
    state = apply_rules(path, "jax", fields, tensors, rules)
    return Pretrained(path, "jax", fields, state, [f"{path}: {FORMATS['jax']}"])


def _from_tinyvit(path, kind, config, state):
    """A tinyvit file's Pretrained: its config and state, checked by ``checkpoint.py``."""
    state = {name: widen(array) for name, array in state.items()}
    return Pretrained(path, kind, dataclasses.asdict(config), state, [f"{path}: {FORMATS[kind]}"])


def _refuse_pickle(path):
    raise PretrainedError(f"{path}: PyTorch pickle files are not read (unpickling runs code from "
                          "the file); use the checkpoint's model.safetensors instead")


def _read_folder(path):
    if (path / "model.safetensors").is_file():
        return _read_safetensors_file(path / "model.safetensors")
    if (path / "best.npz").is_file():  # a training run's folder: its best model, as --init
        return _read_npz(path / "best.npz")
    if (path / "model.safetensors.index.json").is_file():
        raise PretrainedError(f"{path}: sharded checkpoints (model.safetensors.index.json) are not "
                              "supported; a ViT fits in one model.safetensors")
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        _refuse_pickle(pickles[0])
    raise PretrainedError(f"{path}: expected a folder with model.safetensors (and config.json) "
                          f"or a training run's folder (best.npz), got "
                          f"{sorted(p.name for p in path.iterdir())}")


def read_pretrained(path):
    """The weights and config of a checkpoint as a ``Pretrained``, the format told by
    the path: a folder with ``model.safetensors`` (or a training run's folder, its
    ``best.npz``), a ``.safetensors`` file (Hugging Face or timm names) or a ``.npz``
    file (tinyvit's or the paper's JAX names)."""
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        _refuse_pickle(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such checkpoint file or folder: {path}")
    if suffix == ".safetensors":
        return _read_safetensors_file(path)
    if suffix == ".npz":
        return _read_npz(path)
    raise PretrainedError(f"{path}: expected a folder, a .safetensors or a .npz file, "
                          f"got {suffix or 'a file without suffix'}")


def load_pretrained(path, head="auto", dtype=None, seed=0, log=None, **overrides):
    """A ViT holding the weights of a checkpoint in any format ``read_pretrained``
    reads, in training mode (call ``.eval()`` for inference).

    ``overrides`` are ViTConfig fields. ``num_classes``, ``representation_size``,
    ``image_size`` (pos_embed resized bicubically), ``pool``, ``norm_eps`` and the
    dropouts may differ from the file; the architecture's fields must agree with
    it, and ``num_heads`` must be given when the file does not tell it.

    ``head`` says what the classifier ``head.weight`` and ``head.bias`` become:
      "auto"   the file's head when it has one of the model's shape, else as initialized
               (a new num_classes or representation_size, or a file without classifier)
      "load"   the file's head; a PretrainedError if it has none of that shape
      "fresh"  as initialized (timm's init, drawn from ``seed``), never the file's
      "zero"   zeros, as the ViT paper starts fine-tuning
    pre_logits (a representation layer) is loaded when the model's representation_size
    equals the file's, else dropped or left as initialized. ``log`` (e.g. ``print``)
    gets one line for each such choice and each tensor ignored.
    """
    return read_pretrained(path).build(head=head, dtype=dtype, seed=seed, log=log, **overrides)


def timm_architecture(config):
    """A timm model name for ``config``: the preset of its shape, else
    vit_base_patch16_224 (``model_args`` in config.json give the real shape)."""
    shape = dataclasses.replace(config, num_classes=1000, dropout=0.0, attn_dropout=0.0)
    for name, preset in PRESETS.items():
        if name.startswith("vit_") and preset == shape:
            return name
    return "vit_base_patch16_224"


def timm_config(config):
    """timm's hub ``config.json`` for ``config``: timm's ``create_model(architecture,
    **model_args)`` builds the same shape; tinyvit reads back ``tinyvit_config``."""
    c = config
    pool = "token" if c.pool == "cls" else "avg"
    return {
        "architecture": timm_architecture(c),
        "num_classes": c.num_classes,
        "num_features": c.representation_size or c.embed_dim,
        "global_pool": pool,
        "model_args": {"img_size": c.image_size, "patch_size": c.patch_size,
                       "in_chans": c.in_channels, "num_classes": c.num_classes,
                       "embed_dim": c.embed_dim, "depth": c.depth, "num_heads": c.num_heads,
                       "mlp_ratio": c.mlp_ratio, "qkv_bias": c.qkv_bias, "global_pool": pool},
        "pretrained_cfg": {"input_size": [c.in_channels, c.image_size, c.image_size],
                           "num_classes": c.num_classes, "first_conv": "patch_embed.proj",
                           "classifier": "head"},
        "tinyvit_config": dataclasses.asdict(c),
    }


def save_pretrained(model, path, dtype=None):
    """Write ``model`` as timm's layout: ``path`` (a ``.safetensors`` file of its
    ``state_dict``, in its dtype or ``dtype``, its config in the file's metadata) and
    ``config.json`` beside it, for timm and the hub (one model per folder), unless a
    config.json that tinyvit did not write is there (a hub model's, the user's): that one
    stays. PyTorch loads the file with ``safetensors.torch.load_file`` and
    ``load_state_dict``; ``load_pretrained`` takes the config from the file, so a second
    model saved in the same folder, which rewrites config.json, does not change the first.
    Returns the path."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_pretrained: expected a path ending in .safetensors, got {path}")
    if model.config.stem:
        raise ValueError("save_pretrained: timm's layout holds the plain ViT; a hybrid's "
                         "convolutional stem has no counterpart there: save it with save_model")
    dtype = _saved_dtype(dtype)
    config_path = path.parent / "config.json"
    save = safetensors_package().numpy.save
    state = {k: v.astype(dtype or v.dtype) for k, v in model.state_dict().items()}
    metadata = {"format": "pt",  # "pt": what transformers and timm expect
                METADATA_KEY: json.dumps(dataclasses.asdict(model.config))}
    with atomic_write(path) as f:
        f.write(save(state, metadata=metadata))
    if _ours(config_path):
        with atomic_write(config_path) as f:
            f.write(json.dumps(timm_config(model.config), indent=2).encode() + b"\n")
    return path


SAVED_DTYPES = ("float16", "float32", "float64")  # what load_pretrained reads back


def _saved_dtype(dtype):
    """``save_pretrained``'s dtype as NumPy's, or None (each tensor's own); one that
    ``load_pretrained`` could not read back is refused before anything is written."""
    if dtype is None:
        return None
    try:
        chosen = np.dtype(dtype)
    except TypeError:
        chosen = None
    if chosen is None or chosen.name not in SAVED_DTYPES:
        raise ValueError(f"save_pretrained: expected dtype {', '.join(SAVED_DTYPES[:-1])} or "
                         f"{SAVED_DTYPES[-1]} (the floats load_pretrained reads), got {dtype!r}")
    return chosen


def _ours(config_path):
    """Whether ``save_pretrained`` may write ``config_path``: there is none yet, or the one
    there is its own (``tinyvit_config``). Another's (a hub model's, the user's) stays."""
    if not config_path.exists():
        return True
    try:
        return "tinyvit_config" in _json(config_path)
    except PretrainedError:
        return False
