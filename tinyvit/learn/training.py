"""The last exercise: the MNIST preset trained on the learner's own backward passes.

The model is built twice from one seed: once of the library's layers, once with
every layer whose exercise passed its check taking the learner's class (the library's
stays wherever the learner has not got there yet) (a class swap,
as ``tinyvit.fast.accelerate`` does it), whose methods call the learner's functions
where their files import the library's (the softmax backward, splitting and merging
the heads' gradients). Both train step by step, side by side, on the same batches
in float64, and their losses must be the same at every step: a backward that is
right only at some shapes, or only where the checks looked, parts the curves, and
the training stops there.
"""

import functools
import json
import os
import sys

import numpy as np  # the two loss curves, on the host
from tqdm import tqdm

from ..backend import default_dtype, using_backend
from ..data import Batches, DatasetError, dataset_info, load_dataset
from ..models import create_model
from ..nn.loss import SoftmaxCrossEntropy
from ..nn.optim import AdamW
from ..train.gradients import loss_and_gradients
from . import pictures
from .checking import (
    MARKER,
    ExerciseFailed,
    Progress,
    fingerprint,
    load_exercise,
    load_notebook,
    notebook_code,
)
from .exercises import EXERCISES, STEPS, TRAINING, by_number
from .workbook import BLANK

BATCH, LR, AGREE = 32, 1e-3, 1e-6  # the losses must agree to AGREE, relative, at every step
NEEDED = range(1, TRAINING)  # the exercises of the Vision Transformer's track


def check_training(folder):
    """Train the MNIST preset on the learner's layers of the workbook in ``folder`` (those
    whose exercises passed their checks; the library's elsewhere) and on the library's,
    side by side; raise ``ExerciseFailed`` where the losses part. Either way the two loss
    curves and the gradient norms are drawn beside the workbook's files."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    progress = Progress(folder)
    passed = [n for n in NEEDED if progress.read().get(n) == "pass"]
    changed = [n for n in passed if changed_since_checked(folder, by_number(n), progress)]
    if changed:
        numbers = ", ".join(str(n) for n in changed)
        raise ExerciseFailed(f"exercise {TRAINING} trains on your layers that passed their "
                             f"checks, but the code of exercise(s) {numbers} changed since "
                             f"passing: check again first (python -m tinyvit.learn check "
                             f"{changed[0]} {folder})")
    if not passed:
        progress.record(TRAINING, "blank")
        raise ExerciseFailed(f"exercise {TRAINING} trains on your layers where they pass their "
                             f"checks: none of exercises 1-{TRAINING - 1} has passed yet "
                             f"(python -m tinyvit.learn status {folder})")
    yours, mine = _learners_classes(folder, passed)
    with using_backend("numpy"), default_dtype("float64"):
        try:
            batches = _batches(folder)
        except DatasetError as error:
            raise ExerciseFailed(f"exercise {TRAINING} trains on MNIST: {error} (write the "
                                 f"folder of the files into {folder / MARKER}, or set "
                                 "TINYVIT_DATA)") from None
        library, losses, norms = _losses(yours, batches)
    picture = pictures.training(library, losses, norms, folder / pictures.TRAINING_PICTURE,
                                f"yours: {mine}")
    parted = np.flatnonzero(_apart(library, losses))
    steps = len(library)
    table = [f"step {s:>3}: yours {losses[s]:.10f}, the library's {library[s]:.10f}"
             for s in sorted({0, steps // 4, steps // 2, 3 * steps // 4, steps - 1})]
    whose = (f"yours: {mine or 'none'}; the library's: every other layer (exercises not passed: "
             f"{', '.join(str(n) for n in _trains(NEEDED) if n not in passed) or 'none'})")
    drawn = f"The curves, drawn: {picture}"
    if parted.size:
        step = int(parted[0])
        progress.record(TRAINING, "fail")
        raise ExerciseFailed("\n".join([
            f"exercise {TRAINING} (training): the loss curves part at step {step}: yours "
            f"{losses[step]:.10f}, the library's {library[step]:.10f}; a backward that passed "
            "its checks is still wrong somewhere the checks did not look (run every exercise "
            "again: python -m pytest)", whose, *table, drawn]))
    progress.record(TRAINING, "pass")
    print("\n".join([f"exercise {TRAINING} (training): PASS, {steps} steps of the MNIST preset "
                     f"on your backward passes, the same losses as the library's to {AGREE:g}",
                     whose, *table, drawn]))


def _trains(numbers):
    """The exercises among ``numbers`` whose code the training can run (``_run``)."""
    return [n for n in numbers if n in _run()]


@functools.cache
def _run():
    """The exercises whose code the training can run: a method of a layer the MNIST preset
    has (or of its loss), its first exercise (GELU's exact form, not the tanh form; not
    Tanh, nor LayerNorm through its intermediates), or a function the library's module of
    such a layer calls (not softmax through its Jacobian)."""
    used = {type(module) for _, module in _preset().named_modules()} | {SoftmaxCrossEntropy}
    called = {id(value) for layer in used for value in vars(sys.modules[layer.__module__]).values()}
    first = {(ex.reference, ex.method): ex for ex in reversed(EXERCISES) if ex.method}

    def runs(ex):
        if ex.is_function:
            return id(ex.reference) in called
        return ex.reference in used and first[(ex.reference, ex.method)] is ex

    return frozenset(ex.number for ex in EXERCISES if runs(ex))


def _preset():
    """The MNIST preset the training exercise trains, mean-pooled, from seed 0."""
    return create_model("mnist", pool="mean", seed=0)


def _learners_classes(folder, passed):
    """{the library's class: the learner's} for the exercises in ``passed`` that the
    training runs (``_trains``), read from the workbook's files (``written``), and what
    they are, said (a function where one of the learner's layers calls it); Attention
    takes both of the learner's methods where both passed (its core, exercise 12; the
    layer, 15)."""
    passed = _trains(passed)
    functions = {ex.reference: getattr(written(folder, ex), ex.yours)
                 for ex in EXERCISES if ex.number in passed and ex.is_function}
    classes, names, called = {}, [], set()
    for ex in EXERCISES:
        if ex.number not in passed or ex.is_function:
            continue
        module = written(folder, ex)
        for name, value in list(vars(module).items()):  # the learner's, where imported
            if callable(value) and value in functions:
                setattr(module, name, functions[value])
                called.add(value)
        classes.setdefault(ex.reference, {})[ex.method] = getattr(module, ex.yours)
        names.append(f"{ex.title} ({ex.number})")
    names += [f"{ex.yours} ({ex.number}, inside your layers that call it)"
              for ex in EXERCISES if ex.reference in called]
    yours = {reference: type(f"Your{reference.__name__}", (reference,),
                             {name: cls.__dict__[name] for name, cls in methods.items()})
             for reference, methods in classes.items()}
    return yours, ", ".join(names)


def changed_since_checked(folder, ex, progress):
    """Whether exercise ``ex``'s last check (passed or failed) read other code than its
    file (or its notebook, where that was written last) holds now; False where no digest
    was kept."""
    checked = progress.checked_code().get(ex.number)
    if checked is None:
        return False
    try:
        now = fingerprint(ex, getattr(written(folder, ex), ex.yours))
    except Exception:  # it no longer runs, or lost its class: changed
        return True
    return now != checked


def written(folder, ex):
    """The module of the learner's code for exercise ``ex``: its ``.py`` file, or its
    notebook where only the notebook's blank is written, or it was written last."""
    files = [folder / ex.filename, folder / ex.notebook]
    done = [path for path in files if path.is_file() and _is_written(path, ex)]
    path = max(done, key=lambda p: p.stat().st_mtime) if done else files[0]
    return load_notebook(path) if path.suffix == ".ipynb" else load_exercise(path)


