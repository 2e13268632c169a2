"""The layers of a convolutional stem (a hybrid ViT feeds the transformer the
feature map of a few of these instead of raw patches): Conv2d, BatchNorm2d
(and SyncBatchNorm2d, its batch split over processes), GroupNorm, ReLU and
MaxPool2d, each with its backward written by hand.

Each layer keeps the contract of ``tinyvit/nn/module.py``; the derivations are in
the docstrings and, at more length, in ``docs/backprop.md``.

Shape legend (the whole legend heads ``docs/backprop.md``): B batch, C input
channels, F output channels (filters, as in CS231n), H x W the input's height
and width, kh x kw the kernel (k x k when square), sh, sw the strides (s when
equal), ph, pw the padding, Hp = H + 2ph and Wp = W + 2pw the padded size,
Ho = (Hp - kh) // sh + 1 and Wo = (Wp - kw) // sw + 1 the output size,
U = C*kh*kw the values in one receptive field (one im2col column), M = B*Ho*Wo
the output pixels of a batch (the rows that the convolution, a Linear over the
receptive fields, sees), NG the groups of GroupNorm.

Convolution as a matmul (im2col). Every output pixel of a convolution is a
Linear layer applied to its receptive field: lay the fields out as the columns
of a matrix, cols (U, M), and the whole convolution is one matmul with the
weight reshaped to (F, U). The columns are read out of the padded input through
a strided view (``sliding_windows``: no copy until the reshape) and the
backward scatters their gradients back (``col2im``). The layout is
channels-first, (C, B, Hp, Wp) for the padded input and (C*kh*kw, B*Ho*Wo) for
the columns (as CS231n's fast convolution): the copies between it and the
(B, C, H, W) layout of the arrays outside move whole H x W planes, where a
channels-last layout (B, H, W, C) would transpose every pixel, and its rows of
columns are runs of Wo contiguous values. (The fast tier's Conv2d,
``tinyvit/fast/cpu.py``, goes channels-last where runs of C channels are longer.)
"""

import math
import numbers

from ..backend import float_dtype, host_rng, xp
from ..checks import check_float, check_images
from .functional import standardize, standardize_backward
from .init import uniform
from .module import Module, Parameter

# ---------------------------------------------------------------------------
# Sliding windows: im2col and its adjoint col2im
# ---------------------------------------------------------------------------


