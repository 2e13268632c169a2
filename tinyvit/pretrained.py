"""Pre-trained ViT weights in, tinyvit models out.

    model = load_pretrained("vit-base-patch16-224/")   # a Hugging Face folder
    model = load_pretrained("ViT-B_16.npz", num_classes=10, head="zero")  # to fine-tune
    save_pretrained(model, "out/model.safetensors")    # timm's layout, + out/config.json

``load_pretrained`` reads any of the layouts below and returns a ``ViT``;
``save_pretrained`` writes timm's layout, which PyTorch loads with
``load_state_dict``. Every layout is first mapped to tinyvit's own names (timm's),
checking every tensor's name and shape against the config; one error lists
every missing, unexpected or mis-shaped tensor and every unsupported dtype.

In the shapes below: D embed_dim, C in_channels, P patch_size, N the number of
patches (+1 for the class token), M the MLP's hidden width (mlp_ratio * D),
H heads, D/H each head's width, K classes, R representation_size.

1. timm (``.safetensors``): tinyvit's own names and layouts, nothing to map::

       cls_token (1, 1, D)   pos_embed (1, N+1, D)   patch_embed.proj.weight (D, C, P, P)
       blocks.{i}.norm1, .attn.qkv (3D, D) with q, k, v stacked, .attn.proj (D, D),
       blocks.{i}.norm2, .mlp.fc1 (M, D), .mlp.fc2 (D, M),
       norm (class-token pooling) or fc_norm (mean pooling), pre_logits.fc (R, D), head (K, D)

   The config comes from a ``config.json`` beside the file (the hub's layout:
   ``architecture``, ``num_classes``, ``pretrained_cfg``, ``model_args``), and what
   it leaves out from the tensor shapes. Shapes give everything but num_heads: the
   qkv weight is (3D, D) for any number of heads. timm's model name tells it for
   the paper's sizes (vit_tiny 3, small 6, base 12, large 16, huge 16); otherwise
   pass ``num_heads=``.

2. Hugging Face (a folder with ``config.json`` and ``model.safetensors``)::

       vit.embeddings.cls_token                     -> cls_token
       vit.embeddings.position_embeddings           -> pos_embed
       vit.embeddings.patch_embeddings.projection   -> patch_embed.proj
       vit.encoder.layer.{i}.layernorm_before       -> blocks.{i}.norm1
       vit.encoder.layer.{i}.attention.attention.{query,key,value}   3 x (D, D)
                                                    -> blocks.{i}.attn.qkv (3D, D), stacked
       vit.encoder.layer.{i}.attention.output.dense -> blocks.{i}.attn.proj
       vit.encoder.layer.{i}.layernorm_after        -> blocks.{i}.norm2
       vit.encoder.layer.{i}.intermediate.dense     -> blocks.{i}.mlp.fc1
       vit.encoder.layer.{i}.output.dense           -> blocks.{i}.mlp.fc2
       vit.layernorm                                -> norm
       classifier                                   -> head

   A ``ViTModel`` file has the same names without ``vit.``, no classifier (the
   model gets a new head), and often ``pooler.dense``: a tanh layer on the class
   token that ``ViTForImageClassification`` does not use, ignored here. The config
   maps hidden_size -> embed_dim, num_hidden_layers -> depth, num_attention_heads ->
   num_heads, num_channels -> in_channels, intermediate_size / hidden_size ->
   mlp_ratio, layer_norm_eps -> norm_eps (1e-12 in Hugging Face's models), and the
   number of labels in id2label -> num_classes.

3. The ViT paper's JAX checkpoints (``.npz``, Flax names joined by ``/``). Flax
   Dense kernels are (in, out): transposed to PyTorch's (out, in). The attention
   keeps heads as their own axis, which flattens to PyTorch's head-major rows::

       embedding/kernel (P, P, C, D)                    -> patch_embed.proj.weight (D, C, P, P)
       cls                                              -> cls_token
       Transformer/posembed_input/pos_embedding         -> pos_embed
       Transformer/encoderblock_{i}/
         LayerNorm_0/{scale, bias}                      -> blocks.{i}.norm1.{weight, bias}
         MultiHeadDotProductAttention_1/{query,key,value}/kernel 3 x (D, H, D/H)
                                                        -> attn.qkv.weight (3D, D)
         MultiHeadDotProductAttention_1/{query,key,value}/bias   3 x (H, D/H)
                                                        -> attn.qkv.bias (3D,)
         MultiHeadDotProductAttention_1/out/kernel (H, D/H, D) -> attn.proj.weight (D, D)
         LayerNorm_2                                    -> norm2
         MlpBlock_3/Dense_0/kernel (D, M)               -> mlp.fc1.weight (M, D)
         MlpBlock_3/Dense_1/kernel (M, D)               -> mlp.fc2.weight (D, M)
       Transformer/encoder_norm                         -> norm
       pre_logits/kernel (D, R)                         -> pre_logits.fc.weight (R, D)
       head/kernel (D or R, K)                          -> head.weight (K, D or R)

   The number of heads is the query kernel's middle axis. The paper's code uses
   the tanh approximation of GELU; tinyvit (like timm, which loads these files
   too) uses the exact one, so logits differ from the JAX model's very slightly.

4. tinyvit's own model files (``ViT.save``) and training checkpoints
   (``last.npz``, ``best.npz``), which carry their config.

Nothing is unpickled: a ``pytorch_model.bin`` (or ``.pt``, ``.pth``) is refused.
``.safetensors`` files are read with the ``safetensors`` package (``pip install -e
".[hub]"``). NumPy has no bfloat16, so BF16 tensors are read from the file's bytes
(see ``bfloat16_to_float32``); BF16 and F16 are widened to float32.
"""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np  # host-side file reading only, as in checkpoint.py

