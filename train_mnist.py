"""Train a ViT on MNIST (or Fashion-MNIST, or CIFAR-10), evaluate it, or predict an image.

    python train_mnist.py --data-dir ../shared/data                          # MNIST, default recipe
    python train_mnist.py --data-dir ../shared/data --recipe mnist-long      # MNIST, longer recipe
    python train_mnist.py --data-dir ../shared/data --dataset fashion-mnist  # Fashion-MNIST
    python train_mnist.py --resume runs/mnist                                # continue after Ctrl-C
    python train_mnist.py --resume runs/mnist --out runs/mnist-2             # ... into another
    python train_mnist.py --eval runs/mnist/best.npz
    python train_mnist.py --predict digit.png --checkpoint runs/mnist/best.npz
    python train_mnist.py --data-dir ../shared/data --init runs/fashion-mnist --image-size 42
    mpiexec -n 4 python train_mnist.py --data-dir ../shared/data             # 4 processes (MPI)

Every flag is optional; ``--recipe`` picks a tested set of defaults (see
``RECIPES``) that the other flags then override.
"""

import argparse
import dataclasses
import re
import sys
import traceback
import warnings

from tinyvit import cli
from tinyvit.allocator import keep_freed_memory
from tinyvit.backend import BackendError, environment_backend, set_backend
from tinyvit.data import DatasetError, read_image
from tinyvit.fast import check_environment
from tinyvit.files import NoSpaceError
from tinyvit.train import (
    RunRefused,
    TrainConfig,
    TrainingDiverged,
    evaluate,
    fit,
    load_trained,
    make_batches,
)
from tinyvit.train.distributed import LaunchError, StopRequested, communicator, launched
from tinyvit.train.lock import FolderInUse
from tinyvit.train.loop import resume_path
from tinyvit.train.parallel import MAX_AUTO_WORKERS, WorkerDied, auto_workers
from tinyvit.train.predict import classify, trained_path
from tinyvit.train.signals import Stopped
from tinyvit.weights import CheckpointError, PretrainedError

# Tested recipes: what each sets on top of TrainConfig's defaults, which are the
# MNIST recipe (preset "mnist": patch 7, dim 64, depth 4; 18 epochs, AdamW peak
# 3e-3, random shift 1, label smoothing 0.1). What each reached, with its command,
# processor and date, is in docs/results.md.
RECIPES = {
    "mnist": dict(dataset="mnist"),
    "mnist-long": dict(dataset="mnist", model_overrides={"patch_size": 4}, epochs=40, lr=3e-3,
                       max_shift=2),
    "fashion-mnist": dict(dataset="fashion-mnist",
                          model_overrides={"patch_size": 4, "num_heads": 2, "pool": "mean"},
                          epochs=24, batch_size=32, lr=2e-3, max_shift=1, flip=True),
    # the cifar10 preset at dim 128 with 4 heads (811,146 parameters), mean-pooled
    "cifar10": dict(dataset="cifar10", model="cifar10",
                    model_overrides={"embed_dim": 128, "num_heads": 4, "pool": "mean"},
                    epochs=28, eval_every=5, lr=1e-3, warmup_epochs=2, max_shift=4, flip=True),
    # one GPU with CuPy (and CUPY_TF32=1): ViT-Lite-7/4 of the CCT paper (3,722,250 parameters),
    # mean-pooled, mixup or cutmix on every batch, random erasing
    "cifar10-gpu": dict(dataset="cifar10", model="cifar10", backend="cupy",
                        model_overrides={"embed_dim": 256, "depth": 7, "num_heads": 4,
                                         "pool": "mean"},
                        epochs=125, batch_size=256, eval_every=10, lr=1e-3, warmup_epochs=5,
                        max_shift=4, flip=True, erasing=0.25, mixup=0.8, cutmix=1.0),
    # hybrids (a convolutional stem, tinyvit/models/hybrid.py), each in a wall-clock budget: the
    # epochs are planned after the first so that the run ends within it on any processor
    "mnist-hybrid": dict(dataset="mnist", model="mnist_hybrid", budget=10, max_shift=2),
    "fashion-mnist-hybrid": dict(dataset="fashion-mnist", model="fashion_mnist_hybrid", budget=30,
                                 max_shift=2, flip=True),
    "cifar10-hybrid": dict(dataset="cifar10", model="cifar10_hybrid", budget=120, eval_every=5,
                           lr=2e-3, warmup_epochs=2, max_shift=4, flip=True),
    # one GPU with CuPy (and CUPY_TF32=1)
    "cifar10-hybrid-gpu": dict(dataset="cifar10", model="cifar10_hybrid_gpu", backend="cupy",
                               budget=15, batch_size=256, eval_every=10, lr=1e-3, warmup_epochs=5,
                               max_shift=4, flip=True, erasing=0.25, mixup=0.8, cutmix=1.0),
}