def pair(value, name, minimum):
    """An int or a pair of ints, each >= minimum -> a pair (for kernel_size, stride, padding)."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    valid = all(isinstance(v, numbers.Integral) and v >= minimum for v in values)
    if len(values) != 2 or not valid:
        raise ValueError(f"{name} must be an int >= {minimum} or a pair of them, got {value!r}")
    return tuple(int(v) for v in values)


def pad_spatial(x, padding, value=0.0):
    """(..., H, W) -> (..., H + 2ph, W + 2pw), a new array, the border set to ``value``
    (x itself when there is no padding)."""
    (ph, pw), (H, W) = padding, x.shape[-2:]
    if ph == pw == 0:
        return x
    xpad = xp.full((*x.shape[:-2], H + 2 * ph, W + 2 * pw), value, dtype=x.dtype)
    xpad[..., ph : ph + H, pw : pw + W] = x
    return xpad


def sliding_windows(xpad, kernel, stride):
    """A strided view (..., kh, kw, Ho, Wo) of xpad (..., Hp, Wp), no copy:

        windows[..., i, j, ho, wo] = xpad[..., sh*ho + i, sw*wo + j],

    i.e. for each kernel offset (i, j), the input pixels it meets at every output
    position. Windows overlap when a stride is smaller than the kernel (sh < kh or
    sw < kw; s < k for a square kernel of size k and equal strides s): the view
    then holds some entries of xpad several times (so it must never be written to).
    """
    (kh, kw), (sh, sw) = kernel, stride
    *leading, Hp, Wp = xpad.shape
    Ho, Wo = (Hp - kh) // sh + 1, (Wp - kw) // sw + 1
    *leading_strides, row, col = xpad.strides
    return xp.lib.stride_tricks.as_strided(
        xpad, (*leading, kh, kw, Ho, Wo), (*leading_strides, row, col, sh * row, sw * col)
    )


def im2col(windows):
    """The columns of a convolution, a copy: windows (C, B, kh, kw, Ho, Wo) of a
    channels-first padded input -> cols (U, M) = (C*kh*kw, B*Ho*Wo), column m
    holding the U inputs of output pixel m in (c, i, j) order."""
    C, B, kh, kw, Ho, Wo = windows.shape
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(C * kh * kw, B * Ho * Wo)


def col2im(dwindows, dxpad, stride):
    """The adjoint of ``sliding_windows``: adds each entry of dwindows (..., kh, kw,
    Ho, Wo) into the pixel of dxpad (..., Hp, Wp) it was read from, and returns
    dxpad (pass zeros for the gradient alone). A pixel read by several windows
    (sh < kh or sw < kw) gets the sum of their gradients.

    A loop over the kh*kw kernel offsets, each adding a whole (..., Ho, Wo) slab at
    once: the clearest correct way (one slab's pixels are distinct, so ``+=`` on a
    strided slice is exact), and kh*kw is small.
    """
    *_, kh, kw, Ho, Wo = dwindows.shape
    sh, sw = stride
    for i in range(kh):
        for j in range(kw):
            dxpad[..., i : i + sh * Ho : sh, j : j + sw * Wo : sw] += dwindows[..., i, j, :, :]
    return dxpad


def unpad_spatial(dxpad, padding):
    """(..., Hp, Wp) -> (..., Hp - 2ph, Wp - 2pw): the gradient of ``pad_spatial``
    drops the border (a view)."""
    (ph, pw), (Hp, Wp) = padding, dxpad.shape[-2:]
    return dxpad[..., ph : Hp - ph, pw : Wp - pw]


def check_fits(x, kernel, padding, layer):
    """A ValueError unless one kernel window fits in the padded input."""
    (kh, kw), (ph, pw), (H, W) = kernel, padding, x.shape[2:]
    if H + 2 * ph < kh or W + 2 * pw < kw:
        raise ValueError(
            f"{layer}: expected a padded input of at least {kh}x{kw} (the kernel), got "
            f"{H}x{W} padded by {ph}x{pw}"
        )


# ---------------------------------------------------------------------------
# Conv2d
# ---------------------------------------------------------------------------


class Conv2d(Module):
    """A 2-D convolution (a cross-correlation, as in PyTorch), any kernel, stride
    and zero padding; weight (F, C, kh, kw) as in PyTorch. With xpad the padded input,

        y[b, f, ho, wo] = bias[f]
                          + sum over c, i, j of W[f, c, i, j] xpad[b, c, sh*ho + i, sw*wo + j].

    As a matmul: cols = im2col(x), (U, M), whose column m holds the U inputs of
    output pixel m in (c, i, j) order; then y = W2 cols + bias, W2 = W reshaped
    to (F, U). No loop over images or pixels: one copy through a strided view,
    one matmul. The cache is the columns, the (F, U) weight the forward used, its
    rstd under weight standardization, and the padded input's shape.

    ``weight_standardization`` (BiT's ResNet-V2, the stem of the hybrid ViT)
    convolves with w_hat = (W - mean) / sqrt(var + eps) instead of W, mean and
    biased var over each output channel's (C, kh, kw) weights. eps is ``ws_eps``:
    1e-6 by default, as timm's ``StdConv2d``; timm's hybrid ViT builds its
    ResNet-V2 with 1e-8 and BiT's own code uses 1e-10, so loading weights of
    those needs that value.

    Initialization as PyTorch's Conv2d (kaiming uniform with a = sqrt(5)): weight
    and bias uniform in +-1/sqrt(U), drawn from the host generator ``rng``
    (fresh entropy when None).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True,
                 weight_standardization=False, rng=None, dtype=None, ws_eps=1e-6):
        super().__init__()
        dtype = float_dtype(dtype)
        rng = rng or host_rng(None)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = pair(kernel_size, "Conv2d: kernel_size", 1)
        self.stride = pair(stride, "Conv2d: stride", 1)
        self.padding = pair(padding, "Conv2d: padding", 0)
        self.weight_standardization, self.ws_eps = weight_standardization, ws_eps
        fan_in = in_channels * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        shape = (out_channels, in_channels, *self.kernel_size)
        self.weight = Parameter(uniform(rng, bound, shape, dtype), decay=True)
        self.bias = Parameter(uniform(rng, bound, (out_channels,), dtype)) if bias else None

    def forward(self, x):
        check_images(x, "Conv2d", self.in_channels)
        check_fits(x, self.kernel_size, self.padding, "Conv2d")
        B, F = x.shape[0], self.out_channels
        xpad = pad_spatial(x.transpose(1, 0, 2, 3), self.padding)  # (C, B, Hp, Wp)
        windows = sliding_windows(xpad, self.kernel_size, self.stride)  # (C, B, kh, kw, Ho, Wo)
        Ho, Wo = windows.shape[-2:]
        cols = im2col(windows)  # (U, M)
        w2, rstd = self.weight_matrix()  # (F, U)
        y = w2 @ cols  # (F, M)
        if self.bias is not None:
            y += self.bias.data[:, None]
        self.cache = (cols, w2, rstd, xpad.shape) if self.training else None
        y = y.reshape(F, B, Ho, Wo).transpose(1, 0, 2, 3)  # (B, F, Ho, Wo), a view
        return xp.ascontiguousarray(y)

    def weight_matrix(self):
        """The weight as the (F, U) matrix the convolution multiplies by, and None;
        under weight standardization, w_hat (F, U) and its rstd (F, 1)."""
        w2 = self.weight.data.reshape(self.out_channels, -1)
        if not self.weight_standardization:
            return w2, None
        w_hat, rstd, _, _ = standardize(w2, 1, self.ws_eps)  # (F, U) and (F, 1), per row
        return w_hat, rstd

    def backward(self, dout):
        """The forward in reverse, with dy = dout as (F, M) (the matmul's layout):

            y = W2 cols + b     ->  db = sum over m of dy[:, m]
                                    dW2 = dy cols^T                      (F, U)
                                    dcols = W2^T dy                      (U, M)
            cols = im2col(xpad) ->  dxpad = col2im(dcols): each column entry's
                                    gradient added back into the pixel it copied
            xpad = pad(x)       ->  dx = dxpad without its border.

        With weight standardization W2 is w_hat = (W - mean) * rstd, and the
        gradient dw_hat = dy cols^T goes back through it row by row as LayerNorm's:
        with mean and rstd functions of the row, d mean/dw_u = 1/U and
        d rstd/dw_u = -rstd^3 (w_u - mean) / U, so summing the three paths
            dW = rstd * (dw_hat - mean(dw_hat) - w_hat * mean(dw_hat * w_hat)).
        """
        cols, w2, rstd, padded_shape = self._take_cache()
        B, F, Ho, Wo = dout.shape
        dy = xp.ascontiguousarray(dout.transpose(1, 0, 2, 3)).reshape(F, -1)  # (F, M)
        if self.bias is not None:
            self.bias.grad += dy.sum(axis=1)
        dw2 = dy @ cols.T  # (F, U)
        if rstd is not None:  # through w_hat = (W - mean) * rstd
            dw2 = standardize_backward(dw2, w2, rstd, 1)
        self.weight.grad += dw2.reshape(self.weight.shape)
        dcols = w2.T @ dy  # (U, M)
        C, (kh, kw) = self.in_channels, self.kernel_size
        dwindows = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
        dxpad = col2im(dwindows, xp.zeros(padded_shape, dy.dtype), self.stride)
        dx = unpad_spatial(dxpad, self.padding).transpose(1, 0, 2, 3)  # (B, C, H, W)
        return xp.ascontiguousarray(dx)