from .backend import to_device, to_host
from .checkpoint import atomic_write, load_npz
from .model import PRESETS, ViT, ViTConfig, resize_pos_embed

FORMATS = {
    "timm": "timm state dict",
    "hf": "Hugging Face ViT checkpoint",
    "jax": "JAX .npz of the ViT paper",
    "tinyvit": "tinyvit model file",
    "tinyvit-checkpoint": "tinyvit training checkpoint",
}
HEAD_MODES = ("auto", "load", "fresh", "zero")
# fields fixed by the checkpoint's tensors: an override must agree with the file
ARCHITECTURE = ("patch_size", "in_channels", "embed_dim", "depth", "num_heads", "mlp_ratio",
                "qkv_bias")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TIMM_HEADS = {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}
HF_DEFAULTS = {  # transformers' ViTConfig defaults, for keys a config.json leaves out
    "image_size": 224, "patch_size": 16, "num_channels": 3, "hidden_size": 768,
    "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "qkv_bias": True, "hidden_act": "gelu",
}
SAFETENSORS_FLOATS = ("F64", "F32", "F16")  # what safetensors' NumPy API reads; BF16 by hand


class PretrainedError(ValueError):
    """A file that cannot be read as a ViT checkpoint; the message lists every problem."""


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """Stands in for a tensor whose dtype is not a float tinyvit reads."""

    dtype: str
    shape: tuple


# -- reading safetensors ------------------------------------------------------------


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:
        raise ImportError('.safetensors files need the safetensors package: pip install -e ".[hub]"'
                          ) from e
    return safetensors


def bfloat16_to_float32(raw, shape):
    """Widen bfloat16 bytes exactly. A bfloat16 is the high half of a float32 (sign,
    8 exponent bits, 7 mantissa bits): put its 16 bits in the high half of a uint32
    and read that as a float32."""
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


