"""Training: the loop, evaluation, checkpoints, metrics, and the pictures of a run.

One ``TrainConfig`` describes a run. ``fit(config)`` trains and, after every
epoch, evaluates on the test split and writes to ``config.out_dir``:
``last.npz`` (everything needed to resume), ``best.npz`` (the best test accuracy
so far), ``metrics.json`` (one row per epoch) and ``curves.png``. At the end it
also writes ``confusion.png`` and per-class accuracy into ``metrics.json``.

Reproducibility: the data order, the augmentation and the dropout masks of step
b in epoch e are all seeded from ``(seed, e, b)``, so the only state is the
weights, the optimizer and the position (epoch, step). That makes a resumed run,
on NumPy with the same seed, end with exactly the weights of an uninterrupted one.
"""

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np  # host-side bookkeeping only: metrics, confusion matrix
from tqdm import tqdm

from . import augment as aug
from . import plot
from .backend import get_backend, host_rng, quiet_overflow, set_backend, to_device, to_host, xp
from .backend import rng as device_rng
from .checkpoint import atomic_write, load_checkpoint, save_checkpoint
from .checks import check_fields
from .data import Batches, DatasetError, dataset_info, load_dataset, normalize
from .functional import softmax
from .loss import SoftmaxCrossEntropy, loss_and_gradients
from .model import ViT, ViTConfig, preset_config
from .optim import SGD, AdamW, clip_grad_norm, grad_norm, warmup_cosine
from .parallel import DataParallel
from .pretrained import read_pretrained


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run (saved in every checkpoint)."""

    dataset: str = "mnist"
    model: str = "mnist"  # a preset of tinyvit.model.PRESETS
    model_overrides: dict = dataclasses.field(default_factory=dict)  # e.g. {"depth": 6}
    epochs: int = 18
    batch_size: int = 128
    optimizer: str = "adamw"  # or "sgd" (momentum 0.9, Nesterov)
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 0.0
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    clip_grad: float = 0.0  # max global gradient norm; 0 = no clipping
    max_shift: int = 1  # random translation by up to this many pixels (0 = off)
    flip: bool = False  # random horizontal flip
    erasing: float = 0.0  # random erasing probability
    mixup: float = 0.0  # mixup alpha (0 = off)
    cutmix: float = 0.0  # cutmix alpha (0 = off); with both, each batch picks one
    seed: int = 0
    data_dir: str = None
    out_dir: str = "runs/mnist"
    backend: str = "numpy"
    eval_batch_size: int = 500
    eval_every: int = 1  # epochs between test evaluations (the last epoch is always evaluated)
    workers: int = 1  # processes sharing each batch (tinyvit.parallel; NumPy only); 1 = this one
    log_every: int = 20  # steps between progress-bar updates (host transfers)
    train_subset: int = 0  # use only the first N training images (0 = all)
    test_subset: int = 0
    init: str = None  # start from these weights: any file or folder tinyvit.pretrained reads
    reset_head: bool = False  # with init: a zero head even when the class count is the file's
    freeze_backbone: bool = False  # train the head alone (a linear probe)
    budget: float = 0.0  # minutes for the whole run: epochs planned after the first (0: off)

    def __post_init__(self):
        """Every value is checked here, so that a bad one is named before a run starts."""
        if self.init is None:  # with init, the weights' file is read when the run starts
            self.model_config()  # the dataset, the preset and its overrides
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        check_fields(self, ("epochs", "batch_size", "eval_batch_size", "eval_every", "log_every",
                            "workers"),
                     lambda n: n >= 1, "at least 1")
        check_fields(self, ("lr",), lambda x: x > 0, "positive")
        check_fields(self, ("min_lr", "warmup_epochs", "weight_decay", "clip_grad", "max_shift",
                            "mixup", "cutmix", "train_subset", "test_subset", "budget"),
                     lambda x: x >= 0, "at least 0")
        check_fields(self, ("label_smoothing",), lambda p: 0.0 <= p < 1.0, "in [0, 1)")
        check_fields(self, ("erasing",), lambda p: 0.0 <= p <= 1.0, "in [0, 1]")

    def model_fields(self):
        """The ViTConfig fields the run sets: the dataset's channels, image size and
        classes, then ``model_overrides``."""
        info = dataset_info(self.dataset)
        channels, size, _ = info.image_shape
        fields = dict(in_channels=channels, image_size=size, num_classes=len(info.classes))
        return {**fields, **self.model_overrides}

    def model_config(self):
        """The ViT config of a run from a preset: the preset with ``model_fields``."""
        return preset_config(self.model, **self.model_fields())

    def image_size(self):
        """The side of the images the model sees (batches are resized to it)."""
        return self.model_fields()["image_size"]


class TrainingDiverged(RuntimeError):
    """A training loss or gradient norm that is not finite: the run stops there.

    The weights are not finite either by then, so nothing more is saved: the
    checkpoints written before it keep the last finite weights."""


# -- one step and evaluation ------------------------------------------------------


class Trainer:
    """Model, loss, optimizer and schedule for one run; ``step`` is one update.

    As a context manager it also runs the worker processes of a run with
    ``workers > 1`` (``tinyvit.parallel``): then training steps and evaluation
    split each batch over them. Without ``with``, everything runs in this process.
    """

    def __init__(self, config, model=None):
        self.config = config
        self.model = model or build_model(config)[0]
        self.criterion = SoftmaxCrossEntropy(config.label_smoothing)
        if config.optimizer == "adamw":
            self.optimizer = AdamW(self.model, config.lr, weight_decay=config.weight_decay)
        else:
            self.optimizer = SGD(self.model, config.lr, momentum=0.9, nesterov=True,
                                 weight_decay=config.weight_decay)
        self.num_classes = self.model.config.num_classes
        self.trainable = self.head_mask() if config.freeze_backbone else None
        self.parallel = None

    def head_mask(self):
        """For a linear probe: 1 on the head's entries of the flat parameter buffer, 0
        elsewhere. ``step`` multiplies the gradient by it, and the weight decay is
        masked with it, so the optimizer leaves every other parameter as it is."""
        _, _, decay = self.model.flat_parameters()
        mask = xp.zeros_like(decay)
        head = {id(p) for p in self.model.head.parameters()}
        offset = 0
        for p in self.model.parameters():  # the order flat_parameters packs them in
            if id(p) in head:
                mask[offset:offset + p.data.size] = 1
            offset += p.data.size
        decay *= mask
        return mask

    def __enter__(self):
        c = self.config
        if c.workers > 1:
            self.parallel = DataParallel(self.model, c.workers,
                                         max(c.batch_size, c.eval_batch_size))
            self.parallel.__enter__()
        return self

    def __exit__(self, *exc):
        if self.parallel is not None:
            self.parallel.__exit__(*exc)
            self.parallel = None

    def lr_at(self, step, steps_per_epoch):
        c = self.config
        return warmup_cosine(step, c.epochs * steps_per_epoch,
                             round(c.warmup_epochs * steps_per_epoch), c.lr, c.min_lr)

    def mix(self, x, y, seed):
        """Mixup or cutmix (one of the two, chosen per batch), with soft targets."""
        c = self.config
        if not (c.mixup or c.cutmix):
            return x, y
        rng = device_rng(seed)
        if c.cutmix and (not c.mixup or host_rng(seed).random() < 0.5):
            return aug.cutmix(x, y, self.num_classes, rng, alpha=c.cutmix)
        return aug.mixup(x, y, self.num_classes, rng, alpha=c.mixup)

    def step(self, x, y, lr, seed):
        """Forward, loss, backward and update on one batch. Returns (loss, number of
        correct predictions, gradient norm before clipping); in one process as device
        scalars, so nothing waits for the host (the workers' loss is a host float
        already)."""
        x, target = self.mix(x, y, seed + (1,))
        with quiet_overflow():  # a value that overflows shows in the loss or the norm
            if self.parallel is None:
                loss, logits = loss_and_gradients(self.model, self.criterion, x, target, seed)
            else:  # the same, over the workers: their targets are distributions
                self.criterion.check_target(target, len(x), self.num_classes)
                targets = self.criterion.targets(target, self.num_classes, x.dtype)
                loss, logits = self.parallel.gradients(x, targets, seed)
            grad = self.optimizer.grad
            if self.trainable is not None:
                grad *= self.trainable
            if self.config.clip_grad:
                norm = clip_grad_norm(grad, self.config.clip_grad)
            else:
                norm = grad_norm(grad)
            self.optimizer.step(lr)
        return loss, (logits.argmax(axis=1) == y).sum(), norm

    def evaluator(self):
        """What ``evaluate`` runs: the model, or the workers when there are some."""
        return self.model if self.parallel is None else self.parallel


def evaluate(model, batches, criterion=None):
    """Loss, accuracy and predictions of ``model`` (eval mode) over ``batches``;
    ``model`` is anything with ``eval()`` and ``forward(x)``: a ViT or a DataParallel."""
    criterion = criterion or SoftmaxCrossEntropy()
    model.eval()
    total_loss, predictions, labels = 0.0, [], []
    for x, y in batches.epoch(0):
        logits = model.forward(x)
        total_loss += float(criterion.forward(logits, y)) * len(y)
        predictions.append(to_host(logits.argmax(axis=1)))
        labels.append(to_host(y))
    predictions, labels = np.concatenate(predictions), np.concatenate(labels)
    return total_loss / len(labels), float((predictions == labels).mean()), predictions, labels


def confusion_matrix(predictions, labels, num_classes):
    """counts[i, j] = number of images of class i predicted as class j."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


