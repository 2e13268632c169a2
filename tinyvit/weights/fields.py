"""The ViT config a checkpoint's own files tell: from tensor shapes, from a timm or
Hugging Face ``config.json``, from the JAX names; the check of config fields read
from JSON; and the error naming a field that neither the file nor the caller gave."""

import dataclasses
import re

from .formats import PretrainedError

TIMM_HEADS = {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}


HF_DEFAULTS = {  # transformers' ViTConfig defaults, for keys a config.json leaves out
    "image_size": 224, "patch_size": 16, "num_channels": 3, "hidden_size": 768,
    "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "qkv_bias": True, "hidden_act": "gelu",
}


# what a dataclass field's type takes from JSON: an int is a float too, a list a tuple
JSON_TYPES = {int: (int,), float: (int, float), bool: (bool,), str: (str,), dict: (dict,),
              list: (list,), tuple: (list, tuple)}
JSON_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
              int: "a number", float: "a number", type(None): "null"}


def _json_value(value):
    """A JSON value as an error message quotes it: its start and its JSON type."""
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{text} ({JSON_NAMES.get(type(value), type(value).__name__)})"


def _fits(value, kind):
    """Whether a JSON value fits a field's type: a dataclass takes an object, a type
    outside JSON_TYPES anything (its constructor checks it)."""
    if dataclasses.is_dataclass(kind):
        return isinstance(value, dict)
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, JSON_TYPES.get(kind, object))


