"""Where a training step's time goes: exclusive milliseconds per layer method and trainer part.

    python benchmarks/layer_profile.py                               # cifar10-gpu's model,
                                                                     # batch 256
    CUPY_TF32=1 python benchmarks/layer_profile.py --gpu             # the same on CuPy
    python benchmarks/layer_profile.py --recipe cifar10 --batch 128  # another train_mnist.py recipe
    python benchmarks/layer_profile.py --config B                    # benchmark.py's config B

The step is the trainer's own (``Trainer.step`` on batches from ``Batches`` with the
recipe's augmentation and mixing), on random uint8 images, in one process; with
``--config``, the step ``benchmark.py`` times (``runners.py``: forward, loss, backward and
AdamW on one fixed batch, batch 128 unless ``--batch`` says otherwise). Every
forward and backward of the layer classes, the loss, the optimizer's update and each
augmentation is wrapped with a timer; a call is charged its time minus that of the
wrapped calls inside it (exclusive time), so the parts add up to the whole step.
On a GPU each wrapped call starts and ends with a synchronization, so that its
kernels are charged to it; that keeps the GPU from running ahead of Python, and
the parts then add up to more than an unwrapped step, which is timed first and
printed too.
"""

import argparse
import collections
import dataclasses
import functools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # train_mnist.py's RECIPES

import train_mnist  # noqa: E402
from machine import check_kernel_settings, cpu_kernels, describe_cpu_kernels  # noqa: E402
from runners import CONFIGS, RUNNER_NAMES, make_runner  # noqa: E402
from tinyvit import allocator, backend, fast  # noqa: E402
from tinyvit.data import augment, dataset_info  # noqa: E402
from tinyvit.models import hybrid, vit  # noqa: E402
from tinyvit.nn import conv, layers, loss, module  # noqa: E402
from tinyvit.train import build_model  # noqa: E402
from tinyvit.train.build import training_batches  # noqa: E402
from tinyvit.train.step import Trainer  # noqa: E402

# every layer class (each Module subclass defined in these modules), the loss included
LAYERS = [cls for source in (module, layers, conv, hybrid, vit, loss)
          for cls in vars(source).values()
          if isinstance(cls, type) and issubclass(cls, module.Module) and cls is not module.Module
          and cls.__module__ == source.__name__]
AUGMENTATIONS = ("random_crop", "horizontal_flip", "random_erasing", "mixup", "cutmix")
# the methods timed, each charged as the forward or backward it is part of: the fast tier's
# blocks call a LayerNorm's or a Linear's own entry points in place of forward and backward
METHODS = {"forward": "forward", "backward": "backward", "project": "forward",
           "forward_residual": "forward", "backward_residual": "backward",
           "add_forward": "forward", "backward_add": "backward"}


class Profile:
    """Exclusive seconds per label, from wrapped functions that may call each other."""

    def __init__(self, sync):
        self.sync, self.seconds, self.open = sync, collections.Counter(), []

    def wrap(self, owner, name, label):
        """Time ``owner.name`` from now on, charged to ``label``: a string, or a function
        of the call's arguments that names it."""
        function = getattr(owner, name)
        name_of = label if callable(label) else (lambda *args: label)

        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            self.open.append(0.0)  # time of the wrapped calls inside this one
            result = function(*args, **kwargs)
            self.sync()
            spent = time.perf_counter() - start
            self.seconds[name_of(*args)] += spent - self.open.pop()
            if self.open:
                self.open[-1] += spent
            return result

        setattr(owner, name, timed)


def timed_methods():
    """(class, method name, label) of every forward and backward a step may run (METHODS):
    the layers' and, where the fast tier has a kernel on the active backend, the kernel's,
    each method where its class defines it. The label names the layer the call ran on
    (a kernel's by its reference layer) and the pass: ``ClassAttention.backward``, though
    the method is ``Attention``'s; ``LayerNorm.forward`` for ``forward_residual``."""
    kernels = fast.kernels()
    seen = set()
    for cls in LAYERS:
        for name, part in METHODS.items():
            for built in (cls, kernels.get(cls, cls)):
                owner = next((c for c in built.__mro__ if name in vars(c)), module.Module)
                if owner is not module.Module and (owner, name) not in seen:
                    seen.add((owner, name))
                    yield owner, name, functools.partial(layer_label, part)


def layer_label(part, layer, *args):
    """"Layer.part" for a call on ``layer``."""
    return f"{layer_name(type(layer))}.{part}"


