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

from ..nn import conv, layers, loss, optim
from .gpu_attention import Attention, ClassAttention
from .gpu_block import Block
from .gpu_conv import Conv2d
from .gpu_linear import Linear
from .gpu_mlp import GELU, MLP, Dropout
from .gpu_norm import BatchNorm2d, LayerNorm
from .gpu_optim import AdamW, SoftmaxCrossEntropy

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