def _safetensors_header(path):
    """The file layout: an 8-byte little-endian header length, the JSON header
    (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets counted
    from the end of the header), then the data."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length)), 8 + length


def _raw_bytes(path, header, data_start, name):
    begin, end = header[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        return f.read(end - begin)


def widen(array):
    """float16 -> float32; float32 and float64 as they are; any other dtype -> Unsupported."""
    if not isinstance(array, np.ndarray):  # a string entry of a .npz file
        return Unsupported(type(array).__name__, ())
    if array.dtype == np.float16:
        return array.astype(np.float32)
    if array.dtype in (np.float32, np.float64):
        return array
    return Unsupported(str(array.dtype), tuple(array.shape))


def read_safetensors(path):
    """(tensors, metadata) of a ``.safetensors`` file: ``{name: host array}``, F16 and
    BF16 widened to float32, a tensor of another dtype as an ``Unsupported``."""
    safetensors = _safetensors()
    tensors, layout = {}, None
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            metadata = f.metadata() or {}
            names = f.keys()
            for name in names:
                piece = f.get_slice(name)
                dtype, shape = piece.get_dtype(), tuple(piece.get_shape())
                if dtype in SAFETENSORS_FLOATS:
                    tensors[name] = widen(f.get_tensor(name))
                elif dtype == "BF16":
                    layout = layout or _safetensors_header(path)
                    tensors[name] = bfloat16_to_float32(_raw_bytes(path, *layout, name), shape)
                else:
                    tensors[name] = Unsupported(dtype, shape)
    except safetensors.SafetensorError as e:
        raise PretrainedError(f"{path}: not a readable .safetensors file ({e})") from e
    return tensors, metadata


# -- tensor maps: file names and shapes -> timm names -------------------------------


@dataclasses.dataclass
class Rule:
    """One tinyvit tensor made from tensors of the file."""

    key: str  # the tinyvit (timm) name
    sources: tuple  # names in the file
    shapes: tuple  # their shapes in the file
    convert: object = None  # file arrays -> the tinyvit array; None: the one array as it is

    def apply(self, tensors):
        arrays = [tensors[name] for name in self.sources]
        return self.convert(*arrays) if self.convert else arrays[0]


def _dims(f):
    D, P = f["embed_dim"], f["patch_size"]
    return D, f["in_channels"], P, (f["image_size"] // P) ** 2 + 1, int(D * f["mlp_ratio"])


def _head_in(f):
    return f.get("representation_size") or f["embed_dim"]


def timm_rules(f, has_head=True):
    """timm's names and shapes for the config fields ``f`` (num_heads not needed)."""
    D, C, P, N, M = _dims(f)
    shapes = {"cls_token": (1, 1, D), "pos_embed": (1, N, D),
              "patch_embed.proj.weight": (D, C, P, P), "patch_embed.proj.bias": (D,)}
    for i in range(f["depth"]):
        b = f"blocks.{i}."
        shapes.update({b + "norm1.weight": (D,), b + "norm1.bias": (D,),
                       b + "attn.qkv.weight": (3 * D, D)})
        if f["qkv_bias"]:
            shapes[b + "attn.qkv.bias"] = (3 * D,)
        shapes.update({b + "attn.proj.weight": (D, D), b + "attn.proj.bias": (D,),
                       b + "norm2.weight": (D,), b + "norm2.bias": (D,),
                       b + "mlp.fc1.weight": (M, D), b + "mlp.fc1.bias": (M,),
                       b + "mlp.fc2.weight": (D, M), b + "mlp.fc2.bias": (D,)})
    norm = "fc_norm" if f["pool"] == "mean" else "norm"
    shapes.update({norm + ".weight": (D,), norm + ".bias": (D,)})
    R = f.get("representation_size", 0)
    if R:
        shapes.update({"pre_logits.fc.weight": (R, D), "pre_logits.fc.bias": (R,)})
    if has_head:
        K = f["num_classes"]
        shapes.update({"head.weight": (K, _head_in(f)), "head.bias": (K,)})
    return [Rule(key, (key,), (shape,)) for key, shape in shapes.items()]


