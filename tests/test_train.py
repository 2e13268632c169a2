"""Training end to end: the loop learns, a resumed run equals an uninterrupted one,
checkpoints round-trip, and the command line trains, evaluates and predicts.

Most tests use a small synthetic MNIST-like dataset written as real IDX files:
class k is a pattern of bright stripes repeated in every patch, on noise, so a
tiny ViT learns it in a few steps. One smoke test uses the real MNIST files when present.
"""

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import train_mnist
from conftest import (
    TINY_MODEL,
    stripe_images,
    tiny_config,
)
from tinyvit import backend as B
from tinyvit.data import DatasetError
from tinyvit.fast import blocks, cpu_numba, mkl
from tinyvit.models import ViT
from tinyvit.train import TrainConfig, fit, load_trained, predict
from tinyvit.train.parallel import auto_workers
from tinyvit.weights.checkpoint import CheckpointError, load_checkpoint

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def final_weights(out_dir):
    model_state, optim_state, meta = load_checkpoint(Path(out_dir) / "last.npz")
    return model_state, optim_state, meta


def test_training_learns_the_synthetic_task(stripes, tmp_path):
    history = fit(tiny_config(stripes, tmp_path / "run", epochs=5))
    assert [row["epoch"] for row in history] == [1, 2, 3, 4, 5]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["test_acc"] >= 0.9
    out = tmp_path / "run"
    for name in ("last.npz", "best.npz", "metrics.json", "curves.png", "confusion.png"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["epochs"]) == 5 and len(metrics["confusion_matrix"]) == 10
    assert sum(map(sum, metrics["confusion_matrix"])) == 100
    with Image.open(out / "curves.png") as image:
        assert image.mode == "RGB" and image.width > 400


def test_eval_every_evaluates_those_epochs_and_the_last(stripes, tmp_path, capsys):
    history = fit(tiny_config(stripes, tmp_path / "run", epochs=5, eval_every=2))
    evaluated = [row["epoch"] for row in history if row["test_acc"] is not None]
    assert evaluated == [2, 4, 5]
    assert all(row["test_loss"] is None for row in history if row["epoch"] in (1, 3))
    assert "epoch 1: train loss" in capsys.readouterr().out
    _, _, best = load_checkpoint(tmp_path / "run" / "best.npz")
    best_row = max((row for row in history if row["test_acc"] is not None),
                   key=lambda row: row["test_acc"])
    assert best["epoch"] == best_row["epoch"]  # saved as that epoch ended
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["epochs"][0]["test_acc"] is None
            and sum(map(sum, metrics["confusion_matrix"])) == 100)


# stop after step 4 (mid-epoch 1), 10 (end of epoch 1), 15 (mid-epoch 2);
# with 2 worker processes too
@pytest.mark.parametrize("stop_after, workers", [(4, 1), (10, 1), (15, 1), (4, 2)])
def test_resumed_run_ends_with_the_same_weights(stripes, tmp_path, stop_after, workers):
    """10 steps per epoch; dropout on, so the seeded masks must line up too."""
    config = dict(model_overrides={**TINY_MODEL, "dropout": 0.1}, max_shift=2, mixup=0.4,
                  workers=workers)
    fit(tiny_config(stripes, tmp_path / "straight", **config))
    with pytest.raises(KeyboardInterrupt):
        fit(tiny_config(stripes, tmp_path / "resumed", **config), stop_after_steps=stop_after)
    _, _, meta = final_weights(tmp_path / "resumed")
    assert meta["global_step"] == stop_after
    fit(None, resume=tmp_path / "resumed" / "last.npz")
    straight, straight_optim, straight_meta = final_weights(tmp_path / "straight")
    resumed, resumed_optim, resumed_meta = final_weights(tmp_path / "resumed")
    for key in straight:
        np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)
    for key in straight_optim:
        np.testing.assert_array_equal(resumed_optim[key], straight_optim[key], err_msg=key)
    for a, b in zip(straight_meta["history"], resumed_meta["history"]):
        assert {k: v for k, v in a.items() if k not in ("elapsed_s", "images_per_s")} == {
            k: v for k, v in b.items() if k not in ("elapsed_s", "images_per_s")
        }


