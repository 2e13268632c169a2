"""The Vision Transformer's block diagram, one layer (or a group of them) highlighted.

    block_diagram(highlight, note, path=None)   -> a PIL image (and a PNG at ``path``)

The model reads top to bottom: the hybrid's optional convolutional stem, the patch
embedding, the class token and position embedding, the encoder block (drawn once, run
``depth`` times), the final LayerNorm, the pooling, the head and the loss. Each row is a
step of the forward; a row of several boxes is a layer made of parts, left to right.
A highlighted box is filled; ``note`` (its shapes, say) is written beside the first.
"""

from dataclasses import dataclass
from functools import lru_cache

from PIL import Image, ImageDraw

from .canvas import (
    FRAME,
    GAP,
    INK,
    LABEL,
    MARGIN,
    TICK,
    _draw_text,
    _font,
    _text_width,
    _titled,
    _trim,
    save_png,
)

FILL = (255, 221, 120)  # a highlighted box
EDGE = (200, 120, 0)  # its outline and the note
PLAIN = (244, 244, 244)  # every other box
BOX_H, PAD, ROW_GAP, ARROW = 26, 8, 14, 5  # px

# (group, its caption, its rows); a row is a tuple of (key, label) boxes, left to right
GROUPS = (
    ("input", "", ((("image", "images (B, C, H, W)"),),)),
    ("stem", "the hybrid's convolutional stem (optional)",
     ((("conv2d", "Conv2d (im2col, col2im)"), ("batchnorm", "BatchNorm2d"), ("relu", "ReLU"),
       ("maxpool", "MaxPool2d")),)),
    ("patch_embed", "patch embedding", ((("patchify", "Patchify"),
                                         ("patch_linear", "Linear")),)),
    ("tokens", "", ((("cls_pos", "class token, + position embedding"),
                     ("pos_drop", "Dropout")),)),
    ("block", "encoder block, x depth", (
        (("norm1", "LayerNorm"),),
        (("qkv", "Linear qkv"), ("split_heads", "split heads"), ("scores", "q k^T / sqrt(Dh)"),
         ("softmax", "softmax"), ("attn_drop", "Dropout"), ("weighted", "A v"),
         ("merge_heads", "merge heads"), ("proj", "Linear proj"), ("proj_drop", "Dropout")),
        (("add1", "+ x (residual)"),),
        (("norm2", "LayerNorm"),),
        (("fc1", "Linear"), ("gelu", "GELU"), ("mlp_drop1", "Dropout"), ("fc2", "Linear"),
         ("mlp_drop2", "Dropout")),
        (("add2", "+ x (residual)"),),
    )),
    ("top", "", (
        (("norm", "LayerNorm"),),
        (("pool", "pooling: the class token, or the mean of the patches"),),
        (("pre_logits", "pre-logits: Linear, Tanh (optional)"),),
        (("head", "Linear head"),),
        (("loss", "softmax cross-entropy"),),
    )),
)
ROWS = {"attention": 1, "mlp": 4}  # the block's rows that are one layer each
KEYS = ({key for _, _, rows in GROUPS for row in rows for key, _ in row}
        | {group for group, _, _ in GROUPS} | set(ROWS))


