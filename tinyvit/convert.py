"""Convert a ViT checkpoint between formats:

    python -m tinyvit.convert SRC DST [--num-heads NH] [--num-classes K] [--dtype float32|float64]

SRC is anything ``tinyvit.weights.read_pretrained`` reads: a Hugging Face
folder, a timm or Hugging Face ``.safetensors`` file, the ViT paper's JAX ``.npz``,
a tinyvit model file or training checkpoint. DST's suffix picks the output:
``.npz`` a tinyvit model file (``tinyvit.weights.load_model``), ``.safetensors``
timm's layout with a ``config.json`` beside it (``save_pretrained``). The weights keep the source's
float width (float32 or float64) unless ``--dtype`` says otherwise. ``--num-heads``
is needed only where SRC does not tell it (a timm file without config.json);
``--num-classes`` other than SRC's gives the output a new, untrained head.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from . import cli
from .train.predict import check_checkpoint_config
from .weights import read_pretrained, save_model, save_pretrained
from .weights.checkpoint import is_training_checkpoint

OUTPUTS = {".npz": "tinyvit model file", ".safetensors": "timm safetensors + config.json"}


def check_not_a_run(dst):
    """A ValueError if ``dst`` is a training checkpoint (a run's last.npz or best.npz, or
    the source itself): a model file written over it would end the run."""
    if dst.suffix == ".npz" and dst.is_file() and is_training_checkpoint(dst):
        raise ValueError(f"{dst} is a training checkpoint, which a model file would replace "
                         "(the run could not be resumed or evaluated): write DST elsewhere")


def convert(src, dst, num_heads=None, num_classes=None, dtype=None, log=print):
    """Read ``src``, write ``dst`` (format by suffix); returns the model. ``num_heads``
    and ``num_classes`` are needed only where the source does not tell them."""
    dst = Path(dst)
    if dst.suffix not in OUTPUTS:
        raise ValueError(f"DST must end in .npz or .safetensors, got {dst.name}")
    check_not_a_run(dst)
    check_checkpoint_config(src)
    pretrained = read_pretrained(src)
    given = {"num_heads": num_heads, "num_classes": num_classes}
    overrides = {name: value for name, value in given.items() if value is not None}
    model = pretrained.build(head="auto", dtype=dtype or pretrained.dtype, log=log, **overrides)
    if dst.suffix == ".npz":
        save_model(model, dst)
    else:
        save_pretrained(model, dst)
    c = model.config
    log(f"model: embed_dim {c.embed_dim}, depth {c.depth}, "
        f"{c.num_heads} heads, patch {c.patch_size}, {c.image_size}x{c.image_size} images, "
        f"{c.num_classes} classes, {model.num_parameters():,} parameters")
    log(f"wrote {dst} ({OUTPUTS[dst.suffix]}, {np.dtype(model.cls_token.data.dtype).name})")
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tinyvit.convert",
        description="Convert a ViT checkpoint (Hugging Face, timm, JAX .npz, tinyvit) to a "
                    "tinyvit .npz model file or timm .safetensors.")
    parser.add_argument("src", help="checkpoint file or Hugging Face folder")
    parser.add_argument("dst", help="output file: .npz (tinyvit) or .safetensors (timm)")
    parser.add_argument("--num-heads", type=int, help="needed when SRC does not tell it")
    parser.add_argument("--num-classes", type=int,
                        help="a new head of this many classes, or the count when SRC has no head")
    parser.add_argument("--dtype", choices=("float32", "float64"),
                        help="output float width (default: the source's)")
    args = parser.parse_args(argv)
    try:
        dtype = args.dtype and np.dtype(args.dtype).type
        convert(args.src, args.dst, args.num_heads, args.num_classes, dtype)
    except (ValueError, OSError, ImportError) as e:
        message = "; ".join(line.strip() for line in str(e).splitlines())
        print(f"error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