MODEL_FLAGS = ("image_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio",
               "dropout", "attn_dropout", "pool")

# The modes other than training, and the only other flags each reads: a resumed run
# takes every setting from its checkpoint, --out to continue into another folder than
# the checkpoint's, and --data-dir where the data has moved. Any other flag given with one of them
# would be silently ignored, so it is an error instead.
MODES = {"resume": ("out_dir", "data_dir"), "eval": ("data_dir", "test_subset", "backend"),
         "predict": ("checkpoint", "backend")}


def parse_args(argv):
    p = make_parser()
    args = p.parse_args(argv)
    return args, check_mode(p, args)


def flags_of(parser):
    """{dest: the flag that sets it}: warmup_epochs is --warmup."""
    return {action.dest: action.option_strings[0] for action in parser._actions
            if action.option_strings}


def make_parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES),
                   help="a tested recipe (default: the dataset's)")
    p.add_argument("--dataset", choices=["mnist", "fashion-mnist", "cifar10"])
    p.add_argument("--data-dir", help="folder with the dataset files "
                                      "(else $TINYVIT_DATA, the cache, a download)")
    p.add_argument("--out", dest="out_dir",
                   help="output folder (default runs/<recipe>; not one that holds a run)")
    p.add_argument("--backend", choices=["numpy", "cupy"],
                   help="the array backend (default: the recipe's, else the one "
                        "TINYVIT_BACKEND names, else numpy)")
    p.add_argument("--seed", type=int)
    p.add_argument("--workers", type=int,
                   help="processes sharing each batch on NumPy (default: one per "
                        f"CPU core, at most {MAX_AUTO_WORKERS}; 1 on cupy or under mpiexec)")
    p.add_argument("--reference", dest="tier", action="store_const", const="reference",
                   help="train the reference layers of tinyvit/nn as written, not the fast "
                        "kernels of tinyvit/fast (slower)")
    p.add_argument("--cuda-graph", action="store_true", default=None,
                   help="on a GPU, capture the training step in a CUDA graph and replay it "
                        "(one launch a step instead of a few hundred)")
    g = p.add_argument_group("model (a preset, then any field)")
    g.add_argument("--model", help="preset: mnist, cifar10, mnist_hybrid, cifar10_hybrid, "
                                   "vit_tiny_patch16_224, ...")
    g.add_argument("--image-size", type=int,
                   help="side the model sees, the images resized to it (default: the dataset's)")
    g.add_argument("--patch-size", type=int)
    g.add_argument("--embed-dim", type=int)
    g.add_argument("--depth", type=int)
    g.add_argument("--num-heads", type=int)
    g.add_argument("--mlp-ratio", type=float)
    g.add_argument("--dropout", type=float)
    g.add_argument("--attn-dropout", type=float)
    g.add_argument("--pool", choices=["cls", "mean"])
    g = p.add_argument_group("optimization")
    g.add_argument("--epochs", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--optimizer", choices=["adamw", "sgd"])
    g.add_argument("--lr", type=float, help="peak learning rate")
    g.add_argument("--min-lr", type=float)
    g.add_argument("--warmup", dest="warmup_epochs", type=float, help="warmup epochs")
    g.add_argument("--weight-decay", type=float)
    g.add_argument("--label-smoothing", type=float)
    g.add_argument("--clip-grad", type=float, help="max global gradient norm (0: off)")
    g.add_argument("--budget", type=float, metavar="MINUTES",
                   help="plan the epochs after the first so the run ends within this time "
                        "(0: no budget, the recipe's epochs)")
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--init", metavar="CKPT_OR_DIR",
                   help="start from these weights: a checkpoint, a run folder (its best.npz), or "
                        "pre-trained weights (timm or Hugging Face safetensors, "
                        "the ViT paper's .npz)")
    g.add_argument("--reset-head", action="store_true", default=None,
                   help="with --init: a zero head even when the class count matches")
    g.add_argument("--freeze-backbone", action="store_true", default=None,
                   help="train the head alone (a linear probe)")
    g = p.add_argument_group("augmentation")
    g.add_argument("--shift", dest="max_shift", type=int,
                   help="random translation in pixels (0: off)")
    g.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--erasing", type=float, help="random erasing probability")
    g.add_argument("--mixup", type=float, help="mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, help="cutmix alpha (0: off)")
    g = p.add_argument_group("other modes")
    g.add_argument("--resume", metavar="CKPT_OR_DIR", help="continue a run from its last.npz")
    g.add_argument("--eval", metavar="CKPT", help="evaluate a checkpoint on the test set")
    g.add_argument("--predict", metavar="IMAGE", nargs="+",
                   help="print the top-3 classes of each image file (several allowed)")
    g.add_argument("--checkpoint", metavar="CKPT",
                   help="checkpoint (or run folder: its best.npz) for --predict")
    g.add_argument("--train-subset", type=int,
                   help="train on the first N images only (0: all of them)")
    g.add_argument("--test-subset", type=int,
                   help="evaluate on the first N images only (0: all of them)")
    g.add_argument("--eval-every", type=int,
                   help="epochs between test evaluations (the last is always evaluated)")
    return p


def check_mode(parser, args):
    """The mode: "train", or the one of --resume, --eval and --predict given, with only
    the flags it reads; otherwise a ValueError that names the flags."""
    flag = flags_of(parser)
    given = [dest for dest, value in vars(args).items() if value is not None]
    modes = [dest for dest in given if dest in MODES]
    if len(modes) > 1:
        raise ValueError(f"{' and '.join(flag[m] for m in modes)} are separate modes: give one")
    if ("predict" in given) != ("checkpoint" in given):
        raise ValueError("--predict IMAGE and --checkpoint CKPT go together: give both or neither")
    if not modes:
        return "train"
    mode = modes[0]
    ignored = [flag[dest] for dest in given if dest != mode and dest not in MODES[mode]]
    if ignored:
        read = [flag[dest] for dest in MODES[mode]]
        reads = " and ".join(filter(None, (", ".join(read[:-1]), read[-1])))
        reads = (f"every setting from the checkpoint, and {reads}" if mode == "resume"
                 else f"only {reads}")
        again = (f"; to change them, train a new run from its weights: --init "
                 f"{resume_path(args.resume)} with the flags" if mode == "resume" else "")
        raise ValueError(f"{flag[mode]} takes {reads}: it would ignore {', '.join(ignored)}"
                         f"{again}")
    return mode


def make_config(args):
    """TrainConfig = its defaults, then the recipe, then the flags given."""
    recipe = dict(RECIPES.get(args.recipe or args.dataset or "mnist", {}))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if v is not None}
    recipe_model = recipe.pop("model_overrides", {})
    if "init" in given:  # the file's model: a recipe's is one trained from scratch
        recipe_model = {}
        if "model" in given:
            raise ValueError("--init takes the model of its weights: it would ignore --model")
    model_overrides = {**recipe_model, **{k: given[k] for k in MODEL_FLAGS if k in given}}
    if "budget" in given and "epochs" in given:
        raise ValueError("--budget plans the epochs after the first: it would ignore --epochs; "
                         "give one")
    if "epochs" in given:  # the flag beats a recipe's budget
        recipe.pop("budget", None)
    values = {**recipe, **{k: v for k, v in given.items() if k in fields}}
    values.setdefault("out_dir", f"runs/{args.recipe or values.get('dataset', 'mnist')}")
    if "backend" not in values:  # neither --backend nor the recipe's
        values["backend"] = environment_backend()
    if launched()[1] == 1:  # under mpiexec, its processes share each batch
        values.setdefault("workers", auto_workers(values.get("backend", "numpy")))
    try:
        config = TrainConfig(**values, model_overrides=model_overrides)
        # a --warmup that outlasts the run; not a recipe's under fewer --epochs (a run of one
        # epoch to time a recipe), nor with a budget, whose epochs are planned after the first
        if "warmup_epochs" in given and config.warmup_epochs > config.epochs and not (
                config.budget):
            raise ValueError(f"warmup_epochs must be at most epochs (the learning rate rises to "
                             f"lr over the warmup), got warmup_epochs {config.warmup_epochs:g} "
                             f"and epochs {config.epochs}")
    except ValueError as error:  # said with the flags the user gave, not the fields they set
        raise ValueError(said_with_flags(str(error), given)) from None
    return config


