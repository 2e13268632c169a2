"""Using a trained model: rebuilt from its checkpoint, asked about an image file."""

from pathlib import Path

import numpy as np  # host-side ranking only

from ..backend import to_host
from ..data import dataset_info, read_image
from ..models import ViT, ViTConfig
from ..nn.functional import softmax
from ..weights import CheckpointError
from ..weights.checkpoint import config_from_json, read_checkpoint, read_meta
from ..weights.fields import check_json_fields
from ..weights.npz import open_npz
from .config import TrainConfig


def run_config(path, values):
    """The TrainConfig of a checkpoint's meta ``config`` (``values``, read from JSON):
    every field's name and type, its ``model_overrides``' too, then every value
    checked; a CheckpointError naming the file otherwise."""
    check_json_fields(path, "meta config.model_overrides", ViTConfig,
                      values.get("model_overrides", {}), CheckpointError)
    return config_from_json(path, "meta config", TrainConfig, values)


def check_checkpoint_config(path):
    """When ``path`` is a tinyvit training checkpoint, its run config checked as
    ``load_trained`` checks it. For the readers of its weights alone (``--init``,
    ``tinyvit.convert``): they read the file through the weights floor, which checks
    the weights and the model config but does not know TrainConfig."""
    path = Path(path)
    if path.suffix == ".npz" and path.is_file():
        with open_npz(path) as npz:
            if "meta" in npz.entries:
                read_meta(npz, run_config)


def trained_path(path):
    """The checkpoint a path names: a file as it is, a run folder's best.npz."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / "best.npz").is_file():
        raise FileNotFoundError(f"no best.npz in {path}")
    return path / "best.npz"


def load_trained(path):
    """(model, TrainConfig) from a training checkpoint or a run folder (its
    best.npz), every part of the file checked before a model is built; the model of
    reference layers, in eval mode."""
    path = trained_path(path)
    if path.suffix.lower() == ".safetensors":
        raise CheckpointError(f"{path}: weights alone, not a training checkpoint: expected a "
                              "run's best.npz or last.npz, which names its dataset (train from "
                              "these weights with --init)")
    checkpoint = read_checkpoint(path, run_config, optimizer=False)
    model = ViT(checkpoint.model_config)
    model.load_state_dict(checkpoint.model_state)
    return model.eval(), checkpoint.config


def predict(model, config, path, top=3):
    """(classes, changes): the ``top`` most likely classes of an image file, [(class
    name, probability)], and what became of the picture on the way to the model
    (``read_image``'s changes: "inverted", "resized to 28x28", ...)."""
    image, changes = read_image(path, config.dataset, config.image_size())  # (1, C, H, W)
    return classify(model, config, image, top), changes


def classify(model, config, image, top=3):
    """The ``top`` most likely classes of a (1, C, H, W) batch: [(class name,
    probability)]."""
    probs = to_host(softmax(model.eval().forward(image)))[0]  # (K,)
    classes = dataset_info(config.dataset).classes
    return [(classes[i], float(probs[i])) for i in np.argsort(-probs)[:top]]