# ---------------------------------------------------------------------------
# Normalizations: BatchNorm2d, GroupNorm
# ---------------------------------------------------------------------------


class BatchNorm2d(Module):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta per channel, over (B, H, W).

    Training mode normalizes with the batch's mean and biased variance, and
    updates the running averages as PyTorch does:
        running_mean = (1 - momentum) running_mean + momentum mean
        running_var  = (1 - momentum) running_var  + momentum var * V / (V - 1)
    (the unbiased variance, V = B*H*W); eval mode normalizes with them instead.
    Parameters ``weight`` (gamma) and ``bias`` (beta); the running averages are
    plain arrays, named in ``buffers``. The cache (training) is xhat, rstd and V.
    """

    buffers = ("running_mean", "running_var")

    def __init__(self, num_features, eps=1e-5, momentum=0.1, dtype=None):
        super().__init__()
        dtype = float_dtype(dtype)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(xp.ones(num_features, dtype=dtype))
        self.bias = Parameter(xp.zeros(num_features, dtype=dtype))
        self.running_mean = xp.zeros(num_features, dtype=dtype)
        self.running_var = xp.ones(num_features, dtype=dtype)

    def forward(self, x):
        check_images(x, type(self).__name__, self.num_features)
        gamma = self.weight.data[:, None, None]  # (C, 1, 1)
        beta = self.bias.data[:, None, None]
        if not self.training:  # normalized by the running averages
            self.cache = None
            mean = self.running_mean[:, None, None]  # (C, 1, 1)
            rstd = 1.0 / xp.sqrt(self.running_var + self.eps)
            return (x - mean) * (gamma * rstd[:, None, None]) + beta
        V = self.values_per_channel(x)
        # (B, C, H, W), and rstd, mean and var (1, C, 1, 1)
        xhat, rstd, mean, var = standardize(x, (0, 2, 3), self.eps, self.channel_mean(V))
        self.update_running_averages(mean.reshape(-1), var.reshape(-1), V)
        self.cache = (xhat, rstd, V)
        return gamma * xhat + beta

    def values_per_channel(self, x):
        """V, the values a channel's batch statistics are taken over: at least 2 in
        training (one value has no variance)."""
        V = self.batch_values(x)
        if V < 2:
            raise ValueError(f"{type(self).__name__}: expected more than 1 value per channel "
                             f"in training, got {V} (input of shape {x.shape})")
        return V

    def batch_values(self, x):
        """B*H*W: a channel's values in the batch."""
        return x.shape[0] * x.shape[2] * x.shape[3]

    def channel_mean(self, V):
        """a (B, C, H, W) -> its mean per channel over the batch's V values, (1, C, 1, 1)."""
        return lambda a: a.sum(axis=(0, 2, 3), keepdims=True) / V

    def update_running_averages(self, mean, var, V):
        m = self.momentum
        self.running_mean *= 1 - m
        self.running_mean += m * mean
        self.running_var *= 1 - m
        self.running_var += m * var * (V / (V - 1))

    def backward(self, dout):
        """(Training mode.) With y = gamma * xhat + beta per channel:
            dgamma = sum over (B, H, W) of dy * xhat,   dbeta = sum over (B, H, W) of dy;
        g = dy * gamma reaches x through xhat directly and through the batch's mean
        and rstd, every image of the batch through every other:
            dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  means over (B, H, W).
        The running averages take no gradient.
        """
        xhat, rstd, V = self._take_cache()
        self.weight.grad += (dout * xhat).sum(axis=(0, 2, 3))
        self.bias.grad += dout.sum(axis=(0, 2, 3))
        g = dout * self.weight.data[:, None, None]  # (B, C, H, W)
        return standardize_backward(g, xhat, rstd, (0, 2, 3), self.channel_mean(V))


