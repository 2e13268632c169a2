"""Data augmentation on batches of images, vectorized over the batch.

Shapes: ``B`` batch, ``C`` channels, ``H`` height, ``W`` width, ``K`` classes.
Every function takes float images ``x`` of shape (B, C, H, W) with values in
[0, 1] (before mean/std normalization), keeps ``x``'s dtype, returns a new
array and leaves ``x`` alone. Randomness comes only from the ``rng`` argument
(a generator from ``backend.rng(seed)``), so a seed fixes every draw; mixup and
cutmix, which draw a few numbers per batch, take a generator on the host
(``backend.host_rng(seed)``), so that on a GPU nothing waits for the device.

Why a ViT needs this: a convolution is built to be translation invariant and
local, a ViT is not; it has to learn those priors from the data, and on a small
data set (MNIST, CIFAR-10) it memorizes the training images long before it
learns them. Augmentation shows it a new variant of each image every epoch:

- ``random_crop``: pad by ``padding`` zeros and crop back at a random offset,
  i.e. translate each image by up to ``padding`` pixels (torchvision's
  ``RandomCrop(size, padding)``). Teaches the translation invariance that a
  patch grid with learned position embeddings lacks.
- ``horizontal_flip``: mirror left-right with probability ``p``. Natural images
  (CIFAR-10) mean the same mirrored; digits do not, so MNIST leaves it out.
- ``random_erasing``: blank a random rectangle (Zhong et al., 2017;
  torchvision's ``RandomErasing``). The model cannot lean on one patch and must
  use the whole image, as with occlusion.
- ``mixup`` (Zhang et al., 2018) and ``cutmix`` (Yun et al., 2019): blend each
  image with a partner, globally (mixup) or by pasting a box (cutmix), and blend
  the labels in the same proportion. Soft targets regularize the classifier
  strongly, which is how DeiT trains ViTs without huge data sets. They change
  the labels, so the trainer applies them itself, after the pipelines below.

``pipeline`` builds what the trainer hands to the batch iterator: a callable
``augment(x, rng) -> x``.
"""

import math

import numpy as np  # host-side: the few numbers mixup and cutmix draw per batch

from ..backend import float_dtype, xp
from ..checks import check_images


def _check_probability(p, name):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: p must be in [0, 1], got {p}")


# ---------------------------------------------------------------------------
# Geometric and erasing augmentations: the labels stay as they are.


def random_crop(x, padding, rng):
    """Translate each image by a random offset of up to ``padding`` pixels.

    Pads every side with ``padding`` zeros and crops back to (H, W) at an
    offset (dy, dx) drawn independently per image from {0, ..., 2*padding}:
    the image moves by (padding - dy, padding - dx), the uncovered border is 0.

    x: (B, C, H, W); returns (B, C, H, W).
    """
    check_images(x, "random_crop")
    if padding < 0 or int(padding) != padding:
        raise ValueError(f"random_crop: padding must be an int >= 0, got {padding}")
    p = int(padding)
    B, C, H, W = x.shape
    x_padded = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))  # (B, C, H+2p, W+2p)
    dy = rng.integers(0, 2 * p + 1, size=B)  # (B,) top row of each crop
    dx = rng.integers(0, 2 * p + 1, size=B)  # (B,) left column of each crop
    rows = dy[:, None] + xp.arange(H)  # (B, H)
    cols = dx[:, None] + xp.arange(W)  # (B, W)
    # one gather: out[b, c, i, j] = x_padded[b, c, rows[b, i], cols[b, j]]
    return x_padded[
        xp.arange(B)[:, None, None, None],  # (B, 1, 1, 1)
        xp.arange(C)[None, :, None, None],  # (1, C, 1, 1)
        rows[:, None, :, None],  # (B, 1, H, 1)
        cols[:, None, None, :],  # (B, 1, 1, W)
    ]  # (B, C, H, W)


def horizontal_flip(x, rng, p=0.5):
    """Mirror each image left-right with probability ``p``, independently.

    x: (B, C, H, W); returns (B, C, H, W).
    """
    check_images(x, "horizontal_flip")
    _check_probability(p, "horizontal_flip")
    flip = rng.random(x.shape[0]) < p  # (B,)
    return xp.where(flip[:, None, None, None], x[..., ::-1], x)


