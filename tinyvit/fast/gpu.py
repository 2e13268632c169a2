"""The fast tier on a GPU: fused CUDA kernels, one launch where the reference takes many.

At tinyvit's sizes a GPU step is bound by the host launching kernels, not by the
GPU's arithmetic: every operation of a NumPy-style formula is one launch of some
microseconds, and the reference GELU or LayerNorm is a dozen of them. Each class
here subclasses its reference, keeps its parameters and contract, and runs the
work of its forward and backward in one or two kernels of ``kernels/*.cu``
(compiled by ``compile.py``), which mirror the reference's math line by line:

- ``GELU``: the exact form, forward and backward one launch each (the tanh form
  runs the reference);
- ``LayerNorm``: forward one launch (a warp per row), backward one for dx and one
  for the gamma and beta gradients (a reduction down the columns);
- ``Attention``, ``ClassAttention``: the softmax with the 1/sqrt(Dh) scale folded
  in, forward and backward one launch each; the matmuls are CuPy's (cuBLAS);
- ``SoftmaxCrossEntropy``: the loss and its gradient in one launch;
- ``AdamW``: the whole update of the flat parameter buffer in one launch;
- ``Linear``: the reference, its column sums as a matrix-vector product ones^T a,
  which reads whole rows (CuPy's reduction down the columns reads each strided).

``tests/test_fast.py`` checks every class here against its reference on a GPU;
``tests/test_cuda_sources.py`` compiles every kernel without one.
"""

from ..backend import xp
from ..checks import check_float
from ..nn import layers, loss, optim
from .compile import launch_columns, launch_elementwise, launch_rows, scalars
from .cpu import FastKernel


def column_sum(a, b=None):
    """sum of a (or of a * b) over every axis but the last: (..., D) -> (D,)."""
    a = a.reshape(-1, a.shape[-1])
    if b is not None:
        a = a * b.reshape(-1, b.shape[-1])  # (M, D)
    return xp.ones(a.shape[0], dtype=a.dtype) @ a


def check_rows(x, weight, layer):
    """A ValueError unless ``x`` is rows (..., D) of the layer's D and float dtype: a
    kernel reads one type, and rows of the length it is told."""
    if x.dtype != weight.dtype or x.shape[-1:] != weight.shape:
        raise ValueError(f"{layer}: the GPU kernel expects input (..., {weight.shape[0]}) of "
                         f"dtype {weight.dtype}, got {x.shape} of dtype {x.dtype}")


class Linear(FastKernel, layers.Linear):
    column_sum = staticmethod(column_sum)


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


class LayerNorm(FastKernel, layers.LayerNorm):
    """The reference LayerNorm in kernels/layernorm.cu; the cache is xhat and rstd,
    as the reference's (rstd one value per row)."""

    def forward(self, x):
        check_rows(x, self.weight.data, "LayerNorm")
        x = xp.ascontiguousarray(x)
        rows, D = x.size // self.dim, self.dim
        y, xhat = xp.empty_like(x), xp.empty_like(x)
        rstd = xp.empty(rows, dtype=x.dtype)
        args = (x, self.weight.data, self.bias.data, y, xhat, rstd, xp.int64(rows), xp.int32(D),
                *scalars(x.dtype, self.eps))
        launch_rows("layernorm", "layernorm_forward", rows, args, x.dtype)
        self.cache = (xhat, rstd) if self.training else None
        return y

    def backward(self, dout):
        xhat, rstd = self._take_cache()
        dout = xp.ascontiguousarray(dout)
        rows, D = rstd.size, self.dim
        dx = xp.empty_like(dout)
        launch_rows("layernorm", "layernorm_backward", rows,
                    (dout, xhat, rstd, self.weight.data, dx, xp.int64(rows), xp.int32(D)),
                    dout.dtype)
        launch_columns("layernorm", "layernorm_param_grads", rows, D,
                       (dout, xhat, self.weight.grad, self.bias.grad, xp.int64(rows),
                        xp.int32(D)), dout.dtype)
        return dx


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
    scaled by a launch of their own, nor dS."""

    def attend(self, q, k, v):
        A = scaled_softmax(q @ k.transpose(0, 1, 3, 2), self.scale)  # (B, NH, Q, N)
        self.attn = A if self.keep_attn else None
        Ad = self.attn_drop.forward(A)
        self.cache = (q, k, v, A, Ad) if self.training else None
        return Ad @ v  # (B, NH, Q, Dh)

    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dAd = dctx @ v.transpose(0, 1, 3, 2)  # (B, NH, Q, N)
        dv = Ad.transpose(0, 1, 3, 2) @ dctx  # (B, NH, N, Dh)
        dS = scaled_softmax_backward(A, self.attn_drop.backward(dAd), self.scale)  # scale in
        dq = dS @ k  # (B, NH, Q, Dh)
        dk = dS.transpose(0, 1, 3, 2) @ q  # (B, NH, N, Dh)
        return dq, dk, dv


class Attention(FastAttentionCore, layers.Attention):
    pass


class ClassAttention(FastAttentionCore, layers.ClassAttention):
    pass


class SoftmaxCrossEntropy(FastKernel, loss.SoftmaxCrossEntropy):
    """The loss and its gradient in one launch (kernels/cross_entropy.cu); the
    cache is the gradient for dout = 1, which the backward scales by dout."""

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
    """The reference AdamW's update in one launch (kernels/adamw.cu)."""

    def _update(self, lr):
        dtype = self.data.dtype
        args = (self.data, self.grad, self.m, self.v, self.decay, xp.int64(self.data.size),
                *scalars(dtype, lr, self.beta1, self.beta2, self.eps, self.weight_decay,
                         1 - self.beta1**self.t, (1 - self.beta2**self.t) ** 0.5))
        launch_elementwise("adamw", "adamw_update", self.data.size, args, dtype)


KERNELS = {
    layers.Linear: Linear,
    layers.LayerNorm: LayerNorm,
    layers.GELU: GELU,
    layers.Attention: Attention,
    layers.ClassAttention: ClassAttention,
    loss.SoftmaxCrossEntropy: SoftmaxCrossEntropy,
    optim.AdamW: AdamW,
}
