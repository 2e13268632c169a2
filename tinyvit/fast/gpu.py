"""The fast tier on a GPU: fused CUDA kernels, one launch where the reference takes many.

At tinyvit's sizes a GPU step is bound by the host launching kernels, not by the
GPU's arithmetic: every operation of a NumPy-style formula is one launch of some
microseconds, and the reference GELU or LayerNorm is a dozen of them. Each class
here subclasses its reference, keeps its parameters and contract, and runs the
work of its forward and backward in one or two kernels of ``kernels/*.cu``
(compiled by ``compile.py``), which mirror the reference's math line by line:

- ``GELU``: the exact form, forward and backward one launch each (the tanh form
  runs the reference);
- ``MLP``: fc1's bias added inside the GELU's kernel, each way;
- ``Dropout``: the mask drawn inside the kernel from a counter-based generator
  seeded from device memory (``DeviceKeys``), never stored: the backward draws
  it again, one launch each way;
- ``LayerNorm``: forward one launch (a warp per row), backward one for dx and one
  for the gamma and beta gradients (a reduction down the columns);
- ``Block``: the residual adds inside the LayerNorms' kernels, and where no
  dropout follows them, the biases of the attention's output projection and of
  fc2 added with the residuals;
- ``BatchNorm2d`` (the hybrid's stem): one launch each way, a block per channel;
- ``Conv2d`` (the hybrid's stem): im2col and its adjoint col2im one launch each,
  the products cuBLAS's;
- ``Attention``, ``ClassAttention``: up to 128 tokens, the heads' whole attention
  in one launch each way, from the qkv projection before its bias to the merged
  heads (the bias, the split into heads, the scores, the softmax, A v and the
  merge), and back; where that does not fit, the softmax with the 1/sqrt(Dh)
  scale folded in, one launch each way, the matmuls cuBLAS's;
- ``SoftmaxCrossEntropy``: the loss and its gradient in one launch;
- ``AdamW``: the whole update of the flat parameter buffer in one launch, its
  learning rate read from device memory;
- ``Linear``: the reference, its matmuls through ``cublas.py`` and its bias
  gradient (a sum down the columns) in one launch; ``project`` is its forward
  without the bias, for a kernel that adds it.

Nothing in a step reads its changing values (the learning rate, dropout's seed)
from a kernel's arguments, and no matmul goes through CuPy's cuBLAS wrapper: a
step can be captured in a CUDA graph and replayed (``graphs.py``).

``tests/test_fast.py`` checks every class here against its reference on a GPU;
``tests/test_cuda_sources.py`` compiles every kernel without one.
"""

import functools
from typing import NamedTuple

from ..backend import get_backend, host_rng, write, xp
from ..checks import check_float, check_images
from ..nn import conv, layers, loss, optim
from ..nn.functional import standardize_backward
from .compile import (
    launch_channels,
    launch_columns,
    launch_elementwise,
    launch_heads,
    launch_rows,
    scalars,
)
from .cublas import matmul
from .kernel import FastKernel

# kernels/attention.cu's limits: the most tokens, the largest head, a block's warps; and
# the shared memory a block may have without asking the driver for more
MAX_TOKENS, MAX_HEAD_DIM, WARPS = 128, 64, 4
SHARED_BYTES = 48 * 1024


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


class Block(FastKernel, layers.Block):
    """The encoder block with its residual adds fused into the LayerNorms' kernels:
    forward, x1 = x + attn(norm1(x)) and norm2(x1) in one launch; backward, each
    residual's skip gradient added inside the backward of the LayerNorm on its
    branch. Its norms are the GPU LayerNorm (``accelerate`` swaps them with it).

    Where the branches' last Linears have no dropout after them (or in eval mode)
    and the attention takes its fused kernel, their biases wait for the residual
    adds: x1 = x + a + b_proj inside norm2's kernel, and x1 + m + b_fc2 in one
    launch (a and m the projections before their biases)."""

    def forward(self, x):
        h1 = self.norm1.forward(x)
        if not self.defers_biases(h1):
            x1, h = self.norm2.add_forward(x, self.attn.forward(h1))  # x1 = x + a
            return x1 + self.mlp.forward(h)
        attn, mlp = self.attn, self.mlp
        a = attn.proj_drop.forward(attn.proj.project(attn.merged_heads(h1)))  # (B, N, D)
        x1, h = self.norm2.add_forward(x, a, attn.proj.bias.data)  # x1 = x + a + b_proj
        m = mlp.drop2.forward(mlp.fc2.project(mlp.hidden(h)))  # (B, N, D)
        return add_bias_residual(x1, m, mlp.fc2.bias.data)

    def defers_biases(self, h1):
        attn, mlp = self.attn, self.mlp
        quiet = not self.training or (attn.proj_drop.p == 0 and mlp.drop2.p == 0)
        return (quiet and isinstance(attn, Attention) and attn.fits_input(h1)
                and isinstance(mlp, MLP) and mlp.fused()
                and attn.proj.bias is not None and mlp.fc2.bias is not None)

    def backward(self, dout):
        dx1 = self.norm2.backward_add(self.mlp.backward(dout), dout)  # dout + the MLP branch's
        return self.norm1.backward_add(self.attn.backward(dx1), dx1)


