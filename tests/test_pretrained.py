"""Pre-trained checkpoints in and out (tinyvit/weights/, tinyvit/convert.py).

Every external format is written here from a small tinyvit model, its parameters
jittered off their initial values, by the inverse of the loader's mapping written
out on its own (split qkv, transpose Flax kernels, ...); loading the file back must
give exactly the original logits. Also: export round trips, bfloat16 and float16
widening, each error message, the head options, the command line, and (where torch
and transformers are installed) PyTorch and Hugging Face models themselves: Hugging
Face's logits and every parameter's gradient, in float32 and float64.
"""

import dataclasses
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.convert import main as convert_main
from tinyvit.models import ViT, ViTConfig
from tinyvit.nn.resample import resize_pos_embed
from tinyvit.weights import (
    PretrainedError,
    load_model,
    load_pretrained,
    save_checkpoint,
    save_model,
    save_pretrained,
)
from tinyvit.weights.safetensors_file import bfloat16_to_float32, read_safetensors

CONFIG = {"image_size": 12, "patch_size": 4, "in_channels": 3, "num_classes": 5, "embed_dim": 12,
          "depth": 2, "num_heads": 3, "mlp_ratio": 2.0}
ATOL = 1e-12


def tiny_vit(seed=0, scale=0.1, **fields):
    """A float64 model (under the ``backend`` fixture) with every parameter jittered."""
    model = ViT(ViTConfig(**{**CONFIG, **fields}), seed=seed)
    for i, p in enumerate(model.parameters()):
        p.data[...] += B.to_device(B.host_rng((seed, i)).standard_normal(p.shape)) * scale
    return model


def logits(model, seed=0):
    c = model.config
    images = B.host_rng(seed).standard_normal((2, c.in_channels, c.image_size, c.image_size))
    return B.to_host(model.eval().forward(B.to_device(images)))


def assert_same_logits(loaded, original):
    np.testing.assert_allclose(logits(loaded), logits(original), rtol=0, atol=ATOL)


@pytest.fixture
def safetensors_installed():
    """Skips the test without the safetensors package (pip install -e ".[hub]")."""
    pytest.importorskip("safetensors.numpy")


needs_safetensors = pytest.mark.usefixtures("safetensors_installed")


def safetensors_numpy():
    return pytest.importorskip("safetensors.numpy")


def save_safetensors(path, tensors):
    safetensors_numpy().save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
                                  str(path), metadata={"format": "pt"})
    return path


def write_raw_safetensors(path, tensors):
    """The format by hand, for dtypes NumPy lacks: {name: (dtype, shape, bytes)} ->
    an 8-byte little-endian header length, the JSON header, then the data."""
    header, offset = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(raw for _, _, raw in tensors.values())
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def to_bfloat16_bits(values):
    """float32 -> its high 16 bits (bfloat16 by truncation)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2")


# -- each format, written by hand ----------------------------------------------------------


def hf_tensors(model, prefix="vit.", classifier=True):
    """Hugging Face's names: qkv split into query, key, value."""
    s, e = model.state_dict(), prefix + "embeddings."
    t = {e + "cls_token": s["cls_token"], e + "position_embeddings": s["pos_embed"],
         e + "patch_embeddings.projection.weight": s["patch_embed.proj.weight"],
         e + "patch_embeddings.projection.bias": s["patch_embed.proj.bias"],
         prefix + "layernorm.weight": s["norm.weight"], prefix + "layernorm.bias": s["norm.bias"]}
    same = {"layernorm_before": "norm1", "attention.output.dense": "attn.proj",
            "layernorm_after": "norm2", "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"}
    for i in range(model.config.depth):
        b, h = f"blocks.{i}.", f"{prefix}encoder.layer.{i}."
        for theirs, ours in same.items():
            for p in ("weight", "bias"):
                t[f"{h}{theirs}.{p}"] = s[f"{b}{ours}.{p}"]
        for p in ("weight", "bias"):
            q, k, v = np.split(s[f"{b}attn.qkv.{p}"], 3)
            for name, a in zip(("query", "key", "value"), (q, k, v)):
                t[f"{h}attention.attention.{name}.{p}"] = a
    if classifier:
        t.update({"classifier.weight": s["head.weight"], "classifier.bias": s["head.bias"]})
    return t


