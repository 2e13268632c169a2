"""The GPU kernels without a GPU: every CUDA source compiles, and the host side of
every GPU kernel class (shapes, dtypes, argument order, launch shapes) is right.

1. NVRTC (the ``cuda-bindings`` and ``nvidia-cuda-nvrtc`` packages, which need no
   GPU) compiles every file of ``tinyvit/fast/kernels`` for float32 and float64 and
   for the GPUs targeted, sm_80 (A100) and sm_90 (H100, H200); skipped where those
   packages are missing. A compile error names the file and the line.
2. The classes of ``tinyvit/fast/gpu.py`` run on NumPy with every kernel replaced
   by a NumPy mirror of it (``MIRRORS``, one line of the kernel's math each): each
   launch is checked against the C signature parsed from its source (pointers to
   contiguous arrays of the right dtype, C long long and int as int64 and int32, T as
   the arrays' float) and its grid against CUDA's limits, and the classes must
   give the reference's outputs and gradients. cuBLAS's GEMM is replaced the same
   way, by a NumPy model of its column-major contract (``cuda_mirrors.gemm``), and
   tinyvit's ctypes binding of it runs over a stand-in library compiled for the
   CPU (``fake_cublas.c``). On a GPU, ``tests/test_fast.py`` checks the kernels
   themselves.
"""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_on_cpu import compiler, cpu_kernel, signatures

import cuda_mirrors
from conftest import jitter, output_shape, randn
from cuda_mirrors import MIRRORS
from tinyvit import backend as B
from tinyvit.fast import compile as cuda
from tinyvit.fast import cublas, gpu, gpu_attention, gpu_mlp
from tinyvit.models import ViT
from tinyvit.nn import conv, layers, loss, optim

ARCHITECTURES = ("sm_80", "sm_90")
DTYPES = ("float32", "float64")
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def test_every_file_declares_the_functions_the_classes_launch():
    for name, functions in cuda.FUNCTIONS.items():
        assert tuple(signatures(name)) == functions, name


# ----------------------------------------------------------------------------- 1. NVRTC