def random_erasing(x, rng, p=0.25, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0):
    """Set a random rectangle of each image to ``value``, with probability ``p``.

    Per image, as torchvision's ``RandomErasing`` with a constant value: an area
    fraction ``s ~ U(scale)`` and an aspect ratio ``r = h / w`` log-uniform in
    ``ratio`` give ``h = round(sqrt(s*H*W*r))`` and ``w = round(sqrt(s*H*W/r))``,
    clipped to [1, H] and [1, W] (torchvision retries until a rectangle fits;
    clipping keeps this one draw per image); the top-left corner is uniform
    over the positions where the rectangle fits. All channels are erased.

    x: (B, C, H, W); returns (B, C, H, W).
    """
    check_images(x, "random_erasing")
    _check_probability(p, "random_erasing")
    B, _, H, W = x.shape
    erase = rng.random(B) < p  # (B,)
    area = H * W * (scale[0] + (scale[1] - scale[0]) * rng.random(B))  # (B,) in pixels
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * rng.random(B)
    aspect = xp.exp(log_r)  # (B,) h / w
    h = xp.clip(xp.rint(xp.sqrt(area * aspect)), 1, H)  # (B,)
    w = xp.clip(xp.rint(xp.sqrt(area / aspect)), 1, W)  # (B,)
    # uniform corner: floor(u * number_of_positions), kept in range against rounding
    top = xp.minimum(xp.floor(rng.random(B) * (H - h + 1)), H - h)  # (B,)
    left = xp.minimum(xp.floor(rng.random(B) * (W - w + 1)), W - w)  # (B,)

    def per_image(a):  # (B,) -> (B, 1, 1, 1), to broadcast against pixels
        return a[:, None, None, None]

    rows = xp.arange(H)[None, None, :, None]  # (1, 1, H, 1)
    cols = xp.arange(W)[None, None, None, :]  # (1, 1, 1, W)
    inside = (
        (rows >= per_image(top))
        & (rows < per_image(top + h))
        & (cols >= per_image(left))
        & (cols < per_image(left + w))
        & per_image(erase)
    )  # (B, 1, H, W)
    return xp.where(inside, x.dtype.type(value), x)


# ---------------------------------------------------------------------------
# Label-mixing augmentations: they return soft targets (B, K) with the images.


def one_hot(y, num_classes, dtype=None):
    """Labels (B,) of ints -> one-hot rows (B, K).

    A label outside [0, num_classes) gives a row of NaN, so that the loss it
    reaches is NaN (which the trainer stops on): checking the values here would
    make the host wait for the device.
    dtype: the float dtype of the rows (default: the backend's default dtype).
    """
    if y.ndim != 1:
        raise ValueError(f"one_hot: expected labels of shape (B,), got shape {tuple(y.shape)}")
    dtype = float_dtype(dtype)
    rows = (y[:, None] == xp.arange(num_classes)[None, :]).astype(dtype)  # (B, K)
    valid = (y >= 0) & (y < num_classes)  # (B,)
    return xp.where(valid[:, None], rows, rows.dtype.type(math.nan))


def _beta(rng, alpha, tries=64, rounds=16):
    """One draw of lam ~ Beta(alpha, alpha), as a Python float, from the host
    generator ``rng``.

    Jöhnk's algorithm (1964), which needs only uniforms: with U, V ~ U(0, 1),
    X = U**(1/a) and Y = V**(1/b), the ratio X / (X + Y) conditioned on
    X + Y <= 1 is Beta(a, b). It works in logs, so that a small alpha (X and Y
    underflow to 0) stays exact. A try is accepted with probability
    Gamma(a+1) Gamma(b+1) / Gamma(a+b+1): 1/2 for a = b = 1, more for smaller
    alpha (mixup uses 0.8, cutmix 1.0), so ``tries`` candidates are drawn at
    once and a second round is rare. For a large alpha almost no try is accepted
    (about 1 in 10^29 at 50): after ``rounds`` rounds, NumPy's own Beta sampler draws.
    """
    if alpha <= 0:
        raise ValueError(f"mixing needs alpha > 0, got {alpha}")
    for _ in range(rounds):
        u, v = 1.0 - rng.random((2, tries))  # in (0, 1], so the logs are finite
        log_x = np.log(u) / alpha  # (tries,) log X
        log_y = np.log(v) / alpha  # (tries,) log Y
        log_sum = np.logaddexp(log_x, log_y)  # (tries,) log (X + Y)
        accepted = log_sum <= 0.0  # X + Y <= 1
        if accepted.any():
            first = int(np.argmax(accepted))
            return float(np.exp(log_x[first] - log_sum[first]))  # X / (X + Y)
    return float(rng.beta(alpha, alpha))


