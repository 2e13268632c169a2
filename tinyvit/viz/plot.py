"""PNG pictures drawn with pillow alone: training curves, heatmaps, image grids.

Training draws its loss and accuracy curves and the confusion matrix here; model
inspection draws the ViT paper's figures (patch-embedding filters, position-
embedding similarity, mean attention distance, attention maps). Inputs are host
NumPy arrays (move CuPy arrays over with ``backend.to_host`` first). Every
function given a ``path`` writes an RGB PNG there, creating its folder, and
returns the path as a ``pathlib.Path``.

    line_chart(panels, path, ...)     side-by-side panels of Series: lines, markers or both
    heatmap(matrix, path, ...)        one matrix as coloured cells with numbers and a colour bar
    heatmap_grid(maps, path, ...)     a grid of small matrices sharing one colour bar
    image_grid(images, path, ...)     small images as upscaled tiles with captions
    save_panels(images, path, ...)    a few images side by side with captions
    overlay(image, heat, ...)         an image blended with a coarse heatmap -> (H, W, 3) uint8
    colormap(values, ...)             values -> (..., 3) uint8 through "viridis" or "coolwarm"
    nice_ticks(lo, hi)                round tick values, 1, 2 or 5 x 10^k

Layout: line charts have a fixed panel size; the other figures are drawn at
generous offsets on a white scratch canvas and trimmed to what was drawn.
"""

import math
from dataclasses import dataclass
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


def _save(img, path):
    """Write ``img`` as PNG to ``path`` via a temporary file (never a half-written PNG)."""
    with atomic_write(path) as f:
        img.save(f, format="PNG")
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


# ---------------------------------------------------------------- line charts

STYLES = ("line", "markers", "both")
MARKER_R = 3.5


@dataclass
class Series:
    """One named series of a panel.

    xs, ys: equal-length sequences; NaN or None points are skipped (a line joins
    the points either side). style: "line", "markers" or "both". color: an RGB
    tuple, or None for the panel's next PALETTE colour.
    """

    name: str
    xs: object
    ys: object
    style: str = "line"
    color: tuple = None

    def __post_init__(self):
        self.xs, self.ys = _floats(self.xs), _floats(self.ys)
        if self.xs.shape != self.ys.shape or self.xs.ndim != 1:
            raise ValueError(f"Series {self.name!r}: xs and ys must be 1-D and equally long, "
                             f"got shapes {self.xs.shape} and {self.ys.shape}")
        if self.style not in STYLES:
            raise ValueError(f"Series {self.name!r}: style must be one of {STYLES}, "
                             f"got {self.style!r}")

    def finite(self):
        """(xs, ys) of the points where both are finite: the ones drawn."""
        ok = np.isfinite(self.xs) & np.isfinite(self.ys)
        return self.xs[ok], self.ys[ok]


@dataclass
class Panel:
    """One chart: a title, axis labels and a list of Series (a legend shows when there are two
    or more)."""

    title: str
    xlabel: str
    ylabel: str
    series: list


def _floats(values):
    """A float64 array with None turned into NaN."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def line_chart(panels, path, title=None, panel_size=(460, 340)):
    """Draw one or more Panels side by side and save them as a PNG.

    Axes span round tick values around the data (``nice_ticks``), with
    gridlines; a series of one point shows as a marker. For a scatter plot give
    the series style="markers".

    Args:
        panels: a Panel or a list of Panels, drawn left to right.
        path: where the PNG goes.
        title: figure title above the panels.
        panel_size: (width, height) of each panel in px.
    Returns:
        the path written.
    """
    panels = [panels] if isinstance(panels, Panel) else panels
    w, h = panel_size
    row = Image.new("RGB", (w * len(panels), h), "white")
    for i, panel in enumerate(panels):
        _draw_panel(row, (i * w, 0, (i + 1) * w, h), panel)
    return _save(_titled(row, title), path)


def _draw_panel(img, box, panel):
    """Title, axes, gridlines, series and legend of one panel inside box = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    points = [s.finite() for s in panel.series]
    xticks = nice_ticks(*_span([xs for xs, _ in points]))
    yticks = nice_ticks(*_span([ys for _, ys in points]))
    xlim, ylim = _limits(xticks), _limits(yticks)
    tick, label = _font(TICK), _font(LABEL)
    _draw_text(img, ((x0 + x1) / 2, y0 + GAP), panel.title, _font(LABEL + 2), va="top")
    plot = (
        x0 + GAP + _line_height(label) + 2 * GAP
            + max(_text_width(t, tick) for t in _format_ticks(yticks)),
        y0 + 2 * GAP + _line_height(_font(LABEL + 2)) + GAP,
        x1 - 2 * GAP - _text_width(_format_ticks(xticks)[-1], tick) // 2,
        y1 - GAP - _line_height(label) - 2 * GAP - _line_height(tick),
    )
    _draw_axes(img, plot, xlim, ylim, xticks, yticks)
    _draw_text(img, ((plot[0] + plot[2]) / 2, y1 - GAP), panel.xlabel, label, va="bottom")
    _draw_text(img, (x0 + GAP, (plot[1] + plot[3]) / 2), panel.ylabel, label, ha="left", angle=90)
    lines = []  # (series, colour, (n, 2) pixel points)
    for i, (s, (xs, ys)) in enumerate(zip(panel.series, points)):
        px, py = _scale(xs, *xlim, plot[0], plot[2]), _scale(ys, *ylim, plot[3], plot[1])
        lines.append((s, s.color or PALETTE[i % len(PALETTE)], np.stack([px, py], axis=1)))
    draw = ImageDraw.Draw(img)
    for s, color, pts in lines:
        _draw_series(draw, pts, color, s.style)
    if len(lines) > 1:
        _draw_legend(img, plot, lines)


