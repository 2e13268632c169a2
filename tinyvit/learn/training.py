"""The last exercise: the MNIST preset trained on the learner's own backward passes.

The model is built twice from one seed: once of the library's layers, once with
every layer that the learner has written taking the learner's class (a class swap,
as ``tinyvit.fast.accelerate`` does it), whose methods call the learner's functions
where their files import the library's (the softmax backward, splitting and merging
the heads' gradients). Both train step by step, side by side, on the same batches
in float64, and their losses must be the same at every step: a backward that is
right only at some shapes, or only where the checks looked, parts the curves, and
the training stops there.
"""

import json
import os

import numpy as np  # the two loss curves, on the host
from tqdm import tqdm

from ..backend import default_dtype, using_backend
from ..data import Batches, DatasetError, dataset_info, load_dataset
from ..models import create_model
from ..nn.loss import SoftmaxCrossEntropy
from ..nn.optim import AdamW
from ..train.gradients import loss_and_gradients
from .checking import MARKER, ExerciseFailed, Progress, load_exercise
from .exercises import EXERCISES, STEPS, TRAINING

BATCH, LR, AGREE = 32, 1e-3, 1e-6  # the losses must agree to AGREE, relative, at every step
NEEDED = range(1, TRAINING)  # the exercises of the Vision Transformer's track


def check_training(folder):
    """Train the MNIST preset on the learner's layers of the workbook in ``folder`` and
    on the library's, side by side; raise ``ExerciseFailed`` where the losses part."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    progress = Progress(folder)
    missing = [n for n in NEEDED if progress.read().get(n) != "pass"]
    if missing:
        progress.record(TRAINING, "blank")
        raise ExerciseFailed(f"exercise {TRAINING} trains on your layers: pass exercises "
                             f"{', '.join(map(str, missing))} first (python -m tinyvit.learn "
                             f"status {folder})")
    yours = _learners_classes(folder)
    with using_backend("numpy"), default_dtype("float64"):
        try:
            batches = _batches(folder)
        except DatasetError as error:
            raise ExerciseFailed(f"exercise {TRAINING} trains on MNIST: {error} (write the "
                                 f"folder of the files into {folder / MARKER}, or set "
                                 "TINYVIT_DATA)") from None
        library, mine = _losses(yours, batches)
    parted = np.flatnonzero(_apart(library, mine))
    steps = len(library)
    table = [f"step {s:>3}: yours {mine[s]:.10f}, the library's {library[s]:.10f}"
             for s in sorted({0, steps // 4, steps // 2, 3 * steps // 4, steps - 1})]
    if parted.size:
        step = int(parted[0])
        progress.record(TRAINING, "fail")
        raise ExerciseFailed("\n".join([
            f"exercise {TRAINING} (training): the loss curves part at step {step}: yours "
            f"{mine[step]:.10f}, the library's {library[step]:.10f}; a backward that passed its "
            "checks is still wrong somewhere the checks did not look (run every exercise "
            "again: python -m pytest)", *table]))
    progress.record(TRAINING, "pass")
    print("\n".join([f"exercise {TRAINING} (training): PASS, {steps} steps of the MNIST preset "
                     f"on your backward passes, the same losses as the library's to {AGREE:g}",
                     *table]))


def _learners_classes(folder):
    """{the library's class: the learner's} from the workbook's files; Attention takes
    both of the learner's methods (its core, exercise 12; the layer, exercise 15)."""
    functions = {ex.reference: getattr(load_exercise(folder / ex.filename), ex.yours)
                 for ex in EXERCISES if ex.number in NEEDED and ex.is_function}
    classes = {}
    for ex in EXERCISES:  # the first exercise of a method wins: GELU's exact form, not tanh's
        if ex.number in NEEDED and ex.method:
            module = load_exercise(folder / ex.filename)
            for name, value in list(vars(module).items()):  # the learner's, where imported
                if callable(value) and value in functions:
                    setattr(module, name, functions[value])
            classes.setdefault(ex.reference, {}).setdefault(ex.method, getattr(module, ex.yours))
    return {reference: type(f"Your{reference.__name__}", (reference,),
                            {name: cls.__dict__[name] for name, cls in methods.items()})
            for reference, methods in classes.items()}


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
    they part, or to the end."""
    library, mine = _Trainer({}), _Trainer(yours)
    losses = []
    with tqdm(batches.epoch(0), total=len(batches), desc=f"exercise {TRAINING}", unit="step",
              leave=False) as bar:
        for step, (x, y) in enumerate(bar):
            losses.append((library.step(x, y, step), mine.step(x, y, step)))
            if _apart(*losses[-1]):
                break
    return np.array(losses).T


def _apart(library, mine):
    """Whether the learner's loss differs from the library's by more than AGREE, relative
    (for one step, or elementwise for the curves)."""
    return abs(mine - library) > AGREE * abs(library)


class _Trainer:
    """The MNIST preset (mean-pooled) from seed 0 with AdamW, its layers the learner's
    where ``yours`` ({the library's class: the learner's}) has them."""

    def __init__(self, yours):
        self.model = create_model("mnist", pool="mean", seed=0)
        for _, module in self.model.named_modules():
            if type(module) in yours:
                module.__class__ = yours[type(module)]
        self.criterion = yours.get(SoftmaxCrossEntropy, SoftmaxCrossEntropy)(label_smoothing=0.1)
        self.optimizer = AdamW(self.model, lr=LR, weight_decay=0.05)

    def step(self, x, y, step):
        """One training step; returns its loss."""
        loss, _ = loss_and_gradients(self.model, self.criterion, x, y, seed=(0, step))
        self.optimizer.step()
        return float(loss)