def hf_config(config, architecture="ViTForImageClassification"):
    c = config
    return {"architectures": [architecture], "model_type": "vit", "hidden_act": "gelu",
            "image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.in_channels,
            "hidden_size": c.embed_dim, "num_hidden_layers": c.depth,
            "num_attention_heads": c.num_heads, "intermediate_size": int(c.embed_dim * c.mlp_ratio),
            "layer_norm_eps": c.norm_eps, "qkv_bias": c.qkv_bias,
            "id2label": {str(i): f"class {i}" for i in range(c.num_classes)}}


def write_hf_folder(folder, model, prefix="vit.", classifier=True, tensors=None):
    folder.mkdir(exist_ok=True)
    architecture = "ViTForImageClassification" if classifier else "ViTModel"
    (folder / "config.json").write_text(json.dumps(hf_config(model.config, architecture)))
    save_safetensors(folder / "model.safetensors", tensors or hf_tensors(model, prefix, classifier))
    return folder


def jax_arrays(model):
    """The paper's Flax names and shapes: kernels (in, out), heads on their own axis."""
    s, c = model.state_dict(), model.config
    D, H = c.embed_dim, c.num_heads
    a = {"embedding/kernel": s["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # -> (P, P, C, D)
         "embedding/bias": s["patch_embed.proj.bias"], "cls": s["cls_token"],
         "Transformer/posembed_input/pos_embedding": s["pos_embed"],
         "Transformer/encoder_norm/scale": s["norm.weight"],
         "Transformer/encoder_norm/bias": s["norm.bias"],
         "head/kernel": s["head.weight"].T, "head/bias": s["head.bias"]}
    if c.representation_size:
        a.update({"pre_logits/kernel": s["pre_logits.fc.weight"].T,
                  "pre_logits/bias": s["pre_logits.fc.bias"]})
    for i in range(c.depth):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        attn = j + "MultiHeadDotProductAttention_1/"
        for norm, ours in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            a[f"{j}{norm}/scale"] = s[b + ours + ".weight"]
            a[f"{j}{norm}/bias"] = s[b + ours + ".bias"]
        weights = np.split(s[b + "attn.qkv.weight"], 3)
        biases = np.split(s[b + "attn.qkv.bias"], 3)
        for name, w, bias in zip(("query", "key", "value"), weights, biases):
            a[f"{attn}{name}/kernel"] = w.T.reshape(D, H, D // H)
            a[f"{attn}{name}/bias"] = bias.reshape(H, D // H)
        a[attn + "out/kernel"] = s[b + "attn.proj.weight"].T.reshape(H, D // H, D)
        a[attn + "out/bias"] = s[b + "attn.proj.bias"]
        for dense, ours in (("Dense_0", "mlp.fc1"), ("Dense_1", "mlp.fc2")):
            a[f"{j}MlpBlock_3/{dense}/kernel"] = s[b + ours + ".weight"].T
            a[f"{j}MlpBlock_3/{dense}/bias"] = s[b + ours + ".bias"]
    return a


# -- loading each format -------------------------------------------------------------------


@needs_safetensors
def test_hugging_face_folder(backend, tmp_path):
    model = tiny_vit(norm_eps=1e-12)  # Hugging Face's eps: read from config.json
    loaded = load_pretrained(write_hf_folder(tmp_path / "hf", model))
    assert loaded.config == model.config
    assert_same_logits(loaded, model)


@needs_safetensors
def test_vit_model_folder_without_classifier_gets_a_fresh_head(backend, tmp_path):
    model = tiny_vit()
    tensors = hf_tensors(model, prefix="", classifier=False)
    tensors.update({"pooler.dense.weight": np.ones((12, 12)), "pooler.dense.bias": np.ones(12)})
    notes = []
    folder = write_hf_folder(tmp_path / "hf", model, classifier=False, tensors=tensors)
    loaded = load_pretrained(folder, seed=7,
                             log=notes.append)
    fresh = ViT(model.config, seed=7).state_dict()
    state, original = loaded.state_dict(), model.state_dict()
    for key in state:
        want = fresh[key] if key.startswith("head.") else original[key]
        np.testing.assert_array_equal(state[key], want, err_msg=key)
    assert any("pooler.dense.weight" in n for n in notes)
    assert any("no head in the file" in n for n in notes)


@pytest.mark.parametrize("representation_size", [0, 6])
def test_jax_npz(backend, tmp_path, representation_size):
    model = tiny_vit(representation_size=representation_size)
    np.savez(tmp_path / "ViT-tiny.npz", **jax_arrays(model))
    loaded = load_pretrained(tmp_path / "ViT-tiny.npz")
    assert loaded.config == model.config  # num_heads from the query kernel, R from pre_logits
    assert_same_logits(loaded, model)


@needs_safetensors
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_timm_safetensors_with_num_heads_given(backend, tmp_path, pool):
    model = tiny_vit(pool=pool)
    path = save_safetensors(tmp_path / "model.safetensors", model.state_dict())
    loaded = load_pretrained(path, num_heads=3)
    assert loaded.config == model.config  # everything else from shapes
    assert_same_logits(loaded, model)


@needs_safetensors
def test_timm_config_json_names_the_heads(backend, tmp_path):
    model = tiny_vit()  # 12 / 3 heads: as vit_tiny
    save_safetensors(tmp_path / "model.safetensors", model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(
        {"architecture": "vit_tiny_patch16_224.augreg_in21k", "num_classes": 5,
         "pretrained_cfg": {"input_size": [3, 12, 12]}}))
    loaded = load_pretrained(tmp_path / "model.safetensors")
    assert loaded.config == model.config
    assert_same_logits(loaded, model)


def test_tinyvit_model_file_and_training_checkpoint(backend, tmp_path):
    from tinyvit.train import TrainConfig

    model = tiny_vit()
    save_model(model, tmp_path / "model.npz")
    assert_same_logits(load_pretrained(tmp_path / "model.npz"), model)

    train = TrainConfig(model_overrides={"embed_dim": 8, "depth": 1, "num_heads": 2})
    trained = tiny_vit(**dataclasses.asdict(train.model_config()))
    no_optimizer = types.SimpleNamespace(state_dict=dict)
    save_checkpoint(tmp_path / "last.npz", trained, no_optimizer,
                    {"config": dataclasses.asdict(train)})
    loaded = load_pretrained(tmp_path / "last.npz")
    assert loaded.config == trained.config
    assert_same_logits(loaded, trained)
    (tmp_path / "last.npz").rename(tmp_path / "best.npz")  # a run's folder: its best model
    assert_same_logits(load_pretrained(tmp_path), trained)


def test_convert_does_not_write_over_a_training_checkpoint(tmp_path, capsys):
    from tinyvit.train import TrainConfig

    train = TrainConfig(model_overrides={"embed_dim": 8, "depth": 1, "num_heads": 2})
    model = tiny_vit(**dataclasses.asdict(train.model_config()))
    no_optimizer = types.SimpleNamespace(state_dict=dict)
    checkpoint = tmp_path / "best.npz"
    save_checkpoint(checkpoint, model, no_optimizer, {"config": dataclasses.asdict(train)})
    before = checkpoint.read_bytes()
    assert convert_main([str(checkpoint), str(checkpoint)]) == 1
    assert capsys.readouterr().err == (
        f"error: {checkpoint} is a training checkpoint, which a model file would replace (the "
        "run could not be resumed or evaluated): write DST elsewhere\n")
    assert checkpoint.read_bytes() == before
    assert convert_main([str(checkpoint), str(tmp_path / "model.npz")]) == 0
    assert convert_main([str(checkpoint), str(tmp_path / "model.npz")]) == 0  # a model file


def test_a_folder_of_neither_kind_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(PretrainedError, match=rf"^{tmp_path}: expected a folder with "
                                              r"model.safetensors \(and config.json\) or a "
                                              r"training run's folder \(best.npz\), got "
                                              r"\['notes.txt'\]$"):
        load_pretrained(tmp_path)


# -- export ----------------------------------------------------------------------------------


@needs_safetensors
@pytest.mark.parametrize(
    "fields", [{}, {"pool": "mean"}, {"representation_size": 6, "norm_eps": 1e-5}])
def test_save_pretrained_round_trip(backend, tmp_path, fields):
    model = tiny_vit(**fields)
    path = save_pretrained(model, tmp_path / "out" / "model.safetensors")
    config = json.loads((path.parent / "config.json").read_text())
    assert config["model_args"]["num_heads"] == 3 and config["num_classes"] == 5
    loaded = load_pretrained(path)
    assert loaded.config == model.config
    assert_same_logits(loaded, model)


@needs_safetensors
@pytest.mark.parametrize("dtype", ["float16", "float32", None])
def test_save_pretrained_writes_a_dtype_that_loads_back(backend, tmp_path, dtype):
    model = tiny_vit()
    path = save_pretrained(model, tmp_path / "model.safetensors", dtype=dtype)
    saved = B.to_host(model.pos_embed.data).astype(dtype or "float64")
    assert np.array_equal(B.to_host(load_pretrained(path).pos_embed.data), saved)


@needs_safetensors
@pytest.mark.parametrize("dtype", ["int8", "bogus", "complex64", 3])
def test_save_pretrained_refuses_a_dtype_it_could_not_load_back(backend, tmp_path, dtype):
    with pytest.raises(ValueError) as raised:
        save_pretrained(tiny_vit(), tmp_path / "model.safetensors", dtype=dtype)
    assert str(raised.value) == ("save_pretrained: expected dtype float16, float32 or float64 "
                                 f"(the floats load_pretrained reads), got {dtype!r}")
    assert list(tmp_path.iterdir()) == []  # nothing written


@needs_safetensors
def test_two_models_saved_in_one_folder_each_load_with_their_own_config(backend, tmp_path):
    """config.json is the last one's (for timm); each file holds its own config."""
    first, second = tiny_vit(), tiny_vit(num_heads=2, pool="mean")
    first_path = save_pretrained(first, tmp_path / "first.safetensors")
    save_pretrained(second, tmp_path / "second.safetensors")
    assert json.loads((tmp_path / "config.json").read_text())["model_args"]["num_heads"] == 2
    notes = []
    loaded = load_pretrained(first_path, log=notes.append)
    assert loaded.config == first.config
    assert_same_logits(loaded, first)
    assert "config from the file's metadata (tinyvit_config)" in notes


@needs_safetensors
@pytest.mark.parametrize("theirs", ['{"my": "project settings"}',
                                    '{"architecture": "vit_tiny_patch16_224", "num_classes": 9}'])
def test_save_pretrained_leaves_a_config_json_it_did_not_write(backend, tmp_path, theirs):
    """The user's file, or the config of a hub model downloaded into the folder, stays;
    the model saved beside it loads with its own config."""
    (tmp_path / "config.json").write_text(theirs)
    model = tiny_vit(num_heads=2)
    path = save_pretrained(model, tmp_path / "finetuned.safetensors")
    assert (tmp_path / "config.json").read_text() == theirs
    loaded = load_pretrained(path)
    assert loaded.config == model.config
    assert_same_logits(loaded, model)


@needs_safetensors
@pytest.mark.parametrize("text, message", [
    ("[12]", "not a config, expected a JSON object, got list"),
    ("{", r"not a readable JSON file \(Expecting property name"),
])
def test_a_bad_config_in_the_metadata_is_named_as_a_config_json_is(tmp_path, text, message):
    from safetensors.numpy import load_file, save_file

    path = save_pretrained(tiny_vit(), tmp_path / "model.safetensors")
    save_file(load_file(path), path, metadata={"format": "pt", "tinyvit_config": text})
    with pytest.raises(PretrainedError, match=rf"^{path} \(tinyvit_config in its metadata\): "
                                              f"{message}"):
        load_pretrained(path)


@needs_safetensors
def test_timm_model_args_alone_rebuild_the_config(backend, tmp_path):
    from safetensors.numpy import load_file, save_file

    model = tiny_vit(pool="mean")
    path = save_pretrained(model, tmp_path / "model.safetensors")
    save_file(load_file(path), path, metadata={"format": "pt"})  # as timm writes it: the
    config = json.loads((tmp_path / "config.json").read_text())  # config in config.json,
    del config["tinyvit_config"]  # model_args and pretrained_cfg alone
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_pretrained(path)
    assert loaded.config == model.config
    assert_same_logits(loaded, model)


@needs_safetensors
def test_exported_file_loads_into_plain_torch(backend, tmp_path):
    torch = pytest.importorskip("torch")
    if os.path.dirname(__file__) not in sys.path:
        sys.path.insert(0, os.path.dirname(__file__))
    from safetensors.torch import load_file

    from torch_reference import TorchViT

    for pool in ("cls", "mean"):
        model = tiny_vit(pool=pool)
        path = save_pretrained(model, tmp_path / pool / "model.safetensors")
        reference = TorchViT(model.config).double()
        reference.load_state_dict(load_file(str(path)), strict=True)
        c = model.config
        images = B.host_rng(0).standard_normal((2, c.in_channels, c.image_size, c.image_size))
        with torch.no_grad():
            want = reference(torch.from_numpy(images)).numpy()
        np.testing.assert_allclose(logits(model), want, rtol=0, atol=ATOL)


# -- bfloat16 and float16 ----------------------------------------------------------------------


def test_bfloat16_to_float32_is_exact():
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000, 0x4049], dtype="<u2")
    want = np.array([1.0, -2.0, np.inf, 2.0**-133, -0.0, 3.140625], dtype=np.float32)
    got = bfloat16_to_float32(bits.tobytes(), (2, 3))
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got.ravel(), want)
    assert np.signbit(got.ravel()[4])


@needs_safetensors
def test_bfloat16_and_float16_files_are_widened(backend, tmp_path):
    state = tiny_vit().state_dict()
    bf16 = {k: ("BF16", v.shape, to_bfloat16_bits(v).tobytes()) for k, v in state.items()}
    write_raw_safetensors(tmp_path / "bf16.safetensors", bf16)
    fp16 = {k: v.astype(np.float16) for k, v in state.items()}
    save_safetensors(tmp_path / "fp16.safetensors", fp16)
    tensors, _ = read_safetensors(tmp_path / "bf16.safetensors")
    assert all(t.dtype == np.float32 for t in tensors.values())
    for name, narrow in (("bf16", lambda v: bfloat16_to_float32(to_bfloat16_bits(v).tobytes(),
                                                                 v.shape)),
                         ("fp16", lambda v: v.astype(np.float16).astype(np.float32))):
        loaded = load_pretrained(tmp_path / f"{name}.safetensors", num_heads=3).state_dict()
        for key, value in state.items():
            np.testing.assert_array_equal(loaded[key], narrow(value), err_msg=f"{name} {key}")


@needs_safetensors
def test_bfloat16_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    values = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file({"x": values}, str(tmp_path / "x.safetensors"))
    tensors, _ = read_safetensors(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(tensors["x"], values.float().numpy())


# -- errors --------------------------------------------------------------------------------------


@needs_safetensors
def test_every_tensor_problem_is_named_at_once(tmp_path):
    state = tiny_vit().state_dict()
    del state["blocks.1.norm1.weight"]
    state["blocks.0.attn.extra"] = np.zeros(3)
    state["blocks.0.mlp.fc2.bias"] = np.zeros(13)
    state["blocks.1.norm2.bias"] = np.zeros(12, dtype=np.int32)
    path = save_safetensors(tmp_path / "model.safetensors", state)
    with pytest.raises(PretrainedError) as error:
        load_pretrained(path, num_heads=3)
    message = str(error.value)
    assert "missing tensor blocks.1.norm1.weight: expected shape (12,)" in message
    assert "unexpected tensor blocks.0.attn.extra of shape (3,)" in message
    assert "wrong shape: blocks.0.mlp.fc2.bias expected (12,), got (13,)" in message
    assert "unsupported dtype: blocks.1.norm2.bias is I32" in message


@needs_safetensors
def test_hugging_face_errors_use_hugging_face_names(tmp_path):
    model = tiny_vit()
    tensors = hf_tensors(model)
    del tensors["vit.encoder.layer.1.attention.attention.key.weight"]
    tensors["vit.encoder.layer.0.attention.attention.query.bias"] = np.zeros(11)
    with pytest.raises(PretrainedError) as error:
        load_pretrained(write_hf_folder(tmp_path / "hf", model, tensors=tensors))
    message = str(error.value)
    assert "missing tensor vit.encoder.layer.1.attention.attention.key.weight" in message
    query = "vit.encoder.layer.0.attention.attention.query.bias"
    assert f"wrong shape: {query} expected (12,), got (11,)" in message
    (tmp_path / "hf" / "config.json").unlink()
    with pytest.raises(PretrainedError, match="need the config.json"):
        load_pretrained(tmp_path / "hf")


def test_jax_errors_use_flax_names(tmp_path):
    arrays = jax_arrays(tiny_vit())
    out = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/out/kernel"
    arrays[out] = np.zeros((3, 4, 11))  # (H, D/H, D) with D = 11
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(PretrainedError) as error:
        load_pretrained(tmp_path / "bad.npz")
    assert f"wrong shape: {out} expected (3, 4, 12), got (3, 4, 11)" in str(error.value)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pth", "folder"])
def test_pickle_files_are_refused(tmp_path, name):
    if name == "folder":
        (tmp_path / "folder").mkdir()
        (tmp_path / "folder" / "pytorch_model.bin").write_bytes(b"never unpickled")
    else:
        (tmp_path / name).write_bytes(b"never unpickled")
    with pytest.raises(PretrainedError, match="pickle files are not read.*model.safetensors"):
        load_pretrained(tmp_path / name)


@needs_safetensors
def test_num_heads_must_be_given_when_shapes_cannot_tell(tmp_path):
    path = save_safetensors(tmp_path / "model.safetensors", tiny_vit().state_dict())
    with pytest.raises(PretrainedError, match="num_heads: tensor shapes do not tell it") as error:
        load_pretrained(path)
    assert "load_pretrained(path, num_heads=12)" in str(error.value)
    assert "num_classes" not in str(error.value)  # the head tells it
    state = {k: v for k, v in tiny_vit().state_dict().items() if not k.startswith("head.")}
    path = save_safetensors(tmp_path / "headless.safetensors", state)
    with pytest.raises(PretrainedError, match="num_classes: the file has no classifier"):
        load_pretrained(path, num_heads=3)
    assert load_pretrained(path, num_heads=3, num_classes=4).config.num_classes == 4


@needs_safetensors
def test_config_tensors_missing_from_a_file_without_config(tmp_path):
    state = tiny_vit().state_dict()
    del state["pos_embed"]
    path = save_safetensors(tmp_path / "model.safetensors", state)
    with pytest.raises(PretrainedError, match="image_size: pos_embed is missing"):
        load_pretrained(path, num_heads=3)


@needs_safetensors
def test_architecture_overrides_must_agree_with_the_file(tmp_path):
    path = save_pretrained(tiny_vit(), tmp_path / "model.safetensors")
    with pytest.raises(PretrainedError, match=r"embed_dim=24 \(the file has 12\)"):
        load_pretrained(path, embed_dim=24)
    with pytest.raises(ValueError, match="unknown config field"):
        load_pretrained(path, heads=3)
    with pytest.raises(ValueError, match="head must be one of"):
        load_pretrained(path, head="new")


@needs_safetensors
def test_unreadable_safetensors_file(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(PretrainedError, match="not a readable .safetensors file"):
        load_pretrained(tmp_path / "junk.safetensors")


def safetensors_file(path, dtype, data_offsets, data):
    """A one-tensor .safetensors file written byte by byte: the 8-byte header length,
    the JSON header, the data."""
    header = json.dumps({"cls_token": {"dtype": dtype, "shape": [1, 1, 4],
                                       "data_offsets": data_offsets}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


@needs_safetensors
@pytest.mark.parametrize("dtype, itemsize", [("F32", 4), ("BF16", 2)])
def test_truncated_and_overrunning_safetensors_files_are_named(tmp_path, dtype, itemsize):
    size = 4 * itemsize
    whole = safetensors_file(tmp_path / "whole.safetensors", dtype, [0, size], bytes(size))
    with pytest.raises(PretrainedError, match="missing"):  # readable, just not a whole ViT
        load_pretrained(whole)
    truncated = tmp_path / "truncated.safetensors"  # cut inside the JSON header
    truncated.write_bytes(whole.read_bytes()[:30])
    overrunning = safetensors_file(tmp_path / "overrunning.safetensors", dtype, [0, 4 * size],
                                   bytes(size))  # the offsets run past the end of the file
    for path in (truncated, overrunning):
        with pytest.raises(PretrainedError, match=f"^{path}: not a readable .safetensors file"):
            load_pretrained(path)


def test_missing_file_and_missing_safetensors_package(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path / "absent.npz")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[hub\]"'):
        load_pretrained(tmp_path / "model.safetensors")


# -- fine-tuning options: head, image size, pooling ----------------------------------------------


@needs_safetensors
@pytest.mark.parametrize("head, num_classes", [("auto", 5), ("auto", 7), ("fresh", 5), ("zero", 7)])
def test_head_options(tmp_path, head, num_classes):
    model = tiny_vit()
    path = save_pretrained(model, tmp_path / "model.safetensors")
    loaded = load_pretrained(path, head=head, num_classes=num_classes, seed=3).state_dict()
    built = ViT(dataclasses.replace(model.config, num_classes=num_classes), seed=3).state_dict()
    want = {"auto": model.state_dict() if num_classes == 5 else built, "fresh": built,
            "zero": {k: np.zeros_like(v) for k, v in built.items()}}[head]
    for key in ("head.weight", "head.bias"):
        np.testing.assert_array_equal(loaded[key], want[key])
    np.testing.assert_array_equal(loaded["norm.weight"], model.state_dict()["norm.weight"])


@needs_safetensors
def test_head_load_needs_a_head_of_the_right_shape(tmp_path):
    path = save_pretrained(tiny_vit(), tmp_path / "model.safetensors")
    with pytest.raises(PretrainedError, match=r"expected head.weight \(7, 12\).*\(5, 12\)"):
        load_pretrained(path, head="load", num_classes=7)


@needs_safetensors
def test_image_size_and_pool_overrides(backend, tmp_path):
    model = tiny_vit()
    path = save_pretrained(model, tmp_path / "model.safetensors")
    loaded = load_pretrained(path, image_size=16, pool="mean").state_dict()
    original = model.state_dict()
    want = B.to_host(resize_pos_embed(B.to_device(original["pos_embed"]), 3, 4))
    np.testing.assert_allclose(loaded["pos_embed"], want, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(loaded["fc_norm.weight"], original["norm.weight"])
    np.testing.assert_array_equal(loaded["head.weight"], original["head.weight"])


def test_representation_size_override_drops_pre_logits(tmp_path):
    model = tiny_vit(representation_size=6)
    np.savez(tmp_path / "vit.npz", **jax_arrays(model))
    notes = []
    loaded = load_pretrained(tmp_path / "vit.npz", representation_size=0, log=notes.append)
    assert loaded.pre_logits is None and "pre_logits.fc.weight" not in loaded.state_dict()
    assert any("representation_size 6 -> 0" in n for n in notes)
    assert any("the file's head has another shape" in n for n in notes)


# -- the command line ----------------------------------------------------------------------------


@needs_safetensors
def test_convert_command(backend, tmp_path, capsys):
    model = tiny_vit()
    folder = write_hf_folder(tmp_path / "hf", model)
    assert convert_main([str(folder), str(tmp_path / "timm" / "model.safetensors")]) == 0
    timm = tmp_path / "timm" / "model.safetensors"
    assert convert_main([str(timm), str(tmp_path / "m.npz")]) == 0
    out = capsys.readouterr().out
    assert "Hugging Face ViT checkpoint" in out and "wrote" in out and "float64" in out
    assert_same_logits(load_model(tmp_path / "m.npz"), model)

    save_safetensors(tmp_path / "bare.safetensors", model.state_dict())
    assert convert_main([str(tmp_path / "bare.safetensors"), str(tmp_path / "b.npz")]) == 1
    assert convert_main([str(tmp_path / "bare.safetensors"), str(tmp_path / "b.npz"),
                         "--num-heads", "3", "--dtype", "float32"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "num_heads" in err


@needs_safetensors
def test_convert_names_the_config_json_a_timm_file_takes(backend, tmp_path, capsys):
    """A timm file without tinyvit's metadata takes the config.json beside it, as the
    hub lays a model out; the command's output says which file it was."""
    model = tiny_vit()
    save_safetensors(tmp_path / "model.safetensors", model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(
        {"architecture": "vit_tiny_patch16_224", "num_classes": 5,
         "pretrained_cfg": {"input_size": [3, 12, 12]}}))
    assert convert_main([str(tmp_path / "model.safetensors"), str(tmp_path / "m.npz")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"{tmp_path / 'model.safetensors'}: timm state dict",
                         f"config from {tmp_path / 'config.json'} (vit_tiny_patch16_224)"]
    assert load_model(tmp_path / "m.npz").config == model.config


def test_convert_bad_input_is_one_line_without_traceback(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
    command = [sys.executable, "-m", "tinyvit.convert", str(tmp_path / "pytorch_model.bin"),
               str(tmp_path / "out.npz")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "model.safetensors" in done.stderr and not (tmp_path / "out.npz").exists()


# -- against transformers (optional: CI does not install it) --------------------------------------


HF_TOLERANCE = {"float32": 1e-5, "float64": 1e-10}


def max_relative_error(got, want):
    """max |got - want| / max |want|: the error relative to the max-norm of the reference."""
    return np.abs(got - want).max() / np.abs(want).max()


def save_hf_gradients(hf, folder):
    """Save ``hf`` with each parameter replaced by its gradient (zero where it has none:
    ViTModel's pooler), so that ``load_pretrained`` maps the gradients to tinyvit's names
    and layouts (query, key, value stacked into qkv, ...) as it maps the weights. Through
    the file, as HF's names in memory need not be those it saves (transformers 5 renames)."""
    import torch

    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    hf.save_pretrained(folder)


@needs_safetensors
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("architecture", ["ViTForImageClassification", "ViTModel"])
def test_logits_and_gradients_match_transformers(backend, tmp_path, architecture, dtype):
    """Logits, then every parameter's gradient for a random upstream gradient against
    autograd's, each within HF_TOLERANCE[dtype] relative to the max-norm of HF's tensor."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.ViTConfig(image_size=12, patch_size=4, num_channels=3, hidden_size=12,
                                    num_hidden_layers=2, num_attention_heads=3,
                                    intermediate_size=24, num_labels=5)
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path / "weights")
    # ViTModel has no classifier: on both sides a head of the identity on the class token's
    # final features, the same parameters for both
    heads = {"num_classes": 12, "head": "zero"} if architecture == "ViTModel" else {"head": "load"}
    model = load_pretrained(tmp_path / "weights", dtype=dtype, **heads)
    assert model.config.norm_eps == 1e-12
    # no dropout: training mode, whose cache backward needs, computes what HF's eval mode does
    assert model.config.dropout == model.config.attn_dropout == 0

    images = B.host_rng(0).standard_normal((2, 3, 12, 12)).astype(dtype)
    out = hf(pixel_values=torch.from_numpy(images))
    if architecture == "ViTModel":
        weight = torch.eye(12, dtype=out.last_hidden_state.dtype, requires_grad=True)
        bias = torch.zeros(12, dtype=weight.dtype, requires_grad=True)
        want = out.last_hidden_state[:, 0] @ weight.T + bias
        model.head.weight.data[...] = B.to_device(np.eye(12))
    else:
        want = out.logits
    got = B.to_host(model.forward(B.to_device(images)))
    assert got.dtype == dtype
    assert max_relative_error(got, want.detach().numpy()) < HF_TOLERANCE[dtype]

    dlogits = B.host_rng(1).standard_normal(got.shape).astype(dtype)
    want.backward(torch.from_numpy(dlogits))
    model.zero_grad()
    model.backward(B.to_device(dlogits))
    save_hf_gradients(hf, tmp_path / "gradients")
    expected = load_pretrained(tmp_path / "gradients", dtype=dtype,
                               **heads).state_dict()
    if architecture == "ViTModel":
        expected.update({"head.weight": weight.grad.numpy(), "head.bias": bias.grad.numpy()})
    grads = model.grads()
    # every parameter, each from HF's gradients: load_pretrained fails on a missing tensor
    assert sorted(grads) == sorted(expected) == sorted(name for name, _ in model.named_parameters())
    errors = {key: max_relative_error(grads[key], expected[key]) for key in grads}
    assert max(errors.values()) < HF_TOLERANCE[dtype], errors