def scaled_softmax(S, scale):
    """softmax(scale * S) over the last axis (kernels/softmax.cu)."""
    S = xp.ascontiguousarray(S)
    A = xp.empty_like(S)
    rows, N = S.size // S.shape[-1], S.shape[-1]
    launch_rows("softmax", "softmax_forward", rows,
                (S, A, xp.int64(rows), xp.int32(N), *scalars(S.dtype, scale)), S.dtype)
    return A


def scaled_softmax_backward(A, dA, scale):
    """The gradient of the unscaled scores S of A = softmax(scale * S):
    scale * A * (dA - sum(dA * A)) per row."""
    dA = xp.ascontiguousarray(dA)
    dS = xp.empty_like(A)
    rows, N = A.size // A.shape[-1], A.shape[-1]
    launch_rows("softmax", "softmax_backward", rows,
                (A, dA, dS, xp.int64(rows), xp.int32(N), *scalars(A.dtype, scale)), A.dtype)
    return dS


class FastAttentionCore(FastKernel):
    """``attend`` and ``attend_backward`` of the reference attention with its softmax
    and the 1/sqrt(Dh) scale in one kernel each way: the scores S = q k^T are never
    scaled by a launch of their own, nor dS. The matmuls are ``cublas.matmul``'s."""

    def attend(self, q, k, v):
        q, k, v = (xp.ascontiguousarray(a) for a in (q, k, v))  # (B, NH, N or Q, Dh)
        A = scaled_softmax(matmul(q, k, transpose_b=True), self.scale)  # (B, NH, Q, N)
        self.attn = A if self.keep_attn else None
        Ad = self.attn_drop.forward(A)
        self.cache = (q, k, v, A, Ad) if self.training else None
        return matmul(Ad, v)  # (B, NH, Q, Dh)

    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dctx = xp.ascontiguousarray(dctx)  # (B, NH, Q, Dh)
        dAd = matmul(dctx, v, transpose_b=True)  # (B, NH, Q, N)
        dv = matmul(Ad, dctx, transpose_a=True)  # (B, NH, N, Dh)
        dS = scaled_softmax_backward(A, self.attn_drop.backward(dAd), self.scale)  # scale in
        dq = matmul(dS, k)  # (B, NH, Q, Dh)
        dk = matmul(dS, q, transpose_a=True)  # (B, NH, N, Dh)
        return dq, dk, dv


class FusedCache(NamedTuple):
    """What the attention kernel's forward keeps for its backward."""

    u: object  # (B, N, 3D): the qkv projection before its bias
    A: object  # (B, NH, Q, N): the attention weights of the Q query rows


class Attention(FastAttentionCore, layers.Attention):
    """Attention in one kernel each way where it fits (kernels/attention.cu): a block
    per (image, head) takes the qkv projection before its bias and gives the heads'
    merged output, the bias, the split into heads, S, the softmax, A v and the merge
    in one launch; backward, one launch from the merged output's gradient to the qkv
    projection's. It fits up to MAX_TOKENS tokens, MAX_HEAD_DIM values a head and
    SHARED_BYTES of shared memory, with a qkv bias and no attention dropout in
    training; otherwise it runs the heads as ``FastAttentionCore`` does. The cache
    says which ran: a ``FusedCache``, or the reference's."""

    def query_rows(self, tokens):
        """The rows whose queries attend (the first ones): every token's."""
        return tokens

    def shared_bytes(self, tokens, dtype):
        """A block's shared memory: k and v (rows padded to Dh + 1), then a row of N
        and one of Dh values per warp."""
        Dh = self.head_dim
        return (2 * tokens * (Dh + 1) + WARPS * (tokens + Dh)) * xp.dtype(dtype).itemsize

    def fits(self, tokens, dtype):
        return (tokens <= MAX_TOKENS and self.head_dim <= MAX_HEAD_DIM
                and self.shared_bytes(tokens, dtype) <= SHARED_BYTES
                and self.qkv.bias is not None and not (self.training and self.attn_drop.p))

    def fits_input(self, x):
        return x.ndim == 3 and self.fits(x.shape[1], x.dtype)

    def forward(self, x):
        if not self.fits_input(x):
            return super().forward(x)
        return self.proj_drop.forward(self.proj.forward(self.merged_heads(x)))

    def merged_heads(self, x):
        """The heads' outputs merged, (B, Q, D), before the output projection."""
        check_rows(x, self.qkv.weight.data[0], "Attention")
        B_, N, D = x.shape
        Q = self.query_rows(N)
        u = self.qkv.project(x)  # (B, N, 3D): the qkv projection before its bias
        ctx = xp.empty((B_, Q, D), dtype=x.dtype)
        keep = self.training or self.keep_attn
        A = xp.empty((B_, self.num_heads, Q, N) if keep else 1, dtype=x.dtype)
        args = (u, self.qkv.bias.data, ctx, A, xp.int32(keep), xp.int32(N), xp.int32(Q),
                xp.int32(self.num_heads), xp.int32(self.head_dim), *scalars(x.dtype, self.scale))
        self.launch("attention_forward", B_, N, args, x.dtype)
        self.attn = A if self.keep_attn else None
        self.cache = FusedCache(u, A) if self.training else None
        return ctx

    def backward(self, dout):
        if not isinstance(self.cache, FusedCache):
            return super().backward(dout)
        u, A = self._take_cache()
        B_, NH, Q, N = A.shape
        dctx = xp.ascontiguousarray(self.proj.backward(self.proj_drop.backward(dout)))
        dS, du = xp.empty_like(A), xp.empty_like(u)  # (B, NH, Q, N), (B, N, 3D)
        args = (u, self.qkv.bias.data, A, dctx, dS, du, xp.int32(N), xp.int32(Q), xp.int32(NH),
                xp.int32(self.head_dim), *scalars(u.dtype, self.scale))
        self.launch("attention_backward", B_, N, args, u.dtype)
        return self.qkv.backward(du)

    def launch(self, function, images, tokens, args, dtype):
        launch_heads("attention", function, images * self.num_heads, 32 * WARPS,
                     self.shared_bytes(tokens, dtype), args, dtype)


