"""Checkpoints and weights files from anyone: every bad file is refused with one
line naming the file and what is wrong, before a model is built and in memory
bounded by the file's size (a deflate bomb and a .npy header claiming terabytes
are refused unread)."""

import dataclasses
import io
import json
import re
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

import train_mnist
from conftest import TINY_MODEL
from tinyvit.convert import main as convert_main
from tinyvit.models import PRESETS, ViT
from tinyvit.nn.optim import SGD, AdamW
from tinyvit.train import TrainConfig, fit, load_trained
from tinyvit.train.state import RunState
from tinyvit.weights import (
    CheckpointError,
    load_checkpoint,
    load_model,
    load_pretrained,
    save_model,
)
from tinyvit.weights.names import tinyvit_shapes
from tinyvit.weights.npz import MAX_TEXT_CHARS

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def checkpoint_arrays(optimizer="adamw", **meta_changes):
    """The entries of a tiny training checkpoint, as ``fit`` saves them."""
    config = TrainConfig(model_overrides=TINY_MODEL, optimizer=optimizer)
    model = ViT(config.model_config())
    optim = (AdamW if optimizer == "adamw" else SGD)(model)
    meta = {"config": dataclasses.asdict(config), "model_config": dataclasses.asdict(model.config),
            **RunState(lr=config.lr).to_meta(), **meta_changes}
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optim.state_dict().items()})
    arrays["meta"] = json.dumps(meta)
    return arrays