def block_diagram(highlight, note="", path=None):
    """The diagram with the boxes named in ``highlight`` filled: keys of boxes
    ("linear" layers are "qkv", "proj", ...), of a group ("block", "stem") or of a row
    of the block ("attention", "mlp"). ``note`` is written beside the first of them.
    Returns the PIL image; with ``path``, also writes it there as a PNG."""
    unknown = set(highlight) - KEYS
    if unknown:
        raise ValueError(f"block_diagram: no box {sorted(unknown)}; the boxes are "
                         f"{sorted(KEYS)}")
    plain, boxes, frames = _plain()
    img = Image.new("RGB", (plain.width + 4 * GAP + _text_width(note, _font(LABEL)),
                            plain.height), "white")
    img.paste(plain)
    draw = ImageDraw.Draw(img)
    lit = [box for box in boxes if {box.key, box.group} & set(highlight)
           or (box.group == "block" and any(ROWS.get(h) == box.row for h in highlight))]
    for box in lit:
        draw.rectangle(box.rect, fill=FILL, outline=EDGE, width=2)
        x0, y0, x1, y1 = box.rect
        _draw_text(img, ((x0 + x1) / 2, (y0 + y1) / 2), box.label, _font(TICK))
    for group, (rect, caption_at, caption) in frames.items():
        if group in highlight:
            draw.rectangle(rect, outline=EDGE, width=3)
            _draw_text(img, caption_at, caption, _font(TICK - 1), ha="right", fill=EDGE)
    if note and lit:
        _draw_text(img, (plain.width + GAP, (lit[0].rect[1] + lit[0].rect[3]) / 2), note,
                   _font(LABEL), ha="left", fill=EDGE)
    img = _titled(_trim(img), None)
    if path is not None:
        save_png(img, path)
    return img


@dataclass(frozen=True)
class Box:
    key: str
    group: str
    row: int  # its row within the group
    label: str
    rect: tuple  # (x0, y0, x1, y1)


@lru_cache(maxsize=1)
def _plain():
    """The diagram with nothing highlighted (drawn once), its boxes, and each group's
    frame: {group: (rect, where its caption ends, the caption)}."""
    font, small = _font(TICK), _font(TICK - 1)
    rows = [(group, index, row) for group, _, group_rows in GROUPS
            for index, row in enumerate(group_rows)]
    widths = [sum(_text_width(label, font) + 2 * PAD for _, label in row) + GAP * (len(row) - 1)
              for _, _, row in rows]
    left = MARGIN + 3 * GAP + max(_text_width(c, small) for _, c, _ in GROUPS)  # the captions
    right = left + max(widths) + GAP
    height = 2 * MARGIN + len(rows) * (BOX_H + ROW_GAP) + 2 * ROW_GAP * len(GROUPS)
    img = Image.new("RGB", (right + MARGIN, height), "white")
    draw = ImageDraw.Draw(img)
    centre = left + max(widths) / 2
    y, spans, above, boxes = MARGIN, {}, None, []
    for (group, index, row), row_w in zip(rows, widths):
        y += ROW_GAP if index == 0 else 0
        x = centre - row_w / 2
        if above is not None:
            _arrow(draw, centre, above, y)
        for n, (key, label) in enumerate(row):
            w = _text_width(label, font) + 2 * PAD
            boxes.append(Box(key, group, index, label, (x, y, x + w, y + BOX_H)))
            draw.rectangle(boxes[-1].rect, fill=PLAIN, outline=FRAME)
            _draw_text(img, (x + w / 2, y + BOX_H / 2), label, font)
            if n < len(row) - 1:
                _harrow(draw, x + w, x + w + GAP, y + BOX_H / 2)
            x += w + GAP
        spans.setdefault(group, [y, y])[1] = y + BOX_H
        above = y + BOX_H
        y += BOX_H + ROW_GAP
    frames = {}
    for group, caption, _ in GROUPS:
        if caption:
            top, bottom = spans[group]
            frames[group] = ((left - GAP, top - GAP, right, bottom + GAP),
                             (left - 2 * GAP, (top + bottom) / 2), caption)
            draw.rectangle(frames[group][0], outline=FRAME)
            _draw_text(img, *frames[group][1:], small, ha="right")
    return img, boxes, frames


def _arrow(draw, x, top, bottom):
    """A downward arrow from ``top`` to ``bottom`` at ``x``."""
    draw.line((x, top, x, bottom), fill=INK)
    draw.polygon(((x - ARROW, bottom - ARROW), (x + ARROW, bottom - ARROW), (x, bottom)),
                 fill=INK)


def _harrow(draw, left, right, y):
    """A small arrow to the right between two boxes of a row."""
    draw.line((left, y, right, y), fill=INK)
    draw.polygon(((right - 3, y - 3), (right - 3, y + 3), (right, y)), fill=INK)
