"""Fine-tuning and time budgets: runs that start from other weights (a zero head
for new classes, position embeddings resized to a new image size, the images
resized to it, a frozen backbone for a linear probe), and runs that plan their
epochs to end within a budget. On the synthetic stripes of ``conftest``.
"""

import dataclasses
import json
import time

import numpy as np
import pytest
from PIL import Image

import train_mnist
from conftest import stripe_images, tiny_config
from tinyvit import backend as B
from tinyvit.models import ViT
from tinyvit.nn.functional import softmax
from tinyvit.nn.resample import interpolation_matrix, resize_images
from tinyvit.train import TrainConfig, build_model, fit, load_trained, predict
from tinyvit.weights import PretrainedError, save_model
from tinyvit.weights.checkpoint import load_checkpoint

# --------------------------------------------------------------------------- resizing images


def test_linear_interpolation_matrix_rows_and_identity(backend):
    W = B.to_host(interpolation_matrix(28, 42, "linear"))
    assert W.shape == (42, 28)
    np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    assert ((W > 0).sum(axis=1) <= 2).all()  # two taps at most
    np.testing.assert_array_equal(B.to_host(interpolation_matrix(7, 7, "linear")), np.eye(7))


def test_resize_keeps_a_linear_ramp_linear_inside(backend):
    """Linear interpolation reproduces a linear function exactly, away from the
    clamped border: at output pixel o the value is the input coordinate x(o)."""
    ramp = np.arange(28.0)[None, None, None, :].repeat(28, axis=2)  # (1, 1, 28, 28): x
    out = B.to_host(resize_images(B.to_device(ramp), 42))[0, 0, 0]
    x = (np.arange(42) + 0.5) * 28 / 42 - 0.5
    inside = (x >= 0) & (x <= 27)
    np.testing.assert_allclose(out[inside], x[inside], rtol=0, atol=1e-12)


def test_resize_matches_torch_bilinear(backend):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).random((3, 2, 28, 30))
    for size in (42, 14, 31):
        ours = B.to_host(resize_images(B.to_device(x), size))
        theirs = torch.nn.functional.interpolate(torch.from_numpy(x), size=(size, size),
                                                 mode="bilinear", align_corners=False)
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- fine-tuning


@pytest.fixture
def pretrained_run(stripes, tmp_path):
    """A finished tiny run on the stripes, at 28x28 with patch 7 (a 4x4 grid)."""
    fit(tiny_config(stripes, tmp_path / "pre", epochs=2))
    return tmp_path / "pre"


def test_init_resizes_the_position_embeddings_and_keeps_the_head(stripes, pretrained_run):
    config = tiny_config(stripes, pretrained_run.parent / "ft", init=str(pretrained_run),
                         model_overrides={"image_size": 42})
    model, notes = build_model(config)
    source, _, _ = load_checkpoint(pretrained_run / "best.npz")
    state = model.state_dict()
    assert model.config.image_size == 42 and state["pos_embed"].shape == (1, 37, 16)
    np.testing.assert_array_equal(state["head.weight"], source["head.weight"])
    key = "blocks.0.mlp.fc1.weight"
    np.testing.assert_array_equal(state[key], source[key])
    assert any("pos_embed resized from 4x4 to 6x6" in line for line in notes)
    assert notes[0] == f"{pretrained_run / 'best.npz'}: tinyvit training checkpoint"


def test_reset_head_or_new_classes_start_from_a_zero_head(stripes, pretrained_run, tmp_path):
    reset = tiny_config(stripes, tmp_path / "a", init=str(pretrained_run), reset_head=True)
    model, _ = build_model(reset)
    assert not model.state_dict()["head.weight"].any() and not model.state_dict()["head.bias"].any()
    images = B.to_device(np.random.default_rng(0).standard_normal((3, 1, 28, 28), np.float32))
    probabilities = B.to_host(softmax(model.eval().forward(images)))
    assert (probabilities == np.float32(0.1)).all()  # uniform over the 10 classes at step 0
    # a file whose head has another class count: the run's 10 classes get a zero head
    small = build_model(tiny_config(stripes, tmp_path / "b"))[0]
    small.head.weight.data = small.head.weight.data[:4]
    small.head.bias.data = small.head.bias.data[:4]
    small.config.num_classes = 4
    save_model(small, tmp_path / "four.npz")
    config = tiny_config(stripes, tmp_path / "c", init=str(tmp_path / "four.npz"))
    model, notes = build_model(config)
    assert model.head.weight.shape == (10, 16) and not B.to_host(model.head.weight.data).any()
    assert "head set to zero (head='zero')" in notes


def test_fine_tuning_at_a_higher_resolution_trains_and_is_recorded(stripes, pretrained_run,
                                                                   tmp_path):
    out = tmp_path / "ft"
    history = fit(tiny_config(stripes, out, init=str(pretrained_run), epochs=5,
                              model_overrides={"image_size": 42}))
    # at 42x42 each 7x7 patch sees another part of the stripes than at 28x28: it learns anew
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["test_acc"] >= 0.7
    (pretrained_run / "best.npz").rename(pretrained_run / "moved.npz")  # not needed any more
    model, config = load_trained(out / "best.npz")
    assert model.config.image_size == 42 and config.init == str(pretrained_run)
    _, _, meta = load_checkpoint(out / "last.npz")
    assert meta["init"][0] == f"{pretrained_run / 'best.npz'}: tinyvit training checkpoint"
    Image.fromarray(stripe_images([4], seed=5)[0]).save(tmp_path / "four.png")
    top, changes = predict(model, config, tmp_path / "four.png")
    assert changes == ["28x28 gray", "resized to 42x42"]
    assert top[0][0] == "4" and len(top) == 3
    assert top[0][1] >= top[1][1] >= top[2][1]