def npy_header(shape, descr="<f4"):
    """The .npy header of an array of ``shape`` (128 bytes for the shapes here)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue()


def with_meta(path, drop=(), **changes):
    """A checkpoint whose meta has ``changes`` and not the entries ``drop`` names."""
    arrays = checkpoint_arrays()
    meta = {**json.loads(arrays["meta"]), **changes}
    arrays["meta"] = json.dumps({k: v for k, v in meta.items() if k not in drop})
    np.savez(path, **arrays)
    return path


def with_config(path, **changes):
    """A checkpoint whose run config has ``changes``."""
    config = json.loads(checkpoint_arrays()["meta"])["config"]
    return with_meta(path, config={**config, **changes})


def with_arrays(path, changes):
    """A checkpoint with the entries ``changes`` names replaced (None: removed)."""
    arrays = {**checkpoint_arrays(), **changes}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def with_first_value(path, name, value):
    """A checkpoint whose entry ``name`` has ``value`` for its first value."""
    array = checkpoint_arrays()[name].copy()
    array.flat[0] = value
    return with_arrays(path, {name: array})


def bomb(path, megabytes=200):
    """A .npz file of one deflated member: a float32 array of ``megabytes`` of zeros,
    which deflate to a thousandth of that. Written chunk by chunk."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("model/cls_token.npy", "w", force_zip64=True) as f:
            f.write(npy_header((megabytes * MB // 4,)))
            for _ in range(megabytes):
                f.write(bytes(MB))
    return path


def huge_header(path):
    """A .npz file whose .npy header claims a (1e6, 1e6) float32 array (4 TB), with
    16 bytes of data."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/cls_token.npy", npy_header((1_000_000, 1_000_000)) + bytes(16))
    return path


def embed_dim_4096(path):
    """A checkpoint whose model_config asks for embed_dim 4096 (201 M values), with
    the arrays of embed_dim 16."""
    model_config = json.loads(checkpoint_arrays()["meta"])["model_config"]
    return with_meta(path, model_config={**model_config, "embed_dim": 4096, "num_heads": 4})


def not_a_zip(path):
    path.write_text("not a checkpoint")
    return path


def truncated(path):
    np.savez(path, **checkpoint_arrays())
    path.write_bytes(path.read_bytes()[:20_000])
    return path


def tensors_mismatch(fields, expected, got, problems):
    """The message of a checkpoint whose tensors do not match its model config."""
    return (f"the tensors of this tinyvit training checkpoint do not match a ViT with "
            f"image_size=28, patch_size=7, in_channels=1, {fields}, mlp_ratio=2.0, "
            f"num_classes=10, representation_size=0, pool='cls', expected {expected}, got "
            f"{got}: {problems}")


TINY = "embed_dim=16, depth=1, num_heads=2"

# kind -> (builder, the message after "<path>: ", a regular expression where compiled)
BAD_FILES = {
    "not a zip": (not_a_zip, "expected a .npz file (a zip archive), got a file that does not "
                             "start with the zip signature"),
    "truncated zip": (truncated, "not a readable .npz checkpoint, expected a whole zip archive, "
                                 "got a damaged or truncated one (File is not a zip file)"),
    "bomb member": (bomb, re.compile(
        r"the members unpack to too much \(a zip bomb\?\), expected at most [\d,]+ bytes \(20 "
        r"times the file's [\d,]+ and 1,048,576 more\), got 209,715,328 "
        r"\('model/cls_token.npy' unpacks [\d,]+ bytes to 209,715,328\)")),
    "huge .npy header": (huge_header, "entry 'model/cls_token' is not a whole array, expected "
                                      "4,000,000,000,128 bytes for its header's float32 array "
                                      "of shape (1000000, 1000000), got 144"),
    "meta with bad JSON": (lambda p: with_arrays(p, {"meta": "{'config': 1"}),
                           "entry 'meta' is not valid JSON, expected a JSON object, got "
                           "Expecting property name enclosed in double quotes: line 1 column 2 "
                           "(char 1)"),
    "meta without config": (lambda p: with_meta(p, drop=["config"]),
                            "meta is not a training checkpoint's, expected an object with a "
                            "config object, got ['best_acc', 'elapsed', 'epoch', 'global_step', "
                            "'history', 'init', 'lr', 'model_config', 'plan', 'running', "
                            "'step', 'wall']"),
    "unknown config field": (lambda p: with_config(p, dpeth=3),
                             "meta config has an unknown field, expected a field of "
                             "TrainConfig, got 'dpeth'"),
    "wrong-typed field": (lambda p: with_config(p, epochs="18"),
                          "meta config.epochs has the wrong type, expected int, got '18' "
                          "(a string)"),
    "embed_dim=4096, small arrays": (embed_dim_4096, tensors_mismatch(
        "embed_dim=4096, depth=1, num_heads=4", "20 tensors of 134,590,474 values",
        "20 tensors of 3,514 values",
        "wrong shape: cls_token expected (1, 1, 4096), got (1, 1, 16); wrong shape: pos_embed "
        "expected (1, 17, 4096), got (1, 17, 16); wrong shape: patch_embed.proj.weight expected "
        "(4096, 1, 7, 7), got (16, 1, 7, 7); wrong shape: patch_embed.proj.bias expected "
        "(4096,), got (16,); wrong shape: blocks.0.norm1.weight expected (4096,), got (16,); "
        "wrong shape: blocks.0.norm1.bias expected (4096,), got (16,); and 13 more")),
    "missing weight": (
        lambda p: with_arrays(p, {"model/blocks.0.attn.qkv.weight": None}),
        tensors_mismatch(TINY, "20 tensors of 3,514 values", "19 tensors of 2,746 values",
                         "missing tensor blocks.0.attn.qkv.weight: expected shape (48, 16)")),
    "wrong-shaped weight": (
        lambda p: with_arrays(p, {"model/head.bias": np.zeros(3, np.float32)}),
        tensors_mismatch(TINY, "20 tensors of 3,514 values", "20 tensors of 3,507 values",
                         "wrong shape: head.bias expected (10,), got (3,)")),
    "extra array": (
        lambda p: with_arrays(p, {"model/extra": np.zeros(3, np.float32)}),
        tensors_mismatch(TINY, "20 tensors of 3,514 values", "21 tensors of 3,517 values",
                         "unexpected tensor extra of shape (3,)")),
    "NaN weight": (
        lambda p: with_first_value(p, "model/blocks.0.mlp.fc1.weight", np.nan),
        "entry 'model/blocks.0.mlp.fc1.weight' is not finite, expected finite weights, got 1 "
        "NaN and 0 infinite of its 512 values"),
    "infinite weight": (
        lambda p: with_first_value(p, "model/head.bias", -np.inf),
        "entry 'model/head.bias' is not finite, expected finite weights, got 0 NaN and 1 "
        "infinite of its 10 values"),
}

RUN_CONFIG_KINDS = ("unknown config field", "wrong-typed field")  # the trainer's config


def bad_file(tmp_path, kind):
    """(path, the whole message expected) of a bad file of ``kind``."""
    build, message = BAD_FILES[kind]
    path = build(tmp_path / f"{kind.replace(' ', '_')}.npz")
    if isinstance(message, re.Pattern):
        return path, re.compile(re.escape(f"{path}: ") + message.pattern)
    return path, f"{path}: {message}"


def assert_message(error, expected):
    """``error``'s message is ``expected`` (a regular expression where compiled), on one line."""
    message = str(error)
    assert "\n" not in message
    if isinstance(expected, re.Pattern):
        assert expected.fullmatch(message), message
    else:
        assert message == expected


@pytest.mark.parametrize("kind", BAD_FILES)
def test_every_bad_checkpoint_is_one_line_naming_the_file(tmp_path, kind):
    path, expected = bad_file(tmp_path, kind)
    with pytest.raises(CheckpointError) as error:
        load_trained(path)
    assert_message(error.value, expected)
    with pytest.raises(CheckpointError) as error:
        fit(None, resume=path)
    assert_message(error.value, expected)


@pytest.mark.parametrize("kind", [k for k in BAD_FILES if k not in RUN_CONFIG_KINDS])
def test_every_bad_file_is_refused_as_pretrained_weights(tmp_path, kind):
    path, expected = bad_file(tmp_path, kind)
    with pytest.raises(ValueError) as error:  # CheckpointError or PretrainedError
        load_pretrained(path)
    assert_message(error.value, expected)


@pytest.mark.parametrize("build", [bomb, huge_header, embed_dim_4096])
def test_refused_before_anything_large_is_allocated(tmp_path, build):
    path = build(tmp_path / "bad.npz")
    tracemalloc.start()
    try:
        for read in (load_trained, load_pretrained):
            with pytest.raises(CheckpointError):
                read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5 * MB  # the bomb unpacks to 200 MB, the header claims 4 TB


def test_the_same_bounded_reader_reads_the_papers_jax_files(tmp_path):
    with zipfile.ZipFile(tmp_path / "ViT-B_16.npz", "w") as z:
        z.writestr("embedding/kernel.npy", npy_header((16, 16, 3, 10**6)) + bytes(64))
    with pytest.raises(CheckpointError, match=r"'embedding/kernel' is not a whole array, "
                                              r"expected 3,072,000,128 bytes"):
        load_pretrained(tmp_path / "ViT-B_16.npz")


def test_meta_too_long_or_too_deep_and_entries_of_the_wrong_kind(tmp_path):
    path = with_arrays(tmp_path / "long.npz", {"meta": " " * (MAX_TEXT_CHARS + 1)})
    with pytest.raises(CheckpointError, match="entry 'meta' is too long, expected at most "
                                              "1,000,000 characters, got 1,000,001"):
        load_checkpoint(path)
    path = with_arrays(tmp_path / "deep.npz", {"meta": "[" * 100_000})
    with pytest.raises(CheckpointError, match="entry 'meta' is not valid JSON.*recursion"):
        load_checkpoint(path)
    path = with_arrays(tmp_path / "numbers.npz", {"meta": np.zeros(3)})
    with pytest.raises(CheckpointError, match=r"entry 'meta' is not text, expected a string, "
                                              r"got a float64 array of shape \(3,\)"):
        load_checkpoint(path)
    path = with_arrays(tmp_path / "other.npz", {"weights": np.zeros(3)})
    with pytest.raises(CheckpointError, match="entry 'weights' is not a checkpoint's, expected "
                                              "meta, model/... and optim/... entries"):
        load_checkpoint(path)


def test_the_optimizer_state_must_be_the_runs(tmp_path):
    path = with_arrays(tmp_path / "m.npz", {"optim/m": np.zeros(5, np.float32)})
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(error.value) == (
        f"{path}: the optimizer state is not adamw's over 3,514 parameters, expected optim/m "
        "(3514,) float, optim/t () int, optim/v (3514,) float, got optim/m (5,) float, "
        "optim/t () int, optim/v (3514,) float")
    path = with_config(tmp_path / "sgd.npz", optimizer="sgd")  # AdamW's state, SGD's config
    with pytest.raises(CheckpointError, match="not sgd's over 3,514 parameters"):
        load_checkpoint(path)
    assert load_trained(path)[1].optimizer == "sgd"  # evaluation reads no optimizer state


def test_a_wrong_typed_run_state_stops_a_resume(tmp_path):
    path = with_meta(tmp_path / "state.npz", running={"loss_sum": 0.0, "seen": "3"})
    with pytest.raises(CheckpointError) as error:
        fit(None, resume=path)
    assert str(error.value) == (f"{path}: meta.running.seen has the wrong type, expected int, "
                                "got '3' (a string)")


def test_a_bad_model_file(tmp_path):
    save_model(ViT(embed_dim=16, depth=1, num_heads=2), tmp_path / "model.npz")
    arrays = dict(np.load(tmp_path / "model.npz"))
    config = json.loads(str(arrays["__config__"]))
    np.savez(tmp_path / "bad.npz", **{**arrays, "__config__": json.dumps({**config, "heads": 2})})
    with pytest.raises(CheckpointError) as error:
        load_model(tmp_path / "bad.npz")
    assert str(error.value) == (f"{tmp_path / 'bad.npz'}: __config__ has an unknown field, "
                                "expected a field of ViTConfig, got 'heads'")
    np.savez(tmp_path / "bad.npz", **{**arrays, "__config__": json.dumps({**config,
                                                                            "num_heads": 3})})
    with pytest.raises(CheckpointError, match="__config__ is not valid, embed_dim 16 is not "
                                              "divisible by num_heads 3"):
        load_model(tmp_path / "bad.npz")
    np.savez(tmp_path / "bad.npz", **{**arrays, "__config__": json.dumps({**config,
                                                                            "depth": 10**9})})
    with pytest.raises(CheckpointError, match="expected at least 1000000000 tensors for depth "
                                              "1000000000, got 20"):
        load_model(tmp_path / "bad.npz")
    np.savez(tmp_path / "bad.npz", **{**arrays, "pos_embed": np.full((1, 17, 16), np.inf)})
    with pytest.raises(CheckpointError) as error:
        load_model(tmp_path / "bad.npz")
    assert str(error.value) == (f"{tmp_path / 'bad.npz'}: entry 'pos_embed' is not finite, "
                                "expected finite weights, got 0 NaN and 272 infinite of its "
                                "272 values")


@pytest.mark.parametrize("name", [name for name in PRESETS if not name.startswith("vit_")])
@pytest.mark.parametrize("changes", [{}, {"pool": "mean", "representation_size": 5},
                                     {"qkv_bias": False, "stem_norm": "group",
                                      "stem_pool": True}])
def test_the_computed_shapes_are_those_of_the_model(name, changes):
    config = dataclasses.replace(PRESETS[name], **changes)
    if config.feature_size % config.patch_size:
        config = dataclasses.replace(config, patch_size=1)
    model = ViT(config)
    parameters, buffers = tinyvit_shapes(config)
    assert {**parameters, **buffers} == {k: v.shape for k, v in model.state_dict().items()}
    assert sum(np.prod(s) for s in parameters.values()) == model.num_parameters()


def test_a_run_folder_is_evaluated_from_its_best_npz(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^no best.npz in {tmp_path}$"):
        load_trained(tmp_path)
    np.savez(tmp_path / "best.npz", **checkpoint_arrays())
    model, config = load_trained(tmp_path)
    assert config.model_overrides == TINY_MODEL and model.config.embed_dim == 16


# -- the commands ------------------------------------------------------------------------------


def run_command(*args):
    """(exit status, stderr) of a command run as a user runs it."""
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=120)
    return done.returncode, done.stderr


@pytest.mark.parametrize("kind, args", [
    ("bomb member", ["train_mnist.py", "--eval", "{path}"]),
    ("unknown config field", ["train_mnist.py", "--resume", "{path}"]),
    ("embed_dim=4096, small arrays", ["train_mnist.py", "--predict", "digit.png",
                                      "--checkpoint", "{path}"]),
    ("NaN weight", ["train_mnist.py", "--predict", "digit.png", "--checkpoint", "{path}"]),
    ("huge .npy header", ["-m", "tinyvit.convert", "{path}", "{path}.out.npz"]),
])
def test_commands_report_a_bad_file_in_one_line(tmp_path, kind, args):
    path, expected = bad_file(tmp_path, kind)
    code, err = run_command(*[arg.format(path=path) for arg in args])
    prefix = "error: " if "tinyvit.convert" in args else "train_mnist.py: error: "
    assert code == 1 and "Traceback" not in err and err.count("\n") == 1
    assert_message(err.removeprefix(prefix).rstrip("\n"), expected)


@pytest.mark.parametrize("kind", ["wrong-typed field", "missing weight"])
def test_init_reports_a_bad_file_in_one_line(stripes, tmp_path, capsys, kind):
    path, expected = bad_file(tmp_path, kind)
    code = train_mnist.main(["--data-dir", str(stripes), "--out", str(tmp_path / "run"),
                             "--init", str(path), "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert_message(err.removeprefix("train_mnist.py: error: ").rstrip("\n"), expected)
    assert convert_main([str(path), str(tmp_path / "out.npz")]) == 1
    assert_message(capsys.readouterr().err.removeprefix("error: ").rstrip("\n"), expected)