class SyncBatchNorm2d(BatchNorm2d):
    """BatchNorm2d over a batch split between processes (data parallelism): in
    training mode every process normalizes its rows with the mean and variance of
    the whole batch, as one process holding all of it would; eval mode is
    BatchNorm2d's. The data-parallel trainer makes a model's BatchNorm2d layers
    this class (``tinyvit/train/distributed.py``) and gives each one
    ``sum_over_processes(a)``: ``a`` replaced, in place, by its sum over the
    processes (an MPI Allreduce).

    With V_r values per channel on process r and sum_r over the processes, the
    whole batch has V = sum_r V_r values per channel, and each mean of BatchNorm2d,
    forward and backward, is sum_r sum(a_r) / V: each process sums its own
    values, one Allreduce adds the sums up. dgamma and dbeta stay this process's
    part of the batch's: the trainer sums every gradient over the processes after
    the backward. ``dout`` must be this process's part of the whole batch's
    gradient (its loss weighted by its share of the batch), as the means mix
    every process's rows.
    """

    sum_over_processes = None  # set when the class is swapped in

    def batch_values(self, x):
        """The sum over the processes of their B*H*W."""
        local = xp.full((1,), super().batch_values(x), dtype=x.dtype)
        return int(self.sum_over_processes(local)[0])

    def channel_mean(self, V):
        return lambda a: (self.sum_over_processes(a.sum(axis=(0, 2, 3))) / V)[:, None, None]