def nvrtc_compile(source, filename, architecture):
    """(succeeded, log) of NVRTC compiling ``source`` for ``architecture``."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-bindings")
    _, program = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    options = [f"--gpu-architecture={architecture}".encode(), b"--std=c++14"]
    (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = bytearray(size)  # NVRTC writes into it (never into bytes: b" " * 1 is Python's own b" ")
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(program)
    return result == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace").strip("\0 \n")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(cuda.FUNCTIONS))
def test_every_kernel_compiles(name, dtype, architecture):
    ok, log = nvrtc_compile(cuda.source(name, dtype), f"{name}.cu", architecture)
    assert ok, f"kernels/{name}.cu for {dtype} on {architecture}:\n{log}"


def test_a_compile_error_names_the_file_and_its_line():
    broken = cuda.source("gelu", "float32").replace("y[i] = gelu(x[i])", "y[i] = gelu(w[i])")
    ok, log = nvrtc_compile(broken, "gelu.cu", "sm_90")
    line = next(i for i, text in enumerate((cuda.KERNELS_DIR / "gelu.cu").read_text()
                                           .splitlines(), 1) if "y[i] = gelu(x[i])" in text)
    assert not ok and f'gelu.cu({line}): error: identifier "w" is undefined' in log


def test_the_fused_attention_has_the_limits_its_kernel_has():
    text = (cuda.KERNELS_DIR / "attention.cu").read_text()
    for name in ("MAX_TOKENS", "MAX_HEAD_DIM", "WARPS"):
        assert f"#define {name} {getattr(gpu_attention, name)}\n" in text


def test_only_float32_and_float64_are_compiled():
    with pytest.raises(ValueError, match="GPU kernels: expected float32 or float64 arrays, "
                                         "got float16"):
        cuda.source("gelu", "float16")


# ----------------------------------------------------------------------------- 2. mirrors


def check_argument(c_type, value, dtype, where):
    """``value`` as a launch passes it for a C parameter of type ``c_type``."""
    t = c_type.replace("const ", "")
    if t.endswith("*"):
        element = {"T*": dtype, "long long*": np.dtype(np.int64), "double*": np.dtype(np.float64),
                   "unsigned long long*": np.dtype(np.uint64)}[t]
        assert isinstance(value, np.ndarray) and value.dtype == element, where
        assert value.flags.c_contiguous, f"{where}: a kernel ignores strides"
    else:
        expected = {"T": dtype.type, "long long": np.int64, "int": np.int32,
                    "unsigned long long": np.uint64, "double": np.float64}[t]
        assert type(value) is expected, f"{where}: {type(value).__name__} for C {c_type}"


def checked_kernel(name, function, dtype, run):
    """A stand-in for ``compile.kernel``: checks each launch, then ``run(grid, block,
    args)`` does its work."""
    parameters = signatures(name)[function]

    def launch(grid, block, args, shared_mem=0):
        assert len(args) == len(parameters), f"{function}: {len(args)} arguments"
        for i, (c_type, value) in enumerate(zip(parameters, args)):
            check_argument(c_type, value, np.dtype(dtype), f"{function} argument {i}")
        assert all(g >= 1 for g in grid) and len(grid) <= 3 and grid[1:] <= (65535, 65535)
        assert np.prod(block) <= 1024 and np.prod(block) % 32 == 0
        assert 0 <= shared_mem <= gpu_attention.SHARED_BYTES
        run(grid, block, args, shared_mem)

    return launch


def mirrored_kernel(name, function, dtype):
    return checked_kernel(name, function, dtype,
                          lambda grid, block, args, shared_mem: MIRRORS[function](*args))


@pytest.fixture
def mirrored(monkeypatch):
    """NumPy in float64 default, every kernel launch checked and mirrored, and cuBLAS's
    GEMM its NumPy model (cuda_mirrors.gemm)."""
    monkeypatch.setattr(cuda, "kernel", mirrored_kernel)
    monkeypatch.setattr(cublas, "gemm", cuda_mirrors.gemm)
    with B.using_backend("numpy"), B.default_dtype("float64"):
        yield


@pytest.fixture(params=["mirror", "cuda-c-on-cpu"])
def launched(request, monkeypatch, tmp_path_factory):
    """As ``mirrored``, each launch checked, then run by the kernel's NumPy mirror, or
    by its own CUDA C compiled for the CPU (tests/cuda_on_cpu.py; skipped without a
    C++ compiler)."""
    if request.param == "mirror":
        stand_in = mirrored_kernel
    else:
        if compiler() is None:
            pytest.skip("needs g++ 11 or later (C++20 barriers) to run the CUDA C on the CPU")
        folder = tmp_path_factory.getbasetemp()

        def stand_in(name, function, dtype):
            return checked_kernel(name, function, dtype, cpu_kernel(name, function, dtype, folder))
    monkeypatch.setattr(cuda, "kernel", stand_in)
    monkeypatch.setattr(cublas, "gemm", cuda_mirrors.gemm)
    with B.using_backend("numpy"), B.default_dtype("float64"):
        yield


# each GPU class, how to build its reference layer, and input shapes
LAYERS = [
    (gpu.Linear, lambda: layers.Linear(6, 40, rng=B.host_rng(0)), [(3, 6), (2, 9, 6), (1, 300, 6)]),
    (gpu.GELU, lambda: layers.GELU(), [(3, 7), (2, 9, 33)]),
    (gpu.MLP, lambda: layers.MLP(6, 10, rng=B.host_rng(0)), [(3, 6), (2, 9, 6), (1, 1, 6)]),
    (gpu.LayerNorm, lambda: layers.LayerNorm(7), [(3, 7), (2, 9, 7), (1, 1, 7)]),
    (gpu.Block, lambda: layers.Block(6, 2, rng=B.host_rng(0)), [(2, 5, 6), (1, 17, 6)]),
    (gpu.BatchNorm2d, lambda: conv.BatchNorm2d(3), [(2, 3, 5, 7), (1, 3, 1, 3)]),
    # 3x3, stride 2, padding 1, with a bias; 2x3, stride (1, 2), unpadded, weight-standardized
    (gpu.Conv2d, lambda: conv.Conv2d(3, 4, 3, 2, 1, rng=B.host_rng(0)), [(2, 3, 9, 9),
                                                                          (1, 3, 3, 3)]),
    (gpu.Conv2d, lambda: conv.Conv2d(3, 5, (2, 3), (1, 2), 0, bias=False,
                                     weight_standardization=True, rng=B.host_rng(0)),
     [(2, 3, 5, 8), (1, 3, 2, 3)]),
    (gpu.Attention, lambda: layers.Attention(6, 3, rng=B.host_rng(0)),
     [(2, 5, 6), (1, 40, 6), (1, gpu_attention.MAX_TOKENS + 1, 6)]),
    (gpu.ClassAttention, lambda: layers.ClassAttention(6, 2, rng=B.host_rng(0)),
     [(2, 5, 6), (3, 1, 6)]),
]


def as_gpu(layer):
    """``layer`` with each of its parts in its GPU class, as accelerate would on a GPU."""
    for _, part in layer.named_modules():
        part.__class__ = gpu.KERNELS.get(type(part), type(part))
    return layer


def rel_err(ours, theirs):
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def training_pass(layer, x, dout):
    layer.zero_grad()
    y = layer.forward(x)
    return [y, layer.backward(dout)] + [p.grad.copy() for p in layer.parameters()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls, make, shape", [(c, make, s) for c, make, shapes in LAYERS
                                              for s in shapes], ids=str)
def test_each_gpu_layer_launches_its_kernels_as_declared(launched, cls, make, shape, dtype):
    reference = jitter(make()).astype(dtype)
    kernel = jitter(make()).astype(dtype)
    as_gpu(kernel)
    assert type(kernel) is cls
    x = (2 * randn(*shape)).astype(dtype)
    dout = randn(*output_shape(reference, x), seed=1).astype(dtype)
    for ours, theirs in zip(training_pass(kernel, x, dout), training_pass(reference, x, dout)):
        assert ours.dtype == dtype and rel_err(ours, theirs) <= TOLERANCE[dtype]
    reference.eval(), kernel.eval()  # BatchNorm2d's running averages, updated by the pass
    assert rel_err(kernel.forward(x), reference.forward(x)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, tokens", [(16, 33), (20, 7), (48, 65),
                                              (gpu_attention.MAX_HEAD_DIM, 2),
                                              (8, gpu_attention.MAX_TOKENS)])
@pytest.mark.parametrize("cls", [layers.Attention, layers.ClassAttention])
def test_the_fused_attention_gives_the_reference(launched, cls, head_dim, tokens, dtype):
    """Heads of one lane's value and of two, sequences shorter than a warp and up to
    its four keys a lane, every token's query or the class token's alone (float64 at
    48 x 65 takes the unfused path: its k and v pass the shared memory)."""
    reference = jitter(cls(2 * head_dim, 2, rng=B.host_rng(0))).astype(dtype)
    kernel = as_gpu(jitter(cls(2 * head_dim, 2, rng=B.host_rng(0))).astype(dtype))
    x = randn(2, tokens, 2 * head_dim).astype(dtype)
    dout = randn(*output_shape(reference, x), seed=1).astype(dtype)
    for ours, theirs in zip(training_pass(kernel, x, dout), training_pass(reference, x, dout)):
        assert rel_err(ours, theirs) <= TOLERANCE[dtype]


@pytest.mark.parametrize("fields", [{}, {"pool": "mean", "stem": ((4, 3, 2),), "patch_size": 1}])
def test_a_whole_gpu_model_gives_the_reference(launched, fields):
    """A ViT (class-token pooling: its last block the class token's) and a hybrid
    (mean pooling, a Conv2d and BatchNorm2d stem) with every part in its GPU class: the same
    logits, input gradient and parameter gradients, to 1e-12 in float64."""
    config = {**dict(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8,
                     depth=2, num_heads=2), **fields}
    reference, kernel = jitter(ViT(**config)), as_gpu(jitter(ViT(**config)))
    x, dlogits = randn(2, 2, 8, 8), randn(2, 3, seed=1)
    for ours, theirs in zip(training_pass(kernel, x, dlogits),
                            training_pass(reference, x, dlogits), strict=True):
        assert rel_err(ours, theirs) <= TOLERANCE["float64"]


def test_the_block_defers_the_biases_only_where_no_dropout_follows_them(mirrored):
    """x + a + b_proj and x1 + m + b_fc2 equal x + dropout(a + b) only where the
    dropout after each Linear does nothing: in eval mode, or with p = 0."""
    h = randn(2, 5, 6)
    for dropout, training, defers in [(0.1, True, False), (0.1, False, True), (0.0, True, True)]:
        block = as_gpu(layers.Block(6, 2, dropout=dropout, rng=B.host_rng(0)))
        block.train(training)
        assert block.defers_biases(h) is defers


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("batch, shared_b", [((), False), ((2, 3), False), ((2,), True)])
def test_matmul_asks_cublas_for_the_row_major_product(mirrored, transpose_a, transpose_b, batch,
                                                      shared_b):
    """op(a) @ op(b) through cuBLAS's column-major GEMM, batched (b one matrix for
    the whole batch, or one per matrix of a), at odd sizes; with ``out`` the product
    is added to it."""
    m, k, n = 5, 7, 3
    a = randn(*batch, *((k, m) if transpose_a else (m, k)))
    b = randn(*(() if shared_b else batch), *((n, k) if transpose_b else (k, n)), seed=1)
    expected = (np.swapaxes(a, -1, -2) if transpose_a else a) @ (
        np.swapaxes(b, -1, -2) if transpose_b else b)
    product = cublas.matmul(a, b, transpose_a, transpose_b)
    assert product.shape == (*batch, m, n) and rel_err(product, expected) <= 1e-15
    out = randn(*batch, m, n, seed=2)
    total = out + expected
    assert cublas.matmul(a, b, transpose_a, transpose_b, out=out) is out
    assert rel_err(out, total) <= 1e-15


def test_matmul_names_what_it_cannot_multiply(mirrored):
    a = randn(4, 5)
    with pytest.raises(ValueError, match=r"cannot multiply \(4, 5\) by \(4, 3\)"):
        cublas.matmul(a, randn(4, 3))
    with pytest.raises(ValueError, match="C-contiguous arrays of one dtype"):
        cublas.matmul(a.T, randn(4, 3))
    with pytest.raises(ValueError, match=r"out must be C-contiguous \(4, 3\)"):
        cublas.matmul(a, randn(5, 3), out=randn(3, 4))


@pytest.fixture
def fake_cublas(monkeypatch, tmp_path):
    """tinyvit's cuBLAS binding (``cublas.bind``, ``cublas.Handle``) over
    tests/fake_cublas.c compiled for the CPU, on NumPy; yields the library."""
    if compiler() is None:
        pytest.skip("needs a C compiler (g++ 11 or later) to build the stand-in cuBLAS")
    path = tmp_path / "libfake_cublas.so"
    subprocess.run([compiler(), "-x", "c", "-O1", "-shared", "-fPIC",
                    str(Path(__file__).with_name("fake_cublas.c")), "-o", str(path)], check=True)
    lib = cublas.bind(ctypes.CDLL(str(path)))
    with B.using_backend("numpy"):
        blas = cublas.Handle(lib)
        blas.use_stream(0)
        monkeypatch.setattr(cublas, "current_handle", lambda: blas)
        yield lib


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_binding_calls_cublas_as_cublas_declares_it(fake_cublas, dtype):
    """Through ctypes, with the C signatures of cuBLAS's documentation, every
    transposition and batching of ``matmul`` gives NumPy's product."""
    tolerance = {"float64": 1e-13, "float32": 1e-6}[dtype]
    for transpose_a, transpose_b, batch in [(False, False, ()), (True, False, (3,)),
                                            (False, True, (2, 2)), (True, True, (2,))]:
        a = randn(*batch, *((7, 5) if transpose_a else (5, 7))).astype(dtype)
        b = randn(*batch, *((3, 7) if transpose_b else (7, 3)), seed=1).astype(dtype)
        expected = (np.swapaxes(a, -1, -2) if transpose_a else a) @ (
            np.swapaxes(b, -1, -2) if transpose_b else b)
        assert rel_err(cublas.matmul(a, b, transpose_a, transpose_b), expected) <= tolerance


