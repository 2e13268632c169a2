"""Images: small ones as upscaled tiles, a few side by side, one blended with a heatmap.

    image_grid(images, path, ...)     small images as upscaled tiles with captions
    save_panels(images, path, ...)    a few images side by side with captions
    overlay(image, heat, ...)         an image blended with a coarse heatmap -> (H, W, 3) uint8
"""

import math

import numpy as np
from PIL import Image, ImageDraw

from .canvas import (
    FRAME,
    GAP,
    LABEL,
    ROOM,
    TICK,
    _check_count,
    _draw_text,
    _fit,
    _font,
    _line_height,
    _scratch,
    _titled,
    _to_uint8,
    _trim,
    _upscale,
    _value_range,
    colormap,
    save_png,
)


def image_grid(images, path, title=None, cols=None, tile_titles=None, scale=None):
    """Draw small images as a grid of framed tiles, and save it as a PNG.

    Args:
        images: a sequence of (h, w) or (h, w, 3) arrays of one size; uint8 is
            shown as is, any other dtype scaled per tile from its min..max to
            0..255 (so a filter's sign pattern shows whatever its range).
        path: where the PNG goes.
        title: figure title.
        cols: tiles per row (default ceil(sqrt(n))).
        tile_titles: n captions, one below each tile.
        scale: integer nearest-neighbour upscaling (default: tiles at least 64 px).
    Returns:
        the path written.
    """
    tiles = [_to_uint8(im) for im in images]
    if len({t.shape for t in tiles}) != 1:
        raise ValueError("image_grid: images must share one shape, "
                         f"got {sorted({t.shape for t in tiles})}")
    _check_count(tile_titles, len(tiles), "image_grid: tile_titles")
    h, w = tiles[0].shape[:2]
    scale = scale or math.ceil(64 / max(h, w))
    cols = cols or math.ceil(math.sqrt(len(tiles)))
    caption_h = _line_height(_font(TICK)) + GAP if tile_titles is not None else 0
    pitch_x, pitch_y = w * scale + 2 * GAP, h * scale + caption_h + 2 * GAP
    img = _scratch(cols * pitch_x, math.ceil(len(tiles) / cols) * pitch_y)
    for n, tile in enumerate(tiles):
        x, y = ROOM + (n % cols) * pitch_x, ROOM + (n // cols) * pitch_y
        _paste_framed(img, _upscale(tile, scale), (x, y))
        if tile_titles is not None:
            text = _fit(str(tile_titles[n]), _font(TICK), pitch_x - GAP)
            _draw_text(img, (x + w * scale / 2, y + h * scale + GAP // 2), text, _font(TICK),
                       va="top")
    return save_png(_titled(_trim(img), title), path)


def _paste_framed(img, tile, xy):
    """Paste ``tile`` at ``xy`` with a 1 px grey frame just outside it."""
    x, y = xy
    ImageDraw.Draw(img).rectangle((x - 1, y - 1, x + tile.width, y + tile.height), outline=FRAME)
    img.paste(tile, (x, y))


def overlay(image, heat, alpha=0.5, cmap="viridis", vmin=None, vmax=None):
    """Blend a coarse heatmap, upsampled bilinearly, over an image.

    Args:
        image: (H, W) or (H, W, 3); uint8 as is, other dtypes scaled from min..max.
        heat: (h, w), e.g. attention of the class token over a 7x7 patch grid.
        alpha: weight of the heatmap colours (0: the image alone, 1: the heatmap alone).
        cmap, vmin, vmax: as in ``colormap``; None takes the range of ``heat``.
    Returns:
        (H, W, 3) uint8.
    """
    base = _to_uint8(image).astype(np.float64)
    heat = np.asarray(heat, dtype=np.float64)
    if heat.ndim != 2:
        raise ValueError(f"overlay: heat must be 2-D, got shape {heat.shape}")
    vmin, vmax = _value_range(heat, vmin, vmax)
    up = np.asarray(
        Image.fromarray(heat.astype(np.float32)).resize(base.shape[1::-1], Image.BILINEAR)
    )
    colors = colormap(up, vmin, vmax, cmap).astype(np.float64)
    return np.rint((1.0 - alpha) * base + alpha * colors).astype(np.uint8)


def save_panels(images, path, title=None, captions=None, height=196):
    """Place a few images side by side, each upscaled to about ``height`` px, and save them
    as a PNG.

    For "input | attention rollout | head 1 | head 2 ...".

    Args:
        images: a sequence of (h, w) or (h, w, 3) arrays (as in ``image_grid``).
        path: where the PNG goes.
        title: figure title.
        captions: one caption below each image.
        height: images are upscaled by the integer factor max(1, height // h).
    Returns:
        the path written.
    """
    tiles = [_to_uint8(im) for im in images]
    _check_count(captions, len(tiles), "save_panels: captions")
    scaled = [_upscale(t, max(1, height // t.shape[0])) for t in tiles]
    img = _scratch(sum(s.width + 3 * GAP for s in scaled), max(s.height for s in scaled) + 3 * GAP)
    x = ROOM
    for n, tile in enumerate(scaled):
        _paste_framed(img, tile, (x, ROOM))
        if captions is not None:
            text = _fit(str(captions[n]), _font(LABEL), tile.width + 2 * GAP)
            _draw_text(img, (x + tile.width / 2, ROOM + tile.height + GAP), text, _font(LABEL),
                       va="top")
        x += tile.width + 3 * GAP
    return save_png(_titled(_trim(img), title), path)