def test_a_killed_worker_saves_the_steps_before_and_the_run_resumes_to_the_same_weights(
        stripes, tmp_path, monkeypatch):
    """A worker killed (as by the out-of-memory killer) in the 5th step: that step did not
    happen, the 4 before are saved, one error says so, and the resumed run ends as one
    that was never stopped."""
    from tinyvit.train.parallel import DataParallel, WorkerDied

    config = dict(model_overrides=TINY_MODEL, workers=2)
    fit(tiny_config(stripes, tmp_path / "straight", **config))
    calls, run = [], DataParallel._run

    def killing(self, mode, x, seed=0):
        calls.append(mode)
        if len(calls) == 5:
            self.processes[1].kill()
        return run(self, mode, x, seed)

    monkeypatch.setattr(DataParallel, "_run", killing)
    out = tmp_path / "resumed"
    with pytest.raises(WorkerDied) as died:
        fit(tiny_config(stripes, out, **config))
    assert str(died.value) == (
        "tinyvit worker process exited unexpectedly: tinyvit-worker-1 (exit code -9); saved "
        f"{out / 'last.npz'} (epoch 1, step 4); resume with --resume {out}")
    monkeypatch.setattr(DataParallel, "_run", run)
    weights, optim, meta = final_weights(out)
    assert meta["global_step"] == 4 and int(optim["t"]) == 4
    fit(None, resume=out)
    straight, straight_optim, _ = final_weights(tmp_path / "straight")
    resumed, resumed_optim, _ = final_weights(out)
    for key in straight:
        np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)
    for key in straight_optim:
        np.testing.assert_array_equal(resumed_optim[key], straight_optim[key], err_msg=key)


def test_ctrl_c_during_evaluation_saves_and_resumes(stripes, tmp_path, monkeypatch):
    import tinyvit.train.loop as train

    fit(tiny_config(stripes, tmp_path / "straight"))
    original = train.evaluate

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fit(tiny_config(stripes, tmp_path / "resumed"))
    _, _, meta = final_weights(tmp_path / "resumed")
    assert (meta["epoch"], meta["step"], meta["history"]) == (0, 10, [])  # trained, not evaluated
    monkeypatch.setattr(train, "evaluate", original)
    fit(None, resume=tmp_path / "resumed" / "last.npz")
    straight, _, straight_meta = final_weights(tmp_path / "straight")
    resumed, _, resumed_meta = final_weights(tmp_path / "resumed")
    for key in straight:
        np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)
    assert ([r["test_acc"] for r in resumed_meta["history"]]
            == [r["test_acc"] for r in straight_meta["history"]])


def test_checkpoint_rebuilds_the_model(stripes, tmp_path):
    fit(tiny_config(stripes, tmp_path / "run", epochs=1))
    model, config = load_trained(tmp_path / "run" / "best.npz")
    assert config.model_overrides == TINY_MODEL
    assert model.config.embed_dim == 16 and not model.training
    model_state, _, _ = load_checkpoint(tmp_path / "run" / "best.npz")
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, model_state[key])


