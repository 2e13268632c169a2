"""Training: the loop over epochs and steps, and the checkpoints that let a run
survive a crash, a Ctrl-C or a full disk.

One ``TrainConfig`` describes a run. ``fit(config)`` trains and, after every
epoch, evaluates on the test split and writes to ``config.out_dir``:
``last.npz`` (everything needed to resume, written first), ``best.npz`` (the
best test accuracy so far), ``metrics.json`` and ``curves.png`` (``report.py``).

Under mpiexec the processes share each batch (``distributed.py``) and the
primary process alone prints and writes.

Reproducibility: the data order, the augmentation and the dropout masks of step
b in epoch e are all seeded from ``(seed, e, b)``, so the only state is the
weights, the optimizer and where the run stands (``RunState``). That makes a
resumed run, on NumPy with the same seed, end with exactly the weights of an
uninterrupted one.
"""

import dataclasses
import math
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

from tqdm import tqdm

from ..backend import get_backend, on_cpu, set_backend
from ..data import DatasetError
from ..fast import cpu_numba, mkl
from ..fast.blocks import ENVIRONMENT_VARIABLE as THREADS_VARIABLE
from ..fast.blocks import available_cores, num_threads
from ..files import NoSpaceError, atomic_write
from ..models import ViT
from ..weights import CheckpointError, save_checkpoint, saved_model_config
from ..weights.checkpoint import read_checkpoint, read_meta
from ..weights.fields import check_json_fields
from ..weights.npz import open_npz
from .budget import keep_to_budget, plan_epochs
from .build import build_model, init_path, make_batches
from .config import RunRefused, check_out_folder
from .distributed import check_launch, communicator, launched
from .evaluate import evaluate
from .lock import RunLock
from .memory import check_memory
from .parallel import WorkerDied
from .predict import check_checkpoint_config, run_config
from .report import write_final_report, write_metrics
from .signals import Stop, Stopped
from .state import RunState, Totals
from .step import Trainer


class TrainingDiverged(RuntimeError):
    """A training loss or gradient norm that is not finite: the run stops there.

    The weights are not finite either by then, so nothing more is saved: the
    checkpoints written before it keep the last finite weights."""


def fit(config, resume=None, stop_after_steps=None, out_dir=None, data_dir=None):
    """Train (or resume) a run; returns the metrics history.

    ``resume``: a checkpoint written by a previous run, or its folder (its
    ``last.npz``); the checkpoint's config is used, and the run writes into the
    checkpoint's folder, or into ``out_dir`` when given (the paths saved in a
    checkpoint are never a destination; the checkpoint and its folder's best.npz are
    copied there first), and reads the data from ``data_dir`` when given (the data may
    have moved since). The run holds its folder while it runs
    (``lock.py``): a second run into it stops with ``FolderInUse``.
    SIGINT or SIGTERM stops the run after the step in flight and saves
    ``last.npz`` (``signals.py``); then ``Stopped``, a KeyboardInterrupt, is raised
    again for the caller. A full disk raises ``NoSpaceError`` saying what to free
    and how to resume; the checkpoints written before are intact.
    ``stop_after_steps`` simulates an interruption after that many steps of this
    call (for tests).
    """
    started = time.perf_counter()
    rank, processes = launched()  # more than 1 under mpiexec
    if resume is not None:
        resume = resume_path(resume)
        checkpoint = read_checkpoint(resume, run_config)  # every part checked, then read
        model_state, optim_state, meta = (checkpoint.model_state, checkpoint.optim_state,
                                          checkpoint.meta)
        _check_run_state(resume, meta)
        config = dataclasses.replace(checkpoint.config, out_dir=str(out_dir or resume.parent),
                                     data_dir=data_dir or checkpoint.config.data_dir)
        if data_dir is None and config.data_dir and not Path(config.data_dir).exists():
            raise DatasetError(f"{resume}: the run's data folder {config.data_dir} does not "
                               "exist (any more): name where the data is now with --data-dir")
        if processes > 1:  # mpiexec's processes share each batch, whatever ran it before
            config = dataclasses.replace(config, workers=1)
            check_launch(config, processes, resumed=True)
    elif config.init is not None:
        check_checkpoint_config(init_path(config.init))
    check_out_folder(config.out_dir)
    out, stop = Path(config.out_dir), Stop()
    with stop, RunLock(out) if rank == 0 else nullcontext() as lock:
        with stop.interrupting():  # nothing to save yet: a signal stops it at once
            if resume is None or resume.resolve() != (out / "last.npz").resolve():
                check_new_folder(out)  # (a run alive in it was named by the lock)
            if lock is not None and lock.taken_over:
                print(lock.taken_over)
            model, state, train_batches, test_batches, memory = _prepare(
                config, resume and (resume, meta), processes)
        trainer = Trainer(config, model, stop)
        if trainer.primary:
            _print_start(config, trainer, train_batches, state.init, memory)
        if resume is not None:
            trainer.model.load_state_dict(model_state)
            trainer.optimizer.load_state_dict(optim_state)
            started -= state.wall  # the run's wall clock goes on from where it was saved
            if trainer.primary:
                print(_resumed(resume, state, config, out))
        return _train(trainer, train_batches, test_batches, state, out, started,
                      stop_after_steps)


