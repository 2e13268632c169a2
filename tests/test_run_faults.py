"""Runs you can trust: one run per folder, a resumed run writes where it is told,
a run that cannot train is refused before its first step, and SIGTERM or a kill
leaves a run that resumes. Each case asserts the one line printed, the exit
status, what was kept, and that no process is left.

The tests that signal or kill a run start ``train_stripes.py`` (train_mnist.py on
the synthetic files of conftest's ``stripes``) in a process group of its own.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import train_mnist
from conftest import gone
from tinyvit.backend import default_dtype
from tinyvit.models import ViT, ViTConfig
from tinyvit.train import TrainConfig, fit
from tinyvit.train.lock import RunLock
from tinyvit.train.memory import parameter_count, step_bytes
from tinyvit.train.signals import Stop, Stopped
from tinyvit.train.step import Trainer
from tinyvit.weights import load_checkpoint

TRAIN = Path(__file__).parent / "train_stripes.py"
TINY = ["--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--batch-size", "32",
        "--shift", "0", "--lr", "0.01"]


def cli(stripes, out, *flags):
    return ["--data-dir", str(stripes), "--out", str(out), "--workers", "1", *TINY, *flags]


def start(stripes, out, *flags, workers=1):
    """train_stripes.py in a new process group; stdout unbuffered, read line by line."""
    command = [sys.executable, str(TRAIN), str(stripes), "--out", str(out), *TINY,
               "--workers", str(workers), *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def wait_for(process, text):
    """Read the process's stdout up to a line containing ``text``; returns what was read."""
    seen = ""
    while text not in (line := process.stdout.readline()):
        assert line, f"the run ended before printing {text!r}:\n{seen}{process.stderr.read()}"
        seen += line
    return seen + line


# ---------------------------------------------------------------- one run per folder


def test_a_second_run_into_a_held_folder_stops_at_once_naming_the_holder(stripes, tmp_path,
                                                                        capsys):
    out = tmp_path / "run"
    with RunLock(out):
        assert train_mnist.main(cli(stripes, out, "--epochs", "1")) == 1
        holder = f"process {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}"
        assert capsys.readouterr().err == (
            f"train_mnist.py: error: {out} is in use by another run ({holder}): wait for it to "
            "end, or give this one another --out\n")
        assert [p.name for p in out.iterdir()] == ["run.lock"]  # nothing of the second run
    assert not out.exists()  # released: the lock file goes, and the folder it made


def test_two_runs_into_one_folder_the_second_stops_and_sigterm_saves_the_first(stripes,
                                                                                tmp_path):
    """The first run holds the folder; the second stops in one line naming it; SIGTERM
    stops the first after a step, saves last.npz and says how to resume; resumed,
    the run ends; no process of either is left."""
    out = tmp_path / "run"
    first = start(stripes, out, "--epochs", "30")
    wait_for(first, "epoch 1:")
    second = subprocess.run([sys.executable, str(TRAIN), str(stripes), "--out", str(out), *TINY,
                             "--epochs", "2", "--seed", "2"], capture_output=True, text=True)
    assert second.returncode == 1
    assert re.fullmatch(rf"train_mnist.py: error: {re.escape(str(out))} is in use by another "
                        rf"run \(process {first.pid} on .*\): wait for it to end, or give this "
                        r"one another --out\n", second.stderr), second.stderr
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM
    assert re.search(rf"\nstopped by SIGTERM: saved {re.escape(str(out / 'last.npz'))} "
                     rf"\(epoch \d+, step \d+\); resume with --resume {re.escape(str(out))}\n",
                     stdout), stdout
    assert "Traceback" not in stderr
    assert gone(first.pid, group=True, within=10.0)
    assert sorted(p.name for p in out.iterdir()) == ["best.npz", "curves.png", "last.npz",
                                                     "metrics.json"]
    _, _, meta = load_checkpoint(out / "last.npz")
    assert meta["config"]["seed"] == 0  # the first run's, whole
    assert train_mnist.main(["--resume", str(out)]) == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_saves_last_npz_and_workers_end_quietly(stripes, tmp_path, workers):
    out = tmp_path / "run"
    process = start(stripes, out, "--epochs", "30", workers=workers)
    wait_for(process, "epoch 1:")
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert f"saved {out / 'last.npz'}" in stdout
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert gone(process.pid, group=True, within=10.0)  # the workers too
    _, _, meta = load_checkpoint(out / "last.npz")  # whole
    assert meta["epoch"] >= 1