def test_a_truncated_or_foreign_checkpoint_is_a_checkpoint_error(stripes, tmp_path):
    fit(tiny_config(stripes, tmp_path / "run", epochs=1))
    whole = (tmp_path / "run" / "best.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])  # a copy that stopped halfway
    with pytest.raises(CheckpointError, match="cut.npz: not a readable .npz checkpoint"):
        load_checkpoint(tmp_path / "cut.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))  # a .npz, but not one tinyvit wrote
    with pytest.raises(CheckpointError, match="other.npz: not a tinyvit training checkpoint"):
        load_checkpoint(tmp_path / "other.npz")


def draw_stripes(path, label, inverted=False, size=112):
    """A picture as a user might draw it: larger than 28x28, RGB, maybe dark on white."""
    image = stripe_images([label], seed=5)[0]
    if inverted:
        image = 255 - image
    Image.fromarray(image).resize((size, size), Image.NEAREST).convert("RGB").save(path)


def test_cli_trains_evaluates_and_predicts(stripes, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "5", "--batch-size", "32",
            "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--lr", "1e-2",
            "--warmup", "0.5", "--shift", "0"]
    assert train_mnist.main(args) == 0
    assert (out / "best.npz").is_file() and (out / "curves.png").is_file()
    _, _, meta = load_checkpoint(out / "best.npz")
    assert meta["config"]["workers"] == auto_workers()  # one per core by default on NumPy

    capsys.readouterr()
    assert train_mnist.main(["--eval", str(out / "best.npz"), "--data-dir", str(stripes)]) == 0
    said = capsys.readouterr().out
    accuracy = float(said.split("test accuracy ")[1].split(",")[0])
    assert said.startswith(f"{out / 'best.npz'}: ") and said.endswith(" test images)\n")
    assert accuracy >= 0.9

    for inverted in (False, True):
        picture = tmp_path / f"three_{inverted}.png"
        draw_stripes(picture, 3, inverted=inverted)
        assert train_mnist.main(["--predict", str(picture),
                                 "--checkpoint", str(out / "best.npz")]) == 0
        header, *lines = capsys.readouterr().out.splitlines()
        inversion = (", inverted to light strokes on black (it had dark strokes on light "
                     "paper, 0.87 of white)") if inverted else ""
        assert header == (f"{picture} (112x112 RGB, read as gray{inversion}, resized to "
                          f"28x28), the top 3 classes of mnist according to {out / 'best.npz'}:")
        assert len(lines) == 3
        assert lines[0].startswith("  3: ")
        probabilities = [float(line.split(": ")[1]) for line in lines]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1.0


@pytest.mark.parametrize("flags, message", [  # the fields the flags given set, named as those
    (["--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["--eval-every", "0"], "--eval-every must be at least 1, got 0"),
    (["--batch-size", "-1"], "--batch-size must be at least 1, got -1"),
    (["--lr", "-1"], "--lr must be positive, got -1.0"),
    (["--patch-size", "5"], "image_size 28 is not divisible by --patch-size 5"),
    (["--dataset", "cifar10", "--num-heads", "0"], "--num-heads must be at least 1, got 0"),
    (["--seed", "-1"], "--seed must be at least 0, got -1"),
    (["--mixup", "inf"], "--mixup must be a finite number, got inf"),
    (["--warmup", "nan"], "--warmup must be a finite number, got nan"),
    (["--epochs", "2", "--warmup", "2.5"], "--warmup must be at most --epochs (the learning "
                                           "rate rises to lr over the warmup), got "
                                           "--warmup 2.5 and --epochs 2"),
    (["--reset-head"], "--reset-head: a zero head for the weights of init, but no init is given "
                       "(--reset-head goes with --init)"),
    (["--budget", "5", "--epochs", "2"],
     "--budget plans the epochs after the first: it would ignore --epochs; give one"),
    (["--init", "runs/x", "--model", "cifar10"],
     "--init takes the model of its weights: it would ignore --model"),
])
def test_cli_rejects_a_flag_out_of_range_in_one_line(tmp_path, capsys, flags, message):
    out = tmp_path / "cli"
    assert train_mnist.main(["--out", str(out), *flags]) == 2
    assert capsys.readouterr().err == f"train_mnist.py: error: {message}\n"
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--resume", "run", "--epochs", "30", "--out", "x", "--lr", "1"],
     "--resume takes every setting from the checkpoint, and --out and --data-dir: it would "
     "ignore --epochs, --lr; to change them, train a new run from its weights: --init "
     "run/last.npz with the flags"),
    (["--resume", "run/last.npz", "--epochs", "30"],
     "--resume takes every setting from the checkpoint, and --out and --data-dir: it would "
     "ignore --epochs; to change them, train a new run from its weights: --init run/last.npz "
     "with the flags"),
    (["--eval", "best.npz", "--data-dir", "d", "--lr", "1"],
     "--eval takes only --data-dir, --test-subset and --backend: it would ignore --lr"),
    (["--predict", "a.png", "--checkpoint", "best.npz", "--seed", "2"],
     "--predict takes only --checkpoint and --backend: it would ignore --seed"),
    (["--eval", "best.npz", "--predict", "a.png"],
     "--eval and --predict are separate modes: give one"),
    (["--checkpoint", "best.npz"],
     "--predict IMAGE and --checkpoint CKPT go together: give both or neither"),
    (["--predict", "a.png"],
     "--predict IMAGE and --checkpoint CKPT go together: give both or neither"),
])
def test_cli_rejects_flags_its_mode_would_ignore(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()  # the run folder --resume names
    assert train_mnist.main(args) == 2
    assert capsys.readouterr().err == f"train_mnist.py: error: {message}\n"
    assert list(tmp_path.rglob("*")) == [tmp_path / "run"]  # nothing read, nothing written


@pytest.mark.parametrize("make, out, message", [
    (lambda d: (d / "afile").write_text("x"), "afile",
     "out_dir: expected a folder, but {d}/afile is a file"),
    (lambda d: (d / "afile").write_text("x"), "afile/run",
     "out_dir: expected a folder, but {d}/afile/run has {d}/afile, which is a file"),
    (lambda d: (d / "link").symlink_to(d / "nowhere"), "link",
     "out_dir: expected a folder, but {d}/link is a link to {d}/nowhere, which does not exist"),
])
def test_an_out_folder_that_cannot_be_one_is_named_in_one_line(tmp_path, capsys, make, out,
                                                               message):
    make(tmp_path)
    assert train_mnist.main(["--out", str(tmp_path / out)]) == 2
    assert capsys.readouterr().err == (
        f"train_mnist.py: error: {message.format(d=tmp_path)}\n")


def test_init_takes_the_files_model_not_the_recipes():
    """The fashion-mnist recipe's patch 4 and 2 heads describe a model trained from
    scratch; with --init the file's architecture stands, and flags given still count."""
    args, _ = train_mnist.parse_args(["--dataset", "fashion-mnist"])
    assert train_mnist.make_config(args).model_overrides == {"patch_size": 4, "num_heads": 2,
                                                             "pool": "mean"}
    args, _ = train_mnist.parse_args(["--dataset", "fashion-mnist", "--init", "runs/mnist",
                                      "--image-size", "42"])
    assert train_mnist.make_config(args).model_overrides == {"image_size": 42}


def test_a_home_folder_in_the_out_folder_is_expanded_as_a_shell_would(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert TrainConfig(out_dir="~/runs/a").out_dir == f"{tmp_path}/runs/a"


def test_epochs_given_beat_a_recipes_budget():
    args, _ = train_mnist.parse_args(["--recipe", "mnist-hybrid", "--epochs", "3"])
    config = train_mnist.make_config(args)
    assert (config.epochs, config.budget) == (3, 0)
    args, _ = train_mnist.parse_args(["--recipe", "mnist-hybrid"])
    assert train_mnist.make_config(args).budget == 10


def test_a_warmup_longer_than_the_run_is_refused_only_where_the_flag_gives_it():
    """A recipe's warmup stays under fewer --epochs (one epoch that times a recipe), a
    budget's epochs are planned after the first, and TrainConfig takes it: the
    checkpoints of a run trained so still load."""
    args, _ = train_mnist.parse_args(["--recipe", "cifar10", "--epochs", "1"])
    assert train_mnist.make_config(args).warmup_epochs == 2
    args, _ = train_mnist.parse_args(["--recipe", "mnist-hybrid", "--warmup", "30"])
    assert train_mnist.make_config(args).warmup_epochs == 30
    assert TrainConfig(epochs=1, warmup_epochs=3).warmup_epochs == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_a_folder_this_user_may_not_write_is_one_line(stripes, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert train_mnist.main(["--data-dir", str(stripes), "--out", str(locked / "run"),
                                 "--epochs", "1", "--workers", "1"]) == 1
    finally:
        locked.chmod(0o700)
    err = capsys.readouterr().err
    assert err.startswith("train_mnist.py: error: [Errno 13] Permission denied") and \
        err.count("\n") == 1


@pytest.mark.parametrize("save, name, message", [
    ("save_model", "model.npz",
     "not a tinyvit training checkpoint, expected a meta entry (the run: its dataset and where "
     "it stands), got a tinyvit model file (weights and the model's config, no run: train from "
     "it with --init)"),
    ("save_pretrained", "model.safetensors",
     "weights alone, not a training checkpoint: expected a run's best.npz or last.npz, which "
     "names its dataset (train from these weights with --init)"),
])
def test_eval_of_weights_alone_says_it_needs_a_run(tmp_path, capsys, save, name, message):
    from tinyvit import weights

    if save == "save_pretrained":
        pytest.importorskip("safetensors")
    path = tmp_path / name
    getattr(weights, save)(ViT(depth=1), path)
    assert train_mnist.main(["--eval", str(path)]) == 1
    assert capsys.readouterr().err == f"train_mnist.py: error: {path}: {message}\n"


def test_cli_mode_is_decided_once_so_an_empty_resume_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_mnist.main(["--resume", ""]) == 1
    assert capsys.readouterr().err == "train_mnist.py: error: no such checkpoint file: last.npz\n"
    assert list(tmp_path.iterdir()) == []  # no fresh run started in runs/


GARBAGE = ("garbage.npz: expected a .npz file (a zip archive), got a file that does not start "
           "with the zip signature")


@pytest.mark.parametrize("args, message", [
    (["--eval", "missing.npz"], "no such checkpoint file: missing.npz"),
    (["--eval", "garbage.npz"], GARBAGE),
    (["--predict", "a.png", "--checkpoint", "garbage.npz"], GARBAGE),
    (["--data-dir", "nowhere", "--out", "run"],  # as the run keeps it: from any folder
     "mnist train: the data folder {tmp_path}/nowhere does not exist"),
])
def test_cli_reports_a_bad_file_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.npz").write_text("not a checkpoint")
    assert train_mnist.main(args) == 1
    message = message.format(tmp_path=tmp_path)
    assert capsys.readouterr().err == f"train_mnist.py: error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.npz"]  # nothing written


def test_cifar10_gpu_recipe_is_the_one_measured():
    args, _ = train_mnist.parse_args(["--recipe", "cifar10-gpu"])
    c = train_mnist.make_config(args)
    assert (c.dataset, c.backend, c.workers, c.epochs, c.batch_size, c.lr, c.warmup_epochs) == (
        "cifar10", "cupy", 1, 125, 256, 1e-3, 5)
    assert (c.max_shift, c.flip, c.erasing, c.mixup, c.cutmix, c.label_smoothing) == (
        4, True, 0.25, 0.8, 1.0, 0.1)
    assert (c.out_dir, c.eval_every) == ("runs/cifar10-gpu", 10)
    model = ViT(c.model_config())  # on the test's backend: the config only names CuPy
    assert (model.config.embed_dim, model.config.depth, model.config.num_heads,
            model.config.pool) == (256, 7, 4, "mean")
    assert model.num_parameters() == 3_722_250


@pytest.mark.parametrize("args", [["--backend", "cupy"], ["--recipe", "cifar10-gpu"]])
def test_cli_reports_a_missing_cupy_in_one_line(tmp_path, monkeypatch, capsys, args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError, GPU or not
    assert train_mnist.main(args + ["--data-dir", "nowhere"]) == 1
    assert capsys.readouterr().err == (
        "train_mnist.py: error: backend 'cupy' needs CuPy: "
        "install it with `pip install tinyvit[gpu]` "
        "(or the cupy-cudaXXx wheel matching your CUDA)\n")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_runs_backend_wins_over_tinyvit_backend_which_eval_reads_in_any_case(
        stripes, tmp_path, monkeypatch, capsys):
    """TINYVIT_BACKEND is read where the backend is first needed: a run sets its config's
    (--backend, the recipe's, a resumed run's checkpoint's) before that, --eval and
    --predict run on --backend's, else on the variable's, and a bad value is one line
    before any work."""
    monkeypatch.setattr(B, "_active", None)  # as imported: no backend chosen yet
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")
    out = tmp_path / "run"
    assert train_mnist.main(["--data-dir", str(stripes), "--out", str(out), "--epochs", "1",
                             "--backend", "numpy", "--workers", "1", "--embed-dim", "16",
                             "--depth", "1", "--num-heads", "2", "--batch-size", "32"]) == 0
    capsys.readouterr()
    assert train_mnist.main(["--eval", str(out / "best.npz"), "--data-dir", str(stripes)]) == 2
    assert capsys.readouterr().err == ("train_mnist.py: error: TINYVIT_BACKEND: expected numpy "
                                       "or cupy (in any case), got 'abc'\n")
    monkeypatch.setattr(B, "_active", None)
    assert train_mnist.main(["--eval", str(out / "best.npz"), "--data-dir", str(stripes),
                             "--backend", "numpy"]) == 0  # the flag wins over the variable
    assert B.get_backend() == "numpy"
    monkeypatch.setattr(B, "_active", None)
    monkeypatch.setenv("TINYVIT_BACKEND", "NumPy")
    assert train_mnist.main(["--eval", str(out / "best.npz"), "--data-dir", str(stripes)]) == 0
    assert B.get_backend() == "numpy"
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")  # a resumed run takes its checkpoint's backend
    last = (out / "last.npz").read_bytes()
    assert train_mnist.main(["--resume", str(out)]) == 0
    assert capsys.readouterr().out.endswith(
        f"; {out / 'best.npz'}, {out / 'last.npz'} hold the run as it ended\n")
    assert (out / "last.npz").read_bytes() == last


def test_a_new_run_without_backend_or_recipe_takes_tinyvit_backend(monkeypatch):
    """The variable names the backend where neither --backend nor the recipe does."""
    monkeypatch.setenv("TINYVIT_BACKEND", "NumPy")
    assert train_mnist.make_config(train_mnist.parse_args([])[0]).backend == "numpy"
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")
    with pytest.raises(ValueError, match="^TINYVIT_BACKEND: expected numpy or cupy"):
        train_mnist.make_config(train_mnist.parse_args([])[0])
    assert train_mnist.make_config(train_mnist.parse_args(["--backend", "numpy"])[0]
                                   ).backend == "numpy"
    monkeypatch.setenv("TINYVIT_BACKEND", "numpy")  # a recipe's backend wins
    assert train_mnist.make_config(train_mnist.parse_args(["--recipe", "cifar10-gpu"])[0]
                                   ).backend == "cupy"


def test_predict_rejects_a_file_that_is_not_an_image(stripes, tmp_path, capsys):
    fit(tiny_config(stripes, tmp_path / "run", epochs=1))
    model, config = load_trained(tmp_path / "run" / "best.npz")
    not_image = tmp_path / "notes.png"
    not_image.write_text("hello")
    with pytest.raises(DatasetError, match="cannot read image .*notes.png"):
        predict(model, config, not_image)
    best = (tmp_path / "run" / "best.npz").read_bytes()
    assert train_mnist.main(["--predict", str(not_image),
                             "--checkpoint", str(tmp_path / "run" / "best.npz")]) == 1
    assert "train_mnist.py: error: cannot read image" in capsys.readouterr().err
    assert (tmp_path / "run" / "best.npz").read_bytes() == best


def test_ctrl_c_on_a_full_disk_keeps_the_last_checkpoint_and_says_how_to_resume(
        stripes, tmp_path, monkeypatch, capsys):
    """Ctrl-C in epoch 2, whose last.npz meets a full disk: epoch 1's last.npz is
    intact, and the one line says so and how to resume."""
    import errno

    import tinyvit.files as files
    import tinyvit.train.loop as train

    original, replace, calls = train.Trainer.step, files.os.replace, {"n": 0}

    def interrupted_step(self, *args):
        calls["n"] += 1
        if calls["n"] == 13:  # epoch 2, step 3 (10 steps an epoch)
            raise KeyboardInterrupt
        return original(self, *args)

    def full_disk_once_interrupted(source, target):
        if calls["n"] >= 13:
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(train.Trainer, "step", interrupted_step)
    monkeypatch.setattr(files.os, "replace", full_disk_once_interrupted)
    out = tmp_path / "cli"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "2", "--embed-dim", "16",
            "--depth", "1", "--num-heads", "2", "--batch-size", "32", "--workers", "1"]
    capsys.readouterr()
    assert train_mnist.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"train_mnist.py: error: no space left on the device for "
                          f"{out / 'last.npz'}: it needs about ")
    assert err.endswith(f"{out / 'last.npz'} and the other files written before are intact: "
                        f"free some space, then continue with --resume {out}")
    _, _, meta = load_checkpoint(out / "last.npz")
    assert (meta["epoch"], meta["step"]) == (1, 0)


def test_ctrl_c_in_the_cli_saves_and_exits_130(stripes, tmp_path, monkeypatch):
    import tinyvit.train.loop as train

    original = train.Trainer.step
    calls = {"n": 0}

    def interrupted_step(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, *args)

    monkeypatch.setattr(train.Trainer, "step", interrupted_step)
    out = tmp_path / "cli"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "1", "--embed-dim", "16",
            "--depth", "1", "--num-heads", "2", "--batch-size", "32"]
    assert train_mnist.main(args) == 130
    _, _, meta = load_checkpoint(out / "last.npz")
    assert (meta["epoch"], meta["step"]) == (0, 2)
    monkeypatch.setattr(train.Trainer, "step", original)
    assert train_mnist.main(["--resume", str(out)]) == 0
    _, _, meta = load_checkpoint(out / "last.npz")
    assert (meta["epoch"], meta["global_step"]) == (1, 10)


def test_a_diverging_run_stops_and_keeps_its_checkpoints(stripes, tmp_path, monkeypatch, capsys):
    """Weights made non-finite after step 3 of epoch 2: step 4's loss names the run's end,
    in one line, though the loop reads losses back only every ``log_every`` steps."""
    import tinyvit.train.loop as train

    original = train.Trainer.step
    calls = {"n": 0}

    def poisoned_step(self, *args):
        result = original(self, *args)
        calls["n"] += 1
        if calls["n"] == 13:  # epoch 2, step 3 of 10
            self.optimizer.data[:] = np.nan
        return result

    monkeypatch.setattr(train.Trainer, "step", poisoned_step)
    out = tmp_path / "cli"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "3", "--embed-dim", "16",
            "--depth", "1", "--num-heads", "2", "--batch-size", "32"]
    capsys.readouterr()
    assert train_mnist.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("train_mnist.py: error: training diverged at epoch 2, step 4 of 10 "
                          "(learning rate ")
    assert "loss nan" in err and "try a lower --lr" in err
    # as epoch 1 ended (best.npz is a copy of that epoch's last.npz)
    for name, position in (("last.npz", (1, 0)), ("best.npz", (1, 0))):
        weights, _, meta = load_checkpoint(out / name)
        assert (meta["epoch"], meta["step"]) == position, name
        assert all(np.isfinite(w).all() for w in weights.values()), name
    assert len(json.loads((out / "metrics.json").read_text())["epochs"]) == 1
    monkeypatch.setattr(train.Trainer, "step", original)
    assert train_mnist.main(["--resume", str(out)]) == 0
    _, _, meta = load_checkpoint(out / "last.npz")
    assert (meta["epoch"], meta["global_step"]) == (3, 30)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_overflowing_run_stops_in_one_line_without_numpy_warnings(stripes, tmp_path, capsys,
                                                                     workers):
    """A learning rate far too high: float32 overflows, and the divergence check says so
    instead of NumPy's RuntimeWarnings (made errors here, so one would fail the run)."""
    args = ["--data-dir", str(stripes), "--out", str(tmp_path), "--epochs", "3", "--embed-dim",
            "16", "--depth", "1", "--num-heads", "2", "--batch-size", "32", "--lr", "1e30",
            "--workers", str(workers)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert train_mnist.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("train_mnist.py: error: training diverged at epoch 1, step ")


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="unknown model preset 'vit_huge'"):
        TrainConfig(model="vit_huge")
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="unknown dataset 'svhn'"):
        TrainConfig(dataset="svhn")
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['dpeth'\]"):
        TrainConfig(model_overrides={"dpeth": 2})
    with pytest.raises(ValueError, match="image_size 32 is not divisible by patch_size 7"):
        TrainConfig(dataset="cifar10", model="mnist")  # the preset's patch 7 on CIFAR-10's 32x32
    with pytest.raises(ValueError, match="min_lr must be at least 0, got -0.1"):
        TrainConfig(min_lr=-0.1)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\), got 1.0"):
        TrainConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"erasing must be in \[0, 1\], got 2"):
        TrainConfig(erasing=2)