def check_new_folder(out):
    """A new run, or one continued from a checkpoint other than the folder's own
    last.npz, does not write over a run's checkpoints: a RunRefused if ``out`` holds a
    last.npz or a best.npz. One that is not a tinyvit checkpoint (random bytes,
    another program's file) is refused too, so that nothing of the user's is written
    over, but said to be no run's (``check_run_checkpoint``): --resume could not
    continue it."""
    for name in ("last.npz", "best.npz"):
        if (out / name).exists():
            check_run_checkpoint(out / name)
            raise RunRefused(f"{out} holds a run already ({out / name}): continue it with "
                             f"--resume {out}, or give another --out (or delete {out} to "
                             f"start over)")


def check_run_checkpoint(path):
    """A RunRefused naming ``path`` unless it is a training checkpoint (a .npz file with
    a run's meta), with the reason its reader gives."""
    try:
        with open_npz(path) as npz:
            read_meta(npz)
    except CheckpointError as error:
        reason = str(error).removeprefix(f"{path}: ")
        raise RunRefused(f"{path} is not a tinyvit checkpoint ({reason}): no run to continue, "
                         f"and a new run would write over it; move it away, or give another "
                         f"--out") from None


def _prepare(config, resumed, processes):
    """What a run starts from: (model, RunState, training and test batches, the line of
    its step's memory), the memory checked before anything is allocated. ``resumed``:
    (the checkpoint's path, its meta), or None for a new run."""
    known = (saved_model_config(resumed[1]) if resumed
             else config.model_config() if config.init is None else None)
    memory = known and check_memory(known, config)
    set_backend(config.backend)
    if processes > 1 and not on_cpu():
        communicator().use_local_gpu()
    train_batches, test_batches = _batches(config, processes)
    if resumed:
        model, state = ViT(known), RunState.from_meta(resumed[1])
        _carry_checkpoints(resumed[0], Path(config.out_dir))
    else:
        model, notes = build_model(config)
        state = RunState(lr=config.lr, init=notes)
    memory = memory or check_memory(model.config, config)  # with --init: the file's model
    return model, state, train_batches, test_batches, memory


