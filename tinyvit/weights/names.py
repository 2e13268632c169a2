"""How each checkpoint format names and lays out a ViT's tensors, mapped to
tinyvit's own names (timm's).

Every layout below is mapped to tinyvit's names by ``Rule``s, checking every
tensor's name and shape against the config (``check_rules``, on the shapes a
file's headers declare before its arrays are read, then ``apply_rules``); one
error, one line, names the missing, unexpected or mis-shaped tensors and the
unsupported dtypes.

In the shapes below (the letters of the legend that heads ``docs/backprop.md``):
D embed_dim, C in_channels, P patch_size, N = G^2 + 1 the number of tokens (the
G^2 patches and the class token), Dm the MLP's hidden width (mlp_ratio * D),
NH heads, Dh = D/NH each head's width, K classes, R representation_size.

1. timm (``.safetensors``): tinyvit's own names and layouts, nothing to map::

       cls_token (1, 1, D)   pos_embed (1, N, D)   patch_embed.proj.weight (D, C, P, P)
       blocks.{i}.norm1, .attn.qkv (3D, D) with q, k, v stacked, .attn.proj (D, D),
       blocks.{i}.norm2, .mlp.fc1 (Dm, D), .mlp.fc2 (D, Dm),
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
         MultiHeadDotProductAttention_1/{query,key,value}/kernel 3 x (D, NH, Dh)
                                                        -> attn.qkv.weight (3D, D)
         MultiHeadDotProductAttention_1/{query,key,value}/bias   3 x (NH, Dh)
                                                        -> attn.qkv.bias (3D,)
         MultiHeadDotProductAttention_1/out/kernel (NH, Dh, D) -> attn.proj.weight (D, D)
         LayerNorm_2                                    -> norm2
         MlpBlock_3/Dense_0/kernel (D, Dm)              -> mlp.fc1.weight (Dm, D)
         MlpBlock_3/Dense_1/kernel (Dm, D)              -> mlp.fc2.weight (D, Dm)
       Transformer/encoder_norm                         -> norm
       pre_logits/kernel (D, R)                         -> pre_logits.fc.weight (R, D)
       head/kernel (D or R, K)                          -> head.weight (K, D or R)

   The number of heads is the query kernel's middle axis. The paper's code uses
   the tanh approximation of GELU; tinyvit (like timm, which loads these files
   too) uses the exact one, so logits differ from the JAX model's very slightly.

4. tinyvit's own model files (``save_model``) and training checkpoints
   (``last.npz``, ``best.npz``), which carry their config: the shapes that config
   gives (``tinyvit_shapes``, a hybrid's stem included) are computed, not read
   from a model built for it, so that a config from the file is compared with
   the file's tensors before any model is built.

``.safetensors`` files are read by ``safetensors_file.py``, the rest by
``pretrained.py``.
"""

import dataclasses
import math

import numpy as np  # host-side file reading only

from .formats import FORMATS, PretrainedError, Unsupported

MAX_LISTED = 6  # the problems an error names; the others are counted


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


def shape_letters(f):
    """The letters of the shapes above for the config fields ``f``, in this order:
    D embed_dim, C in_channels, P patch_size, N tokens (patches and the class
    token), Dm the MLP's hidden width."""
    D, P = f["embed_dim"], f["patch_size"]
    return D, f["in_channels"], P, (f["image_size"] // P) ** 2 + 1, int(D * f["mlp_ratio"])


def _head_in(f):
    return f.get("representation_size") or f["embed_dim"]


def timm_rules(f, has_head=True):
    """timm's names and shapes for the config fields ``f`` (num_heads not needed)."""
    D, C, P, N, Dm = shape_letters(f)
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
                       b + "mlp.fc1.weight": (Dm, D), b + "mlp.fc1.bias": (Dm,),
                       b + "mlp.fc2.weight": (D, Dm), b + "mlp.fc2.bias": (D,)})
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
    D, C, P, N, Dm = shape_letters(f)
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
        linear(b + "mlp.fc1", h + "intermediate.dense", Dm, D)
        linear(b + "mlp.fc2", h + "output.dense", D, Dm)
    norm("norm", prefix + "layernorm")
    if has_head:
        linear("head", "classifier", f["num_classes"], D)
    return rules


def _transpose(kernel):
    return kernel.T  # Flax (in, out) -> PyTorch (out, in)


def _heads_in(kernel):
    return kernel.reshape(kernel.shape[0], -1).T  # (D, NH, Dh) -> (D, D), rows head-major


def _heads_out(kernel):
    return kernel.reshape(-1, kernel.shape[-1]).T  # (NH, Dh, D) -> (D, D)


def _qkv_kernels(*kernels):
    return _stack(*map(_heads_in, kernels))  # 3 x (D, NH, Dh) -> (3D, D)


