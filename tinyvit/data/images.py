"""An image file as a model's input: what ``--predict`` and the inspection pictures
read.

Every picture becomes float planes in [0, 1] first, whatever its bit depth (8- or
16-bit, integer or float, palette), with its alpha if it has one; the
transparency is then flattened as the dataset's pictures would show it, and the
result resized and normalized.
"""

import re
import warnings
from pathlib import Path

import numpy as np  # host-side image reading only
from PIL import Image, ImageOps, UnidentifiedImageError

from ..backend import to_device
from .batches import normalize
from .datasets import DatasetError, dataset_info

EXPECTED = "expected an image file (PNG, JPEG, BMP, GIF, TIFF, WebP, ...)"
SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
GRAY_MODES = ("1", "L", "LA", "I", "F", *SIXTEEN_BIT)  # Pillow's modes of one gray plane
MODE_WORDS = {"1": "1-bit", "L": "gray", "LA": "gray with alpha", "P": "palette",
              "PA": "palette with alpha", "I": "32-bit gray", "F": "float gray",
              **{mode: "16-bit gray" for mode in SIXTEEN_BIT}}  # RGB, CMYK, ...: Pillow's names
FAINT = 0.5  # strokes whose lightest pixel is below this (of white) are stretched to white
# the ranges an integer ("I") or float ("F") picture is read in: the smallest that holds
# its values (a 16-bit PNG read as "I" is 0..65535, a float picture usually 0..1)
RANGES = {"I": (255, 65535), "F": (1, 255, 65535)}
SOFT = 0.1  # an alpha partly transparent on this share of the visible pixels is soft
ONE_COLOR = 0.25  # strokes whose opaque pixels span less than this are of one color


def load_image(path, dataset, image_size):
    """An image file (PNG, JPG, any size, mode or bit depth) as a normalized
    (1, C, H, W) batch of ``dataset``'s images on the active backend,
    H = W = ``image_size``.

    The pixels are read in [0, 1] by their mode's range (``_planes``). MNIST-style
    data (one channel) is light strokes on black: ``_light_on_dark`` turns a dark
    digit on paper, or a drawing on a transparent background, into that, and
    ``_stretched`` faint strokes to white. A color dataset's picture is shown over white
    where it is transparent. A picture that is not square is made so (``_squared``)
    before it is resized. Anything that is not a readable image raises DatasetError in
    one line (``open_image``).
    """
    return read_image(path, dataset, image_size)[0]


def read_image(path, dataset, image_size):
    """(batch, changes): ``load_image``'s batch, and what became of the picture on the
    way, in words, for a person to check (``--predict`` prints them): the picture as
    read ("640x480 RGB"), then each change made, as "read as gray", "inverted to light
    strokes on black ...", "padded with black to 56x56" or "resized to 28x28"."""
    info = dataset_info(dataset)
    channels = info.image_shape[0]
    image = open_image(path)
    changes = [f"{image.width}x{image.height} {MODE_WORDS.get(image.mode, image.mode)}"]
    planes, alpha = _planes(image, channels, path)  # (h, w, C), (h, w) or None
    changes += _conversion(image.mode, channels)
    if channels == 1:
        gray, made = _light_on_dark(planes[..., 0], alpha)
        gray, stretched = _stretched(gray)
        planes = gray[..., None]
        changes += [change for change in (made, stretched) if change]
    elif alpha is not None:
        planes = planes * alpha[..., None] + (1 - alpha[..., None])  # over white
        changes += ["shown over white where transparent"] if (alpha < 1).any() else []
    planes, squared = _squared(planes)
    changes += [squared] if squared else []
    if planes.shape[:2] != (image_size, image_size):
        changes.append(f"resized to {image_size}x{image_size}")
    pixels = _resize(planes, image_size).transpose(2, 0, 1)[None]  # (1, C, H, W)
    return normalize(to_device(pixels), info.mean, info.std), changes


def _conversion(mode, channels):
    """What reading a picture of Pillow's ``mode`` into ``channels`` planes changes, in
    words (a palette may hold colors: it is read as a color picture is)."""
    gray = mode in GRAY_MODES
    if channels == 1:
        return [] if gray else ["read as gray"]
    if gray:
        return [f"gray in each of the {channels} channels"]
    return [] if mode in ("RGB", "RGBA") else ["read as RGB"]