def _train(trainer, train_batches, test_batches, state, out, started, stop_after_steps):
    """The epochs, the final report, and ``last.npz`` saved when the run is stopped."""
    steps_done, evaluation, config = 0, None, trainer.config
    trained = False  # whether an epoch ended in this call, and so saved the checkpoints
    with trainer:
        try:
            while state.epoch < trainer.config.epochs:
                steps_done += _train_epoch(trainer, train_batches, state, stop_after_steps,
                                           steps_done)
                evaluation = _end_epoch(trainer, test_batches, state, out, started)
                trained = True
            with trainer.interruptible():
                evaluation = evaluation or evaluate(trainer.evaluator(), test_batches)
            if trainer.primary:
                write_final_report(out, config.dataset, state.history, evaluation, trained)
        except KeyboardInterrupt as stopped:  # in training or in evaluation: state says where
            if trainer.primary:
                state.wall = time.perf_counter() - started
                why = (f"stopped by {stopped.args[0]}" if isinstance(stopped, Stopped)
                       else "interrupted")
                print(f"\n{why}: {_save_stopped(trainer, state, out)}", flush=True)
            raise
        except WorkerDied as died:  # its step did not happen: the steps before are saved
            state.wall = time.perf_counter() - started
            raise WorkerDied(f"{died}; {_save_stopped(trainer, state, out)}") from None
        except NoSpaceError as error:
            raise _after_full_disk(error, out) from None
    return state.history


def _save_stopped(trainer, state, out):
    """``last.npz`` of a stopped run, whole even when another signal comes meanwhile;
    returns the line that says where it stands. A new run stopped before its first step
    has nothing to keep, and saves nothing: the same command starts it again."""
    path = out / "last.npz"
    if state.global_step == 0 and not path.exists():
        return "nothing to save before the first step: start the run again with the same command"
    try:
        with trainer.stop.saving(path):
            _save(path, trainer, state)
    except NoSpaceError as error:
        raise _after_full_disk(error, out) from None
    return f"saved {path} (epoch {state.epoch + 1}, step {state.step}); resume with --resume {out}"


def _check_run_state(path, meta):
    """A CheckpointError unless the RunState fields of a checkpoint's meta have their
    names and types (``RunState.from_meta`` reads them)."""
    names = {f.name for f in dataclasses.fields(RunState)}
    check_json_fields(path, "meta", RunState, {k: v for k, v in meta.items() if k in names},
                      CheckpointError)


def resume_path(path):
    """What ``--resume`` names: a run folder means its last.npz; a file, itself."""
    path = Path(path)
    return path / "last.npz" if path.is_dir() else path


def _batches(config, processes):
    """The training and test batches; ``RunRefused`` when no step could run (fewer
    images than a batch), or a batch cannot be shared by the run's processes."""
    train, test = make_batches(config, "train"), make_batches(config, "test")
    images = train.images.shape[0]
    if len(train) == 0:
        raise RunRefused(f"{images} training image(s) make no full batch of "
                         f"{config.batch_size}: lower --batch-size to at most {images}, or "
                         "train on more images (--train-subset)")
    sharing = max(processes, config.workers)
    if config.batch_size < sharing:
        raise RunRefused(f"a batch of {config.batch_size} cannot be shared by {sharing} "
                         f"processes (each needs an image): raise --batch-size to at least "
                         f"{sharing}, or use fewer processes")
    return train, test


def _resumed(resume, state, config, out):
    """The line that says where a resumed run goes on from."""
    where = (f"(the run had ended, {config.epochs} of {config.epochs} epochs: nothing is left "
             f"to train, its last weights are evaluated again)" if state.epoch >= config.epochs
             else f"at epoch {state.epoch + 1}, step {state.step}")
    elsewhere = out.resolve() != resume.parent.resolve()
    return f"resumed from {resume} {where}" + (f", writing into {out}" if elsewhere else "")


def _carry_checkpoints(resume, out):
    """A run continued into another folder takes its checkpoint along as last.npz, and
    its best model (the state's best accuracy is that file's): the folder holds the
    whole run, even one that stops, or ends, before it writes them again."""
    source = resume.parent
    if resume.resolve() == (out / "last.npz").resolve():
        return
    _copy(resume, out / "last.npz")
    if (source / "best.npz").is_file() and source.resolve() != out.resolve():
        _copy(source / "best.npz", out / "best.npz")