# -- the run ----------------------------------------------------------------------


def build_model(config):
    """A new run's ViT and the notes on how it was made: the preset with fresh
    weights, or with ``config.init`` the weights of that file (a checkpoint, a run
    folder's best.npz, or pre-trained weights ``tinyvit.pretrained`` reads) fitted
    to the run as the ViT paper fine-tunes: the position embeddings resized to the
    run's image size, and a zero head when the file's class count differs from
    the dataset's, or the file has no head, or ``reset_head`` asks for one."""
    if config.init is None:
        return ViT(config.model_config(), seed=config.seed), []
    pretrained = read_pretrained(init_path(config.init))
    fields = config.model_fields()
    head = pretrained.state.get("head.weight")
    keep_head = head is not None and head.shape[0] == fields["num_classes"]
    notes = []
    model = pretrained.build(head="load" if keep_head and not config.reset_head else "zero",
                             seed=config.seed, log=notes.append, **fields)
    return model, notes


def init_path(path):
    """What ``--init`` names: a run folder means its best.npz; any other path as it is."""
    path = Path(path)
    return path / "best.npz" if (path / "best.npz").is_file() else path


def make_batches(config, split):
    """The train or test ``Batches`` of a run."""
    info = dataset_info(config.dataset)
    images, labels = load_dataset(config.dataset, split, data_dir=config.data_dir)
    subset = config.train_subset if split == "train" else config.test_subset
    if subset:
        images, labels = images[:subset], labels[:subset]
    if split == "test":
        return Batches(images, labels, config.eval_batch_size, mean=info.mean, std=info.std,
                       image_size=config.image_size())
    return training_batches(config, images, labels)