@pytest.mark.parametrize("fields, message", [
    ({"data_dir": 3}, "data_dir must be a path (a str), got 3 (int)"),
    ({"out_dir": None}, "out_dir must be a path (a str), got None (NoneType)"),
    ({"model_overrides": None},
     "model_overrides must be a dict of ViTConfig fields, got None (NoneType)"),
    ({"model_overrides": {"stem": [16, 32]}},
     "stem must hold (channels, kernel, stride) triples of positive ints, got [16, 32]"),
    ({"model_overrides": {"stem": [[16, 3.5, 2]]}},
     "stem must hold (channels, kernel, stride) triples of positive ints, got [[16, 3.5, 2]]"),
    ({"backend": "torch"}, "backend must be one of ('numpy', 'cupy'), got 'torch'"),
    ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr must be at most lr (the schedule decays from lr to "
                                   "min_lr), got min_lr 0.01 and lr 0.001"),
])
def test_config_values_of_the_wrong_kind_are_named(fields, message):
    with pytest.raises(ValueError) as raised:
        TrainConfig(**fields)
    assert str(raised.value) == message


def test_a_path_object_is_kept_as_text_for_the_checkpoint(tmp_path):
    config = TrainConfig(data_dir=tmp_path, out_dir=tmp_path / "run")
    assert (config.data_dir, config.out_dir) == (str(tmp_path), str(tmp_path / "run"))


