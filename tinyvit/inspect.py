"""``python -m tinyvit.inspect CHECKPOINT``: the ViT paper's inspection pictures of a
trained checkpoint, as PNGs (``tinyvit/viz/inspection.py`` draws them).

    python -m tinyvit.inspect runs/mnist/best.npz --image digit.png --out pictures/
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from . import cli
from .backend import BACKENDS, BackendError, environment_backend, set_backend, xp
from .data import DatasetError, dataset_info, load_image
from .train import load_trained, make_batches
from .viz.inspection import write_pictures


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m tinyvit.inspect",
        description="Draw the ViT paper's inspection pictures of a trained checkpoint as PNGs.",
    )
    p.add_argument("checkpoint",
                   help="a training checkpoint (best.npz, last.npz) or its run folder")
    p.add_argument("--image", nargs="+", default=[], metavar="FILE",
                   help="image(s) for the attention maps (default: the first test images)")
    p.add_argument("--data-dir",
                   help="where the checkpoint's dataset is (default: as in its config)")
    p.add_argument("--num-images", type=int, default=256,
                   help="test images for the mean attention distance (default 256)")
    p.add_argument("--num-maps", type=int, default=6,
                   help="test images for the attention maps when no --image is given (default 6)")
    p.add_argument("--out", help="output folder (default: <checkpoint folder>/inspect)")
    p.add_argument("--backend", choices=BACKENDS,
                   help="the array backend (default: the one TINYVIT_BACKEND names, numpy "
                        "where it is unset)")
    args = p.parse_args(argv)
    try:
        args.backend = args.backend or environment_backend()
    except ValueError as error:  # TINYVIT_BACKEND's value
        p.error(str(error))
    if args.num_images < 1 or args.num_maps < 1:
        p.error("--num-images and --num-maps must be at least 1")
    return args


def _checkpoint_path(path):
    path = Path(path)
    return path / "best.npz" if path.is_dir() else path


def _test_images(config, n):
    """The first ``n`` normalized test images of the checkpoint's dataset, or None
    (with a note) when the dataset cannot be found or read."""
    config = dataclasses.replace(config, test_subset=n, eval_batch_size=n)
    try:
        images, _ = next(make_batches(config, "test").epoch(0))
    except DatasetError as e:
        print(f"note: {config.dataset} test set not available ({e}); give --data-dir to use it")
        return None
    return images


def main(argv=None):
    args = parse_args(argv)
    try:
        set_backend(args.backend)
    except BackendError as e:
        sys.exit(f"inspect: {e}")
    checkpoint = _checkpoint_path(args.checkpoint)
    try:
        model, config = load_trained(checkpoint)
        # each (1, C, H, W)
        given = [load_image(path, config.dataset, config.image_size()) for path in args.image]
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"inspect: {e}")
    if args.data_dir:
        config = dataclasses.replace(config, data_dir=args.data_dir)
    given = xp.concatenate(given) if given else None
    test = _test_images(config, max(args.num_images, args.num_maps))
    if given is None and test is None:
        sys.exit("inspect: no images to look at: give --image FILE or --data-dir with the test set")
    map_images = given if given is not None else test[:args.num_maps]
    distance_images = test[:args.num_images] if test is not None else given
    out = Path(args.out) if args.out else checkpoint.parent / "inspect"
    paths = write_pictures(model, out, map_images, distance_images,
                           dataset_info(config.dataset).classes)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