def _stack(*arrays):
    return np.concatenate(arrays, axis=0)  # q, k, v: 3 x (D, ...) -> (3D, ...)


def hf_rules(f, prefix, has_head):
    """Hugging Face's names (``prefix`` "vit." or "") for the config fields ``f``."""
    D, C, P, N, M = _dims(f)
    e = prefix + "embeddings."
    rules = [Rule("cls_token", (e + "cls_token",), ((1, 1, D),)),
             Rule("pos_embed", (e + "position_embeddings",), ((1, N, D),)),
             Rule("patch_embed.proj.weight", (e + "patch_embeddings.projection.weight",),
                  ((D, C, P, P),)),
             Rule("patch_embed.proj.bias", (e + "patch_embeddings.projection.bias",), ((D,),))]

    def linear(key, name, out, inp, bias=True):
        rules.append(Rule(key + ".weight", (name + ".weight",), ((out, inp),)))
        if bias:
            rules.append(Rule(key + ".bias", (name + ".bias",), ((out,),)))

    def norm(key, name):
        rules.append(Rule(key + ".weight", (name + ".weight",), ((D,),)))
        rules.append(Rule(key + ".bias", (name + ".bias",), ((D,),)))

    for i in range(f["depth"]):
        b, h = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        qkv = tuple(f"{h}attention.attention.{name}" for name in ("query", "key", "value"))
        norm(b + "norm1", h + "layernorm_before")
        rules.append(Rule(b + "attn.qkv.weight", tuple(n + ".weight" for n in qkv),
                          ((D, D),) * 3, _stack))  # 3 x (D, D) -> (3D, D)
        if f["qkv_bias"]:
            rules.append(Rule(b + "attn.qkv.bias", tuple(n + ".bias" for n in qkv),
                              ((D,),) * 3, _stack))  # 3 x (D,) -> (3D,)
        linear(b + "attn.proj", h + "attention.output.dense", D, D)
        norm(b + "norm2", h + "layernorm_after")
        linear(b + "mlp.fc1", h + "intermediate.dense", M, D)
        linear(b + "mlp.fc2", h + "output.dense", D, M)
    norm("norm", prefix + "layernorm")
    if has_head:
        linear("head", "classifier", f["num_classes"], D)
    return rules


def _transpose(kernel):
    return kernel.T  # Flax (in, out) -> PyTorch (out, in)


def _heads_in(kernel):
    return kernel.reshape(kernel.shape[0], -1).T  # (D, H, D/H) -> (D, D), rows head-major


def _heads_out(kernel):
    return kernel.reshape(-1, kernel.shape[-1]).T  # (H, D/H, D) -> (D, D)


def _qkv_kernels(*kernels):
    return _stack(*map(_heads_in, kernels))  # 3 x (D, H, D/H) -> (3D, D)


def _flat(*biases):
    return np.concatenate([b.reshape(-1) for b in biases])  # 3 x (H, D/H) -> (3D,)


def _conv_kernel(kernel):
    return kernel.transpose(3, 2, 0, 1)  # (P, P, C, D) -> (D, C, P, P)