def training_batches(config, images, labels):
    """The run's training ``Batches`` over these images: shuffled, full batches only,
    with the config's augmentation."""
    info = dataset_info(config.dataset)
    augment = aug.pipeline(config.max_shift, config.flip, config.erasing)
    return Batches(images, labels, config.batch_size, mean=info.mean, std=info.std,
                   shuffle=True, drop_last=True, seed=config.seed, augment=augment,
                   image_size=config.image_size())


def fit(config, resume=None, stop_after_steps=None):
    """Train (or resume) a run; returns the metrics history.

    ``resume``: a checkpoint written by a previous run (its config is used).
    Ctrl-C saves ``last.npz`` at the current step and raises KeyboardInterrupt
    again for the caller. ``stop_after_steps`` simulates such an interruption
    after that many steps of this call (for tests).
    """
    started = time.perf_counter()
    if resume is not None:
        model_state, optim_state, meta = load_checkpoint(resume)
        config = TrainConfig(**meta["config"])
    set_backend(config.backend)
    train_batches, test_batches = make_batches(config, "train"), make_batches(config, "test")
    state = {"epoch": 0, "step": 0, "global_step": 0, "lr": config.lr, "elapsed": 0.0,
             "running": _new_running(), "history": [], "best_acc": -1.0, "init": None,
             "plan": None, "wall": 0.0}
    if resume is None:
        model, state["init"] = build_model(config)
    else:
        model = ViT(saved_model_config(meta, config))
    # made once data and model are read: a run that cannot start leaves nothing
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, model)
    if resume is not None:
        trainer.model.load_state_dict(model_state)
        trainer.optimizer.load_state_dict(optim_state)
        state.update({k: meta[k] for k in state if k in meta})
        started -= state["wall"]  # the run's wall clock goes on from where it was saved
        print(f"resumed from {resume} at epoch {state['epoch'] + 1}, step {state['step']}")
    _print_start(config, trainer.model, train_batches, state["init"])
    steps_done, evaluation = 0, None
    with trainer:
        try:
            while state["epoch"] < trainer.config.epochs:
                steps_done += _train_epoch(trainer, train_batches, state, stop_after_steps,
                                           steps_done)
                evaluation = _end_epoch(trainer, test_batches, state, out, started)
            _finish(trainer, test_batches, state, trainer.config, out, evaluation)
        except KeyboardInterrupt:  # in training or in evaluation: state says where the run is
            state["wall"] = time.perf_counter() - started
            path = _save(out / "last.npz", trainer, state)
            print(f"\ninterrupted: saved {path} "
                  f"(epoch {state['epoch'] + 1}, step {state['step']}); "
                  f"resume with --resume {path}")
            raise
    return state["history"]