@pytest.mark.skipif(not (SHARED_DATA / "mnist").is_dir(), reason="real MNIST files not present")
def test_smoke_on_real_mnist(tmp_path):
    """A few hundred real images: the loss falls and accuracy ends well above chance."""
    config = TrainConfig(data_dir=str(SHARED_DATA), out_dir=str(tmp_path / "real"), epochs=3,
                         train_subset=4096, test_subset=500, batch_size=64, lr=3e-3,
                         warmup_epochs=0.3, max_shift=0, log_every=16)
    history = fit(config)
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.3
    assert history[-1]["test_acc"] > 0.4  # chance is 0.1; a ViT's first 200 steps are slow
    assert B.get_backend() == "numpy"


@pytest.mark.skipif(not (SHARED_DATA / "cifar-10").is_dir(),
                    reason="real CIFAR-10 files not present")
def test_smoke_on_real_cifar10(tmp_path):
    """A few hundred real CIFAR-10 images through the same trainer, with the CIFAR
    augmentations and mixup/cutmix: it runs end to end and writes everything."""
    config = TrainConfig(dataset="cifar10", model="cifar10", data_dir=str(SHARED_DATA),
                         out_dir=str(tmp_path / "cifar"), epochs=2,
                         train_subset=512, test_subset=200,
                         batch_size=64, eval_batch_size=100, lr=1e-3, warmup_epochs=0.5,
                         max_shift=4, flip=True, erasing=0.25, mixup=0.8, cutmix=1.0,
                         model_overrides={"embed_dim": 48, "depth": 2, "num_heads": 3})
    history = fit(config)
    assert len(history) == 2 and all(np.isfinite(row["train_loss"]) for row in history)
    metrics = json.loads((tmp_path / "cifar" / "metrics.json").read_text())
    assert list(metrics["per_class_accuracy"])[:2] == ["airplane", "automobile"]
    assert (tmp_path / "cifar" / "confusion.png").is_file()