def _is_written(path, ex):
    """Whether the blank of ``path`` (a file, or a notebook's code) is written."""
    code = notebook_code(path) if path.suffix == ".ipynb" else path.read_text()
    return BLANK.format(number=ex.number) not in code


def _batches(folder):
    settings = json.loads((folder / MARKER).read_text())
    data_dir = settings.get("data_dir") or os.environ.get("TINYVIT_DATA")
    images, labels = load_dataset("mnist", "train", data_dir=data_dir)
    info = dataset_info("mnist")
    return Batches(images[:STEPS * BATCH], labels[:STEPS * BATCH], BATCH, mean=info.mean,
                   std=info.std, shuffle=True, drop_last=True)


def _losses(yours, batches):
    """The losses of the MNIST preset (mean-pooled) from seed 0, step by step, of the
    library's layers and of the learner's (``yours``), up to the first step at which
    they part, or to the end; and the gradient norm of each part of the learner's model
    at each step ({part: [norm]})."""
    library, mine = _Trainer({}), _Trainer(yours)
    losses, norms = [], {}
    with tqdm(batches.epoch(0), total=len(batches), desc=f"exercise {TRAINING}", unit="step",
              leave=False) as bar:
        for step, (x, y) in enumerate(bar):
            losses.append((library.step(x, y, step), mine.step(x, y, step)))
            for part, norm in mine.norms.items():
                norms.setdefault(part, []).append(norm)
            if _apart(*losses[-1]):
                break
    return (*np.array(losses).T, norms)


def _apart(library, mine):
    """Whether the learner's loss differs from the library's by more than AGREE, relative
    (for one step, or elementwise for the curves)."""
    return abs(mine - library) > AGREE * abs(library)


class _Trainer:
    """The MNIST preset (mean-pooled) from seed 0 with AdamW, its layers the learner's
    where ``yours`` ({the library's class: the learner's}) has them."""

    def __init__(self, yours):
        self.model = _preset()
        for _, module in self.model.named_modules():
            if type(module) in yours:
                module.__class__ = yours[type(module)]
        self.criterion = yours.get(SoftmaxCrossEntropy, SoftmaxCrossEntropy)(label_smoothing=0.1)
        self.optimizer = AdamW(self.model, lr=LR, weight_decay=0.05)

    def step(self, x, y, step):
        """One training step; returns its loss, and keeps each part's gradient norm
        (``norms``: the class token and the position embedding, each block, the rest)."""
        loss, _ = loss_and_gradients(self.model, self.criterion, x, y, seed=(0, step))
        squares = {}
        for name, p in self.model.named_parameters():
            part = ".".join(name.split(".")[:2]) if name.startswith("blocks.") else \
                name.split(".")[0]
            squares[part] = squares.get(part, 0.0) + float((p.grad * p.grad).sum())
        self.norms = {part: square ** 0.5 for part, square in squares.items()}
        self.optimizer.step()
        return float(loss)