def jax_rules(f, has_head=True):
    """The paper's Flax names for the config fields ``f``."""
    D, C, P, N, M = _dims(f)
    H = f["num_heads"]
    rules = [Rule("cls_token", ("cls",), ((1, 1, D),)),
             Rule("pos_embed", ("Transformer/posembed_input/pos_embedding",), ((1, N, D),)),
             Rule("patch_embed.proj.weight", ("embedding/kernel",), ((P, P, C, D),), _conv_kernel),
             Rule("patch_embed.proj.bias", ("embedding/bias",), ((D,),))]

    def dense(key, name, inp, out):
        rules.append(Rule(key + ".weight", (name + "/kernel",), ((inp, out),), _transpose))
        rules.append(Rule(key + ".bias", (name + "/bias",), ((out,),)))

    def norm(key, name):
        rules.append(Rule(key + ".weight", (name + "/scale",), ((D,),)))
        rules.append(Rule(key + ".bias", (name + "/bias",), ((D,),)))

    for i in range(f["depth"]):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        attn = j + "MultiHeadDotProductAttention_1/"
        qkv = tuple(attn + name for name in ("query", "key", "value"))
        norm(b + "norm1", j + "LayerNorm_0")
        rules.append(Rule(b + "attn.qkv.weight", tuple(n + "/kernel" for n in qkv),
                          ((D, H, D // H),) * 3, _qkv_kernels))  # -> (3D, D)
        rules.append(Rule(b + "attn.qkv.bias", tuple(n + "/bias" for n in qkv),
                          ((H, D // H),) * 3, _flat))  # -> (3D,)
        rules.append(Rule(b + "attn.proj.weight", (attn + "out/kernel",), ((H, D // H, D),),
                          _heads_out))
        rules.append(Rule(b + "attn.proj.bias", (attn + "out/bias",), ((D,),)))
        norm(b + "norm2", j + "LayerNorm_2")
        dense(b + "mlp.fc1", j + "MlpBlock_3/Dense_0", D, M)
        dense(b + "mlp.fc2", j + "MlpBlock_3/Dense_1", M, D)
    norm("norm", "Transformer/encoder_norm")
    R = f.get("representation_size", 0)
    if R:
        dense("pre_logits.fc", "pre_logits", D, R)
    if has_head:
        dense("head", "head", _head_in(f), f["num_classes"])
    return rules


def _describe(fields):
    names = ("image_size", "patch_size", "in_channels", "embed_dim", "depth", "num_heads",
             "mlp_ratio", "num_classes", "representation_size", "pool")
    return ", ".join(f"{n}={fields[n]!r}" for n in names if n in fields)


def apply_rules(path, kind, fields, tensors, rules, ignored=()):
    """The tinyvit state dict made by ``rules``, after checking every tensor named
    in them (present, float, of the expected shape) and that the file has no other
    tensor than those and the ``ignored`` ones; one PretrainedError lists every problem."""
    problems, expected = [], set()
    for rule in rules:
        for name, shape in zip(rule.sources, rule.shapes):
            expected.add(name)
            tensor = tensors.get(name)
            if tensor is None:
                problems.append(f"missing tensor {name}: expected shape {shape}")
            elif isinstance(tensor, Unsupported):
                problems.append(f"unsupported dtype: {name} is {tensor.dtype}, expected a float "
                                "(F32, F64, F16 or BF16)")
            elif tuple(tensor.shape) != shape:
                problems.append(f"wrong shape: {name} expected {shape}, got {tuple(tensor.shape)}")
    for name, tensor in tensors.items():
        if name not in expected and name not in ignored:
            problems.append(f"unexpected tensor {name} of shape {tuple(tensor.shape)}")
    if problems:
        head = f"{path} ({FORMATS[kind]}): the tensors do not match a ViT with {_describe(fields)}:"
        raise PretrainedError("\n".join([head] + [f"  {p}" for p in problems]))
    return {rule.key: np.ascontiguousarray(rule.apply(tensors)) for rule in rules}


# -- config fields from the file ---------------------------------------------------------


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
    pos = _shape(tensors, "pos_embed")  # (1, N+1, D)
    if pos and len(pos) == 3 and "patch_size" in f and _image_size(pos, f["patch_size"]):
        f["image_size"] = _image_size(pos, f["patch_size"])
    fc1 = _shape(tensors, "blocks.0.mlp.fc1.weight")  # (M, D)
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
    D, M = c["hidden_size"], c["intermediate_size"]
    if int(D * (M / D)) != M:
        raise PretrainedError(f"{path}: intermediate_size {M} is not a whole mlp_ratio of "
                              f"hidden_size {D}")
    labels = c.get("id2label")
    return {"image_size": size, "patch_size": c["patch_size"], "in_channels": c["num_channels"],
            "embed_dim": D, "depth": c["num_hidden_layers"], "num_heads": c["num_attention_heads"],
            "mlp_ratio": M / D, "qkv_bias": c["qkv_bias"], "norm_eps": c["layer_norm_eps"],
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
    pos = _shape(tensors, "Transformer/posembed_input/pos_embedding")  # (1, N+1, D)
    if pos and len(pos) == 3 and "patch_size" in f and _image_size(pos, f["patch_size"]):
        f["image_size"] = _image_size(pos, f["patch_size"])
    block = "Transformer/encoderblock_0/"
    query = _shape(tensors, block + "MultiHeadDotProductAttention_1/query/kernel")  # (D, H, D/H)
    if query and len(query) == 3:
        f["num_heads"] = query[1]
    dense = _shape(tensors, block + "MlpBlock_3/Dense_0/kernel")  # (D, M)
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


def _require_shapes(path, fields, sources):
    """PretrainedError naming every field of ``sources`` that the tensors did not tell."""
    absent = [name for name in sources if name not in fields]
    if absent:
        lines = [f"{path}: cannot infer the config from the tensors:"]
        lines += [f"  {name}: {sources[name]} is missing or of an unexpected shape"
                  for name in absent]
        raise PretrainedError("\n".join(lines))


def _require_given(path, fields):
    """PretrainedError naming num_heads or num_classes when neither the file nor the
    caller gave it, and how to give it."""
    absent = [name for name in NOT_IN_SHAPES if name not in fields]
    if absent:
        lines = [f"{path}: cannot tell the model's config:"]
        lines += [f"  {name}: {NOT_IN_SHAPES[name]}" for name in absent]
        example = ", ".join(f"{name}={EXAMPLES[name]}" for name in absent)
        options = " ".join(f"--{name.replace('_', '-')} {EXAMPLES[name]}" for name in absent)
        lines.append(f"  pass it: load_pretrained(path, {example}) or "
                     f"`python -m tinyvit.convert SRC DST {options}`")
        raise PretrainedError("\n".join(lines))


# -- reading each format ----------------------------------------------------------------


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
        _require_given(self.path, fields)
        return ViTConfig(**fields)

    def build(self, head="auto", dtype=None, seed=0, log=None, **overrides):
        """A ViT of ``self.config(**overrides)`` holding the file's weights; see
        ``load_pretrained``."""
        if head not in HEAD_MODES:
            raise ValueError(f"head must be one of {HEAD_MODES}, got {head!r}")
        config = self.config(**overrides)
        model = ViT(config, seed=seed, dtype=dtype)
        state, notes = adapt_state(self, model, head)
        model.load_state_dict(state)
        for line in self.notes + notes:
            (log or _quiet)(line)
        return model


def _quiet(line):
    pass


def _json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path}: not a readable JSON file ({e})") from e


def _is_hf(tensors):
    return any(name.startswith(("vit.embeddings.", "embeddings.")) for name in tensors)


def _read_hf(path, tensors, config_path):
    if not config_path.is_file():
        raise PretrainedError(f"{path}: Hugging Face ViT weights need the config.json of their "
                              f"folder, expected {config_path}")
    config = _json(config_path)
    fields = hf_fields(config, config_path)
    prefix = "vit." if any(name.startswith("vit.") for name in tensors) else ""
    architectures = config.get("architectures") or []
    has_head = ("ViTForImageClassification" in architectures
                or any(name.startswith("classifier.") for name in tensors))
    pooler = tuple(n for n in tensors if n.startswith(prefix + "pooler."))
    state = apply_rules(path, "hf", fields, tensors, hf_rules(fields, prefix, has_head), pooler)
    notes = [f"{path}: {FORMATS['hf']} ({', '.join(architectures) or 'no architectures named'})"]
    if pooler:
        notes.append(f"ignored {', '.join(pooler)}: the pooler of ViTModel, which the "
                     "classifier does not use")
    return Pretrained(path, "hf", fields, state, notes)


def _read_timm(path, tensors, config_path):
    fields = timm_fields_from_shapes(tensors)
    notes = [f"{path}: {FORMATS['timm']}"]
    if config_path.is_file():
        config = _json(config_path)
        if "architecture" in config or "tinyvit_config" in config:
            fields.update(timm_fields_from_json(config))
            notes.append(f"config from {config_path} ({config.get('architecture', 'tinyvit')})")
        else:
            notes.append(f"ignored {config_path}: not a timm config (no 'architecture')")
    else:
        notes.append("config inferred from tensor shapes (no config.json beside the file)")
    fields.setdefault("representation_size", 0)
    if not fields.get("num_classes"):  # timm's num_classes=0: a model without head
        fields.pop("num_classes", None)
    _require_shapes(path, fields, TIMM_SOURCES)
    has_head = any(name.startswith("head.") for name in tensors) or fields.get("num_classes", 0) > 0
    state = apply_rules(path, "timm", fields, tensors, timm_rules(fields, has_head))
    return Pretrained(path, "timm", fields, state, notes)


def _read_safetensors_file(path):
    tensors, _ = read_safetensors(path)
    config_path = path.parent / "config.json"
    if _is_hf(tensors):
        return _read_hf(path, tensors, config_path)
    return _read_timm(path, tensors, config_path)


def _read_npz(path):
    arrays = load_npz(path)
    if "__config__" in arrays:
        fields = json.loads(arrays.pop("__config__"))
        return _from_tinyvit(path, "tinyvit", fields, arrays)
    if "meta" in arrays:
        from .train import TrainConfig, saved_model_config

        meta = json.loads(arrays.pop("meta"))
        try:
            config = saved_model_config(meta, TrainConfig(**meta["config"]))
            fields = dataclasses.asdict(config)
        except (KeyError, TypeError, ValueError) as e:
            raise PretrainedError(f"{path}: the training config in the checkpoint is not "
                                  f"valid here ({e})") from e
        model = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
        return _from_tinyvit(path, "tinyvit-checkpoint", fields, model)
    tensors = {k: widen(v) for k, v in arrays.items()}
    if any("/" in name for name in tensors):
        fields = jax_fields(tensors)
        _require_shapes(path, fields, JAX_SOURCES)
        has_head = any(name.startswith("head/") for name in tensors)
        state = apply_rules(path, "jax", fields, tensors, jax_rules(fields, has_head))
        return Pretrained(path, "jax", fields, state, [f"{path}: {FORMATS['jax']}"])
    raise PretrainedError(f"{path}: expected a tinyvit model file (__config__ entry), a tinyvit "
                          "training checkpoint (meta entry) or a JAX checkpoint (names with '/'), "
                          f"got entries {sorted(arrays)[:5]}")


def _from_tinyvit(path, kind, fields, arrays):
    """tinyvit's own names, checked against those of a model of the file's config
    (a hybrid's stem and BatchNorm's running averages included)."""
    tensors = {k: widen(v) for k, v in arrays.items()}
    expected = ViT(ViTConfig(**fields)).state_dict()
    rules = [Rule(key, (key,), (value.shape,)) for key, value in expected.items()]
    state = apply_rules(path, kind, fields, tensors, rules)
    return Pretrained(path, kind, fields, state, [f"{path}: {FORMATS[kind]}"])


def _refuse_pickle(path):
    raise PretrainedError(f"{path}: PyTorch pickle files are not read (unpickling runs code from "
                          "the file); use the checkpoint's model.safetensors instead")


def _read_folder(path):
    if (path / "model.safetensors").is_file():
        return _read_safetensors_file(path / "model.safetensors")
    if (path / "model.safetensors.index.json").is_file():
        raise PretrainedError(f"{path}: sharded checkpoints (model.safetensors.index.json) are not "
                              "supported; a ViT fits in one model.safetensors")
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        _refuse_pickle(pickles[0])
    raise PretrainedError(f"{path}: expected a folder with model.safetensors (and config.json), "
                          f"got {sorted(p.name for p in path.iterdir())}")


def read_pretrained(path):
    """The weights and config of a checkpoint as a ``Pretrained``, the format told by
    the path: a folder with ``model.safetensors``, a ``.safetensors`` file (Hugging
    Face or timm names) or a ``.npz`` file (tinyvit's or the paper's JAX names)."""
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


# -- adapting the weights to the config asked for -------------------------------------


def _keys(state, prefix):
    return [k for k in state if k.startswith(prefix)]


def adapt_state(pretrained, model, head):
    """The file's state dict fitted to ``model``: pos_embed resized to its image
    size, the final norm renamed for its pooling, pre_logits and head chosen as
    ``head`` says. Returns (state, notes)."""
    state, notes, f, c = dict(pretrained.state), [], pretrained.fields, model.config
    built = model.state_dict()
    if f["image_size"] != c.image_size:
        grid = dataclasses.replace(c, image_size=f["image_size"]).feature_size // c.patch_size
        old, new = grid, c.feature_size // c.patch_size
        pos = resize_pos_embed(to_device(state["pos_embed"]), old, new)
        state["pos_embed"] = to_host(pos)
        notes.append(f"pos_embed resized from {old}x{old} to {new}x{new} patches (bicubic)")
    if f["pool"] != c.pool:
        old, new = ("norm", "fc_norm") if c.pool == "mean" else ("fc_norm", "norm")
        for key in _keys(state, old + "."):
            state[new + key[len(old):]] = state.pop(key)
        notes.append(f"{old} renamed {new}: the file pools by {f['pool']}, the model by {c.pool}")
    if f.get("representation_size", 0) != c.representation_size:
        for key in _keys(state, "pre_logits."):
            del state[key]
        state.update({k: built[k] for k in _keys(built, "pre_logits.")})
        notes.append(f"pre_logits: representation_size {f.get('representation_size', 0)} -> "
                     f"{c.representation_size}, not loaded")
    return _choose_head(state, built, head, notes), notes


def _choose_head(state, built, head, notes):
    keys = ("head.weight", "head.bias")
    fits = all(k in state and state[k].shape == built[k].shape for k in keys)
    if head == "load" and not fits:
        got = [tuple(state[k].shape) if k in state else "absent" for k in keys]
        raise PretrainedError(f"head='load': expected head.weight {built['head.weight'].shape} and "
                              f"head.bias {built['head.bias'].shape}, the file has {got[0]} and "
                              f"{got[1]}; pass head='fresh' or head='zero' to train a new head")
    if head == "zero":
        state.update({k: np.zeros_like(built[k]) for k in keys})
        notes.append("head set to zero (head='zero')")
    elif head == "fresh" or not fits:
        why = ("head='fresh'" if head == "fresh" else "the file's head has another shape"
               if "head.weight" in state else "no head in the file")
        state.update({k: built[k] for k in keys})
        notes.append(f"head.weight, head.bias not loaded, left as initialized ({why})")
    return state


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


# -- writing timm's layout ------------------------------------------------------------


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
    ``state_dict``, in its dtype or ``dtype``) and ``config.json`` beside it (one
    model per folder, as on the hub). PyTorch loads the file with
    ``safetensors.torch.load_file`` and ``load_state_dict``. Returns the path."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_pretrained: expected a path ending in .safetensors, got {path}")
    if model.config.stem:
        raise ValueError("save_pretrained: timm's layout holds the plain ViT; a hybrid's "
                         "convolutional stem has no counterpart there: save it with model.save")
    save = _safetensors().numpy.save
    state = {k: v.astype(dtype or v.dtype) for k, v in model.state_dict().items()}
    data = save(state, metadata={"format": "pt"})  # "pt": what transformers and timm expect
    with atomic_write(path) as f:
        f.write(data)
    with atomic_write(path.parent / "config.json") as f:
        f.write(json.dumps(timm_config(model.config), indent=2).encode() + b"\n")
    return path
