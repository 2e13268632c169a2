"""The fast tier on a GPU, the encoder Block: its residual adds inside its LayerNorms'
kernels, and where no dropout follows them, the biases of the attention's output
projection and of fc2 added with the residuals."""

from ..nn import layers
from .gpu_attention import Attention
from .gpu_mlp import MLP, add_bias_residual
from .kernel import FastKernel


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