def _flat_biases(*biases):
    return np.concatenate([b.reshape(-1) for b in biases])  # 3 x (NH, Dh) -> (3D,)


def _conv_kernel(kernel):
    return kernel.transpose(3, 2, 0, 1)  # (P, P, C, D) -> (D, C, P, P)


def jax_rules(f, has_head=True):
    """The paper's Flax names for the config fields ``f``."""
    D, C, P, N, Dm = shape_letters(f)
    NH = f["num_heads"]
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
                          ((D, NH, D // NH),) * 3, _qkv_kernels))  # -> (3D, D)
        rules.append(Rule(b + "attn.qkv.bias", tuple(n + "/bias" for n in qkv),
                          ((NH, D // NH),) * 3, _flat_biases))  # -> (3D,)
        rules.append(Rule(b + "attn.proj.weight", (attn + "out/kernel",), ((NH, D // NH, D),),
                          _heads_out))
        rules.append(Rule(b + "attn.proj.bias", (attn + "out/bias",), ((D,),)))
        norm(b + "norm2", j + "LayerNorm_2")
        dense(b + "mlp.fc1", j + "MlpBlock_3/Dense_0", D, Dm)
        dense(b + "mlp.fc2", j + "MlpBlock_3/Dense_1", Dm, D)
    norm("norm", "Transformer/encoder_norm")
    R = f.get("representation_size", 0)
    if R:
        dense("pre_logits.fc", "pre_logits", D, R)
    if has_head:
        dense("head", "head", _head_in(f), f["num_classes"])
    return rules


def tinyvit_shapes(config):
    """(parameters, buffers): ``{name: shape}`` of the state dict of ``ViT(config)``,
    computed without building it: a hybrid's stem (``patch_embed.backbone``, with
    BatchNorm's running averages as buffers), then timm's names over the stem's
    channels and feature map."""
    parameters, buffers, channels = {}, {}, config.in_channels
    for i, (out, kernel, _) in enumerate(config.stem, start=1):
        conv, norm = f"patch_embed.backbone.conv{i}.", f"patch_embed.backbone.norm{i}."
        parameters.update({conv + "weight": (out, channels, kernel, kernel),
                           norm + "weight": (out,), norm + "bias": (out,)})
        if config.stem_norm == "batch":
            buffers.update({norm + "running_mean": (out,), norm + "running_var": (out,)})
        channels = out
    fields = {**dataclasses.asdict(config), "in_channels": channels,
              "image_size": config.feature_size}
    parameters.update({rule.key: rule.shapes[0] for rule in timm_rules(fields)})
    return parameters, buffers


def check_depth(path, kind, depth, tensors, error=PretrainedError):
    """An ``error`` when a config's depth asks for more blocks than the file has
    tensors, before the rules of that many blocks are listed."""
    if depth > len(tensors):
        raise error(f"{path}: the config of this {FORMATS[kind]} does not match its tensors, "
                    f"expected at least {depth} tensors for depth {depth}, got {len(tensors)}")


def _describe(fields):
    names = ("image_size", "patch_size", "in_channels", "embed_dim", "depth", "num_heads",
             "mlp_ratio", "num_classes", "representation_size", "pool")
    return ", ".join(f"{n}={fields[n]!r}" for n in names if n in fields)


def _problems(tensors, rules, ignored):
    """What is wrong with ``tensors`` against ``rules``, a line each."""
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
    return problems


def _count(shapes):
    """The text "N tensors of V values" of a list of shapes."""
    return f"{len(shapes)} tensors of {sum(math.prod(s) for s in shapes):,} values"


def check_rules(path, kind, fields, tensors, rules, ignored=(), error=PretrainedError):
    """An ``error`` unless every tensor named in ``rules`` is present, float and of
    the expected shape, and the file has no other tensor than those and the
    ``ignored`` ones. ``tensors`` may be arrays, or anything with a ``shape`` (a
    header read before the arrays) or ``Unsupported``. The message says how many
    tensors and values the config expects and the file has, and names the first
    ``MAX_LISTED`` problems."""
    problems = _problems(tensors, rules, ignored)
    if problems:
        listed = "; ".join(problems[:MAX_LISTED])
        if len(problems) > MAX_LISTED:
            listed += f"; and {len(problems) - MAX_LISTED} more"
        expected = _count([shape for rule in rules for shape in rule.shapes])
        got = _count([tuple(tensor.shape) for tensor in tensors.values()])
        raise error(f"{path}: the tensors of this {FORMATS[kind]} do not match a ViT with "
                    f"{_describe(fields)}, expected {expected}, got {got}: {listed}")


def apply_rules(path, kind, fields, tensors, rules, ignored=()):
    """The tinyvit state dict made by ``rules``, after ``check_rules``."""
    check_rules(path, kind, fields, tensors, rules, ignored)
    return {rule.key: np.ascontiguousarray(rule.apply(tensors)) for rule in rules}