def _limits(ticks):
    """Axis limits: the outer ticks plus 3% of their span, so data on a round value clears the
    frame."""
    pad = 0.03 * (ticks[-1] - ticks[0])
    return ticks[0] - pad, ticks[-1] + pad


def _span(arrays):
    """(min, max) over all arrays; (0, 1) when they are empty."""
    values = np.concatenate(list(arrays) + [np.empty(0)])
    return (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)


def _draw_axes(img, plot, xlim, ylim, xticks, yticks):
    """Gridlines, tick marks and tick labels around the plot box, then its frame."""
    draw = ImageDraw.Draw(img)
    px0, py0, px1, py1 = plot
    tick = _font(TICK)
    for t, text in zip(xticks, _format_ticks(xticks)):
        x = round(_scale(t, *xlim, px0, px1))
        draw.line((x, py0, x, py1), fill=GRID)
        draw.line((x, py1, x, py1 + 4), fill=INK)
        _draw_text(img, (x, py1 + 4 + GAP // 2), text, tick, va="top")
    for t, text in zip(yticks, _format_ticks(yticks)):
        y = round(_scale(t, *ylim, py1, py0))
        draw.line((px0, y, px1, y), fill=GRID)
        draw.line((px0 - 4, y, px0, y), fill=INK)
        _draw_text(img, (px0 - 4 - GAP // 2, y), text, tick, ha="right")
    draw.rectangle(plot, outline=FRAME)


def _draw_series(draw, pts, color, style):
    """A polyline and/or markers through the (n, 2) pixel points; a lone point always gets a
    marker."""
    points = [tuple(p) for p in pts]
    if style != "markers" and len(points) > 1:
        draw.line(points, fill=color, width=2, joint="curve")
    if style != "line" or len(points) == 1:
        for x, y in points:
            draw.ellipse((x - MARKER_R, y - MARKER_R, x + MARKER_R, y + MARKER_R),
                         fill=color, outline="white")


def _draw_legend(img, plot, lines):
    """A boxed legend in the plot corner that covers the fewest data points."""
    font = _font(TICK)
    row_h, swatch = _line_height(font) + 4, 22
    w = 3 * GAP + swatch + max(_text_width(s.name, font) for s, _, _ in lines)
    h = row_h * len(lines) + GAP
    px0, py0, px1, py1 = plot
    corners = [(px1 - w - GAP, py0 + GAP), (px0 + GAP, py0 + GAP),
               (px1 - w - GAP, py1 - h - GAP), (px0 + GAP, py1 - h - GAP)]
    trace = np.concatenate([_trace(pts, s.style) for s, _, pts in lines])
    lx, ly = min(corners, key=lambda c: _count_inside(trace, (c[0], c[1], c[0] + w, c[1] + h)))
    draw = ImageDraw.Draw(img)
    draw.rectangle((lx, ly, lx + w, ly + h), fill="white", outline=FRAME)
    for k, (s, color, _) in enumerate(lines):
        y = ly + GAP / 2 + row_h * (k + 0.5)
        if s.style != "markers":
            _draw_series(draw, np.array([[lx + GAP, y], [lx + GAP + swatch, y]]), color, "line")
        if s.style != "line":
            _draw_series(draw, np.array([[lx + GAP + swatch / 2, y]]), color, "markers")
        _draw_text(img, (lx + 2 * GAP + swatch, y), s.name, font, ha="left")


def _trace(pts, style):
    """Pixel points along a series as drawn: its points, plus samples along the line segments."""
    if style == "markers" or len(pts) < 2:
        return pts
    t = np.linspace(0, 1, 16)[:, None, None]
    return (pts[:-1] * (1 - t) + pts[1:] * t).reshape(-1, 2)


def _count_inside(points, rect):
    """How many of the (n, 2) points lie in rect = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = rect
    x, y = points[:, 0], points[:, 1]
    return int(np.sum((x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)))


# ---------------------------------------------------------------- heatmaps

def heatmap(matrix, path, title=None, xlabel=None, ylabel=None, xticklabels=None,
            yticklabels=None, annotate=True, cmap="viridis", vmin=None, vmax=None):
    """Draw a matrix as coloured cells, row 0 on top, with a colour bar, and save it as a PNG.

    Args:
        matrix: (R, C) array-like, e.g. a confusion matrix (rows true, columns predicted).
        path: where the PNG goes.
        title, xlabel, ylabel: figure title and axis labels.
        xticklabels, yticklabels: C column / R row names (default: indices); names
            wider than MAX_LABEL_W px are cut, column names that do not fit a
            cell are turned 45 degrees.
        annotate: write each value in its cell (integers when all values are
            whole, else 2 decimals), dark or white for contrast, when a legible
            font fits the cells.
        cmap, vmin, vmax: as in ``colormap``.
    Returns:
        the path written.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"heatmap: matrix must be 2-D, got shape {m.shape}")
    rows, cols = m.shape
    vmin, vmax = _value_range(m, vmin, vmax)
    cell = int(np.clip(480 // max(rows, cols), 12, 64))
    img = _scratch(cols * cell, rows * cell)
    rgb = colormap(m, vmin, vmax, cmap)
    img.paste(_upscale(rgb, cell), (ROOM, ROOM))
    if annotate:
        _annotate(img, m, rgb, cell)
    _draw_matrix_labels(img, cell, (rows, cols), xticklabels, yticklabels, xlabel, ylabel)
    _colorbar(img, ROOM + cols * cell + 3 * GAP, ROOM, rows * cell, vmin, vmax, cmap)
    return _save(_titled(_trim(img), title), path)


def _annotate(img, m, rgb, cell):
    """Write each value in its cell in the largest font (12 px down to 7 px) that fits."""
    whole = np.all(m[np.isfinite(m)] == np.round(m[np.isfinite(m)]))
    texts = [[f"{v:.0f}" if whole else f"{v:.2f}" if np.isfinite(v) else "" for v in row]
             for row in m]
    widest = max((t for row in texts for t in row), key=len)
    size = next((s for s in range(12, 6, -1) if _text_width(widest, _font(s)) <= cell - 4), None)
    if size is None:
        return
    for i, row in enumerate(texts):
        for j, text in enumerate(row):
            _draw_text(img, (ROOM + (j + 0.5) * cell, ROOM + (i + 0.5) * cell), text, _font(size),
                       fill=_ink_for(rgb[i, j]))


def _draw_matrix_labels(img, cell, shape, xticklabels, yticklabels, xlabel, ylabel):
    """Row names left of the cells, column names below them, then the axis labels."""
    rows, cols = shape
    font = _font(TICK)
    xnames = [_fit(t, font, MAX_LABEL_W) for t in _tick_names(xticklabels, cols, "xticklabels")]
    ynames = [_fit(t, font, MAX_LABEL_W) for t in _tick_names(yticklabels, rows, "yticklabels")]
    step = max(1, math.ceil((_line_height(font) + 2) / cell))  # skip names when cells are tiny
    turned = max(_text_width(t, font) for t in xnames) > step * cell - 4
    for i in range(0, rows, step):
        _draw_text(img, (ROOM - GAP, ROOM + (i + 0.5) * cell), ynames[i], font, ha="right")
    bottom = ROOM + rows * cell + GAP
    for j in range(0, cols, step):
        x = ROOM + (j + 0.5) * cell
        _draw_text(img, (x + (_line_height(font) / 2 if turned else 0), bottom), xnames[j], font,
                   ha="right" if turned else "center", va="top", angle=45 if turned else 0)
    names_h = _line_height(font)
    if turned:  # a 45-degree name reaches down sin(45) of its width
        names_h += max(_text_width(t, font) for t in xnames) * 0.71
    names_w = max(_text_width(t, font) for t in ynames)
    _draw_text(img, (ROOM + cols * cell / 2, bottom + names_h + GAP), xlabel, _font(LABEL),
               va="top")
    _draw_text(img, (ROOM - 2 * GAP - names_w, ROOM + rows * cell / 2), ylabel, _font(LABEL),
               ha="right", angle=90)


def _tick_names(names, n, what):
    """``names`` as strings, checked to be ``n`` long; indices 0..n-1 when None."""
    if names is None:
        return [str(i) for i in range(n)]
    if len(names) != n:
        raise ValueError(f"heatmap: {what} needs {n} names, got {len(names)}")
    return [str(t) for t in names]


def heatmap_grid(maps, path, title=None, cols=None, cell_titles=None, row_labels=None,
                 col_labels=None, row_title=None, col_title=None, cmap="viridis",
                 vmin=None, vmax=None):
    """Draw small matrices as a grid of heatmaps sharing one colour bar, and save it as a PNG.

    The ViT paper's position-embedding figure is ``heatmap_grid(sim, path,
    row_labels=range(1, 8), col_labels=range(1, 8), row_title="input patch row",
    col_title="input patch column", cmap="coolwarm", vmin=-1, vmax=1)`` with sim
    of shape (7, 7, 7, 7): the cosine similarity of each patch's embedding with
    every other's.

    Args:
        maps: (R, C, h, w), or (K, h, w) laid out ``cols`` to a row.
        path: where the PNG goes.
        title: figure title.
        cols: maps per row for (K, h, w) maps (default ceil(sqrt(K))).
        cell_titles: K captions, one above each map.
        row_labels, col_labels: R names left of the rows, C names below the columns.
        row_title, col_title: what the rows / columns are, beside / below those names.
        cmap, vmin, vmax: as in ``colormap``; None takes the range of all maps.
    Returns:
        the path written.
    """
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim == 4:
        if cols not in (None, maps.shape[1]):
            raise ValueError(f"heatmap_grid: maps of shape {maps.shape} have {maps.shape[1]} "
                             f"columns, got cols={cols}")
        cols = maps.shape[1]
        maps = maps.reshape(-1, *maps.shape[2:])
    if maps.ndim != 3:
        raise ValueError("heatmap_grid: maps must be (R, C, h, w) or (K, h, w), "
                         f"got shape {maps.shape}")
    k, h, w = maps.shape
    cols = cols or math.ceil(math.sqrt(k))
    rows = math.ceil(k / cols)
    _check_count(cell_titles, k, "heatmap_grid: cell_titles")
    _check_count(row_labels, rows, "heatmap_grid: row_labels")
    _check_count(col_labels, cols, "heatmap_grid: col_labels")
    vmin, vmax = _value_range(maps, vmin, vmax)
    scale = math.ceil(48 / max(h, w))
    caption_h = _line_height(_font(TICK)) + 2 if cell_titles is not None else 0
    pitch_x, pitch_y = w * scale + GAP, caption_h + h * scale + GAP
    img = _scratch(cols * pitch_x, rows * pitch_y)
    for n in range(k):
        x, y = ROOM + (n % cols) * pitch_x, ROOM + (n // cols) * pitch_y
        img.paste(_upscale(colormap(maps[n], vmin, vmax, cmap), scale), (x, y + caption_h))
        if cell_titles is not None:
            text = _fit(str(cell_titles[n]), _font(TICK), pitch_x)
            _draw_text(img, (x + w * scale / 2, y), text, _font(TICK), va="top")
    _draw_grid_labels(img, (rows, cols), (pitch_x, pitch_y), caption_h, row_labels, col_labels,
                      row_title, col_title)
    _colorbar(img, ROOM + cols * pitch_x + 2 * GAP, ROOM + caption_h,
              rows * pitch_y - caption_h - GAP, vmin, vmax, cmap)
    return _save(_titled(_trim(img), title), path)


def _draw_grid_labels(img, shape, pitch, caption_h, row_labels, col_labels, row_title, col_title):
    """Row names and title left of a grid of tiles, column names and title below it."""
    (rows, cols), (pitch_x, pitch_y) = shape, pitch
    font, tile_h = _font(TICK), pitch_y - caption_h - GAP
    row_labels = [str(t) for t in row_labels] if row_labels is not None else []
    col_labels = [str(t) for t in col_labels] if col_labels is not None else []
    for i, text in enumerate(row_labels):
        _draw_text(img, (ROOM - GAP, ROOM + i * pitch_y + caption_h + tile_h / 2),
                   text, font, ha="right")
    for j, text in enumerate(col_labels):
        _draw_text(img, (ROOM + j * pitch_x + (pitch_x - GAP) / 2, ROOM + rows * pitch_y),
                   text, font, va="top")
    names_w = max((_text_width(t, font) for t in row_labels), default=0)
    names_h = _line_height(font) + GAP if col_labels else 0
    _draw_text(img, (ROOM + (cols * pitch_x - GAP) / 2, ROOM + rows * pitch_y + names_h), col_title,
               _font(LABEL), va="top")
    _draw_text(img, (ROOM - 2 * GAP - names_w, ROOM + (rows * pitch_y - GAP) / 2), row_title,
               _font(LABEL), ha="right", angle=90)


def _check_count(items, n, what):
    """Raise unless ``items`` is None or has ``n`` entries."""
    if items is not None and len(items) != n:
        raise ValueError(f"{what}: expected {n}, got {len(items)}")


# ---------------------------------------------------------------- images

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
    return _save(_titled(_trim(img), title), path)


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
    return _save(_titled(_trim(img), title), path)
