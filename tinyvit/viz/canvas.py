"""What every figure of ``tinyvit/viz`` is drawn with: the colour tables and
colormap, round ticks, fonts and text, a white scratch canvas trimmed to what was drawn,
the title, the colour bar, and saving as an RGB PNG (its folder made, the path returned).
Inputs are host NumPy arrays (move CuPy arrays over with ``backend.to_host`` first)."""

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from ..files import atomic_write

# Colour tables, linearly interpolated between evenly spaced anchors.
CMAPS = {
    # matplotlib's viridis at 0, 0.1, ..., 1: perceptually uniform, for magnitudes
    "viridis": np.array([
        (68, 1, 84), (72, 36, 117), (65, 68, 135), (53, 95, 141), (42, 120, 142), (33, 145, 140),
        (34, 168, 132), (68, 191, 112), (122, 209, 81), (189, 223, 38), (253, 231, 37),
    ], dtype=np.float64),
    # Moreland's cool-warm at 0, 0.125, ..., 1: diverging, grey in the middle, for signed values
    "coolwarm": np.array([
        (59, 76, 192), (98, 130, 234), (141, 176, 254), (184, 208, 249), (221, 221, 221),
        (245, 196, 173), (244, 154, 123), (222, 96, 77), (180, 4, 38),
    ], dtype=np.float64),
}
NAN_COLOR = (255, 0, 255)  # not in either table, so a missing value stands out
# matplotlib's tab10: distinct series colours
PALETTE = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]
INK = (33, 33, 33)  # text and axes
GRID = (228, 228, 228)
FRAME = (150, 150, 150)

TITLE, LABEL, TICK = 18, 14, 12  # font sizes in px
MARGIN = 12  # white border around every figure
GAP = 6  # between a thing and its label
MAX_LABEL_W = 110  # px; longer tick labels are cut with "…"
BAR_W = 14  # colour bar width
ROOM = 300  # scratch canvas space around the content, trimmed away



# ---------------------------------------------------------------- colours and ticks

def colormap(values, vmin=None, vmax=None, name="viridis"):
    """Map values to RGB colours.

    Args:
        values: array-like of any shape (...).
        vmin, vmax: the values mapped to the first and last colour; values
            outside are clipped. None takes the min / max of the finite values;
            a range of zero width is widened by 0.5 each side (middle colour).
        name: "viridis" (magnitudes) or "coolwarm" (signed values, e.g. cosine
            similarity with vmin=-1, vmax=1).
    Returns:
        (..., 3) uint8; NaN maps to NAN_COLOR.

    >>> colormap([0.0, 1.0]).tolist()
    [[68, 1, 84], [253, 231, 37]]
    """
    if name not in CMAPS:
        raise ValueError(f"colormap: name must be one of {sorted(CMAPS)}, got {name!r}")
    anchors = CMAPS[name]
    values = np.asarray(values, dtype=np.float64)
    vmin, vmax = _value_range(values, vmin, vmax)
    with np.errstate(invalid="ignore"):
        t = np.clip((values - vmin) / (vmax - vmin), 0.0, 1.0) * (len(anchors) - 1)
    i = np.minimum(np.nan_to_num(t).astype(int), len(anchors) - 2)
    frac = (t - i)[..., None]
    rgb = anchors[i] * (1.0 - frac) + anchors[i + 1] * frac
    rgb[np.isnan(values)] = NAN_COLOR
    return np.rint(rgb).astype(np.uint8)


