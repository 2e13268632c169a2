"""The fast tier on a GPU, the MLP's kernels: GELU, the MLP with fc1's bias inside
the GELU's launch, and Dropout with its mask drawn inside the kernel."""

import functools
from typing import NamedTuple

from ..backend import get_backend, host_rng, write, xp
from ..checks import check_float
from ..nn import layers
from .compile import (
    launch_elementwise,
    scalars,
)
from .gpu_linear import check_rows
from .kernel import FastKernel


class GELU(FastKernel, layers.GELU):
    """y = x Phi(x) (kernels/gelu.cu); the cache is x, as the reference's."""

    def forward(self, x):
        if self.approximate == "tanh":
            return super().forward(x)
        check_float(x, "GELU")
        x = xp.ascontiguousarray(x)
        y = xp.empty_like(x)
        launch_elementwise("gelu", "gelu_forward", x.size, (x, y, xp.int64(x.size)), x.dtype)
        self.cache = x if self.training else None
        return y

    def backward(self, dout):
        if self.approximate == "tanh":
            return super().backward(dout)
        x = self._take_cache()
        dout = xp.ascontiguousarray(dout)
        dx = xp.empty_like(x)
        launch_elementwise("gelu", "gelu_backward", x.size, (x, dout, dx, xp.int64(x.size)),
                           x.dtype)
        return dx


def bias_gelu(u, b):
    """GELU(u + b) for rows u (..., D) and a bias b (D,), in one launch."""
    y = xp.empty_like(u)
    launch_elementwise("gelu", "bias_gelu_forward", u.size,
                       (u, b, y, xp.int64(u.size), xp.int32(b.size)), u.dtype)
    return y


def bias_gelu_backward(u, b, dy):
    """dy * GELU'(u + b), in one launch."""
    dy = xp.ascontiguousarray(dy)
    du = xp.empty_like(u)
    launch_elementwise("gelu", "bias_gelu_backward", u.size,
                       (u, b, dy, du, xp.int64(u.size), xp.int32(b.size)), u.dtype)
    return du


def add_bias_residual(x, m, b):
    """x + m + b for rows x, m (..., D) and a bias b (D,), in one launch."""
    y = xp.empty_like(m)
    launch_elementwise("linear", "add_bias_residual", y.size,
                       (xp.ascontiguousarray(x), xp.ascontiguousarray(m), b, y,
                        xp.int64(y.size), xp.int32(b.size)), y.dtype)
    return y


class MLP(FastKernel, layers.MLP):
    """fc1, GELU: the matmul u = x W1^T, then one launch for GELU(u + b1), the bias
    added inside the GELU's kernel; backward, one launch for du = dh GELU'(u + b1),
    then fc1's own backward of du (dW1, db1 = du summed over rows, dx). The cache
    is u (fc1's is x, as the reference's). The tanh GELU, or fc1 without a bias,
    runs the layers one by one."""

    def fused(self):
        return self.act.approximate != "tanh" and self.fc1.bias is not None

    def forward(self, x):
        if not self.fused():
            return super().forward(x)
        return self.drop2.forward(self.fc2.forward(self.hidden(x)))

    def hidden(self, x):
        """drop1(GELU(fc1(x))), (..., Dm): fc1's matmul, then its bias and the GELU in
        one launch."""
        check_rows(x, self.fc1.weight.data[0], "MLP")
        u = self.fc1.project(x)  # (..., Dm): fc1 before its bias
        self.cache = u if self.training else None
        return self.drop1.forward(bias_gelu(u, self.fc1.bias.data))

    def backward(self, dout):
        if not self.fused():
            return super().backward(dout)
        u = self._take_cache()
        dh = self.drop1.backward(self.fc2.backward(self.drop2.backward(dout)))
        du = bias_gelu_backward(u, self.fc1.bias.data, dh)  # (..., Dm)
        return self.fc1.backward(du)


class DeviceKeys:
    """Dropout's random keys, kept on the device: the 64-bit seed of a step in device
    memory, and the count of masks drawn from it so far. Mask number ``draw`` takes
    its key from the two inside the kernel (kernels/dropout.cu), so the launches of
    a forward read the seed from memory, not from their arguments: a CUDA graph that
    captured them draws new masks each time the seed is rewritten."""

    def __init__(self):
        self.seed = xp.zeros(1, dtype=xp.uint64)
        self.draws = 0

    def reseed(self, seed):
        """Start drawing from ``seed`` (an int or a tuple), written into the same
        device memory, queued on the current stream."""
        write(self.seed, host_rng(seed).integers(2**63, size=1, dtype="uint64"))
        self.draws = 0
        return self

    def draw(self):
        """The number of the next mask."""
        self.draws += 1
        return self.draws - 1


@functools.cache
def device_keys(backend):
    """The one ``DeviceKeys`` of ``backend`` (made at the first call)."""
    return DeviceKeys()


def step_keys(seed):
    """The process's one ``DeviceKeys`` (of the active backend), reseeded with
    ``seed``: what ``seed_dropouts`` gives the GPU dropouts, one seed in one place,
    so a captured step reads each step's seed where it was captured."""
    return device_keys(get_backend()).reseed(seed)


class Mask(NamedTuple):
    """A dropout mask as the kernel draws it: from the keys' seed and its number."""

    keys: DeviceKeys
    draw: int


def dropout(x, mask, p):
    """x * keep / (1 - p), the mask drawn inside the kernel."""
    x = xp.ascontiguousarray(x)
    y = xp.empty_like(x)
    args = (x, y, xp.int64(x.size), mask.keys.seed, xp.uint64(mask.draw), xp.float64(p),
            *scalars(x.dtype, 1 / (1 - p)))
    launch_elementwise("dropout", "dropout_apply", x.size, args, x.dtype)
    return y


class Dropout(FastKernel, layers.Dropout):
    """The mask from a counter-based generator inside the kernel (kernels/dropout.cu),
    from the ``DeviceKeys`` that ``model.seed_dropout`` gives the layer: no random
    state lives on the device but a seed, and nothing is read back from it. The cache
    is the mask's number: the backward draws the same mask from it again, and no mask
    is kept between the passes. A layer given another generator (``rng=``) runs the
    reference's forward with it."""

    generator = staticmethod(step_keys)

    def forward(self, x):
        if not (self.training and self.p and isinstance(self.rng, DeviceKeys)):
            return super().forward(x)  # the identity, the reference's mask, or its error
        self.cache = Mask(self.rng, self.rng.draw())
        return dropout(x, self.cache, self.p)

    def backward(self, dout):
        if not isinstance(self.cache, Mask):
            return super().backward(dout)
        return dropout(dout, self._take_cache(), self.p)
