"""Using a trained model: rebuilt from its checkpoint, asked about an image file."""

import numpy as np  # host-side ranking only

from ..backend import to_host
from ..data import dataset_info, load_image
from ..models import ViT
from ..nn.functional import softmax
from ..weights import load_checkpoint, saved_model_config
from .config import TrainConfig


def load_trained(path):
    """(model, TrainConfig) from a training checkpoint; the model of reference layers,
    in eval mode."""
    model_state, _, meta = load_checkpoint(path)
    model = ViT(saved_model_config(meta))
    model.load_state_dict(model_state)
    return model.eval(), TrainConfig(**meta["config"])


def predict(model, config, path, top=3):
    """The ``top`` most likely classes of an image file: [(class name, probability)]."""
    image = load_image(path, config.dataset, config.image_size())  # (1, C, H, W)
    probs = to_host(softmax(model.eval().forward(image)))[0]  # (K,)
    classes = dataset_info(config.dataset).classes
    return [(classes[i], float(probs[i])) for i in np.argsort(-probs)[:top]]