def said_with_flags(message, given):
    """``message`` with each field that a flag given sets named as that flag:
    "warmup_epochs must be at most epochs" is "--warmup must be at most --epochs"."""
    flags = {dest: flag for dest, flag in flags_of(make_parser()).items() if dest in given}
    if not flags:
        return message
    words = re.compile(r"\b(" + "|".join(map(re.escape, flags)) + r")\b")
    return words.sub(lambda match: flags[match.group(1)], message)


def run(args, mode, config):
    """Train, resume, evaluate or predict, as ``mode`` says."""
    if mode in ("eval", "predict"):  # a run's backend is its config's
        set_backend(args.backend or environment_backend())
    if mode == "predict":
        model, config = load_trained(args.checkpoint)
        # every file read before any is answered: a bad one stops the command at once
        pictures = [read_image(path, config.dataset, config.image_size())
                    for path in args.predict]
        for path, (image, changes) in zip(args.predict, pictures, strict=True):
            classes = classify(model, config, image)
            print(f"{path} ({', '.join(changes)}), the top {len(classes)} classes of "
                  f"{config.dataset} according to {trained_path(args.checkpoint)}:")
            for name, prob in classes:
                print(f"  {name}: {prob:.4f}")
    elif mode == "eval":
        model, config = load_trained(args.eval)
        try:  # the flags checked as a run's
            config = dataclasses.replace(config, data_dir=args.data_dir or config.data_dir,
                                         test_subset=args.test_subset or 0)
        except ValueError as error:
            raise RunRefused(str(error)) from None
        loss, acc, _, labels = evaluate(model, make_batches(config, "test"))
        print(f"{trained_path(args.eval)}: test accuracy {acc:.4f}, loss {loss:.4f} "
              f"({config.dataset}, {len(labels):,} test images)")
    else:
        fit(config, resume=args.resume, out_dir=args.out_dir, data_dir=args.data_dir)


