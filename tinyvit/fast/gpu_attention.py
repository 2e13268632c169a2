"""The fast tier on a GPU, attention: up to MAX_TOKENS tokens the heads' whole
attention in one launch each way; beyond, the softmax with its scale folded in."""

from typing import NamedTuple

from ..backend import xp
from ..nn import layers
from .compile import (
    launch_heads,
    launch_rows,
    scalars,
)
from .cublas import matmul
from .gpu_linear import check_rows
from .kernel import FastKernel

# kernels/attention.cu's limits: the most tokens, the largest head, a block's warps; and
# the shared memory a block may have without asking the driver for more
MAX_TOKENS, MAX_HEAD_DIM, WARPS = 128, 64, 4
SHARED_BYTES = 48 * 1024


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