def _value_range(values, vmin, vmax):
    """(vmin, vmax) with None filled from the finite values; a zero-width range widened."""
    finite = values[np.isfinite(values)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmin > vmax:
        raise ValueError(f"colour range: vmin must not exceed vmax, got vmin={vmin} vmax={vmax}")
    if vmin == vmax:
        return vmin - 0.5, vmax + 0.5
    return vmin, vmax


def nice_ticks(lo, hi, count=6):
    """About ``count`` round tick values covering [lo, hi]: multiples of 1, 2 or 5 x 10^k.

    The first tick is at or below ``lo`` and the last at or above ``hi``, so the
    ticks also give the axis range (Heckbert's loose labels, Graphics Gems 1990).
    A range of zero width is widened by a tenth of the value (or by 1 at zero).

    >>> nice_ticks(0, 0.93)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    >>> nice_ticks(1, 10)
    [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"nice_ticks: need finite lo <= hi, got lo={lo} hi={hi}")
    if lo == hi:
        pad = abs(lo) / 10 or 1.0
        lo, hi = lo - pad, hi + pad
    step = _nice_number(_nice_number(hi - lo, nearest=False) / (count - 1), nearest=True)
    decimals = _decimals(step)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, decimals) + 0.0 for k in range(first, last + 1)]  # + 0.0: no -0.0


def _nice_number(x, nearest):
    """1, 2, 5 or 10 x 10^k: the nearest to x, or else the smallest at or above x."""
    exp = math.floor(math.log10(x))
    f = x / 10.0**exp
    if nearest:
        nice = 1 if f < 1.5 else 2 if f < 3 else 5 if f < 7 else 10
    else:
        nice = 1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10
    return nice * 10.0**exp


def _decimals(step):
    """Digits after the point that a tick step of one significant digit needs."""
    return max(0, -math.floor(math.log10(step) + 1e-9))


def _format_ticks(ticks):
    """Tick labels with as many decimals as the step needs: [0, 0.5, 1] -> ['0.0', '0.5', '1.0']."""
    decimals = _decimals(ticks[1] - ticks[0])
    return [f"{t:.{decimals}f}" for t in ticks]


# ---------------------------------------------------------------- text and canvas

@lru_cache(maxsize=None)
def _font(size):
    """Pillow's built-in font at ``size`` px (a fixed small bitmap font on Pillow < 10.1)."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def _text_width(text, font):
    """Width of ``text`` in px."""
    left, _, right, _ = font.getbbox(text)
    return right - left


def _line_height(font):
    """Height of one line of text, ascender to descender: the box every label is aligned by."""
    return font.getbbox("Ag(|")[3]


def _draw_text(img, xy, text, font, ha="center", va="center", angle=0, fill=INK):
    """Draw ``text`` turned ``angle`` degrees counter-clockwise.

    ``ha`` ("left", "center", "right") and ``va`` ("top", "center", "bottom")
    say which point of the (turned) text box lands on ``xy``.
    """
    if not text:
        return
    left, _, right, _ = font.getbbox(text)
    mask = Image.new("L", (right - left, _line_height(font)))
    ImageDraw.Draw(mask).text((-left, 0), text, font=font, fill=255)
    if angle:
        mask = mask.rotate(angle, resample=Image.BICUBIC, expand=True)
    x = xy[0] - {"left": 0, "center": mask.width / 2, "right": mask.width}[ha]
    y = xy[1] - {"top": 0, "center": mask.height / 2, "bottom": mask.height}[va]
    img.paste(fill, (round(x), round(y)), mask)


def _fit(text, font, max_width):
    """``text``, cut and ended with "…" where it is wider than ``max_width`` px."""
    if _text_width(text, font) <= max_width:
        return text
    while text and _text_width(text + "…", font) > max_width:
        text = text[:-1]
    return text.rstrip() + "…"


def _scratch(width, height):
    """A white canvas with ROOM px around a (width, height) content area at (ROOM, ROOM)."""
    return Image.new("RGB", (width + 2 * ROOM, height + 2 * ROOM), "white")


def _trim(img):
    """Crop to the bounding box of everything that is not white."""
    return img.crop(ImageOps.invert(img).getbbox())


def _titled(content, title):
    """``content`` centred on a white figure with MARGIN around it and ``title`` on top."""
    font = _font(TITLE)
    title_h = _line_height(font) + 2 * GAP if title else 0
    width = max(content.width, _text_width(title, font) if title else 0) + 2 * MARGIN
    img = Image.new("RGB", (width, content.height + title_h + 2 * MARGIN), "white")
    _draw_text(img, (width / 2, MARGIN), title, font, va="top")
    img.paste(content, ((width - content.width) // 2, MARGIN + title_h))
    return img


def save_png(img, path):
    """Write ``img`` as PNG to ``path`` via a temporary file (never a half-written PNG)."""
    with atomic_write(path) as f:
        img.save(f, format="PNG", compress_level=1)  # fast; flat colours compress well anyway
    return Path(path)


def _to_uint8(image):
    """An image as (h, w, 3) uint8: uint8 kept, anything else scaled from its min..max to 0..255."""
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)):
        raise ValueError(f"image: expected shape (h, w) or (h, w, 3), got {a.shape}")
    if a.dtype != np.uint8:
        a = a.astype(np.float64)
        lo, hi = _value_range(a, None, None)
        a = np.rint(np.clip((a - lo) / (hi - lo), 0.0, 1.0) * 255).astype(np.uint8)
    return np.repeat(a[..., None], 3, axis=2) if a.ndim == 2 else a


def _upscale(rgb, factor):
    """Nearest-neighbour upscaling of an (h, w, 3) uint8 array by an integer factor, as an Image."""
    h, w = rgb.shape[:2]
    return Image.fromarray(rgb).resize((w * factor, h * factor), Image.NEAREST)


def _ink_for(rgb):
    """Dark text on light colours, white text on dark ones."""
    r, g, b = (float(c) for c in rgb)
    return INK if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255)


def _colorbar(img, x, y, height, vmin, vmax, cmap):
    """A vertical colour bar, ``vmax`` on top, with tick labels on its right; top-left at (x, y)."""
    ramp = colormap(np.linspace(vmax, vmin, height), vmin, vmax, cmap)  # (height, 3)
    img.paste(Image.fromarray(np.repeat(ramp[:, None, :], BAR_W, axis=1)), (x, y))
    draw = ImageDraw.Draw(img)
    draw.rectangle((x - 1, y - 1, x + BAR_W, y + height), outline=FRAME)
    ticks = nice_ticks(vmin, vmax)
    eps = 1e-9 * (vmax - vmin)
    for t, label in zip(ticks, _format_ticks(ticks)):
        if vmin - eps <= t <= vmax + eps:
            ty = round(_scale(t, vmin, vmax, y + height - 1, y))
            draw.line((x + BAR_W, ty, x + BAR_W + 4, ty), fill=INK)
            _draw_text(img, (x + BAR_W + 4 + GAP, ty), label, _font(TICK), ha="left")


def _scale(v, lo, hi, a, b):
    """Map v linearly from [lo, hi] to [a, b]."""
    return a + (v - lo) / (hi - lo) * (b - a)


def _check_count(items, n, what):
    """Raise unless ``items`` is None or has ``n`` entries."""
    if items is not None and len(items) != n:
        raise ValueError(f"{what}: expected {n}, got {len(items)}")

