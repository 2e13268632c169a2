"""The fast tier on a GPU: CuPy kernels.

Fused CUDA kernels (one launch where the reference takes many) belong here, each
a subclass of its reference layer registered in ``KERNELS`` and tested equal to
it by ``tests/test_fast.py``, which runs every registered kernel of the active
backend. Until then the GPU takes the CPU's kernels with what differs on a GPU:

- column sums as a matrix-vector product ones^T a, which reads whole rows; CuPy's
  reduction down the columns reads each column strided, slowly;
- GELU over the whole array at once: row blocks serve a CPU's cache.

Attention runs the reference: the CPU's one-max softmax needs the score range on
the host, a round trip a GPU step must not make.
"""

from ..backend import xp
from ..nn import layers
from . import cpu


def column_sum(a, b=None):
    """sum of a (or of a * b) over every axis but the last: (..., D) -> (D,)."""
    a = a.reshape(-1, a.shape[-1])
    if b is not None:
        a = a * b.reshape(-1, b.shape[-1])  # (M, D)
    return xp.ones(a.shape[0], dtype=a.dtype) @ a


class Linear(cpu.Linear):
    column_sum = staticmethod(column_sum)


class LayerNorm(cpu.LayerNorm):
    column_sum = staticmethod(column_sum)


class GELU(cpu.GELU):
    block_elements = None  # one block: the whole array


KERNELS = {
    layers.Linear: Linear,
    layers.LayerNorm: LayerNorm,
    layers.GELU: GELU,
}