class ClassAttention(Attention, layers.ClassAttention):
    """The class token's query alone (Q = 1) through the same kernel; with
    ``keep_attn``, which asks for every token's attention row, as ``FastAttentionCore``."""

    def query_rows(self, tokens):
        return 1

    def fits(self, tokens, dtype):
        return not self.keep_attn and super().fits(tokens, dtype)


class SoftmaxCrossEntropy(FastKernel, loss.SoftmaxCrossEntropy):
    """The loss and its gradient in one launch (kernels/cross_entropy.cu); the
    cache is the gradient for dout = 1, which the backward scales by dout.

    It checks the target's shape and dtype but not the labels' values, which would
    wait for the device every step: a label outside [0, K) makes its row's loss
    and gradient NaN, which the trainer stops on (``Batches`` checks a data set's
    labels once, when it is loaded)."""

    def forward(self, logits, target):
        self._check_logits(logits)
        B, K = logits.shape
        self.check_target(target, B, K)
        z = xp.ascontiguousarray(logits)
        rows, grad = xp.empty(B, dtype=z.dtype), xp.empty_like(z)
        if xp.issubdtype(target.dtype, xp.floating):
            args = (z, xp.ascontiguousarray(target, dtype=z.dtype), rows, grad)
            function = "cross_entropy_soft"
        else:
            args = (z, xp.ascontiguousarray(target, dtype=xp.int64),
                    *scalars(z.dtype, self.label_smoothing), rows, grad)
            function = "cross_entropy_labels"
        launch_rows("cross_entropy", function, B, (*args, xp.int64(B), xp.int32(K)), z.dtype)
        self.cache = grad
        return rows.sum()

    def backward(self, dout=1.0):
        grad = self._take_cache()
        return grad if dout == 1.0 else grad * dout


class AdamW(FastKernel, optim.AdamW):
    """The reference AdamW's update in one launch (kernels/adamw.cu). What changes
    from step to step, the learning rate and the bias corrections, ``advance``
    writes into device memory, ``schedule``, where the kernel reads it: the update
    queues the same launch every step (a CUDA graph can replay it)."""

    schedule = None  # made at the first step (``accelerate`` swaps a built optimizer's class)

    def advance(self, lr=None):
        super().advance(lr)
        if self.schedule is None:
            self.schedule = xp.zeros(3, dtype=xp.float64)  # lr, bias1, bias2_sqrt
        t = self.t
        write(self.schedule, [self.step_lr, 1 - self.beta1**t, (1 - self.beta2**t) ** 0.5])

    def update(self):
        dtype = self.data.dtype
        args = (self.data, self.grad, self.m, self.v, self.decay, xp.int64(self.data.size),
                self.schedule, *scalars(dtype, self.beta1, 1 - self.beta1, self.beta2,
                                        1 - self.beta2, self.eps, self.weight_decay))
        launch_elementwise("adamw", "adamw_update", self.data.size, args, dtype)


KERNELS = {
    layers.Linear: Linear,
    layers.LayerNorm: LayerNorm,
    layers.Block: Block,
    conv.BatchNorm2d: BatchNorm2d,
    conv.Conv2d: Conv2d,
    layers.GELU: GELU,
    layers.MLP: MLP,
    layers.Dropout: Dropout,
    layers.Attention: Attention,
    layers.ClassAttention: ClassAttention,
    loss.SoftmaxCrossEntropy: SoftmaxCrossEntropy,
    optim.AdamW: AdamW,
}