def _train_epoch(trainer, batches, state, stop_after_steps, steps_done):
    """Train from state's (epoch, step) to the end of the epoch; returns steps run.

    The running sums (loss, correct, seen, time) live in ``state`` so that a run
    interrupted mid-epoch and resumed reports the same epoch metrics."""
    config, epoch, n = trainer.config, state["epoch"], len(batches)
    run = state["running"]
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
            run["loss_sum"] += loss * size
            run["correct"] += int(correct)
            run["seen"] += size
        pending.clear()

    epochs = "?" if config.budget and not state["plan"] else config.epochs  # "?": not planned yet
    bar = tqdm(batches.epoch(epoch, start=state["step"]), total=n, initial=state["step"],
               desc=f"epoch {epoch + 1}/{epochs}", unit="batch")
    try:
        for x, y in bar:
            if stop_after_steps is not None and steps_done + ran >= stop_after_steps:
                raise KeyboardInterrupt
            state["lr"] = trainer.lr_at(state["global_step"], n)
            loss, correct, norm = trainer.step(x, y, state["lr"],
                                               (config.seed, epoch, state["step"]))
            pending.append((loss, correct, len(y), norm, state["step"], state["lr"]))
            state["step"] += 1
            state["global_step"] += 1
            ran += 1
            if len(pending) == config.log_every:
                flush()
                rate = run["seen"] / (run["time"] + time.perf_counter() - start_time)
                bar.set_postfix(loss=f"{run['loss_sum'] / run['seen']:.4f}",
                                acc=f"{run['correct'] / run['seen']:.4f}",
                                lr=f"{state['lr']:.2e}", img_s=f"{rate:.0f}")
    finally:
        bar.close()
        spent = time.perf_counter() - start_time
        run["time"] += spent
        state["elapsed"] += spent
        flush()
    return ran