def test_freeze_backbone_trains_the_head_alone(stripes, pretrained_run, tmp_path):
    out = tmp_path / "probe"
    fit(tiny_config(stripes, out, init=str(pretrained_run), freeze_backbone=True, epochs=1,
                    weight_decay=0.5))
    before, _, _ = load_checkpoint(pretrained_run / "best.npz")
    after, _, _ = load_checkpoint(out / "last.npz")
    changed = sorted(k for k in before if not np.array_equal(before[k], after[k]))
    assert changed == ["head.bias", "head.weight"]


def test_init_of_weights_for_other_channels_names_the_dataset(stripes, tmp_path):
    small = build_model(tiny_config(stripes, tmp_path / "a"))[0]
    save_model(ViT(dataclasses.replace(small.config, in_channels=3)), tmp_path / "rgb.npz")
    with pytest.raises(PretrainedError) as raised:
        build_model(tiny_config(stripes, tmp_path / "b", init=str(tmp_path / "rgb.npz")))
    assert str(raised.value) == (f"{tmp_path / 'rgb.npz'}: the weights take images of 3 "
                                 "channel(s), but mnist's have 1: fine-tune them on a dataset "
                                 "of 3-channel images")


def test_init_that_does_not_exist_is_a_clear_error(stripes, tmp_path, capsys):
    code = train_mnist.main(["--data-dir", str(stripes), "--out", str(tmp_path / "run"),
                             "--init", str(tmp_path / "nothing.npz")])
    assert code == 1
    assert "nothing.npz" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- budgets


def test_budget_plans_the_epochs_after_the_first(stripes, tmp_path, monkeypatch):
    """With a first epoch of 20 s and a test evaluation of 5 s on a fake clock, a
    2-minute budget leaves 120 - 25 - 5 = 90 s: 3 more epochs of 25 s, 4 in all."""
    clock = FakeClock(monkeypatch)
    config = tiny_config(stripes, tmp_path / "run", epochs=50, budget=2.0)
    clock.step_seconds, clock.eval_seconds = 2.0, 5.0  # 10 steps of 2 s per epoch
    history = fit(config)
    assert len(history) == 4
    _, _, meta = load_checkpoint(tmp_path / "run" / "last.npz")
    assert meta["plan"]["epochs"] == 4 and meta["config"]["epochs"] == 4
    assert meta["plan"]["first_epoch_s"] == pytest.approx(20.0)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [row["test_acc"] is not None for row in metrics["epochs"]] == [True] * 4


def test_a_budgeted_run_that_slows_down_ends_earlier(stripes, tmp_path, monkeypatch):
    """Planned as above (4 epochs), but from the second epoch on a step takes 4 s: the
    second epoch ends at 25 + 40 = 65 s, and another epoch of 40 s and the final test
    (5 s) would end at 110 s; one more would not fit. So 3 epochs in all."""
    clock = FakeClock(monkeypatch)
    clock.step_seconds, clock.eval_seconds = 2.0, 5.0
    clock.slower_after = 10, 4.0  # after the first 10 steps, 4 s per step
    history = fit(tiny_config(stripes, tmp_path / "run", epochs=50, budget=2.0))
    assert len(history) == 3 and history[-1]["test_acc"] is not None
    _, _, meta = load_checkpoint(tmp_path / "run" / "last.npz")
    assert meta["plan"]["epochs"] == 3 and meta["config"]["epochs"] == 3
    assert clock.now <= 120


def test_a_resumed_budgeted_run_keeps_its_plan(stripes, tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    clock.step_seconds, clock.eval_seconds = 2.0, 5.0
    config = tiny_config(stripes, tmp_path / "run", epochs=50, budget=2.0)
    with pytest.raises(KeyboardInterrupt):
        fit(config, stop_after_steps=15)  # in the second epoch, after the plan
    clock.now += 1000.0  # time between the two processes does not count
    history = fit(None, resume=tmp_path / "run" / "last.npz")
    assert len(history) == 4  # the plan of the first process, not a new one


class FakeClock:
    """``time.perf_counter`` of tinyvit.train.loop, advanced by each training step and
    each evaluation by set amounts."""

    def __init__(self, monkeypatch):
        import tinyvit.train.loop as train

        self.now, self.step_seconds, self.eval_seconds = 0.0, 0.0, 0.0
        self.steps, self.slower_after = 0, None  # (steps, seconds per step after them)
        monkeypatch.setattr(train.time, "perf_counter", lambda: self.now)
        step, evaluate = train.Trainer.step, train.evaluate

        def timed_step(trainer, *args):
            self.steps += 1
            slower = self.slower_after and self.steps > self.slower_after[0]
            self.now += self.slower_after[1] if slower else self.step_seconds
            return step(trainer, *args)

        def timed_evaluate(*args, **kwargs):
            self.now += self.eval_seconds
            return evaluate(*args, **kwargs)

        monkeypatch.setattr(train.Trainer, "step", timed_step)
        monkeypatch.setattr(train, "evaluate", timed_evaluate)


def test_budget_and_epochs_are_checked():
    with pytest.raises(ValueError, match="budget must be at least 0, got -1"):
        TrainConfig(budget=-1)
    assert time.perf_counter  # the real clock is left alone outside FakeClock