def test_a_killed_run_leaves_its_lock_which_the_resumed_run_takes_over(stripes, tmp_path,
                                                                       capsys):
    out = tmp_path / "run"
    process = start(stripes, out, "--epochs", "30")
    wait_for(process, "epoch 2:")  # last.npz of epoch 1 is written by then
    process.kill()
    process.wait()
    assert (out / "run.lock").read_text().startswith(f"process {process.pid} on ")
    capsys.readouterr()
    assert train_mnist.main(["--resume", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{out / 'run.lock'}: taken over from a run that ended without "
                               f"releasing it (process {process.pid} on ")
    assert not (out / "run.lock").exists()


# ---------------------------------------------------------------- resuming where told


def stopped_run(stripes, out):
    """A run stopped after 4 steps of its first epoch (as by Ctrl-C)."""
    config = TrainConfig(data_dir=str(stripes), out_dir=str(out), epochs=2, batch_size=32,
                         model_overrides={"embed_dim": 16, "depth": 1, "num_heads": 2},
                         max_shift=0, eval_batch_size=50)
    with pytest.raises(KeyboardInterrupt):
        fit(config, stop_after_steps=4)


def test_a_run_stopped_before_its_first_step_saves_nothing_and_starts_again(stripes, tmp_path,
                                                                             capsys):
    config = TrainConfig(data_dir=str(stripes), out_dir=str(tmp_path / "run"), epochs=1,
                         batch_size=32, max_shift=0, eval_batch_size=50,
                         model_overrides={"embed_dim": 16, "depth": 1, "num_heads": 2})
    with pytest.raises(KeyboardInterrupt):
        fit(config, stop_after_steps=0)  # as by Ctrl-C while the run starts
    assert capsys.readouterr().out.splitlines()[-1] == (
        "interrupted: nothing to save before the first step: start the run again with the "
        "same command")
    assert not (tmp_path / "run" / "last.npz").exists()
    assert len(fit(config)) == 1  # not refused as a folder that holds a run


def test_resume_writes_into_the_folder_it_resumes_not_the_one_saved(stripes, tmp_path):
    stopped_run(stripes, tmp_path / "full")
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "full", moved)  # copied off a full disk, or sent by someone
    assert train_mnist.main(["--resume", str(moved)]) == 0
    assert not (tmp_path / "full").exists()  # the path saved in the checkpoint is not used
    _, _, meta = load_checkpoint(moved / "last.npz")
    assert meta["epoch"] == 2 and meta["config"]["out_dir"] == str(moved)


