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

from ..viz.canvas import save_png
from ..viz.charts import Panel, Series, line_chart
from ..viz.diagram import block_diagram
from ..viz.matrices import heatmap, heatmap_grid
from .exercises import TRAINING

WORST = 3  # the worst entries marked on a difference, where they stand out:
STANDS_OUT = 1.01  # larger than every entry not marked by this factor
MAP_PX = 120  # the size of each map of a difference drawn as a grid
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
    shapes = ex.first_case(lambda module, inputs, out: " -> ".join(
        str(tuple(a.shape)) for a in (inputs[0], out)))
    note = f"exercise {ex.number}, {ex.title}: {shapes} in its first check"
    return block_diagram(WHERE[ex.name], note)


def difference(name, yours, library, path):
    """A heat map of ``yours - library`` (one gradient, host arrays), coolwarm around zero,
    the worst entries outlined where they stand out. A matrix (or a vector) is drawn as
    it is; a larger tensor as a grid of maps over its two largest axes, one per index of
    the others (a wrong head, a wrong image, a missing row sum show as their own maps)."""
    diff = np.asarray(yours, dtype=np.float64) - library
    size = float(np.abs(diff).max()) or 1.0
    order = np.argsort(np.abs(diff), axis=None)[::-1]
    rest = np.abs(diff).flat[order[WORST]] if diff.size > WORST else 0.0  # the first not marked
    worst = [np.unravel_index(w, diff.shape) for w in order[:WORST]
             if np.abs(diff).flat[w] > STANDS_OUT * rest]  # those that stand out of the rest
    said = f"the worst {len(worst)} outlined" if worst else "no entry stands out"
    colours = dict(cmap="coolwarm", vmin=-size, vmax=size)
    if diff.ndim <= 2:
        matrix = np.atleast_2d(diff)
        names = (dict(xlabel="axis 1", ylabel="axis 0") if diff.ndim == 2
                 else dict(xlabel="entry", yticklabels=[""] * matrix.shape[0]))
        marks = [tuple(int(i) for i in (0, *w)[-2:]) for w in worst]
        heatmap(matrix, path, title=f"{name}: yours - the library's; {said}", annotate=False,
                marks=marks, **names, **colours)
        return path
    keep = sorted(np.argsort(diff.shape, kind="stable")[-2:])  # the maps' axes
    other = [a for a in range(diff.ndim) if a not in keep]
    maps = np.moveaxis(diff, keep, (-2, -1))  # (*other, rows, cols)
    grid = dict(row_labels=range(maps.shape[0]), col_labels=range(maps.shape[1]),
                row_title=f"axis {other[0]}", col_title=f"axis {other[1]}") \
        if len(other) == 2 else dict(cols=min(8, int(np.prod(maps.shape[:-2]))), cell_titles=[
            f"axis {', '.join(map(str, other))} = {', '.join(map(str, i))}"
            for i in np.ndindex(maps.shape[:-2])])
    marks = [(int(np.ravel_multi_index([w[a] for a in other], maps.shape[:-2])),
              int(w[keep[0]]), int(w[keep[1]])) for w in worst]
    title = (f"{name}: yours - the library's, a map over axes {keep[0]} and {keep[1]} for "
             f"each index of axis {', '.join(map(str, other))}; {said}")
    heatmap_grid(maps.reshape(-1, *maps.shape[-2:]) if len(other) != 2 else maps, path,
                 title=title, marks=marks, map_px=MAP_PX, **grid, **colours)
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
