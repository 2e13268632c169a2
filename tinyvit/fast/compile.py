"""The CUDA C of the GPU kernels (``kernels/*.cu``), compiled by CuPy, and how they launch.

Each file is compiled once per float dtype and kept: its source is
``#define T float`` (or ``double``), then ``kernels/common.cuh`` (the warp
reductions and indexes every file uses), then the file, each part preceded by a
``#line`` directive so that a compiler error names the file and line it is in.
``tests/test_cuda_sources.py`` compiles every file with NVRTC for the GPUs it
targets on machines without one.

The launch shapes:
- elementwise (``launch_elementwise``): blocks of THREADS threads, each thread
  taking every stride-th value of the array (a grid-stride loop), the grid at
  most MAX_BLOCKS blocks;
- rows (``launch_rows``): one warp of 32 threads per row, THREADS / 32 rows a block;
- channels (``launch_channels``): one block of THREADS threads per channel;
- heads (``launch_heads``): one block per (image, head), its warps taking the rows.
"""

import functools
from pathlib import Path

from ..backend import xp

KERNELS_DIR = Path(__file__).with_name("kernels")
C_TYPES = {"float32": "float", "float64": "double"}
# each file's kernels, by the names its ``extern "C" __global__`` functions have
FUNCTIONS = {
    "linear": ("add_bias_residual", "bias_grad"),
    "gelu": ("gelu_forward", "gelu_backward", "bias_gelu_forward", "bias_gelu_backward"),
    "dropout": ("dropout_apply",),
    "batchnorm": ("batchnorm_forward", "batchnorm_eval", "batchnorm_backward"),
    "layernorm": ("layernorm_forward", "add_layernorm_forward", "add_bias_layernorm_forward",
                  "layernorm_backward", "layernorm_backward_add", "layernorm_param_grads"),
    "softmax": ("softmax_forward", "softmax_backward"),
    "attention": ("attention_forward", "attention_backward"),
    "cross_entropy": ("cross_entropy_soft", "cross_entropy_labels"),
    "adamw": ("adamw_update",),
    "conv": ("im2col", "col2im"),
}
THREADS = 256  # per block
MAX_BLOCKS = 4096  # an elementwise grid's largest: enough blocks to fill any current GPU
COLUMN_ROWS = 8  # the column kernels': the rows of threads in a block (their COLUMN_ROWS)


def source(name, dtype):
    """The CUDA C of ``kernels/<name>.cu`` for arrays of ``dtype`` (float32 or float64)."""
    dtype = str(xp.dtype(dtype))
    if dtype not in C_TYPES:
        raise ValueError(f"GPU kernels: expected float32 or float64 arrays, got {dtype}")
    parts = [f"#define T {C_TYPES[dtype]}\n"]
    for file in ("common.cuh", f"{name}.cu"):
        parts.append(f'#line 1 "{file}"\n{(KERNELS_DIR / file).read_text()}')
    return "".join(parts)


@functools.cache
def _module(name, dtype):
    return xp.RawModule(code=source(name, dtype), options=("--std=c++14",))


@functools.cache
def _function(name, function, dtype):  # kept: getting it again is a driver call per launch
    return _module(name, dtype).get_function(function)


def kernel(name, function, dtype):
    """Function ``function`` of ``kernels/<name>.cu``, compiled for ``dtype``."""
    return _function(name, function, str(xp.dtype(dtype)))


def scalars(dtype, *values):
    """``values`` as the kernel's T arguments (C float or double)."""
    return tuple(xp.dtype(dtype).type(v) for v in values)


def launch_elementwise(name, function, n, args, dtype):
    """Run an elementwise kernel over ``n`` values; ``args`` end with its n."""
    blocks = min(max(1, -(-n // THREADS)), MAX_BLOCKS)
    kernel(name, function, dtype)((blocks,), (THREADS,), args)


def launch_rows(name, function, rows, args, dtype):
    """Run a row kernel over ``rows`` rows, one warp each."""
    per_block = THREADS // 32
    blocks = max(1, -(-rows // per_block))
    kernel(name, function, dtype)((blocks,), (THREADS,), args)


def launch_channels(name, function, channels, args, dtype):
    """Run a channel kernel (``batchnorm.cu``): one block per channel."""
    kernel(name, function, dtype)((channels,), (THREADS,), args)


def launch_columns(name, function, rows, columns, args, dtype):
    """Run a column kernel (``bias_grad``, ``layernorm_param_grads``): 32 columns a
    block, and enough blocks down the rows that each of its threads sums about
    COLUMN_ROWS * 32 rows."""
    down = min(max(1, -(-rows // (COLUMN_ROWS * 32))), MAX_BLOCKS)
    kernel(name, function, dtype)((-(-columns // 32), down), (32, COLUMN_ROWS), args)


def launch_heads(name, function, blocks, threads, shared_bytes, args, dtype):
    """Run a head kernel (``attention.cu``): one block of ``threads`` per (image,
    head), with ``shared_bytes`` of shared memory."""
    kernel(name, function, dtype)((blocks,), (threads,), args, shared_mem=shared_bytes)