def test_resume_with_out_continues_into_another_folder_leaving_the_first(stripes, tmp_path,
                                                                         capsys):
    stopped_run(stripes, tmp_path / "a")
    before = (tmp_path / "a" / "last.npz").read_bytes()
    assert train_mnist.main(["--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 0
    assert f"writing into {tmp_path / 'b'}" in capsys.readouterr().out
    assert (tmp_path / "a" / "last.npz").read_bytes() == before
    assert {"last.npz", "best.npz", "metrics.json"} <= {p.name for p in (tmp_path / "b").iterdir()}


def test_a_new_run_into_a_folder_holding_a_run_is_refused_leaving_it_whole(stripes, tmp_path,
                                                                          capsys):
    stopped_run(stripes, tmp_path / "a")
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    capsys.readouterr()
    assert train_mnist.main(cli(stripes, tmp_path / "a", "--epochs", "1")) == 2
    a = tmp_path / "a"
    assert capsys.readouterr().err == (
        f"train_mnist.py: error: {a} holds a run already ({a / 'last.npz'}): continue it with "
        f"--resume {a}, or give another --out (or delete {a} to start over)\n")
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before
    stopped_run(stripes, tmp_path / "b")  # nor does a run continued into it,
    shutil.copy(tmp_path / "b" / "last.npz", a / "other.npz")  # nor one from another file
    before["other.npz"] = (a / "other.npz").read_bytes()
    for args in (["--resume", str(tmp_path / "b"), "--out", str(a)],
                 ["--resume", str(a / "other.npz")]):
        capsys.readouterr()
        assert train_mnist.main(args) == 2
        assert capsys.readouterr().err.startswith(f"train_mnist.py: error: {a} holds a run "
                                                  f"already ({a / 'last.npz'})")
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before
    (a / "last.npz").rename(a / "best.npz")  # a best.npz alone is a run's too
    assert train_mnist.main(cli(stripes, a, "--epochs", "1")) == 2
    assert capsys.readouterr().err.startswith(f"train_mnist.py: error: {a} holds a run "
                                              f"already ({a / 'best.npz'})")


def test_a_folder_whose_last_npz_is_no_checkpoint_says_so_and_keeps_every_file(stripes, tmp_path,
                                                                              capsys):
    """Random bytes named last.npz are no run to continue: the refusal says what the file
    is, as --resume would, and the new run writes nothing over it."""
    a = tmp_path / "a"
    a.mkdir()
    (a / "last.npz").write_bytes(np.random.default_rng(0).bytes(5000))
    (a / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    assert train_mnist.main(cli(stripes, a, "--epochs", "1")) == 2
    assert capsys.readouterr().err == (
        f"train_mnist.py: error: {a / 'last.npz'} is not a tinyvit checkpoint (expected a .npz "
        "file (a zip archive), got a file that does not start with the zip signature): no run "
        "to continue, and a new run would write over it; move it away, or give another --out\n")
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before


@pytest.mark.parametrize("flags, message", [
    (["--out", "{tmp}/afile"], "out_dir: expected a folder, but {tmp}/afile is a file"),
    (["--out", "{tmp}/afile/run"],
     "out_dir: expected a folder, but {tmp}/afile/run has {tmp}/afile, which is a file"),
])
def test_a_resume_into_a_folder_that_cannot_be_one_is_one_line(stripes, tmp_path, capsys,
                                                              flags, message):
    stopped_run(stripes, tmp_path / "a")
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert train_mnist.main(["--resume", str(tmp_path / "a"), *flags]) == 2
    assert capsys.readouterr().err == f"train_mnist.py: error: {message.format(tmp=tmp_path)}\n"


def test_eval_with_a_test_subset_out_of_range_is_one_line(stripes, tmp_path, capsys):
    stopped_run(stripes, tmp_path / "a")
    capsys.readouterr()
    assert train_mnist.main(["--eval", str(tmp_path / "a" / "last.npz"), "--test-subset",
                             "-5"]) == 2
    assert capsys.readouterr().err == ("train_mnist.py: error: test_subset must be at least 0, "
                                       "got -5\n")


def test_a_finished_run_resumed_into_another_folder_says_so_and_the_folder_holds_it(
        stripes, tmp_path, capsys):
    stopped_run(stripes, tmp_path / "a")
    assert train_mnist.main(["--resume", str(tmp_path / "a")]) == 0  # to its end: 2 epochs
    ended = (tmp_path / "a" / "last.npz").read_bytes()
    capsys.readouterr()
    assert train_mnist.main(["--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert (f"resumed from {tmp_path / 'a' / 'last.npz'} (the run had ended, 2 of 2 epochs: "
            f"nothing is left to train, its last weights are evaluated again), writing into "
            f"{tmp_path / 'b'}") in out
    assert (tmp_path / "b" / "last.npz").read_bytes() == ended  # as the report says it wrote
    b = tmp_path / "b"
    assert out.endswith(f"wrote {b / 'metrics.json'}, {b / 'curves.png'}, {b / 'confusion.png'}; "
                        f"{b / 'best.npz'}, {b / 'last.npz'} hold the run as it ended\n")
    for name in ("best.npz", "metrics.json", "curves.png", "confusion.png"):
        assert (b / name).is_file()
    assert train_mnist.main(["--resume", str(b)]) == 0


def test_a_run_resumes_from_another_working_folder_and_from_moved_data(stripes, tmp_path,
                                                                       monkeypatch, capsys):
    """A relative --data-dir is kept as an absolute path; data that moved is named with
    --data-dir beside --resume."""
    run = stripes.parent / "a"
    monkeypatch.chdir(stripes.parent)
    assert train_mnist.main(cli(Path(stripes.name), Path("a"), "--epochs", "1")) == 0
    _, _, meta = load_checkpoint(run / "last.npz")
    assert meta["config"]["data_dir"] == str(stripes)
    monkeypatch.chdir(tmp_path.parent)
    assert train_mnist.main(["--resume", str(run)]) == 0
    moved = shutil.move(stripes, tmp_path / "moved")
    capsys.readouterr()
    assert train_mnist.main(["--resume", str(run)]) == 1  # the data is gone from there
    assert capsys.readouterr().err == (
        f"train_mnist.py: error: {run / 'last.npz'}: the run's data folder {stripes} does not "
        "exist (any more): name where the data is now with --data-dir\n")
    monkeypatch.chdir(moved)  # a relative --data-dir is the working folder's
    assert train_mnist.main(["--resume", str(run), "--data-dir", "."]) == 0
    assert "test_acc" in (run / "metrics.json").read_text()


# ---------------------------------------------------------------- refused before a step


@pytest.mark.parametrize("flags, message", [
    (["--train-subset", "20"],
     "20 training image(s) make no full batch of 32: lower --batch-size to at most 20, or "
     "train on more images (--train-subset)"),
    (["--train-subset", "1"],
     "1 training image(s) make no full batch of 32: lower --batch-size to at most 1, or train "
     "on more images (--train-subset)"),
])
def test_a_run_without_a_full_batch_is_refused_leaving_nothing(stripes, tmp_path, capsys,
                                                               flags, message):
    out = tmp_path / "runs" / "x"
    assert train_mnist.main(cli(stripes, out, *flags)) == 2
    assert capsys.readouterr().err == f"train_mnist.py: error: {message}\n"
    assert not (tmp_path / "runs").exists()


def test_a_batch_smaller_than_the_processes_is_refused(stripes, tmp_path, capsys):
    args = cli(stripes, tmp_path / "run", "--batch-size", "1")
    args[args.index("--workers") + 1] = "2"
    assert train_mnist.main(args) == 2
    assert capsys.readouterr().err == (
        "train_mnist.py: error: a batch of 1 cannot be shared by 2 processes (each needs an "
        "image): raise --batch-size to at least 2, or use fewer processes\n")


def test_an_image_size_beyond_the_machines_memory_is_refused_before_anything_is_allocated(
        stripes, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tinyvit.train.memory.available_bytes", lambda: 24 * 10 ** 9)
    assert train_mnist.main(cli(stripes, tmp_path / "run", "--image-size", "7000")) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"train_mnist.py: error: a step of this run needs about [\d,]+\.\d GB, "
                        r"more than the 24.0 GB this machine has available \(image size 7000, "
                        r"patch size 7, 1000001 tokens, batch 32\): lower --image-size or "
                        r"--batch-size, or raise --patch-size\n",
                        err), err
    assert not (tmp_path / "run").exists()


def test_the_first_lines_state_the_step_memory(stripes, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tinyvit.train.memory.available_bytes", lambda: 24 * 10 ** 9)
    assert train_mnist.main(cli(stripes, tmp_path / "run", "--epochs", "1")) == 0
    # the test batches' 500 images, each 1 x 28 x 28 as it comes and resized, and the MLP's
    # hidden layer: 500 x (2 x 784 + 17 x 32) floats, 4.2 MB, with the parameters 4.3 MB
    assert "step memory: about 4.3 MB of 24.0 GB available" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("attn_dropout", [0.0, 0.1])
@pytest.mark.parametrize("tier", ["fast", "reference"])
@pytest.mark.parametrize("model, overrides", [("mnist", {}), ("mnist", {"image_size": 56}),
                                              ("mnist_hybrid", {})])
def test_the_step_memory_estimate_is_above_a_measured_step_within_twice_it(model, overrides,
                                                                           tier, attn_dropout):
    """The peak of NumPy's allocations in a float32 training step (tracemalloc sees them)
    against the estimate, less the parameters' part (allocated before the step), on either
    tier, with attention dropout and without."""
    config = TrainConfig(model=model, model_overrides={**overrides, "attn_dropout": attn_dropout},
                         batch_size=64, tier=tier)
    vit = config.model_config()
    with default_dtype("float32"):
        trainer = Trainer(config, ViT(vit, seed=0))
        x = np.random.default_rng(0).random((64, 1, vit.image_size, vit.image_size), np.float32)
        y = np.arange(64) % 10
        trainer.step(x, y, 1e-3, (0, 0, 0))  # the optimizer's state made
        tracemalloc.start()
        trainer.step(x, y, 1e-3, (0, 0, 1))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    estimate = step_bytes(vit, 64, 0) - 4 * 4 * parameter_count(vit)
    assert peak < estimate < 2 * peak


def test_the_step_memory_estimate_grows_as_the_attention_does():
    """Tokens N: the scores grow as N^2, the rest as N."""
    small, large = ViTConfig(image_size=28, patch_size=7), ViTConfig(image_size=56, patch_size=7)
    ratio = step_bytes(large, 128, 500) / step_bytes(small, 128, 500)
    assert 3.5 < ratio < 16


# ---------------------------------------------------------------- signals


def test_a_signal_stops_between_steps_and_a_second_one_says_it_is_stopping(capsys):
    with Stop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert capsys.readouterr().err == "\nSIGINT: already stopping, after the step in flight\n"
        with pytest.raises(Stopped) as stopped:
            stop.check()
    assert stopped.value.signum == signal.SIGTERM and str(stopped.value) == "SIGTERM"


def test_a_signal_while_saving_waits_for_the_file(capsys, tmp_path):
    with Stop() as stop, stop.saving(tmp_path / "last.npz"):
        os.kill(os.getpid(), signal.SIGINT)  # no exception here: the save goes on
    assert capsys.readouterr().err == (
        f"\nSIGINT: still saving {tmp_path / 'last.npz'}; the run stops once it is whole\n")


def test_a_signal_stops_evaluation_at_once():
    with Stop() as stop, pytest.raises(Stopped):
        with stop.interrupting():
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("not stopped")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored on leaving


# ---------------------------------------------------------------- a full disk


@pytest.mark.parametrize("fails_at, kept, says", [
    (1, [], "no checkpoint was written yet: free some space and start the run again"),
    (2, ["best.npz", "last.npz", "metrics.json"], "{out}/last.npz and the other files written "
     "before are intact: free some space, then continue with --resume {out}"),
])
def test_a_full_disk_at_the_first_or_a_later_checkpoint(stripes, tmp_path, capsys, monkeypatch,
                                                        fails_at, kept, says):
    """The fails_at-th last.npz meets a full disk (writes patched to raise ENOSPC, so that
    the test needs no root): one line, exit status 1, the files written before kept whole."""
    import errno

    import tinyvit.files as files

    out, replace, writes = tmp_path / "run", files.os.replace, []

    def full_disk(source, target):
        writes.append(Path(target).name)
        if writes.count("last.npz") == fails_at and Path(target).name == "last.npz":
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(files.os, "replace", full_disk)
    capsys.readouterr()
    assert train_mnist.main(cli(stripes, out, "--epochs", "3")) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"train_mnist.py: error: no space left on the device for "
                          f"{out / 'last.npz'}: it needs about ")
    assert err.endswith(says.format(out=out))
    left = sorted(p.name for p in out.iterdir() if p.suffix != ".png") if out.exists() else []
    assert left == kept  # a folder the run made and left empty is removed
    if kept:
        _, _, meta = load_checkpoint(out / "last.npz")
        assert (meta["epoch"], meta["step"]) == (1, 0)