@pytest.mark.parametrize("flags, first_line", [
    ([], "layers: fast kernels of tinyvit.fast.cpu: Linear x"),
    (["--reference"], "layers: reference layers (tinyvit.nn)"),
])
def test_the_trainer_says_which_layers_it_runs(stripes, tmp_path, capsys, flags, first_line):
    """Fast kernels by default, the reference layers with --reference; the first line
    says which, and the run's config records it."""
    out = tmp_path / "run"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "1", "--workers", "1",
            "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--train-subset", "64",
            "--batch-size", "32", *flags]
    capsys.readouterr()
    assert train_mnist.main(args) == 0
    line, second = capsys.readouterr().out.splitlines()[:2]
    assert second.endswith(", 1 process" + (", the kernels on "
                                            f"{blocks.num_threads()} thread(s)" * (not flags)))
    assert line.startswith(first_line)
    compiled = ("; GELU, LayerNorm and the softmax compiled by Numba "
                "(TINYVIT_NUMBA=0: in NumPy blocks)")
    products = "; Linear's products of 2^26 multiply-adds or more by MKL (TINYVIT_MKL=0: NumPy's)"
    assert line.endswith(products) == (not flags and mkl.enabled())
    line = line.removesuffix(products)
    assert line.endswith(compiled) == (not flags and cpu_numba.compiled())
    _, _, meta = load_checkpoint(out / "last.npz")
    assert meta["config"]["tier"] == ("reference" if flags else "fast")