def _end_epoch(trainer, test_batches, state, out, started):
    """Evaluate (every ``eval_every`` epochs and after the last; other epochs
    record None), plan a budgeted run's epochs after its first, then move the
    state past this epoch in one update, so a Ctrl-C anywhere leaves it either
    before the epoch's end (resuming evaluates again) or after it. Returns
    ``evaluate``'s result, or None."""
    start = time.perf_counter()
    if trainer.config.budget and state["plan"] is not None:
        _keep_to_budget(trainer, state, start - started)
    config, epoch = trainer.config, state["epoch"]
    planning = config.budget > 0 and state["plan"] is None
    evaluation = test_loss = test_acc = None
    if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs or planning:
        evaluation = evaluate(trainer.evaluator(), test_batches)
        test_loss, test_acc = evaluation[:2]
    eval_seconds = time.perf_counter() - start
    elapsed = state["elapsed"] + eval_seconds
    run = state["running"]
    if planning:
        spent = time.perf_counter() - started
        state["plan"] = _plan_epochs(trainer, run["time"], eval_seconds, spent)
    seen = max(run["seen"], 1)
    row = {
        "epoch": epoch + 1,
        "train_loss": run["loss_sum"] / seen,
        "train_acc": run["correct"] / seen,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "lr": state["lr"],
        "images_per_s": run["seen"] / max(run["time"], 1e-9),
        "elapsed_s": elapsed,
    }
    best = test_acc is not None and test_acc > state["best_acc"]
    if best:
        _save(out / "best.npz", trainer, state)
    state.update(history=state["history"] + [row], epoch=epoch + 1, step=0, elapsed=elapsed,
                 running=_new_running(), best_acc=test_acc if best else state["best_acc"],
                 wall=time.perf_counter() - started)
    test = "not evaluated" if test_acc is None else f"loss {test_loss:.4f} acc {test_acc:.4f}"
    print(f"epoch {epoch + 1}: train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | "
          f"test {test} | {row['images_per_s']:.0f} img/s | {elapsed:.0f} s")
    _save(out / "last.npz", trainer, state)
    _write_metrics(out, state["history"])
    return evaluation


