"""Line charts: side-by-side panels of ``Series`` (lines, markers or both), each with
its axes, round ticks and a legend placed where it covers the fewest points.

    line_chart(panels, path, ...)     side-by-side panels of Series

Training draws its loss and accuracy curves here, the workbook its training exercise."""

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from .canvas import (
    FRAME,
    GAP,
    GRID,
    INK,
    LABEL,
    PALETTE,
    TICK,
    _draw_text,
    _font,
    _format_ticks,
    _line_height,
    _scale,
    _text_width,
    _titled,
    nice_ticks,
    save_png,
)

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
    return save_png(_titled(row, title), path)


def _draw_panel(img, box, panel):
    """Title, axes, gridlines, series and legend of one panel inside box = (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = box
    points = [s.finite() for s in panel.series]
    xticks = whole_steps(nice_ticks(*_span([xs for xs, _ in points])), [xs for xs, _ in points])
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


def whole_steps(ticks, arrays):
    """``ticks`` a step of 1 apart at least where every value of ``arrays`` is a whole number
    (epochs): 1, 2, 3, not 1.5 and 2.5 between them, where no point can be."""
    values = np.concatenate(list(arrays) + [np.empty(0)])
    if len(ticks) < 2 or ticks[1] - ticks[0] >= 1 or not np.all(values == np.round(values)):
        return ticks
    return [float(t) for t in range(math.floor(ticks[0]), math.ceil(ticks[-1]) + 1)]


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