def test_the_binding_finds_the_libcublas_the_process_mapped():
    maps = ["7f2a1000-7f2a2000 r-xp 00000000 08:01 1 /usr/lib/libc.so.6",
            "7f3b0000-7f3c0000 r-xp 00000000 08:01 2 /nvidia/cu13/lib/libcublasLt.so.13",
            "7f3d0000-7f3e0000 r-xp 00000000 08:01 3 /nvidia/cu13/lib/libcublas.so.13",
            "7f3e0000-7f3e1000 rw-p 00000000 00:00 0 "]
    assert cublas.mapped_cublas(maps, 13) == "/nvidia/cu13/lib/libcublas.so.13"
    assert cublas.mapped_cublas(maps[:2], 13) is None
    cuda12 = "7f4d0000-7f4e0000 r-xp 00000000 08:01 4 /a/nvidia/cublas/lib/libcublas.so.12"
    assert cublas.mapped_cublas([*maps, cuda12], 13) == "/nvidia/cu13/lib/libcublas.so.13"
    assert cublas.mapped_cublas([*maps, cuda12], 12) == "/a/nvidia/cublas/lib/libcublas.so.12"


def test_the_binding_names_a_failed_call_and_follows_cupy_tf32(fake_cublas, monkeypatch):
    a = np.ones((2, 2))
    with pytest.raises(RuntimeError, match="cuBLAS gemmStridedBatched failed with status 7"):
        cublas.gemm(False, False, 2, 2, 2, 1.0, a, 1, 0, a, 2, 0, 0.0, a, 2, 0, 1)  # lda < m
    assert fake_cublas.fake_math_mode() == cublas.DEFAULT_MATH
    for value, mode in [("1", cublas.TF32_MATH), ("2", cublas.TF32_MATH),
                        ("0", cublas.DEFAULT_MATH)]:
        monkeypatch.setenv("CUPY_TF32", value)
        cublas.Handle(fake_cublas)
        assert fake_cublas.fake_math_mode() == mode, value