def _after_full_disk(error, out):
    """The error of a checkpoint that could not be written, with what to do next."""
    if (out / "last.npz").is_file():
        advice = (f"{out / 'last.npz'} and the other files written before are intact: free "
                  f"some space, then continue with --resume {out}")
    else:
        advice = "no checkpoint was written yet: free some space and start the run again"
    return NoSpaceError(error.path, error.needed, error.free, advice)


def _train_epoch(trainer, batches, state, stop_after_steps, steps_done):
    """Train from the state's (epoch, step) to the end of the epoch; returns steps run.

    The running sums (loss, correct, seen, time) live in the state so that a run
    interrupted mid-epoch and resumed reports the same epoch metrics."""
    config, epoch, n = trainer.config, state.epoch, len(batches)
    totals = state.running
    ran, pending = 0, []  # device scalars not yet read: the host stays out of the step
    start_time = time.perf_counter()

    def flush():
        """Read the pending steps' results and add them up; the first loss or gradient
        norm that is not finite stops the run (read here, with the rest, so that a GPU
        step never waits for the host)."""
        for loss, correct, size, norm, step, lr in pending:
            loss, norm = float(loss), float(norm)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                raise TrainingDiverged(
                    f"training diverged at epoch {epoch + 1}, step {step + 1} of {n} "
                    f"(learning rate {lr:.3g}): loss {loss}, gradient norm {norm}; the "
                    "checkpoints written before it are left as they were: try a lower --lr")
            totals.loss_sum += loss * size
            totals.correct += int(correct)
            totals.seen += size
        pending.clear()

    epochs = "?" if config.budget and not state.plan else config.epochs  # "?": not planned yet
    bar = tqdm(batches.epoch(epoch, start=state.step), total=n, initial=state.step,
               desc=f"epoch {epoch + 1}/{epochs}", unit="batch", disable=not trainer.primary)
    try:
        for x, y in bar:
            trainer.check_stop()  # a signal since the last step: stop here, between two
            if stop_after_steps is not None and steps_done + ran >= stop_after_steps:
                raise KeyboardInterrupt
            state.lr = trainer.lr_at(state.global_step, n)
            loss, correct, norm = trainer.step(x, y, state.lr, (config.seed, epoch, state.step))
            pending.append((loss, correct, len(y), norm, state.step, state.lr))
            state.step += 1
            state.global_step += 1
            ran += 1
            if len(pending) == config.log_every:
                flush()
                rate = totals.seen / (totals.time + time.perf_counter() - start_time)
                bar.set_postfix(loss=f"{totals.loss_sum / totals.seen:.4f}",
                                acc=f"{totals.correct / totals.seen:.4f}",
                                lr=f"{state.lr:.2e}", img_s=f"{rate:.0f}")
    finally:
        bar.close()
        spent = time.perf_counter() - start_time
        totals.time += spent
        state.elapsed += spent
        flush()
    return ran


