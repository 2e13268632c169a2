"""The fast tier on a GPU, Linear: its matmuls through ``cublas.py`` and its bias
gradient in one launch; and the checks of an input every GPU kernel makes."""


from ..backend import xp
from ..nn import layers
from .compile import (
    launch_columns,
)
from .cublas import matmul
from .kernel import FastKernel


def check_rows(x, weight, layer):
    """A ValueError unless ``x`` is rows (..., D) of the layer's D and float dtype: a
    kernel reads one type, and rows of the length it is told."""
    if x.dtype != weight.dtype or x.shape[-1:] != weight.shape:
        raise ValueError(f"{layer}: the GPU kernel expects input (..., {weight.shape[0]}) of "
                         f"dtype {weight.dtype}, got {x.shape} of dtype {x.dtype}")


def check_dtype(x, weight, layer):
    """A ValueError unless ``x`` has the layer's float dtype: a kernel reads one type."""
    if x.dtype != weight.dtype:
        raise ValueError(f"{layer}: the GPU kernel expects input of dtype {weight.dtype}, "
                         f"got {x.dtype}")


class Linear(FastKernel, layers.Linear):
    """The reference Linear, its matmuls through ``cublas.matmul`` (which a CUDA graph
    can capture) and its weight gradient added by the matmul itself; its backward
    adds the bias gradient, a sum down the rows of dy, in one launch
    (kernels/linear.cu) where a matrix-vector product takes three."""

    def forward(self, x):
        y = self.project(x)
        if self.bias is not None:
            y += self.bias.data
        return y

    def project(self, x):
        """x W^T, (..., out): the forward without its bias, which the kernel after it
        adds; the cache is the forward's, so the backward is the same."""
        check_rows(x, self.weight.data[0], "Linear")
        x2 = xp.ascontiguousarray(x).reshape(-1, self.in_features)  # (M, in)
        self.cache = x2 if self.training else None
        y = matmul(x2, self.weight.data, transpose_b=True)  # (M, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = xp.ascontiguousarray(dout).reshape(-1, self.out_features)  # (M, out)
        matmul(dout2, x2, transpose_a=True, out=self.weight.grad)  # dW += dy^T x
        if self.bias is not None:
            add_column_sum(dout2, self.bias.grad)
        return matmul(dout2, self.weight.data).reshape(*dout.shape[:-1], self.in_features)


def add_column_sum(dy, grad):
    """grad += dy (M, D) summed down its rows: a bias gradient, in one launch."""
    M, D = dy.shape
    launch_columns("linear", "bias_grad", M, D, (dy, grad, xp.int64(M), xp.int32(D)), dy.dtype)
