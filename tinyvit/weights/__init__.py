"""Weights in and out: checkpoints and model files, pre-trained formats (timm,
Hugging Face, the ViT paper's JAX files), and weights fitted to another shape."""

from .adapt import resize_image
from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model,
    save_checkpoint,
    save_model,
    saved_model_config,
)
from .formats import PretrainedError
from .pretrained import load_pretrained, read_pretrained, save_pretrained

__all__ = ["CheckpointError", "PretrainedError", "load_checkpoint", "load_model",
           "load_pretrained", "read_pretrained", "resize_image", "save_checkpoint", "save_model",
           "save_pretrained", "saved_model_config"]