def test_layernorm_names_an_input_it_cannot_read(mirrored):
    norm = layers.LayerNorm(7).astype("float32")
    norm.__class__ = gpu.LayerNorm
    with pytest.raises(ValueError, match=r"LayerNorm: the GPU kernel expects input \(\.\.\., 7\) "
                                         r"of dtype float32, got \(3, 7\) of dtype float64"):
        norm.forward(randn(3, 7))


def test_batchnorm_names_an_input_it_cannot_read(mirrored):
    norm = conv.BatchNorm2d(3).astype("float32")
    norm.__class__ = gpu.BatchNorm2d
    with pytest.raises(ValueError, match="BatchNorm2d: the GPU kernel expects input of dtype "
                                         "float32, got float64"):
        norm.forward(randn(2, 3, 4, 4))


@pytest.mark.parametrize("target", ["labels", "soft"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gpu_loss_launches_its_kernel_as_declared(launched, target, dtype):
    z = (3 * randn(6, 5)).astype(dtype)
    labels = np.array([0, 4, 2, 2, 1, 3])
    t = labels if target == "labels" else np.full((6, 5), 0.2, dtype=dtype)
    reference, kernel = loss.SoftmaxCrossEntropy(0.1), loss.SoftmaxCrossEntropy(0.1)
    kernel.__class__ = gpu.SoftmaxCrossEntropy
    for dout in (1.0, 0.25):
        assert rel_err(kernel.forward(z, t), reference.forward(z, t)) <= TOLERANCE[dtype]
        assert rel_err(kernel.backward(dout), reference.backward(dout)) <= TOLERANCE[dtype]


def test_the_gpu_loss_gives_nan_for_a_label_out_of_range_and_reads_none(launched, monkeypatch):
    def unread(*args):
        raise AssertionError("the GPU loss read the labels")
    monkeypatch.setattr(loss.SoftmaxCrossEntropy, "check_labels", unread)
    kernel = loss.SoftmaxCrossEntropy(0.1)
    kernel.__class__ = gpu.SoftmaxCrossEntropy
    kernel.forward(randn(3, 5), np.array([0, 5, 2]))
    grad = kernel.backward()
    assert np.isnan(grad[1]).all() and np.isfinite(grad[[0, 2]]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gpu_adamw_launches_its_kernel_as_declared(launched, dtype):
    models = [jitter(layers.LayerNorm(9)).astype(dtype) for _ in range(2)]
    reference, kernel = (optim.AdamW(m, lr=0.1, weight_decay=0.05) for m in models)
    kernel.__class__ = gpu.AdamW
    for step in range(3):
        for model in models:
            model.weight.grad[...] = randn(9, seed=step).astype(dtype)
            model.bias.grad[...] = randn(9, seed=step + 10).astype(dtype)
        reference.step()
        kernel.step()
    for name in ("data", "m", "v"):
        assert rel_err(getattr(kernel, name), getattr(reference, name)) <= TOLERANCE[dtype], name


def gpu_dropout(p, seed=0):
    layer = layers.Dropout(p)
    layer.__class__ = gpu.Dropout
    layer.rng = gpu_mlp.step_keys(seed)
    return layer


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gpu_dropout_draws_a_mask_and_its_backward_draws_it_again(launched, dtype):
    """Kept values scaled by 1/(1-p), about 1-p of them; the backward scales the
    same entries; the next forward draws a new mask; eval mode is the identity."""
    layer, x = gpu_dropout(0.3), randn(20, 501).astype(dtype) + 3  # no zero in x
    y = layer.forward(x)
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02  # 10,020 draws: 0.02 is 4.4 standard deviations
    scale = np.dtype(dtype).type(1 / 0.7)
    assert np.array_equal(y[kept], x[kept] * scale)
    dout = randn(20, 501, seed=1).astype(dtype)
    assert np.array_equal(layer.backward(dout), np.where(kept, dout * scale, 0))
    assert not np.array_equal(layer.forward(x) != 0, kept)
    layer.eval()
    assert layer.forward(x) is x and layer.backward(dout) is dout


def test_the_gpu_dropout_mask_is_the_seed_s_and_its_number_s_alone(launched):
    """Reseeded alike, two layers draw the same masks in the same order, whatever
    their inputs; the second mask of a seed is not its first."""
    a, b = gpu_dropout(0.5), gpu_dropout(0.5)
    masks = []
    for layer in (a, b):
        gpu_mlp.step_keys(7)
        masks.append([layer.forward(randn(9, 13, seed=s)) != 0 for s in (1, 2)])
    assert all(np.array_equal(ours, theirs) for ours, theirs in zip(*masks))
    assert not np.array_equal(*masks[0])


def test_the_gpu_dropout_seed_stays_where_it_was_written(mirrored):
    """Every reseeding writes the same device memory, which each mask's launch reads:
    what a captured step needs to draw new masks each step."""
    first = gpu_mlp.step_keys(1).seed
    assert gpu_mlp.step_keys(2).seed is first
    assert gpu_dropout(0.5, seed=3).rng.seed is first and first[0] == B.host_rng(3).integers(
        2**63, size=1, dtype="uint64")[0]


def test_seed_dropout_gives_each_kind_of_dropout_its_generator(mirrored):
    """The GPU dropouts share one host generator, the reference ones another."""
    model = ViT(image_size=8, patch_size=4, in_channels=1, num_classes=3, embed_dim=8, depth=2,
                num_heads=2, dropout=0.1)
    dropouts = [m for _, m in model.named_modules() if isinstance(m, layers.Dropout) and m.p > 0]
    for m in dropouts[::2]:
        m.__class__ = gpu.Dropout
    model.seed_dropout(3)
    ours, theirs = {id(m.rng) for m in dropouts[::2]}, {id(m.rng) for m in dropouts[1::2]}
    assert len(ours) == len(theirs) == 1 and ours != theirs
