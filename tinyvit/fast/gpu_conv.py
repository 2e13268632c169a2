"""The fast tier on a GPU, Conv2d (the hybrid's stem): im2col and col2im one launch
each, the products cuBLAS's."""


from ..backend import xp
from ..checks import check_images
from ..nn import conv
from ..nn.functional import standardize_backward
from .compile import (
    launch_elementwise,
)
from .cublas import matmul
from .gpu_linear import add_column_sum, check_dtype
from .kernel import FastKernel


class Conv2d(FastKernel, conv.Conv2d):
    """The reference Conv2d as a Linear over receptive fields: one launch lays the
    fields out as rows (kernels/conv.cu's im2col, the padding read as zeros), a
    cuBLAS product gives every output pixel's channels, one copy puts them in
    (B, F, Ho, Wo) order; backward, one copy back to rows, the bias gradient in one
    launch, two products, and one launch of col2im for dx. The cache is the rows,
    the (F, U) weight the forward used, its rstd under weight standardization, and
    the input's shape."""

    def forward(self, x):
        check_images(x, "Conv2d", self.in_channels)
        conv.check_fits(x, self.kernel_size, self.padding, "Conv2d")
        check_dtype(x, self.weight.data, "Conv2d")
        x = xp.ascontiguousarray(x)
        B, F = x.shape[0], self.out_channels
        rows, (Ho, Wo) = self.im2col(x)  # (M, U), M = B*Ho*Wo
        w2, rstd = self.weight_matrix()  # (F, U)
        y = matmul(rows, w2, transpose_b=True)  # (M, F)
        y = xp.ascontiguousarray(y.reshape(B, Ho * Wo, F).transpose(0, 2, 1))  # (B, F, Ho*Wo)
        if self.bias is not None:
            y += self.bias.data[:, None]
        self.cache = (rows, w2, rstd, x.shape) if self.training else None
        return y.reshape(B, F, Ho, Wo)

    def backward(self, dout):
        rows, w2, rstd, shape = self._take_cache()
        B, F, Ho, Wo = dout.shape
        dy = xp.ascontiguousarray(dout.reshape(B, F, Ho * Wo).transpose(0, 2, 1))  # (B, Ho*Wo, F)
        dy = dy.reshape(-1, F)  # (M, F)
        if self.bias is not None:
            add_column_sum(dy, self.bias.grad)
        if rstd is None:  # dW += dy^T rows
            matmul(dy, rows, transpose_a=True, out=self.weight.grad.reshape(F, -1))
        else:  # through what = (W - mean) * rstd, as the reference
            dw2 = standardize_backward(matmul(dy, rows, transpose_a=True), w2, rstd, 1)
            self.weight.grad += dw2.reshape(self.weight.shape)
        return self.col2im(matmul(dy, w2), shape)  # drows (M, U) -> dx (B, C, H, W)

    def geometry(self, shape):
        """The launch's int arguments for input ``shape``: C, H, W, kh, kw, sh, sw, ph, pw,
        Ho, Wo."""
        _, C, H, W = shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
        return tuple(xp.int32(v) for v in (C, H, W, kh, kw, sh, sw, ph, pw, Ho, Wo))

    def im2col(self, x):
        """The receptive fields of x (B, C, H, W) as rows (M, U), and (Ho, Wo)."""
        geometry = self.geometry(x.shape)
        Ho, Wo = int(geometry[-2]), int(geometry[-1])
        U = self.in_channels * self.kernel_size[0] * self.kernel_size[1]
        rows = xp.empty((x.shape[0] * Ho * Wo, U), dtype=x.dtype)
        launch_elementwise("conv", "im2col", rows.size, (x, rows, xp.int64(rows.size), *geometry),
                           x.dtype)
        return rows, (Ho, Wo)

    def col2im(self, drows, shape):
        """dx (B, C, H, W) from the rows' gradient drows (M, U)."""
        dx = xp.empty(shape, dtype=drows.dtype)
        launch_elementwise("conv", "col2im", dx.size,
                           (drows, dx, xp.int64(dx.size), *self.geometry(shape)), dx.dtype)
        return dx
