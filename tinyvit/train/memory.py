"""How much memory a run's step needs, estimated from its config before anything is
allocated, so that a run the machine cannot hold is refused in one line instead of
being killed for memory with no word.

A training step holds, per image, what each layer's forward caches for its
backward (shape legend: N tokens, D embed_dim, M the MLP's hidden width, H heads):
  - a block: about 12 N D (the LayerNorms' inputs and outputs, q, k, v, the
    heads' context, the projection, the residuals), 3 N M (the MLP's first
    Linear, GELU's input and output) and 2 H N^2 (the attention's softmax, and
    the scores the backward makes), 3 H N^2 with attention dropout (its output
    and its mask too);
  - a hybrid's stem: per convolution its unfolded input (C_in k^2 values per
    output position) and three maps of its output (the convolution, the norm,
    the activation);
  - the batch itself, as it comes and resized.
The parameters count four times (weights, gradients, AdamW's two moments).
Evaluation caches nothing, but its batches are larger: its peak is the widest
layer's output for a test batch. The estimate is the larger of the two.
"""

import os

from ..files import megabytes
from .config import RunRefused


def step_bytes(model, batch_size, eval_batch_size, itemsize=4):
    """About the bytes a training step (and an evaluation batch) of a ViT of
    ``ViTConfig`` ``model`` takes."""
    n = model.num_patches + 1
    d, m, h = model.embed_dim, int(model.mlp_ratio * model.embed_dim), model.num_heads
    image = model.in_channels * model.image_size ** 2
    block = 12 * n * d + 3 * n * m + (3 if model.attn_dropout else 2) * h * n * n
    stem, widest = 0, max(n * m, h * n * n)
    channels, side = model.in_channels, model.image_size
    for out_channels, kernel, stride in model.stem:
        side = (side + 2 * (kernel // 2) - kernel) // stride + 1
        unfolded = channels * kernel ** 2 * side ** 2
        stem += unfolded + 3 * out_channels * side ** 2
        widest = max(widest, unfolded)
        channels = out_channels
    training = batch_size * (2 * image + stem + model.depth * block)
    evaluation = eval_batch_size * (2 * image + widest)
    return itemsize * (max(training, evaluation) + 4 * parameter_count(model))


def parameter_count(model):
    """About the parameters of a ViT of config ``model`` (the blocks, the patch
    embedding, the stem, the head), from its config alone."""
    d, m = model.embed_dim, int(model.mlp_ratio * model.embed_dim)
    block = 4 * d * d + 2 * d * m + 9 * d + m  # qkv, projection, MLP, two LayerNorms
    channels, stem = model.in_channels, 0
    for out_channels, kernel, _ in model.stem:
        stem += channels * kernel ** 2 * out_channels + 3 * out_channels
        channels = out_channels
    patches = channels * model.patch_size ** 2 * d + d
    return (model.depth * block + patches + stem + (model.num_patches + 2) * d
            + (d + 1) * model.num_classes)


def available_bytes():
    """The memory the machine can give a new process: MemAvailable on Linux, else
    the physical memory, else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(model, config, itemsize=4):
    """The line that states a run's step memory; ``RunRefused`` saying what to change
    when the estimate exceeds what the machine has."""
    needed = step_bytes(model, config.batch_size, config.eval_batch_size, itemsize)
    free = available_bytes()
    line = f"step memory: about {_size(needed)}" + (
        f" of {_size(free)} available" if free else "")
    if free and needed > free:
        raise RunRefused(
            f"a step of this run needs about {_size(needed)}, more than the {_size(free)} this "
            f"machine has available (image size {model.image_size}, patch size "
            f"{model.patch_size}, {model.num_patches + 1} tokens, batch {config.batch_size}): "
            f"lower --image-size or --batch-size, or raise --patch-size")
    return line


def _size(n):
    return megabytes(n) if n < 1e9 else f"{n / 1e9:,.1f} GB"

