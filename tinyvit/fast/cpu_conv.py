"""The fast tier's Conv2d on the CPU (the hybrid's stem): the im2col columns formed a
block of images at a time, each block multiplied while it is still in the cache,
channels-last where that makes their rows longer.

``tests/test_fast.py`` checks it against the reference ``tinyvit.nn.conv.Conv2d``.

Shapes as in ``tinyvit/nn/conv.py``: F filters, U = C*kh*kw the values of one
im2col column, and B' the images of one block of a Conv2d's batch.
"""

from ..backend import xp
from ..checks import check_images
from ..nn import conv
from ..nn.functional import standardize_backward
from .kernel import FastKernel


class Conv2d(FastKernel, conv.Conv2d):
    """The reference Conv2d with its columns formed one block of images at a time,
    in whichever layout gives them longer rows.

    Blocks. The reference forms all the columns, then multiplies: at a stem's
    sizes they are tens of MB, so the product reads them back from memory. Here
    each block of images holds about ``block_bytes`` of columns, formed and
    multiplied while it is still in the cache. The cache keeps the padded input,
    not the columns (kh*kw / stride^2 times smaller), and the backward forms each
    block's columns again.

    Layout. Forming the columns copies, and col2im adds back, rows of values that
    are contiguous in both arrays, and NumPy pays a fixed cost per row:
    - channels-first, as the reference: the padded input (C, B, Hp, Wp), the
      columns (U, B'*Ho*Wo) for a block of B' images, rows of Wo pixels;
    - channels-last: the padded input (B, Hp, Wp, C), the columns (B'*Ho*Wo, U)
      with U in (kh, kw, C) order, rows of C channels (kw*C when forming them).
    Each call takes channels-last when C >= Wo: 32 channels on a 14x14 input at
    stride 2 (rows of 7 pixels) run channels-last, 3 channels on 32x32 at
    stride 1 channels-first. Channels-last, the products are the reference's
    transposed, with the columns and the upstream gradient as rows, (B'*Ho*Wo, U)
    and dy (B'*Ho*Wo, F): out = cols W2^T, dW2 = dy^T cols, dcols = dy W2.
    """

    block_bytes = 1 << 20

    def image_blocks(self, batch, columns_per_image):
        """Slices of the batch, each holding about ``block_bytes`` of columns."""
        step = max(1, self.block_bytes // columns_per_image)
        return [slice(start, start + step) for start in range(0, batch, step)]

    def forward(self, x):
        check_images(x, "Conv2d", self.in_channels)
        conv.check_fits(x, self.kernel_size, self.padding, "Conv2d")
        channels_last = self.channels_last(x)
        w2, rstd = self.weight_matrix()  # (F, U), U in (C, kh, kw) order
        if channels_last:
            y, xpad = self.forward_channels_last(x, w2)
        else:
            y, xpad = self.forward_channels_first(x, w2)
        self.cache = (channels_last, xpad, w2, rstd) if self.training else None
        return y

    def channels_last(self, x):
        """Whether x (B, C, H, W) runs channels-last: C >= Wo."""
        (kw, pw, sw), W = (self.kernel_size[1], self.padding[1], self.stride[1]), x.shape[3]
        return self.in_channels >= (W + 2 * pw - kw) // sw + 1

    def backward(self, dout):
        channels_last, xpad, w2, rstd = self._take_cache()
        if channels_last:
            dx, dw2 = self.backward_channels_last(dout, xpad, w2)
        else:
            dx, dw2 = self.backward_channels_first(dout, xpad, w2)
        if rstd is not None:
            dw2 = standardize_backward(dw2, w2, rstd, 1)
        self.weight.grad += dw2.reshape(self.weight.shape)
        return dx

    # channels-first: (C, B, Hp, Wp), columns (U, B'*Ho*Wo)

    def forward_channels_first(self, x, w2):
        xpad = conv.pad_spatial(x.transpose(1, 0, 2, 3), self.padding)  # (C, B, Hp, Wp)
        # (C, B, kh, kw, Ho, Wo), a view
        windows = conv.sliding_windows(xpad, self.kernel_size, self.stride)
        C, B, kh, kw, Ho, Wo = windows.shape
        y = xp.empty((B, self.out_channels, Ho, Wo), dtype=x.dtype)
        for images in self.image_blocks(B, windows[:, 0].nbytes):
            out = w2 @ conv.im2col(windows[:, images])  # (F, B'*Ho*Wo)
            if self.bias is not None:
                out += self.bias.data[:, None]
            y[images] = out.reshape(self.out_channels, -1, Ho, Wo).transpose(1, 0, 2, 3)
        return y, xpad

    def backward_channels_first(self, dout, xpad, w2):
        windows = conv.sliding_windows(xpad, self.kernel_size, self.stride)
        C, B, kh, kw, Ho, Wo = windows.shape
        dw2, dxpad = xp.zeros_like(w2), xp.zeros_like(xpad)
        for images in self.image_blocks(B, windows[:, 0].nbytes):
            cols = conv.im2col(windows[:, images])  # (U, B'*Ho*Wo), formed again
            dy = xp.ascontiguousarray(dout[images].transpose(1, 0, 2, 3))
            dy = dy.reshape(self.out_channels, -1)  # (F, B'*Ho*Wo)
            if self.bias is not None:
                self.bias.grad += dy.sum(axis=1)
            dw2 += dy @ cols.T
            dcols = w2.T @ dy  # (U, B'*Ho*Wo)
            dwindows = dcols.reshape(C, kh, kw, -1, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
            conv.col2im(dwindows, dxpad[:, images], self.stride)
        dx = conv.unpad_spatial(dxpad, self.padding).transpose(1, 0, 2, 3)  # (B, C, H, W)
        return xp.ascontiguousarray(dx), dw2

    # channels-last: (B, Hp, Wp, C), columns (B'*Ho*Wo, U) with U in (kh, kw, C) order

    def forward_channels_last(self, x, w2):
        B, C, H, W = x.shape
        (kh, kw), (ph, pw), F = self.kernel_size, self.padding, self.out_channels
        xpad = xp.zeros((B, H + 2 * ph, W + 2 * pw, C), dtype=x.dtype)  # (B, Hp, Wp, C)
        windows = self.windows_channels_last(xpad)  # (B, Ho, Wo, kh, kw, C), a view
        Ho, Wo = windows.shape[1:3]
        w2 = _kernel_channels_last(w2, C, kh, kw)
        y = xp.empty((B, F, Ho * Wo), dtype=x.dtype)
        for images in self.image_blocks(B, windows[0].nbytes):
            xpad[images, ph : ph + H, pw : pw + W] = x[images].transpose(0, 2, 3, 1)
            out = windows[images].reshape(-1, kh * kw * C) @ w2.T  # (B'*Ho*Wo, F)
            if self.bias is not None:
                out += self.bias.data
            y[images] = out.reshape(-1, Ho * Wo, F).transpose(0, 2, 1)
        return y.reshape(B, F, Ho, Wo), xpad

    def backward_channels_last(self, dout, xpad, w2):
        B, F, Ho, Wo = dout.shape
        (kh, kw), (ph, pw), C = self.kernel_size, self.padding, self.in_channels
        windows = self.windows_channels_last(xpad)
        Hp, Wp = xpad.shape[1:3]
        w2 = _kernel_channels_last(w2, C, kh, kw)
        dw2 = xp.zeros_like(w2)
        dx = xp.empty((B, C, Hp - 2 * ph, Wp - 2 * pw), dtype=dout.dtype)
        for images in self.image_blocks(B, windows[0].nbytes):
            cols = windows[images].reshape(-1, kh * kw * C)  # (B'*Ho*Wo, U), formed again
            dy = dout[images].reshape(-1, F, Ho * Wo).transpose(0, 2, 1)
            dy = xp.ascontiguousarray(dy).reshape(-1, F)  # (B'*Ho*Wo, F)
            if self.bias is not None:
                self.bias.grad += dy.sum(axis=0)
            dw2 += dy.T @ cols
            dcols = (dy @ w2).reshape(-1, Ho, Wo, kh, kw, C)
            dxpad = xp.zeros((len(dcols), Hp, Wp, C), dtype=dout.dtype)
            # col2im on (B', C, ...) views, so each added row is C contiguous channels
            conv.col2im(dcols.transpose(0, 5, 3, 4, 1, 2), dxpad.transpose(0, 3, 1, 2),
                        self.stride)
            dx[images] = dxpad[:, ph : Hp - ph, pw : Wp - pw].transpose(0, 3, 1, 2)
        dw2 = dw2.reshape(F, kh * kw, C).transpose(0, 2, 1)  # back to U in (C, kh, kw) order
        return dx, dw2.reshape(F, -1)

    def windows_channels_last(self, xpad):
        """xpad (B, Hp, Wp, C) -> its windows (B, Ho, Wo, kh, kw, C), a view."""
        windows = conv.sliding_windows(xpad.transpose(0, 3, 1, 2), self.kernel_size, self.stride)
        return windows.transpose(0, 4, 5, 2, 3, 1)  # from (B, C, kh, kw, Ho, Wo)


def _kernel_channels_last(w2, C, kh, kw):
    """W2 (F, U) with U in (C, kh, kw) order -> (F, U) in (kh, kw, C) order, a copy."""
    F = len(w2)
    return xp.ascontiguousarray(w2.reshape(F, C, kh * kw).transpose(0, 2, 1)).reshape(F, -1)
