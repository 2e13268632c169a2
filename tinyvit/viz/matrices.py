"""Matrices as coloured cells: one with numbers and a colour bar, or a grid of small
ones sharing one colour bar.

    heatmap(matrix, path, ...)        one matrix as coloured cells with numbers and a colour bar
    heatmap_grid(maps, path, ...)     a grid of small matrices sharing one colour bar

The other figures are drawn at generous offsets on a white scratch canvas and trimmed to
what was drawn."""

import math

import numpy as np
from PIL import ImageDraw

from .canvas import (
    GAP,
    INK,
    LABEL,
    MAX_LABEL_W,
    ROOM,
    TICK,
    _check_count,
    _colorbar,
    _draw_text,
    _fit,
    _font,
    _ink_for,
    _line_height,
    _scratch,
    _text_width,
    _titled,
    _trim,
    _upscale,
    _value_range,
    colormap,
    save_png,
)


def heatmap(matrix, path, title=None, xlabel=None, ylabel=None, xticklabels=None,
            yticklabels=None, annotate=True, cmap="viridis", vmin=None, vmax=None, marks=()):
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
        marks: (row, column) of cells to outline (the worst entries of a difference).
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
    _outline(img, [(ROOM + j * cell, ROOM + i * cell) for i, j in marks], cell)
    _draw_matrix_labels(img, cell, (rows, cols), xticklabels, yticklabels, xlabel, ylabel)
    _colorbar(img, ROOM + cols * cell + 3 * GAP, ROOM, rows * cell, vmin, vmax, cmap)
    return save_png(_titled(_trim(img), title), path)


def _outline(img, corners, cell):
    """An ink square around each cell whose top left corner is in ``corners``."""
    draw = ImageDraw.Draw(img)
    for x, y in corners:
        draw.rectangle((x, y, x + cell - 1, y + cell - 1), outline=INK, width=max(2, cell // 16))


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
                 vmin=None, vmax=None, marks=(), map_px=48):
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
        marks: (map, row, column) of cells to outline, the map counted row by row.
        map_px: each map's longer side, at least, in pixels.
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
    scale = math.ceil(map_px / max(h, w))
    caption_h = _line_height(_font(TICK)) + 2 if cell_titles is not None else 0
    pitch_x, pitch_y = w * scale + GAP, caption_h + h * scale + GAP
    img = _scratch(cols * pitch_x, rows * pitch_y)
    for n in range(k):
        x, y = ROOM + (n % cols) * pitch_x, ROOM + (n // cols) * pitch_y
        img.paste(_upscale(colormap(maps[n], vmin, vmax, cmap), scale), (x, y + caption_h))
        if cell_titles is not None:
            text = _fit(str(cell_titles[n]), _font(TICK), pitch_x)
            _draw_text(img, (x + w * scale / 2, y), text, _font(TICK), va="top")
    _outline(img, [(ROOM + (n % cols) * pitch_x + j * scale,
                    ROOM + (n // cols) * pitch_y + caption_h + i * scale) for n, i, j in marks],
             scale)
    _draw_grid_labels(img, (rows, cols), (pitch_x, pitch_y), caption_h, row_labels, col_labels,
                      row_title, col_title)
    _colorbar(img, ROOM + cols * pitch_x + 2 * GAP, ROOM + caption_h,
              rows * pitch_y - caption_h - GAP, vmin, vmax, cmap)
    return save_png(_titled(_trim(img), title), path)


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