def _plan_epochs(trainer, train_seconds, eval_seconds, spent):
    """The epochs of a run with a ``budget``, planned once its first epoch is done.

    ``spent`` is the wall-clock time since the run started (reading the data,
    starting the workers, the first epoch and its evaluation); each further epoch
    is taken to cost the first one's training time plus its share of the test
    evaluations, and the last epoch is always evaluated:
        epochs = 1 + floor((budget - spent - eval) / (train + eval / eval_every)).
    The first epoch, usually the slowest, makes the plan err on the short side.
    The plan replaces ``epochs`` in the trainer's config, so the cosine schedule
    ends with the run; it is saved in every checkpoint, so a resumed run keeps it.
    """
    c = trainer.config
    per_epoch = train_seconds + eval_seconds / c.eval_every
    left = 60 * c.budget - spent - eval_seconds
    epochs = 1 + max(0, int(left // per_epoch))
    trainer.config = dataclasses.replace(c, epochs=epochs)
    print(f"budget {c.budget:g} min: {spent:.0f} s so far, an epoch takes {train_seconds:.0f} s "
          f"and a test evaluation {eval_seconds:.0f} s: {epochs} epochs in all")
    return {"budget_minutes": c.budget, "epochs": epochs, "first_epoch_s": train_seconds,
            "eval_s": eval_seconds, "spent_s": spent}


def _keep_to_budget(trainer, state, spent):
    """After each later epoch's training: when the epochs since the plan ran slower
    than it assumed (another process took a core, say) and the rest would end past
    the budget, end the run earlier,
        epochs = done + floor((budget - spent - eval) / per_epoch),
    per_epoch the wall-clock time an epoch took since the plan, never more epochs
    than planned. The cosine schedule then ends with the shorter run."""
    plan, c, done = state["plan"], trainer.config, state["epoch"] + 1
    per_epoch = (spent - plan["spent_s"]) / (done - 1)
    left = 60 * c.budget - spent - plan["eval_s"]
    epochs = max(done, min(c.epochs, done + int(left // per_epoch)))
    if epochs < c.epochs:
        print(f"budget {c.budget:g} min: epochs take {per_epoch:.0f} s, {spent:.0f} s so far: "
              f"{epochs} epochs in all instead of {c.epochs}")
        trainer.config = dataclasses.replace(c, epochs=epochs)
        plan["epochs"] = epochs


def _new_running():
    return {"loss_sum": 0.0, "correct": 0, "seen": 0, "time": 0.0}


def _save(path, trainer, state):
    meta = {"config": dataclasses.asdict(trainer.config),
            "model_config": dataclasses.asdict(trainer.model.config), **state}
    return save_checkpoint(path, trainer.model, trainer.optimizer, meta)


def saved_model_config(meta, config):
    """The ViTConfig a checkpoint's model was built with (a checkpoint without one
    was built from its preset)."""
    if "model_config" in meta:
        return ViTConfig(**meta["model_config"])
    return config.model_config()


def _write_metrics(out, history, extra=None):
    text = json.dumps({"epochs": history, **(extra or {})}, indent=1)
    with atomic_write(out / "metrics.json") as f:
        f.write(text.encode())
    epochs = [row["epoch"] for row in history]

    def series(key):
        return [plot.Series(split, epochs, [r[f"{split}_{key}"] for r in history], style="both")
                for split in ("train", "test")]

    plot.line_chart(
        [plot.Panel("loss", "epoch", "cross-entropy", series("loss")),
         plot.Panel("accuracy", "epoch", "accuracy", series("acc"))],
        out / "curves.png",
        title=f"training curves ({out.name})",
    )


def _finish(trainer, test_batches, state, config, out, evaluation=None):
    """Per-class accuracy and the confusion matrix of the final model, from the
    last epoch's ``evaluation`` (or a new one, for a resumed run already done)."""
    _, test_acc, predictions, labels = evaluation or evaluate(trainer.evaluator(), test_batches)
    classes = dataset_info(config.dataset).classes
    counts = confusion_matrix(predictions, labels, len(classes))
    per_class = {name: float(counts[i, i] / max(counts[i].sum(), 1))
                 for i, name in enumerate(classes)}
    _write_metrics(out, state["history"], {"per_class_accuracy": per_class,
                                           "confusion_matrix": counts.tolist()})
    plot.heatmap(counts, out / "confusion.png",
                 title=f"confusion matrix (test accuracy {test_acc:.2%})",
                 xlabel="predicted", ylabel="true", xticklabels=classes, yticklabels=classes)
    print("per-class test accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in per_class.items()))
    print(f"wrote {out / 'metrics.json'}, {out / 'curves.png'}, {out / 'confusion.png'}, "
          f"{out / 'best.npz'}, {out / 'last.npz'}")


def _print_start(config, model, batches, init_notes):
    epochs = f"a budget of {config.budget:g} min" if config.budget else f"{config.epochs} epochs"
    print(f"{config.dataset}: {batches.images.shape[0]} training images, "
          f"{len(batches)} steps/epoch, {epochs}, backend {get_backend()}, "
          f"{config.workers} worker(s)")
    print(f"model: {model.num_parameters():,} parameters, {model.config}")
    for line in init_notes or ():
        print(f"  {line}")


# -- using a trained model ----------------------------------------------------------


def load_trained(path):
    """(model, TrainConfig) from a training checkpoint."""
    model_state, _, meta = load_checkpoint(path)
    config = TrainConfig(**meta["config"])
    model = ViT(saved_model_config(meta, config))
    model.load_state_dict(model_state)
    return model.eval(), config


def load_image(path, config):
    """An image file (PNG, JPG, any size or mode) as a normalized (1, C, H, W) batch
    on the active backend.

    Converted to the dataset's channels and resized to the model's image size. MNIST-style
    data is light strokes on a dark background: a grayscale picture whose border
    is mostly light (a dark digit on white paper) is inverted to match.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    info = dataset_info(config.dataset)
    channels, height, width = info.image_shape[0], config.image_size(), config.image_size()
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image).convert("L" if channels == 1 else "RGB")
            image = image.resize((width, height), Image.BILINEAR)
    except (FileNotFoundError, UnidentifiedImageError) as e:
        raise DatasetError(f"cannot read image {path}: {e}") from e
    pixels = np.asarray(image, dtype=np.float32) / 255  # (H, W) or (H, W, C)
    pixels = pixels.reshape(height, width, channels).transpose(2, 0, 1)[None]  # (1, C, H, W)
    if channels == 1:
        edges = (pixels[0, 0, 0], pixels[0, 0, -1], pixels[0, 0, :, 0], pixels[0, 0, :, -1])
        border = np.concatenate(edges)
        if border.mean() > 0.5:
            pixels = 1 - pixels
    return normalize(to_device(pixels), info.mean, info.std)


def predict(model, config, path, top=3):
    """The ``top`` most likely classes of an image file: [(class name, probability)]."""
    probs = to_host(softmax(model.eval().forward(load_image(path, config))))[0]  # (K,)
    classes = dataset_info(config.dataset).classes
    return [(classes[i], float(probs[i])) for i in np.argsort(-probs)[:top]]