def main(argv=None):
    """The command's exit status. Under mpiexec every process runs it, and the first
    error in any one of them ends them all."""
    rank, size = launched()
    try:
        args, mode = parse_args(argv)
        with warnings.catch_warnings():  # more threads than cores: the start's line says it
            warnings.simplefilter("ignore", RuntimeWarning)  # where the kernels run here
            check_environment()  # TINYVIT_NUM_THREADS, TINYVIT_NUMBA, TINYVIT_MKL, read again
        if mode in ("eval", "predict") and args.backend is None:  # TINYVIT_BACKEND's
            environment_backend()
        config = make_config(args) if mode == "train" else None
        world = communicator() if size > 1 else None
    except (ValueError, LaunchError) as error:  # a flag out of range, or one its mode would
        if rank == 0:  # ignore, or mpi4py missing: the same in every process
            print(f"train_mnist.py: error: {error}", file=sys.stderr)
        return 2
    if mode in ("eval", "predict") and rank > 0:  # one process does it: the others have no part
        return 0
    keep_freed_memory()  # this process is ours: reuse freed arrays' pages (tinyvit/allocator.py)
    try:
        code = run_reporting_errors(args, mode, config)
    except StopRequested:  # every process stopped at the same step; the first saved last.npz
        return 130
    except Exception:  # a bug
        if world is None:
            raise
        traceback.print_exc()
        code = 1
    # an error or an interruption of this process alone (a launch error, 2, is every process's):
    # the others may be waiting for it in a collective that would never end
    if world is not None and code not in (0, 2):
        world.abort(code)
    return code


def run_reporting_errors(args, mode, config):
    """``run``, with the errors that are not bugs reported in one line; returns the
    exit status."""
    rank, size = launched()
    process = f" (process {rank} of {size})" if size > 1 else ""
    try:
        run(args, mode, config)
    except LaunchError as error:  # the same in every process: the first says it
        if rank == 0:
            print(f"train_mnist.py: error: {error}", file=sys.stderr)
        return 2
    except RunRefused as error:  # the same in every process: the first says it
        if rank == 0:
            print(f"train_mnist.py: error: {error}", file=sys.stderr)
        return 2
    except (DatasetError, CheckpointError, PretrainedError, FileNotFoundError, BackendError,
            TrainingDiverged, NoSpaceError, FolderInUse, PermissionError, WorkerDied) as error:
        # not a bug: a file it was given, a backend not installed here, a learning rate
        # too high for the run, a full disk, a folder another run writes into, one this
        # user may not write, or a worker process killed (by the system, out of memory)
        print(f"train_mnist.py: error{process}: {error}", file=sys.stderr)
        return 1
    except StopRequested:  # for main: not this process's alone
        raise
    except Stopped as stopped:  # SIGINT or SIGTERM: a training run has saved last.npz by now
        return 128 + stopped.signum
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