def check_json_fields(path, where, cls, values, error=PretrainedError):
    """An ``error`` naming ``path`` and ``where`` unless ``values``, read from JSON, is
    an object of ``cls``'s fields, each of its field's type: null where the default
    is None, an object where the field is a dataclass (checked the same way). A
    field without default must be there; any other may be left out."""
    if not isinstance(values, dict):
        raise error(f"{path}: {where}, expected an object of {cls.__name__} fields, got "
                    f"{_json_value(values)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        if name not in fields:
            raise error(f"{path}: {where} has an unknown field, expected a field of "
                        f"{cls.__name__}, got {name!r}")
        field = fields[name]
        if value is None and field.default is None:
            continue
        if not _fits(value, field.type):
            raise error(f"{path}: {where}.{name} has the wrong type, expected "
                        f"{field.type.__name__}, got {_json_value(value)}")
        if dataclasses.is_dataclass(field.type):
            check_json_fields(path, f"{where}.{name}", field.type, value, error)
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise error(f"{path}: {where} misses a field, expected {required}, got "
                    f"{sorted(values)}")


def _depth(tensors, pattern):
    indices = [int(m.group(1)) for m in map(re.compile(pattern).match, tensors) if m]
    return max(indices) + 1 if indices else None


def _shape(tensors, name):
    tensor = tensors.get(name)
    return None if tensor is None else tuple(tensor.shape)


def _image_size(pos_embed_shape, patch_size):
    grid = round((pos_embed_shape[1] - 1) ** 0.5)
    return grid * patch_size if grid * grid == pos_embed_shape[1] - 1 else None


def timm_fields_from_shapes(tensors):
    """The config fields that timm tensor shapes tell (all but num_heads); a field
    whose tensor is absent is left out."""
    f = {"qkv_bias": "blocks.0.attn.qkv.bias" in tensors, "norm_eps": 1e-6,
         "pool": "mean" if "fc_norm.weight" in tensors else "cls"}
    depth = _depth(tensors, r"blocks\.(\d+)\.")
    if depth:
        f["depth"] = depth
    proj = _shape(tensors, "patch_embed.proj.weight")  # (D, C, P, P)
    if proj and len(proj) == 4:
        f.update(embed_dim=proj[0], in_channels=proj[1], patch_size=proj[2])
    pos = _shape(tensors, "pos_embed")  # (1, N, D), N tokens
    if pos and len(pos) == 3 and "patch_size" in f and _image_size(pos, f["patch_size"]):
        f["image_size"] = _image_size(pos, f["patch_size"])
    fc1 = _shape(tensors, "blocks.0.mlp.fc1.weight")  # (Dm, D), Dm the MLP's hidden width
    if fc1 and len(fc1) == 2:
        f["mlp_ratio"] = fc1[0] / fc1[1]
    pre = _shape(tensors, "pre_logits.fc.weight")  # (R, D)
    f["representation_size"] = pre[0] if pre else 0
    head = _shape(tensors, "head.weight")  # (K, D)
    if head:
        f["num_classes"] = head[0]
    return f


def timm_heads_from_name(architecture):
    """num_heads of timm's ViT and DeiT names (``vit_base_patch16_224.augreg_in1k``: 12)."""
    m = re.match(r"(?:vit|deit)_(tiny|small|base|large|huge)_", architecture or "")
    return TIMM_HEADS[m.group(1)] if m else None


def timm_fields_from_json(config):
    """The config fields a timm hub ``config.json`` gives: tinyvit's own section when
    written by ``save_pretrained``, else ``model_args``, ``pretrained_cfg`` and the name."""
    if "tinyvit_config" in config:
        return dict(config["tinyvit_config"])
    f, args = {}, config.get("model_args") or {}
    for ours, theirs in (("image_size", "img_size"), ("patch_size", "patch_size"),
                         ("in_channels", "in_chans"), ("embed_dim", "embed_dim"),
                         ("depth", "depth"), ("num_heads", "num_heads"),
                         ("mlp_ratio", "mlp_ratio"), ("qkv_bias", "qkv_bias")):
        if theirs in args:
            f[ours] = args[theirs]
    input_size = (config.get("pretrained_cfg") or {}).get("input_size")
    if input_size and "image_size" not in f:
        f["image_size"] = input_size[-1]
    if "num_classes" in config:
        f["num_classes"] = config["num_classes"]
    pool = args.get("global_pool", config.get("global_pool"))
    if pool in ("token", "avg"):
        f["pool"] = "cls" if pool == "token" else "mean"
    heads = timm_heads_from_name(config.get("architecture"))
    if heads and "num_heads" not in f:
        f["num_heads"] = heads
    return f


def hf_fields(config, path):
    """ViTConfig fields from a Hugging Face ViT ``config.json``."""
    c = {**HF_DEFAULTS, **config}
    if c.get("model_type", "vit") != "vit":
        raise PretrainedError(f"{path}: expected a Hugging Face ViT config (model_type 'vit'), "
                              f"got model_type {c['model_type']!r}")
    if c["hidden_act"] != "gelu":
        raise PretrainedError(f"{path}: hidden_act {c['hidden_act']!r} is not supported: tinyvit's "
                              "MLP uses the exact GELU, Hugging Face's 'gelu'")
    size = c["image_size"]
    if not isinstance(size, int):
        if len(set(size)) != 1:
            raise PretrainedError(f"{path}: expected square images, got image_size {size}")
        size = size[0]
    D, Dm = c["hidden_size"], c["intermediate_size"]
    if int(D * (Dm / D)) != Dm:
        raise PretrainedError(f"{path}: intermediate_size {Dm} is not a whole mlp_ratio of "
                              f"hidden_size {D}")
    labels = c.get("id2label")
    return {"image_size": size, "patch_size": c["patch_size"], "in_channels": c["num_channels"],
            "embed_dim": D, "depth": c["num_hidden_layers"], "num_heads": c["num_attention_heads"],
            "mlp_ratio": Dm / D, "qkv_bias": c["qkv_bias"], "norm_eps": c["layer_norm_eps"],
            "pool": "cls", "representation_size": 0,
            "num_classes": len(labels) if labels else c.get("num_labels", 2)}


def jax_fields(tensors):
    """The config fields the paper's tensor shapes tell (all of them)."""
    f = {"qkv_bias": True, "norm_eps": 1e-6, "pool": "cls"}
    depth = _depth(tensors, r"Transformer/encoderblock_(\d+)/")
    if depth:
        f["depth"] = depth
    kernel = _shape(tensors, "embedding/kernel")  # (P, P, C, D)
    if kernel and len(kernel) == 4:
        f.update(patch_size=kernel[0], in_channels=kernel[2], embed_dim=kernel[3])
    pos = _shape(tensors, "Transformer/posembed_input/pos_embedding")  # (1, N, D)
    if pos and len(pos) == 3 and "patch_size" in f and _image_size(pos, f["patch_size"]):
        f["image_size"] = _image_size(pos, f["patch_size"])
    block = "Transformer/encoderblock_0/"
    query = _shape(tensors, block + "MultiHeadDotProductAttention_1/query/kernel")  # (D, NH, Dh)
    if query and len(query) == 3:
        f["num_heads"] = query[1]
    dense = _shape(tensors, block + "MlpBlock_3/Dense_0/kernel")  # (D, Dm)
    if dense and len(dense) == 2:
        f["mlp_ratio"] = dense[1] / dense[0]
    pre = _shape(tensors, "pre_logits/kernel")  # (D, R)
    f["representation_size"] = pre[1] if pre else 0
    head = _shape(tensors, "head/kernel")  # (D or R, K)
    if head:
        f["num_classes"] = head[1]
    return f


# the tensor each config field is read from, for the error when it is absent
TIMM_SOURCES = {"embed_dim": "patch_embed.proj.weight", "in_channels": "patch_embed.proj.weight",
                "patch_size": "patch_embed.proj.weight", "image_size": "pos_embed",
                "depth": "blocks.0.*", "mlp_ratio": "blocks.0.mlp.fc1.weight"}


JAX_SOURCES = {"embed_dim": "embedding/kernel", "in_channels": "embedding/kernel",
               "patch_size": "embedding/kernel",
               "image_size": "Transformer/posembed_input/pos_embedding",
               "depth": "Transformer/encoderblock_0/*",
               "num_heads": "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/"
                            "kernel",
               "mlp_ratio": "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"}


NOT_IN_SHAPES = {  # why a file may not tell these fields; the caller passes them
    "num_heads": "tensor shapes do not tell it (the qkv weight is (3D, D) for any number of "
                 "heads) and no config.json beside the file names it",
    "num_classes": "the file has no classifier and no config.json names the number of classes",
}


EXAMPLES = {"num_heads": 12, "num_classes": 10}


def require_shapes(path, fields, sources):
    """PretrainedError naming every field of ``sources`` that the tensors did not tell."""
    absent = [name for name in sources if name not in fields]
    if absent:
        problems = [f"{name}: {sources[name]} is missing or of an unexpected shape"
                    for name in absent]
        raise PretrainedError(f"{path}: cannot infer the config from the tensors: "
                              + "; ".join(problems))


def require_given(path, fields):
    """PretrainedError naming num_heads or num_classes when neither the file nor the
    caller gave it, and how to give it."""
    absent = [name for name in NOT_IN_SHAPES if name not in fields]
    if absent:
        problems = [f"{name}: {NOT_IN_SHAPES[name]}" for name in absent]
        example = ", ".join(f"{name}={EXAMPLES[name]}" for name in absent)
        options = " ".join(f"--{name.replace('_', '-')} {EXAMPLES[name]}" for name in absent)
        raise PretrainedError(f"{path}: cannot tell the model's config: {'; '.join(problems)}; "
                              f"pass it: load_pretrained(path, {example}) or "
                              f"`python -m tinyvit.convert SRC DST {options}`")