@functools.cache
def layer_name(cls):
    """The name of the first of LAYERS in ``cls``'s MRO (a fast kernel subclasses its
    reference layer), once per class: the timers call it on every call they time."""
    return next(c for c in cls.__mro__ if c in LAYERS).__name__


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", choices=sorted(train_mnist.RECIPES),
                   help="the recipe whose step is timed (default cifar10-gpu)")
    p.add_argument("--config", choices=sorted(CONFIGS), type=str.upper,
                   help="benchmark.py's model and step in place of a recipe's")
    p.add_argument("--batch", type=int, help="batch size (default: the recipe's, or 128)")
    p.add_argument("--images", type=int, default=4096,
                   help="random images per epoch (with --config: images / batch steps)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs, after one untimed")
    p.add_argument("--gpu", action="store_true", help="CuPy (else NumPy, in one process)")
    p.add_argument("--reference", action="store_true",
                   help="the reference layers of tinyvit/nn (else the fast kernels, as training)")
    args = p.parse_args(argv)
    check_kernel_settings(p)
    if args.config and args.recipe:
        p.error(f"--config {args.config} and --recipe {args.recipe} each name a step: give one")
    args.recipe = args.recipe or "cifar10-gpu"
    for name in ("batch", "images", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def recipe_step(args):
    """(what runs, its optimizer, ``run(phase)``): the recipe's trainer over fresh batches,
    one epoch in phase 0 (the warm-up), ``args.epochs`` in phases 1 and 2; ``run``
    returns (steps, seconds)."""
    trainer = make_trainer(args)
    title = (f"recipe {args.recipe}: {trainer.model.num_parameters():,} parameters, "
             f"batch {trainer.config.batch_size}")

    def run(phase):  # batches made anew: a pipeline keeps the functions it was built from
        first = 1 + (phase - 1) * args.epochs
        epochs = [0] if phase == 0 else range(first, first + args.epochs)
        return train(trainer, make_batches(trainer.config, args.images), epochs)

    return title, trainer.model, trainer.optimizer, run


def config_step(args):
    """As ``recipe_step``, for benchmark.py's config ``args.config``: its runner's step on
    its fixed batch, ``args.images // batch`` steps an epoch."""
    backend.set_backend("cupy" if args.gpu else "numpy")
    batch = args.batch or 128
    runner = make_runner(RUNNER_NAMES["reference" if args.reference else "fast"],
                         CONFIGS[args.config], batch, args.gpu)
    runner.prepare_training()
    runner.set_training(True)
    title = f"config {args.config}: {runner.model.num_parameters():,} parameters, batch {batch}"

    def run(phase):
        steps = max(1, args.images // batch) * (1 if phase == 0 else args.epochs)
        backend.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            runner.train_step()
        runner.final_loss()  # waits for the last step
        return steps, time.perf_counter() - start

    return title, runner.model, runner.optimizer, run


def make_trainer(args):
    """The recipe's Trainer, on the backend asked for."""
    recipe = train_mnist.make_config(train_mnist.parse_args(["--recipe", args.recipe])[0])
    config = dataclasses.replace(recipe, backend="cupy" if args.gpu else "numpy",
                                 batch_size=args.batch or recipe.batch_size,
                                 tier="reference" if args.reference else "fast")
    backend.set_backend(config.backend)
    return Trainer(config, build_model(config)[0])


def make_batches(config, count):
    """The recipe's training batches over ``count`` random images."""
    info = dataset_info(config.dataset)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(count, *info.image_shape), dtype=np.uint8)
    labels = rng.integers(0, len(info.classes), size=count)
    return training_batches(config, images, labels)


def train(trainer, batches, epochs):
    """Steps over ``epochs``; returns (steps, seconds) from the first batch to the last result."""
    backend.synchronize()
    start, steps = time.perf_counter(), 0
    for epoch in epochs:
        for index, (x, y) in enumerate(batches.epoch(epoch)):
            loss_value = trainer.step(x, y, trainer.config.lr, (0, epoch, index))[0]
            steps += 1
    float(loss_value)  # waits for the last step
    return steps, time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    allocator.keep_freed_memory()
    title, model, optimizer, run = (config_step if args.config else recipe_step)(args)
    kernels = "" if args.gpu else f"; {describe_cpu_kernels(cpu_kernels())}"
    print(f"{title}, backend {backend.get_backend()}, {model.describe_tier()}{kernels}")
    run(0)  # warm-up: allocations, and on a GPU the kernels' compilation
    steps, seconds = run(1)
    print(f"step without the timers: {1e3 * seconds / steps:.2f} ms ({steps} steps)")

    profile = Profile(backend.synchronize)
    for owner, name, label in timed_methods():
        profile.wrap(owner, name, label)
    for name in AUGMENTATIONS:
        profile.wrap(augment, name, f"augment.{name}")
    profile.wrap(optimizer, "update", f"{type(optimizer).__name__}.update")
    steps, seconds = run(2)
    rest = seconds - sum(profile.seconds.values())
    print(f"step with the timers: {1e3 * seconds / steps:.2f} ms; exclusive ms per step:")
    for label, spent in [*profile.seconds.most_common(), ("everything else", rest)]:
        print(f"  {label:30s} {1e3 * spent / steps:8.2f}")


if __name__ == "__main__":
    main()