def _end_epoch(trainer, test_batches, state, out, started):
    """Evaluate (every ``eval_every`` epochs and after the last; other epochs
    record None), plan a budgeted run's epochs after its first, move the state past
    this epoch, then write ``last.npz`` first (what ``--resume`` needs), ``best.npz``
    when the test accuracy is the best so far (a copy of it), and the metrics.
    Returns ``evaluate``'s result, or None."""
    start = time.perf_counter()
    if trainer.config.budget and state.plan is not None:
        trainer.config = trainer.on_primary(keep_to_budget, trainer.config, state.plan,
                                            state.epoch + 1, start - started)
    config, epoch, totals = trainer.config, state.epoch, state.running
    planning = config.budget > 0 and state.plan is None
    evaluation = test_loss = test_acc = None
    if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs or planning:
        with trainer.interruptible():
            evaluation = evaluate(trainer.evaluator(), test_batches)
        test_loss, test_acc = evaluation[:2]
    eval_seconds = time.perf_counter() - start
    elapsed = state.elapsed + eval_seconds
    if planning:
        trainer.config, state.plan = trainer.on_primary(plan_epochs, config, totals.time,
                                                        eval_seconds,
                                                        time.perf_counter() - started)
    seen = max(totals.seen, 1)
    row = {
        "epoch": epoch + 1,
        "train_loss": totals.loss_sum / seen,
        "train_acc": totals.correct / seen,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "lr": state.lr,
        "images_per_s": totals.seen / max(totals.time, 1e-9),
        "elapsed_s": elapsed,
    }
    best = test_acc is not None and test_acc > state.best_acc
    # in one update, so that a Ctrl-C leaves the state before the epoch's end or after it
    vars(state).update(history=state.history + [row], epoch=epoch + 1, step=0, elapsed=elapsed,
                       running=Totals(), best_acc=test_acc if best else state.best_acc,
                       wall=time.perf_counter() - started)
    if not trainer.primary:
        return evaluation
    test = "not evaluated" if test_acc is None else f"loss {test_loss:.4f} acc {test_acc:.4f}"
    print(f"epoch {epoch + 1}: train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | "
          f"test {test} | {row['images_per_s']:.0f} img/s | {elapsed:.0f} s")
    last = _save(out / "last.npz", trainer, state)
    if best:
        _copy(last, out / "best.npz")
    write_metrics(out, state.history)
    return evaluation


def _save(path, trainer, state):
    meta = {"config": dataclasses.asdict(trainer.config),
            "model_config": dataclasses.asdict(trainer.model.config), **state.to_meta()}
    return save_checkpoint(path, trainer.model, trainer.optimizer, meta)


def _copy(source, target):
    """``target`` replaced by a copy of ``source``, whole or not at all."""
    with open(source, "rb") as f, atomic_write(target, source.stat().st_size) as out:
        shutil.copyfileobj(f, out)


def _processes(config, comm):
    """The processes and threads a step runs on, for the start's second line."""
    threads, cores = "", available_cores()
    if config.tier == "fast" and on_cpu():  # the kernels' blocks (fast/blocks.py)
        count = num_threads()
        threads = f", the kernels on {count} thread(s)"
        if count > cores:
            threads += (f" (more than the {cores} CPU cores here: the threads take turns, and "
                        f"each kernel is slower than on {cores})")
    if comm is not None:
        return f"{comm.size} processes (MPI){threads and threads + ' each'}"
    if config.workers > 1:  # one thread each (parallel.py)
        text = f"{config.workers} worker processes of one thread each"
        setting = os.environ.get(THREADS_VARIABLE, "").strip()
        if setting:
            text += f" ({THREADS_VARIABLE}={setting} sets one process's threads: not used here)"
        if config.workers > cores:
            text += (f", more than the {cores} CPU cores here: they take turns, and each step "
                     f"is slower than with --workers {cores}")
        return text
    return f"1 process{threads}"


def _print_start(config, trainer, batches, init_notes, memory):
    epochs = (f"a budget of {config.budget:g} min" if config.budget else
              f"{config.epochs} epoch{'' if config.epochs == 1 else 's'}")
    model = trainer.model
    processes = _processes(config, trainer.communicator)
    how = ", the step captured in a CUDA graph" if config.cuda_graph else ""
    if config.tier == "fast" and on_cpu() and cpu_numba.compiled():
        how = ("; GELU, LayerNorm and the softmax compiled by Numba "
               "(TINYVIT_NUMBA=0: in NumPy blocks)")
    if config.tier == "fast" and on_cpu() and mkl.enabled():
        how += "; Linear's products of 2^26 multiply-adds or more by MKL (TINYVIT_MKL=0: NumPy's)"
    print(f"layers: {model.describe_tier()}{how}")
    print(f"{config.dataset}: {batches.images.shape[0]} training images, "
          f"{len(batches)} steps/epoch, {epochs}, backend {get_backend()}, {processes}")
    print(f"model: {model.num_parameters():,} parameters, {model.config}")
    print(memory)
    for line in init_notes or ():
        print(f"  {line}")
