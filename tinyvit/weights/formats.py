"""The checkpoint formats tinyvit reads, the errors that say in one line what is
wrong with a file, and what stands in for a tensor of a dtype tinyvit does not read."""

import dataclasses

import numpy as np  # host-side file reading only

FORMATS = {
    "timm": "timm state dict",
    "hf": "Hugging Face ViT checkpoint",
    "jax": "JAX .npz of the ViT paper",
    "tinyvit": "tinyvit model file",
    "tinyvit-checkpoint": "tinyvit training checkpoint",
}


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class PretrainedError(ValueError):
    """A file that cannot be read as a ViT checkpoint; the message, one line, lists
    every problem."""


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or is not a tinyvit checkpoint; the message is
    one line: "<path>: <what is wrong>, expected <...>, got <...>"."""


def one_line(error):
    """The message of an error raised by another library (zipfile, json, safetensors)
    on one line."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """Stands in for a tensor whose dtype is not a float tinyvit reads."""

    dtype: str
    shape: tuple


def widen(array):
    """float16 -> float32; float32 and float64 as they are; any other dtype -> Unsupported."""
    if not isinstance(array, np.ndarray):  # a string entry of a .npz file
        return Unsupported(type(array).__name__, ())
    if array.dtype == np.float16:
        return array.astype(np.float32)
    if array.dtype in (np.float32, np.float64):
        return array
    return Unsupported(str(array.dtype), tuple(array.shape))
