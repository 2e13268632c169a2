"""The data: finding and verifying the official files, reading them, batching and
augmenting them on the active backend."""

from .batches import Batches, normalize
from .datasets import DATASETS, DatasetError, dataset_info
from .fetch import load_dataset
from .images import load_image, read_image

__all__ = ["DATASETS", "Batches", "DatasetError", "dataset_info", "load_dataset", "load_image",
           "normalize", "read_image"]
