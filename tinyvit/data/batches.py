"""Mini-batches of a dataset on the active backend: gathered, scaled to [0, 1],
resized, augmented and normalized, reproducibly per (seed, epoch, batch).

Shapes: ``N`` examples, ``B`` batch, ``C`` channels, ``H``/``W`` image height/width.
"""

import numpy as np  # host-side: the order of an epoch

from .. import backend
from ..backend import to_device, xp
from ..checks import check_label_range
from ..nn.resample import resize_images


def normalize(x, mean, std):
    """(x - mean) / std per channel, the input the models see: x (B, C, H, W) floats
    in [0, 1] on the active backend; mean, std C values each (``dataset_info``), on
    the host or already on the device."""
    shape = (1, x.shape[1], 1, 1)
    mean = to_device(mean, dtype=x.dtype).reshape(shape)
    std = to_device(std, dtype=x.dtype).reshape(shape)
    return (x - mean) / std


class Batches:
    """Normalized mini-batches on the active backend, reproducible per (seed, epoch).

    The uint8 images and int64 labels move to the device once, and so do the
    mean and std: a batch is made without a transfer from the host, nor a read
    from the device. For epoch ``e``
    the order is ``backend.host_rng((seed, e)).permutation(N)`` when
    ``shuffle``, else 0..N-1, so it depends on nothing but ``(seed, e)``: resuming
    at batch ``start`` gives exactly the batches a full epoch would have given.

    Each batch: gather the images on the device, scale to [0, 1] in the default
    float dtype (read when the Batches is made), resize them to ``image_size``
    if given (``resize_images``), apply
    ``augment(x, backend.rng((seed, epoch, batch_index)))`` if given, then
    normalize each channel: ``(x - mean) / std``.

    Args:
        images: (N, C, H, W) uint8, host or device.
        labels: (N,) ints.
        batch_size: examples per batch.
        mean, std: C values each, in [0, 1] pixel units (``dataset_info(name).mean``).
        shuffle: a new order each epoch.
        drop_last: leave out the final batch when it is short.
        seed: with the epoch, seeds the order and the augmentation.
        augment: ``f(x, rng) -> x`` on (B, C, H, W) floats in [0, 1], or None.
        image_size: the side the images are resized to (None: as they are).
        num_classes: when given, the labels are checked to be in [0, num_classes)
            here, once (the GPU loss does not read them to check them).
    """

    def __init__(self, images, labels, batch_size, *, mean, std, shuffle=False,
                 drop_last=False, seed=0, augment=None, image_size=None, num_classes=None):
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(
                f"images should be (N, C, H, W) uint8, got {images.shape} {images.dtype}"
            )
        if labels.shape != images.shape[:1]:
            raise ValueError(f"{images.shape[0]} images but labels have shape {labels.shape}")
        if batch_size < 1:
            raise ValueError(f"batch_size should be at least 1, got {batch_size}")
        channels = images.shape[1]
        if len(mean) != channels or len(std) != channels:
            raise ValueError(
                f"images have {channels} channels but mean has {len(mean)} values "
                f"and std {len(std)}"
            )
        if num_classes is not None and len(labels):
            check_label_range(labels, num_classes, "")  # once, where the labels are
        self.images = to_device(images)  # (N, C, H, W) uint8
        self.labels = to_device(labels, dtype=xp.int64)  # (N,)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.augment = seed, augment
        self.dtype = backend.get_default_dtype()
        self.mean = to_device(mean, dtype=self.dtype)  # (C,), reshaped by normalize
        self.std = to_device(std, dtype=self.dtype)
        self.image_size = image_size

    def __len__(self):
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch):
        """The example indices of an epoch, in the order it visits them (host array)."""
        n = len(self.labels)
        if self.shuffle:
            return backend.host_rng((self.seed, epoch)).permutation(n)
        return np.arange(n)

    def epoch(self, epoch, start=0):
        """Yield ``(x, y)`` for batches ``start``, ``start + 1``, ... of ``epoch``.

        x: (B, C, H, W) floats, normalized. y: (B,) int64. Both on the active backend.
        """
        if not 0 <= start <= len(self):
            raise ValueError(f"start should be in 0..{len(self)}, got {start}")
        order = to_device(self.order(epoch))  # (N,)
        for b in range(start, len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]  # (B,)
            x = self.images[index].astype(self.dtype)  # (B, C, H, W) in 0..255
            x *= 1 / 255
            if self.image_size is not None and x.shape[-2:] != (self.image_size,) * 2:
                x = resize_images(x, self.image_size)
            if self.augment is not None:
                x = self.augment(x, backend.rng((self.seed, epoch, b)))
            yield normalize(x, self.mean, self.std), self.labels[index]
