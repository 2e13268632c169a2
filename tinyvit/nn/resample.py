"""Resampling a grid to another size: images to the size a model sees (bilinear)
and position embeddings to another patch grid (bicubic).

Both are separable: a 1-D resampling is a matrix W (new, old), ``resized = W @
values``, and a 2-D grid X becomes Wh X Ww^T. Both follow
``torch.nn.functional.interpolate(..., align_corners=False)`` without antialias,
so they can be checked against PyTorch: output sample o sits at the input
coordinate x = (o + 0.5) * old / new - 0.5 (pixel centres aligned, not corners)
and takes the input samples around floor(x), an index past either end clamped
to the edge. Every row of W sums to 1; for new == old W is exactly the identity.
"""

from ..backend import xp

CUBIC_A = -0.75  # the cubic convolution parameter of PyTorch's and OpenCV's bicubic


def linear_taps(t):
    """The weights of samples floor(x) and floor(x) + 1 at fractional positions
    t = x - floor(x): 1 - t and t. t: (new,) -> (new, 2)."""
    return xp.stack([1.0 - t, t], axis=1)


def cubic_taps(t):
    """Keys' cubic convolution weights of the samples at floor(x) - 1 ... floor(x) + 2,
    for fractional positions t = x - floor(x) (PyTorch's upsample_bicubic2d):

        w(s) = ((a + 2)|s| - (a + 3)) s^2 + 1            for |s| <= 1
        w(s) = ((a|s| - 5a)|s| + 8a)|s| - 4a             for 1 < |s| < 2

    at s = t + 1, t, 1 - t, 2 - t. At t = 0 they are exactly (0, 1, 0, 0).
    t: (new,) -> (new, 4).
    """
    a = CUBIC_A

    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return xp.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


MODES = {"linear": (linear_taps, 0), "cubic": (cubic_taps, -1)}  # mode -> (weights, first tap)


def interpolation_matrix(old, new, mode):
    """The (new, old) matrix W of 1-D resampling, ``mode`` "linear" or "cubic".

    Output sample o sits at x = (o + 0.5) * old / new - 0.5; linear takes samples
    floor(x) and floor(x) + 1 (x first clamped to [0, old - 1], as PyTorch does),
    cubic floor(x) - 1 ... floor(x) + 2; the tap weights are ``linear_taps`` or
    ``cubic_taps`` of t = x - floor(x), and a tap past either end is the edge
    sample (its weight added to the edge's).
    """
    taps, first = MODES[mode]
    x = (xp.arange(new, dtype=xp.float64) + 0.5) * (old / new) - 0.5  # (new,)
    if mode == "linear":
        x = xp.clip(x, 0, old - 1)
    start = xp.floor(x)
    weights = taps(x - start)  # (new, taps)
    offsets = xp.arange(first, first + weights.shape[1])
    index = xp.clip(start[:, None] + offsets, 0, old - 1)  # (new, taps), clamped
    hits = index[:, :, None] == xp.arange(old)  # (new, taps, old) one-hot
    return (weights[:, :, None] * hits).sum(axis=1)  # (new, old)


def resize_images(x, size):
    """(B, C, H, W) -> (B, C, size, size) by bilinear interpolation, vectorized over
    the batch: each image channel X becomes Wh X Ww^T."""
    _, _, H, W = x.shape
    Wh = interpolation_matrix(H, size, "linear").astype(x.dtype)  # (size, H)
    Ww = interpolation_matrix(W, size, "linear").astype(x.dtype)  # (size, W)
    return Wh @ x @ Ww.T  # (B, C, size, size)


def _grid_shape(grid):
    return (grid, grid) if isinstance(grid, int) else tuple(grid)


def resize_pos_embed(pos_embed, old_grid, new_grid):
    """Resize position embeddings from one patch grid to another.

    The class token's row (first) is kept as is; the patch rows, seen as a
    (Gh, Gw) grid of D-vectors, are resampled channel by channel with separable
    bicubic interpolation:

        grid'[:, :, d] = Wh @ grid[:, :, d] @ Ww^T,   Wh (Gh', Gh), Ww (Gw', Gw).

    Bicubic, not bilinear, because it is what DeiT and timm use to fine-tune at a
    higher resolution (timm's ``resample_abs_pos_embed`` now defaults to
    antialias=True, PIL's a = -0.5 kernel, which differs slightly; the ViT paper's
    own code used bilinear, ``scipy.ndimage.zoom(order=1)``). Like any cubic it
    can overshoot the input range a little between samples. When the grid is
    unchanged the result equals the input exactly.

    Args:
        pos_embed: (1, 1 + Gh*Gw, D), class token first, patches in row-major order.
        old_grid, new_grid: patches per side, an int or (rows, cols).
    Returns:
        (1, 1 + Gh'*Gw', D), same dtype.
    """
    (gh, gw), (nh, nw) = _grid_shape(old_grid), _grid_shape(new_grid)
    if pos_embed.ndim != 3 or pos_embed.shape[:2] != (1, 1 + gh * gw):
        raise ValueError(
            f"resize_pos_embed: expected pos_embed of shape (1, 1 + {gh}*{gw}, D) = "
            f"(1, {1 + gh * gw}, D) for a {gh}x{gw} grid, got {tuple(pos_embed.shape)}"
        )
    D = pos_embed.shape[2]
    Wh = interpolation_matrix(gh, nh, "cubic").astype(pos_embed.dtype)  # (nh, gh)
    Ww = interpolation_matrix(gw, nw, "cubic").astype(pos_embed.dtype)  # (nw, gw)
    grid = pos_embed[0, 1:].reshape(gh, gw, D).transpose(2, 0, 1)  # (D, gh, gw)
    grid = Wh @ grid @ Ww.T  # (D, nh, nw)
    patches = grid.transpose(1, 2, 0).reshape(1, nh * nw, D)  # (1, nh*nw, D)
    return xp.concatenate([pos_embed[:, :1], patches], axis=1)  # (1, 1 + nh*nw, D)
