"""An image file as a model's input: what ``--predict`` and the inspection pictures
read."""

import numpy as np  # host-side image reading only
from PIL import Image, ImageOps, UnidentifiedImageError

from ..backend import to_device
from .batches import normalize
from .datasets import DatasetError, dataset_info


def load_image(path, dataset, image_size):
    """An image file (PNG, JPG, any size or mode) as a normalized (1, C, H, W) batch
    of ``dataset``'s images on the active backend, H = W = ``image_size``.

    Converted to the dataset's channels and resized. MNIST-style data is light
    strokes on a dark background: a grayscale picture whose border is mostly light
    (a dark digit on white paper) is inverted to match.
    """
    info = dataset_info(dataset)
    channels = info.image_shape[0]
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image).convert("L" if channels == 1 else "RGB")
            # Pillow's resize averages every source pixel an output pixel covers: a photo
            # shrinks by 100x without aliasing (nn.resample interpolates, for small factors)
            image = image.resize((image_size, image_size), Image.BILINEAR)
    except (FileNotFoundError, UnidentifiedImageError) as e:
        raise DatasetError(f"cannot read image {path}: {e}") from e
    pixels = np.asarray(image, dtype=np.float32) / 255  # (H, W) or (H, W, C)
    pixels = pixels.reshape(image_size, image_size, channels).transpose(2, 0, 1)[None]
    if channels == 1:
        edges = (pixels[0, 0, 0], pixels[0, 0, -1], pixels[0, 0, :, 0], pixels[0, 0, :, -1])
        if np.concatenate(edges).mean() > 0.5:
            pixels = 1 - pixels
    return normalize(to_device(pixels), info.mean, info.std)  # (1, C, H, W)
