"""Reading ``.safetensors`` files with the ``safetensors`` package's NumPy API
(``pip install -e ".[hub]"``). NumPy has no bfloat16, so BF16 tensors are read
from the file's bytes (``bfloat16_to_float32``); BF16 and F16 are widened to
float32."""

import json

import numpy as np  # host-side file reading only

from .formats import PretrainedError, Unsupported, one_line, widen

SAFETENSORS_FLOATS = ("F64", "F32", "F16")  # what safetensors' NumPy API reads; BF16 by hand


def safetensors_package():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:
        raise ImportError('.safetensors files need the safetensors package: pip install -e ".[hub]"'
                          ) from e
    return safetensors


def bfloat16_to_float32(raw, shape):
    """Widen bfloat16 bytes exactly. A bfloat16 is the high half of a float32 (sign,
    8 exponent bits, 7 mantissa bits): put its 16 bits in the high half of a uint32
    and read that as a float32."""
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


def _safetensors_header(path):
    """The file layout: an 8-byte little-endian header length, the JSON header
    (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets counted
    from the end of the header), then the data."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length)), 8 + length


def _raw_bytes(path, header, data_start, name):
    begin, end = header[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        return f.read(end - begin)


def read_safetensors(path):
    """(tensors, metadata) of a ``.safetensors`` file: ``{name: host array}``, F16 and
    BF16 widened to float32, a tensor of another dtype as an ``Unsupported``."""
    safetensors = safetensors_package()
    tensors, layout = {}, None
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            metadata = f.metadata() or {}
            names = f.keys()
            for name in names:
                piece = f.get_slice(name)
                dtype, shape = piece.get_dtype(), tuple(piece.get_shape())
                if dtype in SAFETENSORS_FLOATS:
                    tensors[name] = widen(f.get_tensor(name))
                elif dtype == "BF16":
                    layout = layout or _safetensors_header(path)
                    tensors[name] = bfloat16_to_float32(_raw_bytes(path, *layout, name), shape)
                else:
                    tensors[name] = Unsupported(dtype, shape)
    except safetensors.SafetensorError as e:
        raise PretrainedError(f"{path}: not a readable .safetensors file ({one_line(e)})") from e
    return tensors, metadata
