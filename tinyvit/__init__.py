"""tinyvit: a Vision Transformer from scratch on NumPy (CuPy on a GPU), every
backward pass written by hand."""

from .backend import get_backend, set_backend
from .fast import use_fast, use_reference
from .gradcheck import gradient_check
from .loss import SoftmaxCrossEntropy
from .model import PRESETS, ViT, ViTConfig, create_model
from .pretrained import load_pretrained

__all__ = [
    "PRESETS",
    "SoftmaxCrossEntropy",
    "ViT",
    "ViTConfig",
    "create_model",
    "get_backend",
    "gradient_check",
    "load_pretrained",
    "set_backend",
    "use_fast",
    "use_reference",
]