def _partner(a):
    """Each sample's mixing partner: the previous one in the batch.

    The batch is already shuffled, so the neighbour is a random partner, and
    rolling (unlike a random permutation) never pairs a sample with itself.
    """
    return xp.roll(a, 1, axis=0)


def _mixed_targets(y, num_classes, lam, dtype):
    """lam * one_hot(y) + (1 - lam) * one_hot(partner's y): (B, K)."""
    onehot = one_hot(y, num_classes, dtype)  # (B, K)
    return lam * onehot + (1.0 - lam) * _partner(onehot)


def _check_mixing(x, y, name):
    check_images(x, name)
    if y.shape != (x.shape[0],):
        raise ValueError(
            f"{name}: expected labels of shape (B,) = ({x.shape[0]},), got shape {tuple(y.shape)}"
        )


def mixup(x, y, num_classes, rng, alpha=0.8):
    """Blend each image and its label with its partner's (mixup).

    One ``lam ~ Beta(alpha, alpha)`` per batch, as timm does:
    ``x_mixed = lam * x + (1 - lam) * x_partner`` and the targets mix the same way.

    x: (B, C, H, W); y: (B,) int labels; rng: a host generator.
    Returns (x_mixed (B, C, H, W), targets (B, K)), both in x's dtype.
    """
    _check_mixing(x, y, "mixup")
    lam = _beta(rng, alpha)
    x_mixed = lam * x + (1.0 - lam) * _partner(x)  # (B, C, H, W)
    return x_mixed, _mixed_targets(y, num_classes, lam, x.dtype)


def cutmix(x, y, num_classes, rng, alpha=1.0):
    """Paste a box from each image's partner into it (CutMix).

    One ``lam ~ Beta(alpha, alpha)`` and one box per batch, as timm does: the
    box has sides ``sqrt(1 - lam)`` times the image's, is centred at a uniform
    pixel and clipped at the border; ``lam`` is then corrected to the area the
    box really kept, ``1 - box_area / (H * W)``, and the targets mix with it.

    x: (B, C, H, W); y: (B,) int labels; rng: a host generator.
    Returns (x_mixed (B, C, H, W), targets (B, K)), both in x's dtype.
    """
    _check_mixing(x, y, "cutmix")
    _, _, H, W = x.shape
    lam = _beta(rng, alpha)
    cut_h, cut_w = int(H * math.sqrt(1.0 - lam)), int(W * math.sqrt(1.0 - lam))
    cy = int(rng.integers(0, H, size=1)[0])  # box centre
    cx = int(rng.integers(0, W, size=1)[0])
    y1, y2 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, H)
    x1, x2 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, W)
    x_mixed = x.copy()
    x_mixed[:, :, y1:y2, x1:x2] = _partner(x[:, :, y1:y2, x1:x2])
    lam = 1.0 - (y2 - y1) * (x2 - x1) / (H * W)  # the fraction of x really kept
    return x_mixed, _mixed_targets(y, num_classes, lam, x.dtype)


# ---------------------------------------------------------------------------
# Pipelines for the trainer: callables augment(x, rng) -> x.


class Compose:
    """Apply augmentations ``fn(x, rng) -> x`` one after another, sharing ``rng``."""

    def __init__(self, *fns):
        self.fns = fns

    def __call__(self, x, rng):
        for fn in self.fns:
            x = fn(x, rng)
        return x


def pipeline(max_shift=0, flip=False, erasing=0.0):
    """The per-image augmentations a trainer hands to the batch iterator, in order:
    random translation by up to ``max_shift`` pixels (0: off), a horizontal flip
    (natural images, not digits), random erasing with probability ``erasing``
    (0: off). Returns ``augment(x, rng) -> x``, or None when all are off."""
    steps = []
    if max_shift:
        steps.append(lambda x, rng: random_crop(x, max_shift, rng))
    if flip:
        steps.append(horizontal_flip)
    if erasing:
        steps.append(lambda x, rng: random_erasing(x, rng, p=erasing))
    return Compose(*steps) if steps else None
