"""The fast tier on a GPU, the normalizations: LayerNorm and BatchNorm2d, one launch
each way (LayerNorm's with a residual add inside, for ``gpu_block.py``)."""


from ..backend import xp
from ..checks import check_images
from ..nn import conv, layers
from .compile import (
    launch_channels,
    launch_columns,
    launch_elementwise,
    launch_rows,
    scalars,
)
from .gpu_linear import check_dtype, check_rows
from .kernel import FastKernel


class LayerNorm(FastKernel, layers.LayerNorm):
    """The reference LayerNorm in kernels/layernorm.cu; the cache is xhat and rstd,
    as the reference's (rstd one value per row). ``add_forward`` and
    ``backward_add`` fuse a residual connection into it (``Block``)."""

    def forward(self, x):
        return self._forward("layernorm_forward", x)

    def add_forward(self, x, r, bias=None):
        """(s, LayerNorm(s)) for s = x + r (+ bias, (D,)), in one launch."""
        s = xp.empty(r.shape, r.dtype)
        if bias is None:
            return s, self._forward("add_layernorm_forward", x, r, s)
        return s, self._forward("add_bias_layernorm_forward", x, r, bias, s)

    def _forward(self, function, x, *more):
        """``function`` of x (and the arrays ``more`` it takes), each (..., D)."""
        for a in (x, *more):
            check_rows(a, self.weight.data, "LayerNorm")  # a bias (D,) too
        inputs = tuple(xp.ascontiguousarray(a) for a in (x, *more))
        rows, D = x.size // self.dim, self.dim
        y, xhat = xp.empty(x.shape, x.dtype), xp.empty(x.shape, x.dtype)
        rstd = xp.empty(rows, dtype=x.dtype)
        args = (*inputs, self.weight.data, self.bias.data, y, xhat, rstd, xp.int64(rows),
                xp.int32(D), *scalars(x.dtype, self.eps))
        launch_rows("layernorm", function, rows, args, x.dtype)
        self.cache = (xhat, rstd) if self.training else None
        return y

    def backward(self, dout):
        return self._backward(dout, "layernorm_backward", ())

    def backward_add(self, dout, skip):
        """skip + the backward of dout, in one launch: a residual's input gradient."""
        return self._backward(dout, "layernorm_backward_add", (xp.ascontiguousarray(skip),))

    def _backward(self, dout, function, skip):
        xhat, rstd = self._take_cache()
        dout = xp.ascontiguousarray(dout)
        rows, D = rstd.size, self.dim
        dx = xp.empty_like(dout)
        launch_rows("layernorm", function, rows,
                    (dout, xhat, rstd, self.weight.data, *skip, dx, xp.int64(rows), xp.int32(D)),
                    dout.dtype)
        launch_columns("layernorm", "layernorm_param_grads", rows, D,
                       (dout, xhat, self.weight.grad, self.bias.grad, xp.int64(rows),
                        xp.int32(D)), dout.dtype)
        return dx


class BatchNorm2d(FastKernel, conv.BatchNorm2d):
    """The reference BatchNorm2d in kernels/batchnorm.cu, one launch each way: in
    training a block per channel takes its statistics, normalizes, and updates the
    running averages; its backward gives dx and the gamma and beta gradients from
    the same two sums; eval mode one elementwise launch. The cache is xhat and rstd
    (one value per channel)."""

    def forward(self, x):
        check_images(x, "BatchNorm2d", self.num_features)
        check_dtype(x, self.weight.data, "BatchNorm2d")
        x = xp.ascontiguousarray(x)
        B, C, H, W = x.shape
        y = xp.empty_like(x)
        gamma, beta = self.weight.data, self.bias.data
        if not self.training:
            self.cache = None
            args = (x, gamma, beta, self.running_mean, self.running_var, y, xp.int64(x.size),
                    xp.int32(C), xp.int64(H * W), *scalars(x.dtype, self.eps))
            launch_elementwise("batchnorm", "batchnorm_eval", x.size, args, x.dtype)
            return y
        self.values_per_channel(x)
        xhat, rstd = xp.empty_like(x), xp.empty(C, dtype=x.dtype)
        args = (x, gamma, beta, y, xhat, rstd, self.running_mean, self.running_var, xp.int64(B),
                xp.int32(C), xp.int64(H * W), *scalars(x.dtype, self.eps, self.momentum))
        launch_channels("batchnorm", "batchnorm_forward", C, args, x.dtype)
        self.cache = (xhat, rstd)
        return y

    def backward(self, dout):
        xhat, rstd = self._take_cache()
        dout = xp.ascontiguousarray(dout)
        B, C, H, W = dout.shape
        dx = xp.empty_like(dout)
        args = (dout, xhat, rstd, self.weight.data, dx, self.weight.grad, self.bias.grad,
                xp.int64(B), xp.int32(C), xp.int64(H * W))
        launch_channels("batchnorm", "batchnorm_backward", C, args, dout.dtype)
        return dx
