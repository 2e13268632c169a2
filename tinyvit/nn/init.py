"""Initial weights, drawn on the host.

``rng`` is always a host generator (``backend.host_rng``): the values are drawn
with NumPy and then moved to the active backend, so a seed gives the same model
on NumPy and on CuPy.
"""

from ..backend import float_dtype, to_device


def trunc_normal(rng, shape, std=0.02, dtype=None):
    """Normal(0, std) values redrawn until inside [-2 std, 2 std] (timm's init)."""
    dtype = float_dtype(dtype)
    values = rng.standard_normal(shape, dtype=dtype)
    flat = values.reshape(-1)
    redraw = (abs(flat) > 2).nonzero()[0]
    while redraw.size:
        flat[redraw] = rng.standard_normal(redraw.size, dtype=dtype)
        redraw = redraw[abs(flat[redraw]) > 2]
    return to_device(values * dtype(std))


def uniform(rng, bound, shape, dtype=None):
    """Uniform(-bound, bound) values (PyTorch's default for Linear and Conv2d
    layers, with bound = 1/sqrt(fan_in))."""
    return to_device(rng.uniform(-bound, bound, shape), dtype=float_dtype(dtype))
