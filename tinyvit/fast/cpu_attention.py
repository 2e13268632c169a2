"""The attention core of the fast tier on the CPU: the scores, their softmax and
A v per block of images while the block's scores are in the cache, and back
(``cpu.py`` has the other layers; its docstring says what makes each faster).

Shapes as in the reference layers (the legend heads ``docs/backprop.md``): B images,
NH heads, Q query rows, N tokens, Dh head dim.
"""

from ..backend import xp
from ..nn import layers
from . import cpu_numba_softmax
from .blocks import each_block
from .kernel import FastKernel

ATTENTION_BLOCK_BYTES = 1 << 19  # scores of a block of images: 512 KiB, in L2 with A v's inputs


class FastAttentionCore(FastKernel):
    """``attend`` and the backward of the reference attention, a block of images at
    a time: the scores S = q (k^T / sqrt(Dh)), their softmax in place and A v one
    after the other while the block's scores are in the cache, the blocks over the
    cores. The scale 1/sqrt(Dh) rides on copies made anyway: k^T is copied per block
    into contiguous memory (the product runs faster on it) and scaled in the same
    pass, and the backward's softmax step scales dS as it writes it, so that
    dq = dS k and dk = dS^T q need no pass of their own. The forward writes A v in
    the layout of the heads side by side (``merge_heads`` then copies nothing), the
    backward dq, dk, dv straight into the qkv gradient's layout. The softmax and its
    backward run compiled where Numba is installed (``cpu_numba_softmax.py``), else in
    NumPy (``elementwise.py``). Attention dropout, where it is on, comes between the
    softmax and A v: the blocks then stop at the softmax, and the rest runs on the whole
    arrays.
    """

    def dropping(self):
        return self.attn_drop.training and self.attn_drop.p > 0

    def attend(self, q, k, v):
        B, NH, Q, Dh = q.shape
        N = k.shape[2]
        # ctx in the heads-side-by-side layout merge_heads wants: its reshape copies nothing
        ctx = xp.empty((B, Q, NH, Dh), dtype=q.dtype).transpose(0, 2, 1, 3)  # (B, NH, Q, Dh)
        fused = not self.dropping()
        # the weights A of the whole batch where something reads them later (the backward,
        # dropout, the maps kept); else each block's in an array of its own, which stays in
        # the cache: inference writes no (B, NH, Q, N) array to memory
        kept = self.training or self.keep_attn or not fused
        A = xp.empty((B, NH, Q, N), dtype=q.dtype) if kept else None

        def scores(q, k, v, ctx, A=None):  # one block of images
            b = len(k)
            kT = xp.empty((b, NH, Dh, N), dtype=k.dtype)  # k^T / sqrt(Dh), contiguous
            xp.multiply(k.transpose(0, 1, 3, 2), self.scale, out=kT)
            A = xp.matmul(q, kT, out=A)  # (b, NH, Q, N)
            cpu_numba_softmax.softmax_block(A)
            if fused:
                xp.matmul(A, v, out=ctx)

        arrays = (q, k, v, ctx) + ((A,) if kept else ())
        images = max(1, ATTENTION_BLOCK_BYTES // (NH * Q * N * q.itemsize))  # scores in L2
        each_block(scores, *arrays, block_bytes=images * max(a[:1].nbytes for a in arrays))
        self.attn = A if self.keep_attn else None
        Ad = A if fused else self.attn_drop.forward(A)
        self.cache = (q, k, v, A, Ad) if self.training else None
        return ctx if fused else Ad @ v  # (B, NH, Q, Dh)

    def attend_backward_into(self, cache, dctx, dq, dk, dv):
        """dq, dk, dv (each (B, NH, ., Dh), views of dqkv) from dctx (B, NH, Q, Dh)."""
        q, k, v, A, Ad = cache
        if Ad is A:
            each_block(self.block_backward, dctx, q, k, v, A, dq, dk, dv,
                       block_bytes=ATTENTION_BLOCK_BYTES)
            return
        xp.matmul(Ad.transpose(0, 1, 3, 2), dctx, out=dv)
        dS = self.attn_drop.backward(dctx @ v.transpose(0, 1, 3, 2))  # (B, NH, Q, N)
        each_block(self.block_backward, dctx, q, k, v, A, dq, dk, dv, dS,
                   block_bytes=ATTENTION_BLOCK_BYTES)

    def block_backward(self, dctx, q, k, v, A, dq, dk, dv, dS=None):
        """One block of images: with no dropout dS from dctx and A (and dv); then
        softmax's backward in place, times 1/sqrt(Dh), and dq, dk."""
        if dS is None:
            xp.matmul(A.transpose(0, 1, 3, 2), dctx, out=dv)
            vT = xp.ascontiguousarray(v.transpose(0, 1, 3, 2))  # (b, NH, Dh, N): the product
            # runs faster on contiguous memory
            dS = dctx @ vT  # (b, NH, Q, N)
        cpu_numba_softmax.softmax_backward_block(A, dS, self.scale)  # dS / sqrt(Dh)
        xp.matmul(dS, k, out=dq)
        xp.matmul(dS.transpose(0, 1, 3, 2), q, out=dk)

    def backward(self, dout):
        dctx = self.proj.backward(self.proj_drop.backward(dout))  # (B, Q, D)
        dctx = layers.split_heads_grad(dctx, self.num_heads)  # (B, NH, Q, Dh)
        cache = self._take_cache()
        B, NH, Q, Dh = dctx.shape
        N = cache[1].shape[2]  # k's tokens
        dqkv = xp.empty((B, N, 3, NH, Dh), dtype=dctx.dtype)
        dq, dk, dv = dqkv.transpose(2, 0, 3, 1, 4)  # each (B, NH, N, Dh), views
        if Q < N:  # class attention: the other tokens' queries had no use
            dq[:, :, Q:] = 0.0
        self.attend_backward_into(cache, dctx, dq[:, :, :Q], dk, dv)
        return self.qkv.backward(dqkv.reshape(B, N, 3 * NH * Dh))  # (B, N, D)


class Attention(FastAttentionCore, layers.Attention):
    pass


class ClassAttention(FastAttentionCore, layers.ClassAttention):
    pass
