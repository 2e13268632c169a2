"""Layers around the backward functions an exercise asks for, so that a function is
checked as a layer is: the forward is the library's, the backward the function
under test (the learner's, or the library's own for the reference)."""

from ..backend import xp
from ..nn.conv import pad_spatial, sliding_windows, unpad_spatial
from ..nn.functional import softmax
from ..nn.layers import merge_heads, split_heads
from ..nn.module import Module


class Softmax(Module):
    """A = softmax(S) over the last axis; backward: ``backward_fn(A, dA)``."""

    def __init__(self, backward_fn):
        super().__init__()
        self.backward_fn = backward_fn

    def forward(self, s):
        A = softmax(s)
        self.cache = A
        return A

    def backward(self, dA):
        return self.backward_fn(self._take_cache(), dA)


class MergeHeads(Module):
    """(B, NH, N, Dh) -> (B, N, NH*Dh); backward: ``backward_fn(dout, num_heads)``."""

    def __init__(self, backward_fn):
        super().__init__()
        self.backward_fn = backward_fn

    def forward(self, ctx):
        self.cache = ctx.shape[1]
        return merge_heads(ctx)

    def backward(self, dout):
        return self.backward_fn(dout, self._take_cache())


class SplitHeads(Module):
    """(B, N, 3D) -> q, k, v, each (B, NH, N, Dh), stacked as one (3, B, NH, N, Dh)
    output; backward: ``backward_fn(dq, dk, dv)``."""

    def __init__(self, backward_fn, num_heads):
        super().__init__()
        self.backward_fn, self.num_heads = backward_fn, num_heads

    def forward(self, qkv):
        self.cache = True
        return xp.stack(split_heads(qkv, self.num_heads))

    def backward(self, dout):
        self._take_cache()
        return self.backward_fn(*dout)


class Windows(Module):
    """The sliding windows of a padded image, copied: (B, C, H, W) ->
    (B, C, kh, kw, Ho, Wo); backward: ``backward_fn(dwindows, dxpad, stride)`` adds
    them back into a zero padded image, whose border is then dropped."""

    def __init__(self, backward_fn, kernel, stride, padding):
        super().__init__()
        self.backward_fn = backward_fn
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x):
        xpad = pad_spatial(x, self.padding)
        self.cache = xpad.shape
        return sliding_windows(xpad, self.kernel, self.stride).copy()

    def backward(self, dwindows):
        dxpad = xp.zeros(self._take_cache(), dtype=dwindows.dtype)
        return unpad_spatial(self.backward_fn(dwindows, dxpad, self.stride), self.padding)