@pytest.mark.parametrize("workers", [1, 2])
def test_more_kernel_threads_than_cores_is_said_on_the_start_line_and_the_run_goes_on(
        stripes, tmp_path, capsys, monkeypatch, workers):
    """Where the kernels run in this process; worker processes take one thread each."""
    cores = blocks.available_cores()
    monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, str(cores + 1))
    args = ["--data-dir", str(stripes), "--out", str(tmp_path / "run"), "--epochs", "1",
            "--workers", str(workers), "--embed-dim", "16", "--depth", "1", "--num-heads", "2",
            "--train-subset", "64", "--batch-size", "32"]
    capsys.readouterr()
    assert train_mnist.main(args) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err.lower()
    assert out.splitlines()[1].endswith(
        f", 2 worker processes of one thread each (TINYVIT_NUM_THREADS={cores + 1} sets one "
        "process's threads: not used here)" if workers > 1 else
        f", 1 process, the kernels on {cores + 1} thread(s) (more than the {cores} CPU cores "
        f"here: the threads take turns, and each kernel is slower than on {cores})")


@pytest.mark.parametrize("workers, mpi, expected", [
    (2, None, "2 worker processes of one thread each"),
    (1, 3, "3 processes (MPI), the kernels on 2 thread(s) each"),
    (9, None, "9 worker processes of one thread each, more than the 4 CPU cores here: they "
              "take turns, and each step is slower than with --workers 4"),
])
def test_the_start_says_how_many_processes_and_threads_a_step_runs_on(monkeypatch, workers,
                                                                      mpi, expected):
    from types import SimpleNamespace

    from tinyvit.train import loop
    monkeypatch.setattr(loop, "available_cores", lambda: 4)
    monkeypatch.setattr(loop, "num_threads", lambda: 2)
    monkeypatch.delenv(blocks.ENVIRONMENT_VARIABLE, raising=False)
    config = SimpleNamespace(tier="fast", workers=workers)
    comm = None if mpi is None else SimpleNamespace(size=mpi)
    assert loop._processes(config, comm) == expected