class GroupNorm(Module):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta, mean and biased var over each
    image's group of C/NG channels and all their pixels (BiT's ResNet-V2 norm);
    gamma (``weight``) and beta (``bias``) per channel. The same in training and
    eval mode. The cache is xhat and rstd, grouped: (B, NG, C/NG * H * W) and
    (B, NG, 1).
    """

    def __init__(self, num_groups, num_channels, eps=1e-5, dtype=None):
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} is not divisible by "
                             f"num_groups {num_groups}")
        dtype = float_dtype(dtype)
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(xp.ones(num_channels, dtype=dtype))
        self.bias = Parameter(xp.zeros(num_channels, dtype=dtype))

    def forward(self, x):
        check_images(x, "GroupNorm", self.num_channels)
        B, C, H, W = x.shape
        xg = x.reshape(B, self.num_groups, -1)  # (B, NG, C/NG*H*W)
        xhat, rstd, _, _ = standardize(xg, 2, self.eps)  # (B, NG, C/NG*H*W) and (B, NG, 1)
        self.cache = (xhat, rstd) if self.training else None
        y = xhat.reshape(B, C, H, W)
        return self.weight.data[:, None, None] * y + self.bias.data[:, None, None]

    def backward(self, dout):
        """As BatchNorm2d's, with the statistics per (image, group):
            dgamma = sum over (B, H, W) of dy * xhat,   dbeta = sum over (B, H, W) of dy,
            g = dy * gamma,   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        with the means over each group's C/NG*H*W values.
        """
        xhat, rstd = self._take_cache()
        B, C, H, W = dout.shape
        self.weight.grad += (dout * xhat.reshape(B, C, H, W)).sum(axis=(0, 2, 3))
        self.bias.grad += dout.sum(axis=(0, 2, 3))
        g = (dout * self.weight.data[:, None, None]).reshape(xhat.shape)  # (B, NG, C/NG*H*W)
        return standardize_backward(g, xhat, rstd, 2).reshape(B, C, H, W)


# ---------------------------------------------------------------------------
# ReLU, MaxPool2d
# ---------------------------------------------------------------------------


class ReLU(Module):
    """y = max(x, 0). The cache is the output y: y > 0 exactly where x > 0."""

    def forward(self, x):
        check_float(x, "ReLU")
        y = xp.maximum(x, 0)
        self.cache = y if self.training else None
        return y

    def backward(self, dout):
        """dy/dx = 1 where x > 0, else 0 (at x = 0 too, as PyTorch): dx = dout * (y > 0)."""
        y = self._take_cache()
        return dout * (y > 0)


class MaxPool2d(Module):
    """y[b, c, ho, wo] = the max of x's kh x kw window at (sh*ho - ph, sw*wo - pw),
    the padding -inf (so it never wins). ``stride`` defaults to the kernel size, and
    ``padding`` may be at most half the kernel (as in PyTorch: no window is all
    padding).

    The cache is the argmax of each window: its first maximum in row-major window
    order (i * kw + j), so ties go to one element, the same one every time.
    """

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = pair(kernel_size, "MaxPool2d: kernel_size", 1)
        self.stride = pair(self.kernel_size if stride is None else stride, "MaxPool2d: stride", 1)
        self.padding = pair(padding, "MaxPool2d: padding", 0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"MaxPool2d: padding must be at most half the kernel size, got "
                             f"padding {self.padding} for kernel {self.kernel_size}")

    def forward(self, x):
        check_images(x, "MaxPool2d")
        check_fits(x, self.kernel_size, self.padding, "MaxPool2d")
        B, C = x.shape[:2]
        xpad = pad_spatial(x, self.padding, value=-xp.inf)  # (B, C, Hp, Wp)
        windows = sliding_windows(xpad, self.kernel_size, self.stride)  # (B, C, kh, kw, Ho, Wo)
        Ho, Wo = windows.shape[-2:]
        windows = windows.reshape(B, C, -1, Ho, Wo)  # (B, C, kh*kw, Ho, Wo), a copy
        argmax = windows.argmax(axis=2)  # (B, C, Ho, Wo): the first maximum
        self.cache = (argmax, xpad.shape) if self.training else None
        return windows.max(axis=2)  # (B, C, Ho, Wo)

    def backward(self, dout):
        """y is the window entry at argmax, so each window sends its gradient to that
        one entry and none to the others; col2im then adds it into the pixel the
        entry was read from (summing where windows overlap: sh < kh or sw < kw)."""
        argmax, padded_shape = self._take_cache()
        B, C, Ho, Wo = dout.shape
        kh, kw = self.kernel_size
        offsets = xp.arange(kh * kw)[:, None, None]  # (kh*kw, 1, 1)
        onehot = offsets == argmax[:, :, None]  # (B, C, kh*kw, Ho, Wo)
        dwindows = (onehot * dout[:, :, None]).reshape(B, C, kh, kw, Ho, Wo)
        dxpad = col2im(dwindows, xp.zeros(padded_shape, dout.dtype), self.stride)  # (B, C, Hp, Wp)
        return xp.ascontiguousarray(unpad_spatial(dxpad, self.padding))  # (B, C, H, W)
