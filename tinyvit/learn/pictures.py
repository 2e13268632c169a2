"""The workbook's pictures, drawn by ``tinyvit/viz``: where an exercise's layer sits in
the ViT (its block diagram, the layer highlighted, with its shapes), a wrong gradient's
difference from the library's (a heat map over its two largest axes, the worst entries
marked), and the training exercise's loss curves and gradient norms.

Each is written as a PNG beside the exercise's files (``ex01_linear.where.png``,
``ex01_linear.difference.png``, ``ex20_training.png``) and returned as a PIL image,
which a notebook shows inline.
"""

from functools import lru_cache

import numpy as np  # the difference is drawn from host arrays

from ..backend import default_dtype, using_backend
from ..viz.canvas import save_png
from ..viz.charts import Panel, Series, line_chart
from ..viz.diagram import block_diagram
from ..viz.matrices import heatmap
from .exercises import TRAINING

WORST = 3  # the worst entries marked on a difference, where they stand out:
STANDS_OUT = 1.01  # larger than the median size by this factor
TRAINING_PICTURE = f"ex{TRAINING:02d}_training.png"  # beside the training exercise

# each exercise's boxes of the diagram (``tinyvit/viz/diagram.py``)
WHERE = {
    "linear": {"patch_linear", "qkv", "proj", "fc1", "fc2", "head"},
    "tanh": {"pre_logits"},
    "gelu": {"gelu"},
    "gelu_tanh": {"gelu"},
    "dropout": {"pos_drop", "attn_drop", "proj_drop", "mlp_drop1", "mlp_drop2"},
    "residual": {"add1", "add2"},
    "patchify": {"patchify"},
    "layernorm_steps": {"norm1", "norm2", "norm"},
    "layernorm": {"norm1", "norm2", "norm"},
    "softmax_jacobian": {"softmax"},
    "softmax": {"softmax"},
    "attention_core": {"scores", "softmax", "attn_drop", "weighted"},
    "merge_heads": {"merge_heads"},
    "split_heads": {"split_heads"},
    "attention": {"attention"},
    "mlp": {"mlp"},
    "block": {"block"},
    "vit": {"cls_pos", "pos_drop", "norm", "pool", "head"},
    "cross_entropy": {"loss"},
    "col2im": {"conv2d", "maxpool"},
    "conv2d": {"conv2d"},
    "batchnorm": {"batchnorm"},
    "maxpool": {"maxpool"},
}


def where(ex, path=None):
    """The block diagram with exercise ``ex``'s layer highlighted and the shapes of its
    first case's input and output beside it; with ``path``, also written there."""
    image = _where(ex)
    if path is not None:
        save_png(image, path)
    return image


@lru_cache(maxsize=None)
def _where(ex):
    """The picture is the same for every workbook: drawn once per process."""
    with using_backend("numpy"), default_dtype("float64"):
        module, inputs, before_forward = ex.cases[0](ex.reference)
        if before_forward:
            before_forward()
        out = module.forward(*inputs)
    shapes = " -> ".join(str(tuple(a.shape)) for a in (inputs[0], out))
    note = f"exercise {ex.number}, {ex.title}: {shapes} in its first check"
    return block_diagram(WHERE[ex.name], note)


def difference(name, yours, library, path):
    """A heat map of ``yours - library`` (one gradient, host arrays) over its two largest
    axes, each cell the entry of largest size along the other axes, the worst marked."""
    diff = np.atleast_2d(np.asarray(yours, dtype=np.float64) - library)
    keep = sorted(np.argsort(diff.shape, kind="stable")[-2:])
    rows, cols = diff.shape[keep[0]], diff.shape[keep[1]]
    moved = np.moveaxis(diff, keep, (-2, -1)).reshape(-1, rows, cols)
    picked = np.take_along_axis(moved, np.abs(moved).argmax(axis=0)[None], axis=0)[0]
    sizes = np.abs(picked)
    worst = np.argsort(sizes, axis=None)[::-1][:WORST]  # those that stand out of the rest
    marks = [tuple(int(i) for i in np.unravel_index(w, picked.shape)) for w in worst
             if sizes.flat[w] > STANDS_OUT * np.median(sizes)]
    size = float(np.abs(picked).max()) or 1.0
    axes = ", ".join(f"axis {a} ({diff.shape[a]})" for a in keep)
    said = f"the worst {len(marks)} outlined" if marks else "no entry stands out"
    title = f"{name}: yours - the library's over {axes}; {said}"
    heatmap(picked, path, title=title, xlabel=f"axis {keep[1]}", ylabel=f"axis {keep[0]}",
            annotate=False, cmap="coolwarm", vmin=-size, vmax=size, marks=marks)
    return path


def training(library, yours, norms, path, mine):
    """The loss curves of the learner's layers and the library's, and the gradient norm
    of each of the model's parts over the steps (``norms``: {part: [norm per step]});
    ``mine`` says which layers are the learner's."""
    steps = np.arange(len(library))
    losses = Panel("loss", "step", "cross-entropy", [
        Series("the library's layers", steps, library),
        Series("yours where passed", steps, yours, style="markers")])
    gradients = Panel("gradient norm (yours)", "step", "norm", [
        Series(part, steps[:len(values)], values) for part, values in norms.items()])
    return line_chart([losses, gradients], path, title=f"training on {mine}")
