"""tinyvit: a Vision Transformer from scratch on NumPy (CuPy on a GPU), every
backward pass written by hand."""

from . import fast
from .backend import get_backend, set_backend
from .gradcheck import gradient_check
from .models import PRESETS, ViT, ViTConfig, create_model
from .nn.loss import SoftmaxCrossEntropy
from .weights import load_pretrained, save_pretrained

__all__ = [
    "PRESETS",
    "SoftmaxCrossEntropy",
    "ViT",
    "ViTConfig",
    "create_model",
    "fast",
    "get_backend",
    "gradient_check",
    "load_pretrained",
    "save_pretrained",
    "set_backend",
]
