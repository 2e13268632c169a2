"""Random inputs and parameters for gradient checks, the same on every backend."""

from ..backend import host_rng, to_device
from ..nn.layers import Dropout, seed_dropouts


def randn(*shape, seed=0):
    """Standard normal float64 values on the active backend (the same on every backend)."""
    return to_device(host_rng(seed).standard_normal(shape))


def jitter(module, scale=0.2, seed=1):
    """Move every parameter off its neat initial value (unit gammas, zero biases),
    which could hide a backward that mixes them up. Returns the module."""
    for i, p in enumerate(module.parameters()):
        p.data[...] += to_device(host_rng((seed, i)).standard_normal(p.shape)) * scale
    return module


def seeded_dropout(module, seed=5):
    """A ``before_forward`` for ``gradient_check``: gives every Dropout in ``module``
    one generator, restarted before each forward, so that every forward of the check
    draws the same masks."""
    dropouts = [m for _, m in module.named_modules() if isinstance(m, Dropout)]
    return lambda: seed_dropouts(dropouts, seed)