@pytest.mark.parametrize("variable, value", [("TINYVIT_NUMBA", "yes"), ("TINYVIT_MKL", "on"),
                                             ("TINYVIT_NUM_THREADS", "abc")])
def test_a_bad_kernel_setting_is_one_line_before_any_work(stripes, tmp_path, capsys,
                                                           monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    args = ["--data-dir", str(stripes), "--out", str(tmp_path / "run"), "--epochs", "1"]
    assert train_mnist.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"train_mnist.py: error: {variable}: expected ") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_full_disk_keeps_the_last_checkpoint_and_says_how_to_resume(stripes, tmp_path,
                                                                     monkeypatch, capsys):
    """Epoch 1's best.npz meets a full disk (ENOSPC): its last.npz, written first, is
    whole; the temporary file is gone; one line names the file, the space it needs
    and --resume, and the run resumes from there."""
    import errno

    import tinyvit.files as files

    out = tmp_path / "run"
    args = ["--data-dir", str(stripes), "--out", str(out), "--epochs", "3", "--workers", "1",
            "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--batch-size", "32",
            "--lr", "1e-2", "--shift", "0"]
    replace, calls = files.os.replace, []

    def full_disk(source, target):
        calls.append(Path(target).name)
        if target.name == "best.npz":
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(files.os, "replace", full_disk)
    capsys.readouterr()
    assert train_mnist.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's
    assert err.startswith(f"train_mnist.py: error: no space left on the device for "
                          f"{out / 'best.npz'}: it needs about ")
    assert err.endswith(f"free some space, then continue with --resume {out}")
    assert calls == ["last.npz", "best.npz"]  # last.npz first
    assert sorted(p.name for p in out.iterdir()) == ["last.npz"]  # no temporary file left
    _, _, meta = load_checkpoint(out / "last.npz")
    assert (meta["epoch"], meta["step"]) == (1, 0)
    monkeypatch.setattr(files.os, "replace", replace)
    assert train_mnist.main(["--resume", str(out)]) == 0
    _, _, meta = load_checkpoint(out / "last.npz")
    assert meta["epoch"] == 3
