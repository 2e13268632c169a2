"""The models: the Vision Transformer, its configs and presets, the hybrid's stem."""

from .config import PRESETS, ViTConfig, preset_config
from .vit import ViT, create_model

__all__ = ["PRESETS", "ViT", "ViTConfig", "create_model", "preset_config"]