def open_image(path):
    """The picture in ``path``, decoded (its first frame) and turned upright by its
    EXIF orientation. A directory, a missing file, a file that is not an image, a
    truncated or corrupted one, and one over Pillow's ``Image.MAX_IMAGE_PIXELS``
    (a decompression bomb: Pillow's warning is an error here) each raise
    DatasetError: "cannot read image PATH: what is wrong, expected ...".
    """
    if Path(path).is_dir():
        raise _unreadable(path, f"it is a directory, {EXPECTED}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                return ImageOps.exif_transpose(image)
    except FileNotFoundError as e:
        raise _unreadable(path, f"no such file, {EXPECTED}") from e
    except IsADirectoryError as e:
        raise _unreadable(path, f"it is a directory, {EXPECTED}") from e
    except PermissionError as e:
        raise _unreadable(path, "permission denied, expected a file this user can read") from e
    except UnidentifiedImageError as e:
        raise _unreadable(path, f"not an image format Pillow knows, {EXPECTED}") from e
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _unreadable(path, _too_large(e)) from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # what Pillow's decoders raise
        raise _unreadable(path, f"truncated or corrupted ({e}), expected a complete "
                                "image file") from e


def _unreadable(path, problem):
    return DatasetError(f"cannot read image {path}: {problem}")


def _too_large(error):
    limit = Image.MAX_IMAGE_PIXELS
    pixels = re.search(r"\((\d+) pixels\)", str(error))  # Pillow's message names the size
    size = f"{int(pixels[1]):,} pixels" if pixels else "too many pixels"
    return (f"{size}, over Pillow's limit of {limit:,} (a decompression bomb?), "
            f"expected a picture of at most {limit:,} pixels")


def _planes(image, channels, path):
    """(planes (h, w, channels) float32 in [0, 1], alpha (h, w) in [0, 1] or None).

    16-bit pictures are divided by 65535; integer ("I") and float ("F") ones by the
    smallest of the usual ranges that holds their values (``RANGES``), negative
    values read as 0; these have no alpha and, gray, fill every channel. The 8-bit
    modes (palettes included) are converted by Pillow to gray or RGB, and those with
    transparency (RGBA, LA, PA, a palette or a color marked transparent) give their
    alpha.
    """
    if image.mode in SIXTEEN_BIT or image.mode in RANGES:
        gray = _scaled(np.asarray(image), image.mode)
        return np.repeat(gray[..., None], channels, axis=2), None
    alpha = None
    try:
        if image.has_transparency_data:
            image = image.convert("RGBA")
            alpha = np.asarray(image.getchannel("A"), dtype=np.float32) / 255
        image = image.convert("RGB").convert("L" if channels == 1 else "RGB")
    except ValueError as e:  # a mode Pillow cannot convert (LAB to gray, La, ...)
        raise _unreadable(path, f"its color mode {image.mode} cannot be converted, "
                                "expected a gray, RGB or palette picture") from e
    planes = np.asarray(image, dtype=np.float32) / 255
    return planes.reshape(*planes.shape[:2], channels), alpha


def _scaled(values, mode):
    """A 16-bit, integer or float picture's values in [0, 1], float32."""
    values = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    values = np.maximum(values, 0)
    if mode in SIXTEEN_BIT:
        return (values / 65535).astype(np.float32)
    top = values.max()
    scale = next((limit for limit in RANGES[mode] if top <= limit), top)
    return (values / scale).astype(np.float32)


def _light_on_dark(gray, alpha):
    """(gray, change): (h, w) in [0, 1], light strokes on a black background as in
    MNIST, and what was changed, in words (None: nothing).

    In an opaque picture (no alpha, or the same alpha everywhere) most pixels are its
    background: their median is its level. A light one (a dark digit on paper, photographed
    or scanned, a dark frame or table edge around it or not) is inverted, the paper's level
    taken to black and the darkest ink to white: ``(paper - gray) / paper``, ``1 - gray``
    on white paper. Where the alpha varies the transparent part is the background, and a
    visible pixel is ink in proportion to its alpha (``_alpha_ink``).
    """
    if alpha is None or np.ptp(alpha) < 1 / 255:
        paper = float(np.median(gray))
        if paper <= 0.5 or np.ptp(gray) < 1 / 255:  # strokes on black already, or no strokes
            return gray, None
        return np.clip((paper - gray) / paper, 0, 1), (
            f"inverted to light strokes on black (it had dark strokes on light paper, "
            f"{paper:.2f} of white)")
    ink, dark = _alpha_ink(gray, alpha)
    return alpha * ink, ("the transparent part became the black background, the visible "
                         f"part the strokes{' (inverted: dark on light)' if dark else ''}")


def _stretched(gray):
    """(gray, change): light strokes on black whose lightest pixel is under ``FAINT`` of
    white (a 12-bit scan in a 16-bit file, a faint pencil) stretched to reach white; a
    picture of one level everywhere, black or not, said to be blank."""
    top = float(gray.max())
    if np.ptp(gray) < 1 / 255:
        return gray, "blank: no strokes for the model to see"
    if top >= FAINT:
        return gray, None
    return gray / top, f"its strokes, only {top:.2f} of white at most, stretched to white"


def _squared(planes):
    """(planes, change): a picture that is not square made so, as the datasets' are: one
    plane (strokes on black) padded with black around it, as MNIST centres a digit;
    colors cropped to their centre square, as a photo is for a classifier."""
    h, w, channels = planes.shape
    if h == w:
        return planes, None
    if channels == 1:
        side = max(h, w)
        square = np.zeros((side, side, 1), dtype=planes.dtype)
        top, left = (side - h) // 2, (side - w) // 2
        square[top:top + h, left:left + w] = planes
        return square, f"padded with black to {side}x{side}"
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    return planes[top:top + side, left:left + side], f"cropped to its centre {side}x{side}"


def _alpha_ink(gray, alpha):
    """(ink, dark): how much ink each visible pixel holds, in [0, 1], to be multiplied
    by its alpha, and whether that is 1 - gray (dark strokes on light paper).

    A soft alpha (at least ``SOFT`` of the visible pixels partly transparent: a
    drawing's antialiased strokes, whatever color they were given or blended
    with) is the ink itself: 1. A hard one (a cut-out: GIF or palette
    transparency, a card on a transparent margin) leaves it to the colors of the
    opaque part (alpha at least 0.5): strokes of one color (5th to 95th percentile
    less than ``ONE_COLOR`` apart) are ink, 1; otherwise the paper is the rim of the
    opaque part (its pixels next to a transparent one or to the picture's edge),
    and ink is what differs from it: 1 - gray where the rim is lighter than the
    opaque part on average (dark strokes), gray where it is darker (light strokes).
    The colors that transparent pixels hide play no part.
    """
    visible = alpha > 0
    if np.mean(alpha[visible] < 1) >= SOFT:
        return np.ones_like(gray), False
    opaque = alpha >= 0.5
    low, high = np.percentile(gray[opaque], [5, 95])
    if high - low < ONE_COLOR:
        return np.ones_like(gray), False
    rim = gray[opaque & ~_interior(opaque)]
    dark = rim.mean() > gray[opaque].mean()
    return (1 - gray if dark else gray), dark


def _interior(mask):
    """The pixels of ``mask`` whose four neighbours are all in it (outside the
    picture counts as not)."""
    padded = np.pad(mask, 1)
    return (mask & padded[:-2, 1:-1] & padded[2:, 1:-1]
            & padded[1:-1, :-2] & padded[1:-1, 2:])


def _resize(planes, image_size):
    """(image_size, image_size, C) float32: each plane resized by Pillow.

    Pillow's resize averages every source pixel an output pixel covers: a photo
    shrinks by 100x without aliasing (nn.resample interpolates, for small factors).
    """
    size = (image_size, image_size)
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(plane, np.float32))
                                .resize(size, Image.BILINEAR))
                     for plane in planes.transpose(2, 0, 1)], axis=2)
