"""The fast tier against the reference: every kernel registered for the active
backend gives the reference layer's output, input gradient and parameter
gradients, in training and in eval mode, at several shapes (odd ones included):
float64 to 1e-12 and float32 to 1e-5, relative to the largest value. Then the
fast kernels' own numerics: the float32 erf's and GELU's accuracy, the row blocks
and threads every CPU kernel runs on, the one-max softmax, the CPU's dropout.
"""

import functools
import math
import re
import threading
import time
import warnings

import numpy as np
import pytest

import tinyvit
from conftest import jitter, output_shape, randn
from cuda_mirrors import dropout_apply
from tinyvit import backend as B
from tinyvit import fast
from tinyvit.fast import (
    blocks,
    cpu,
    cpu_conv,
    cpu_numba,
    cpu_numba_gelu,
    cpu_numba_norm,
    cpu_numba_softmax,
    elementwise,
    mkl,
)
from tinyvit.nn import conv, layers, loss, optim

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}

# how to build each layer that may have a fast kernel, and its input shapes
CASES = {
    layers.Linear: (lambda: layers.Linear(7, 5, rng=B.host_rng(0)),
                    [(3, 7), (2, 9, 7), (1, 7), (4, 300, 7)]),
    layers.LayerNorm: (lambda: layers.LayerNorm(7), [(3, 7), (2, 9, 7), (1, 1, 7)]),
    layers.GELU: (lambda: layers.GELU(), [(3, 7), (2, 9, 33), (5, 300, 301)]),
    layers.MLP: (lambda: layers.MLP(6, 10, rng=B.host_rng(0)), [(3, 6), (2, 9, 6), (1, 1, 6)]),
    layers.Block: (lambda: layers.Block(6, 2, rng=B.host_rng(0)), [(2, 5, 6), (1, 17, 6)]),
    layers.Attention: (lambda: layers.Attention(6, 3, rng=B.host_rng(0)),
                       [(2, 5, 6), (1, 17, 6), (3, 1, 6)]),
    layers.ClassAttention: (lambda: layers.ClassAttention(6, 2, rng=B.host_rng(0)),
                            [(2, 5, 6), (1, 17, 6), (3, 1, 6)]),
    conv.BatchNorm2d: (lambda: conv.BatchNorm2d(3), [(2, 3, 5, 7), (1, 3, 1, 3), (9, 3, 17, 19)]),
    # 3 input channels, 3x3 stride 2, padding 1, odd sizes
    conv.Conv2d: (lambda: conv.Conv2d(3, 4, 3, 2, 1, rng=B.host_rng(0)),
                  [(2, 3, 9, 9), (5, 3, 8, 7), (1, 3, 3, 3)]),
}


@pytest.fixture(params=[False, True], ids=["blocks", "numba"])
def route(request):
    """The CPU's GELU and LayerNorm in NumPy blocks, or compiled by Numba (skipped
    where it is not installed); the choice undone after the test."""
    if request.param and not cpu_numba.INSTALLED:
        pytest.skip("Numba is not installed")
    cpu_numba.set_compiled(request.param)
    yield request.param
    cpu_numba.set_compiled(None)


def rel_err(ours, reference):
    ours, reference = B.to_host(ours), B.to_host(reference)
    scale = np.abs(reference).max()
    return float(np.abs(ours - reference).max() / scale) if scale else float(np.abs(ours).max())


def build(cls, tier_name, dtype):
    make, _ = CASES[cls]
    layer = jitter(make()).astype(dtype)
    return fast.accelerate(layer) if tier_name == "fast" else layer


def run(layer, x, dout):
    """Output, input gradient and parameter gradients of one training-mode pass."""
    layer.zero_grad()
    y = layer.forward(x)
    dx = layer.backward(dout)
    return [y, dx] + [p.grad for p in layer.parameters()]


# the kernels with a test of their own below: a loss, an optimizer, dropout's random masks
OWN_TESTS = {loss.SoftmaxCrossEntropy, optim.AdamW, layers.Dropout}


def test_every_kernel_has_a_case(backend):
    assert set(fast.kernels()) <= set(CASES) | OWN_TESTS


def kernel_cases():
    return [(cls, shape) for cls, (_, shapes) in CASES.items() for shape in shapes]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cls, shape", kernel_cases(), ids=lambda c: getattr(c, "__name__", str(c)))
def test_fast_kernel_equals_reference(backend, route, cls, shape, dtype):
    if cls not in fast.kernels():
        pytest.skip(f"no fast {cls.__name__} on {backend}")
    reference, kernel = build(cls, "reference", dtype), build(cls, "fast", dtype)
    assert type(reference) is cls and type(kernel) is fast.kernels()[cls]
    x = (randn(*shape) * 2).astype(dtype)
    dout = randn(*output_shape(reference, x), seed=1).astype(dtype)
    names = ["output", "input gradient"] + [n for n, _ in reference.named_parameters()]
    results = zip(names, run(kernel, x, dout), run(reference, x, dout), strict=True)
    for name, ours, theirs in results:
        assert ours.dtype == dtype, name
        assert rel_err(ours, theirs) <= TOLERANCE[dtype], name
    reference.eval(), kernel.eval()
    assert rel_err(kernel.forward(x), reference.forward(x)) <= TOLERANCE[dtype]


def kernel_or_skip(cls, backend):
    if cls not in fast.kernels():
        pytest.skip(f"no fast {cls.__name__} on {backend}")
    return fast.kernels()[cls]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("target", ["labels", "soft"])
def test_fast_loss_equals_reference(backend, target, dtype):
    """Loss and gradient, at dout 1 and at a share of a batch, labels smoothed."""
    kernel_or_skip(loss.SoftmaxCrossEntropy, backend)
    z = (3 * randn(7, 10)).astype(dtype)
    labels = B.xp.asarray([0, 9, 3, 3, 5, 1, 8])
    t = labels if target == "labels" else B.xp.full((7, 10), 0.1, dtype=dtype)
    reference = loss.SoftmaxCrossEntropy(0.1)
    kernel = fast.accelerate(loss.SoftmaxCrossEntropy(0.1))
    assert type(kernel) is fast.kernels()[loss.SoftmaxCrossEntropy]
    for dout in (1.0, 0.25):
        assert rel_err(kernel.forward(z, t), reference.forward(z, t)) <= TOLERANCE[dtype]
        assert rel_err(kernel.backward(dout), reference.backward(dout)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("head_dim, tokens", [(16, 33), (20, 7), (48, 65), (64, 2), (8, 129)])
def test_fast_attention_at_each_head_size_equals_reference(backend, head_dim, tokens, dtype):
    """Heads of 16, 20, 48 and 64 values (the GPU kernel's registers hold 16, 32 or
    64), one warp of tokens and several, and past the fused kernel's 128 tokens."""
    def make():
        return jitter(layers.Attention(2 * head_dim, 2, rng=B.host_rng(0))).astype(dtype)
    x = randn(2, tokens, 2 * head_dim).astype(dtype)
    dout = randn(2, tokens, 2 * head_dim, seed=1).astype(dtype)
    for ours, theirs in zip(run(fast.accelerate(make()), x, dout), run(make(), x, dout)):
        assert rel_err(ours, theirs) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_adamw_equals_reference(backend, dtype):
    """Three steps on the flat buffer of a layer whose weight decays and bias does not."""
    kernel_or_skip(optim.AdamW, backend)
    layers_ = [jitter(layers.Linear(7, 5, rng=B.host_rng(0))).astype(dtype) for _ in range(2)]
    reference = optim.AdamW(layers_[0], lr=0.1, weight_decay=0.05)
    kernel = fast.accelerate(optim.AdamW(layers_[1], lr=0.1, weight_decay=0.05))
    for step in range(3):
        for layer in layers_:
            layer.weight.grad[...] = randn(5, 7, seed=step).astype(dtype)
            layer.bias.grad[...] = randn(5, seed=step + 10).astype(dtype)
        reference.step()
        kernel.step()
    for name in ("data", "m", "v"):
        assert rel_err(getattr(kernel, name), getattr(reference, name)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_dropout_draws_the_mask_of_its_numpy_mirror(backend, dtype):
    """The kernel's mask is the one the NumPy mirror of its generator draws from the
    same seed and mask number, forward and backward."""
    if backend == "numpy":
        pytest.skip("the CPU's Dropout draws the reference's mask (test_cpu_dropout_...)")
    kernel_or_skip(layers.Dropout, backend)
    layer = fast.accelerate(layers.Dropout(0.3))
    layers.seed_dropouts([layer], 0)
    x, dout = randn(7, 301).astype(dtype), randn(7, 301, seed=1).astype(dtype)
    layer.forward(x)  # a first mask: the one checked is number 1
    y = layer.forward(x)
    mask, expected = layer.cache, np.empty(x.shape, dtype=dtype)
    seed = B.to_host(mask.keys.seed)
    assert mask.draw == 1
    for ours, theirs in ((y, B.to_host(x)), (layer.backward(dout), B.to_host(dout))):
        dropout_apply(theirs, expected, x.size, seed, mask.draw, 0.3, dtype(1 / 0.7))
        assert rel_err(ours, expected) <= TOLERANCE[dtype]


# --------------------------------------------------------------------------- CPU kernels' numerics


def exact_gelu_and_derivative(x):
    x = x.astype(np.float64)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def test_float32_gelu_value_and_derivative_within_2e7(route):
    """float32 computes max(x, 0) - |x| Phi(-|x|) by its own erfc polynomial, and its
    derivative: both within 2e-7 (relative to max(1, |x|)), the value in eval mode too
    (compiled, each mode is a loop of its own, rounded its own way); every 2^-17 of
    [-2, 2], where the compiled Phi's series near 0 meets 1/2 - Phi(-|x|), and every
    2^-21 of [-0.2, 0.2], where the blocks' derivative, 1/2 + (1/2 - Phi(-|x|)) + ...,
    keeps up to 5 float32 spacings of Phi(-|x|) ~ 1/2: 3e-7 there."""
    x = np.unique(np.concatenate([np.linspace(-10, 10, 20001), np.arange(-2, 2, 2.0**-17),
                                  np.arange(-0.2, 0.2, 2.0**-21)]).astype(np.float32))
    exact, exact_dydx = exact_gelu_and_derivative(x)
    gelu = cpu.GELU()
    y = gelu.forward(x)
    dydx = gelu.backward(np.ones_like(x))
    assert y.dtype == np.float32 and dydx.dtype == np.float32
    assert np.abs(dydx - exact_dydx).max() < (2e-7 if route else 3e-7)
    for value in (y, gelu.eval().forward(x)):
        assert (np.abs(value - exact) / np.maximum(1, np.abs(x))).max() < 2e-7


def float32_sample():
    """float32 values over the whole range: every 2^-12 of [-8, 8], 64 values per
    power of two from the smallest normal to the largest finite, both signs, 0 and inf."""
    dense = np.arange(-8, 8, 2.0**-12)
    powers = np.ldexp(1 + np.arange(64)[:, None] / 64, np.arange(-126, 128)).ravel()
    values = np.concatenate([dense, powers, -powers, [0.0, np.inf, -np.inf]])
    return values.astype(np.float32)


def test_erf32_within_1_5e7_of_math_erf_over_the_float32_range():
    z = float32_sample()
    exact = np.array([math.erf(v) for v in z.astype(np.float64)])
    ours = elementwise.erf32(z)
    assert ours.dtype == np.float32
    error = np.abs(ours - exact)
    assert error.max() < 1.5e-7
    assert error.max() > 1e-8  # it is an approximation: a measurement, not a copy of erf
    np.testing.assert_array_equal(elementwise.erf32(np.float32([np.nan])), [np.nan])


# --------------------------------------------------------------------------- MKL's products

needs_mkl = pytest.mark.skipif(mkl.library_path() is None, reason="MKL is not installed")


@pytest.fixture
def small_products_to_mkl(monkeypatch):
    """MKL takes products of any size, so that small test cases reach it."""
    monkeypatch.setattr(mkl, "MIN_MULTIPLY_ADDS", 1)


@pytest.fixture(params=[False, True], ids=["numpy", "mkl"])
def products(request, small_products_to_mkl):
    """Linear's products by NumPy's BLAS, or by MKL (skipped where it is not installed),
    on any processor and at any size; the choice undone after the test."""
    if request.param and mkl.library_path() is None:
        pytest.skip("MKL is not installed")
    mkl.set_enabled(request.param)
    yield request.param
    mkl.set_enabled(None)


def layouts(a):
    """a row-major, as the transpose of a row-major array, and as a slice of a wider one."""
    wide = np.zeros((a.shape[0], a.shape[1] + 3), dtype=a.dtype)
    wide[:, 1:-2] = a
    return [a, np.ascontiguousarray(a.T).T, wide[:, 1:-2]]


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mkl_matmul_equals_numpys_in_every_layout_on_any_thread_count(threads, dtype,
                                                                      small_products_to_mkl):
    """One row, one of everything, more rows than threads; each operand in each layout;
    on 1 and 3 threads; with a bias added to every row."""
    rng = np.random.default_rng(0)
    for M, K, N in ((1, 7, 5), (1, 1, 1), (301, 64, 40)):
        a, b = (rng.standard_normal(s).astype(dtype) for s in ((M, K), (K, N)))
        c = rng.standard_normal(N).astype(dtype) * 10
        for A in layouts(a):
            for B_ in layouts(b):
                assert mkl.takes(A, B_)
                for count, bias in ((1, None), (3, None), (3, c)):
                    threads(count)
                    ours = mkl.matmul(A, B_, bias)
                    assert ours.dtype == dtype and ours.shape == (M, N)
                    theirs = A @ B_ if bias is None else A @ B_ + bias
                    np.testing.assert_allclose(ours, theirs, rtol=TOLERANCE[dtype],
                                               atol=TOLERANCE[dtype])


def test_mkl_takes_products_of_config_b_and_c_not_of_config_a():
    """A Linear's forward in config A (2176 x 64 by 64 x 192) and in B (6400 x 128 by
    128 x 256), on either side of MIN_MULTIPLY_ADDS."""
    a, w = np.ones((2176, 64), dtype=np.float32), np.ones((192, 64), dtype=np.float32)
    b, v = np.ones((6400, 128), dtype=np.float32), np.ones((256, 128), dtype=np.float32)
    assert not mkl.takes(a, w.T) and mkl.takes(b, v.T)


@needs_mkl
def test_mkl_matmul_leaves_to_numpy_what_gemm_cannot_read(small_products_to_mkl):
    """Integers, two dtypes, float16, a batch of matrices, an empty axis, steps along
    both axes, and steps that are not whole elements (a record array's field): NumPy's
    product, the same values."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 3))
    records = np.zeros((6, 4), dtype=[("x", "f4"), ("flag", "u1")])
    records["x"] = a
    cases = [(records["x"], b.astype(np.float32)),
             (np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)),
             (a.astype(np.float32), b), (a.astype(np.float16), b.astype(np.float16)),
             (np.stack([a, a]), b), (a[:, :0], b[:0]), (a[::2, ::2], b[::2, ::2])]
    for A, B_ in cases:
        assert not mkl.takes(A, B_)
        np.testing.assert_array_equal(mkl.matmul(A, B_), A @ B_)
        bias = np.arange(B_.shape[1]).astype((A @ B_).dtype)
        np.testing.assert_array_equal(mkl.matmul(A, B_, bias), A @ B_ + bias)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(3, 7), (2, 9, 7), (4, 300, 7)])
def test_fast_linear_equals_reference_by_either_blas(products, shape, dtype):
    reference, kernel = (build(layers.Linear, tier, dtype) for tier in ("reference", "fast"))
    x, dout = (randn(*shape) * 2).astype(dtype), randn(*shape[:-1], 5, seed=1).astype(dtype)
    for ours, theirs in zip(run(kernel, x, dout), run(reference, x, dout), strict=True):
        assert ours.dtype == dtype and ours.shape == theirs.shape
        assert rel_err(ours, theirs) <= TOLERANCE[dtype]


def test_tinyvit_mkl_chooses_the_products_and_refuses_other_values(monkeypatch):
    """Unset: MKL on an Intel processor; 1: MKL on any; 0: NumPy's BLAS; without MKL
    installed, NumPy's whatever the variable says."""
    monkeypatch.setattr(mkl, "library_path", lambda: "/lib/libmkl_rt.so.2")
    monkeypatch.delenv(mkl.ENVIRONMENT_VARIABLE, raising=False)
    for intel, setting, expected in ((True, None, True), (False, None, False), (False, "1", True),
                                     (True, "0", False), (True, " 1 ", True)):
        monkeypatch.setattr(mkl, "intel_processor", lambda intel=intel: intel)
        if setting is not None:
            monkeypatch.setenv(mkl.ENVIRONMENT_VARIABLE, setting)
        mkl.set_enabled(None)  # read again
        assert mkl.enabled() is expected, (intel, setting)
    monkeypatch.setattr(mkl, "library_path", lambda: None)
    mkl.set_enabled(None)
    assert mkl.enabled() is False
    monkeypatch.setenv(mkl.ENVIRONMENT_VARIABLE, "on")
    with pytest.raises(ValueError, match=r"TINYVIT_MKL: expected 1 \(MKL's products, where it is "
                                         r"installed\) or 0 \(NumPy's\), got 'on'"):
        mkl.set_enabled(None)  # refused when read, not by the next product
    assert mkl.enabled() is False  # the reading it had


def test_set_enabled_takes_true_false_or_none_and_true_needs_mkl(monkeypatch):
    with pytest.raises(ValueError, match=r"set_enabled: expected True, False or None, got 1"):
        mkl.set_enabled(1)
    monkeypatch.setattr(mkl, "library_path", lambda: None)
    with pytest.raises(ImportError,
                       match=r'set_enabled\(True\) needs MKL: pip install -e "\.\[mkl\]"'):
        mkl.set_enabled(True)


# --------------------------------------------------------------------------- blocks and threads


@pytest.fixture
def threads():
    """set_num_threads for a test, undone after it."""
    yield blocks.set_num_threads
    blocks.set_num_threads(None)


def test_each_block_calls_every_row_once_in_block_order(threads):
    threads(2)
    seen = np.zeros(1000, dtype=int)

    def kernel(index, out):
        seen[index] += 1
        out[...] = 2 * index
        return int(index[0]), len(index)

    index, out = np.arange(1000), np.empty(1000, dtype=int)
    results = blocks.each_block(kernel, index, out, block_bytes=8 * 64)  # 64 rows at most
    sizes = [62, 63] * 8  # 16 blocks: 1000 rows in blocks of 64 at most
    assert results == [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]
    assert (seen == 1).all()
    np.testing.assert_array_equal(out, 2 * np.arange(1000))


def threads_of_eight_blocks():
    """each_block over 8 blocks of 100 rows: the thread that ran each block, in the
    order the blocks ran (the results checked on the way)."""
    ran_on = []
    out = blocks.each_block(lambda x: ran_on.append(threading.get_ident()) or len(x),
                            np.zeros(800), block_bytes=8 * 100)
    assert out == [100] * 8
    return ran_on


def test_the_pools_threads_keep_the_callers_numpy_error_state(threads):
    """quiet_overflow in the training step holds in the blocks' threads too: a diverging
    run's AdamW update printed NumPy's overflow warning from a pool thread."""
    threads(2)
    ran_on = set()

    def square(x):
        ran_on.add(threading.get_ident())
        np.multiply(x, x, out=x)  # 1e30 squared overflows float32
        time.sleep(0.002)  # long enough for the pool's thread to take blocks too

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning in any thread fails its block, and the call
        with B.quiet_overflow():
            blocks.each_block(square, np.full((64, 4), 1e30, np.float32), block_bytes=4 * 4)
    assert len(ran_on) == 2


def test_each_block_does_not_wait_for_a_thread_that_has_not_started(threads):
    """The pool's thread held busy: the calling thread claims every block itself and
    returns, where blocks dealt out in advance would wait for the busy thread."""
    threads(2)
    held = threading.Event()
    pool = blocks._get_pool(1)
    for _ in range(blocks._pool_size):  # every thread of the pool (an earlier test's size), busy
        pool.submit(held.wait, 10)
    release = threading.Timer(2.0, held.set)  # so that blocks dealt out would end
    release.start()
    try:
        assert threads_of_eight_blocks() == [threading.get_ident()] * 8
    finally:
        held.set()
        release.cancel()


def test_each_block_raises_a_blocks_error_after_the_begun_blocks_end(threads):
    """Block 2 raises: the caller gets its error once no block is running, and the
    blocks claimed after the error are skipped."""
    threads(2)
    running, calls = [0], []
    lock = threading.Lock()

    def kernel(index):
        with lock:
            running[0] += 1
        calls.append(int(index[0]))
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        if index[0] == 20:
            raise ValueError("block 2")

    with pytest.raises(ValueError, match="block 2"):
        blocks.each_block(kernel, np.arange(100), block_bytes=8 * 10)
    assert running[0] == 0
    assert 20 in calls and len(calls) < 10  # the blocks claimed after the error: skipped


def test_each_block_lets_go_of_the_arrays_of_a_call_that_raised(threads):
    """No reference cycle through the error: the array is freed when the caller drops
    the exception, without the cyclic garbage collector."""
    import gc
    import weakref
    threads(2)
    x = np.ones(100_000)
    alive = weakref.ref(x)

    def kernel(block):
        raise ValueError("bad block")

    gc.disable()
    try:
        with pytest.raises(ValueError, match="bad block"):
            blocks.each_block(kernel, x, block_bytes=8 * 1000)
        del x
        assert alive() is None
    finally:
        gc.enable()


def test_an_interrupt_reaches_the_caller_after_the_begun_blocks_end(threads):
    """Ctrl-C (SIGALRM calling Python's default SIGINT handler) while the caller waits
    for the pool's thread: the KeyboardInterrupt comes once that thread's block has
    written all its rows."""
    import signal
    threads(2)
    caller, pool_block_began = threading.get_ident(), threading.Event()
    x = np.zeros(200)

    def kernel(block):
        if threading.get_ident() == caller:
            pool_block_began.wait(5)  # so that the pool's thread holds the other block
            return
        pool_block_began.set()
        time.sleep(0.3)
        block[...] = 1.0

    previous = signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.setitimer(signal.ITIMER_REAL, 0.15)
    try:
        with pytest.raises(KeyboardInterrupt):
            blocks.each_block(kernel, x, block_bytes=8 * 100)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert pool_block_began.is_set()
    assert np.count_nonzero(x) == 100  # the pool's block, written whole; the caller's writes none
    assert len(np.unique(x[:100])) == len(np.unique(x[100:])) == 1


def test_each_block_runs_every_block_itself_when_the_pool_refuses_work(threads, monkeypatch):
    """A pool shut down under the call (resized by another thread, or at exit): the
    calling thread claims every block."""
    class ShutDown:
        def submit(self, *args):
            raise RuntimeError("cannot schedule new futures after shutdown")

    threads(3)
    monkeypatch.setattr(blocks, "_get_pool", lambda workers: ShutDown())
    assert threads_of_eight_blocks() == [threading.get_ident()] * 8


@pytest.mark.parametrize("rows, row_bytes, block_bytes, sizes", [
    (128, 4 * 17 * 17 * 4, 1 << 19, [64, 64]),  # config A's scores: 111 a block at most
    (128, 3 * 65 * 65 * 4, 1 << 19, [9] + [10] * 5 + [9] + [10] * 6),  # C's: 10 at most
    (1000, 8, 8 * 1000, [1000]), (3, 8, 8, [1, 1, 1]), (0, 8, 8, [])])
def test_row_blocks_are_as_few_as_the_bound_allows_and_within_one_row(rows, row_bytes,
                                                                     block_bytes, sizes):
    """As many blocks as the bound needs, in order, their sizes within one row of each other."""
    found = blocks.row_blocks(rows, row_bytes, block_bytes)
    assert [b.start for b in found] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert [b.stop - b.start for b in found] == sizes


@needs_mkl
@pytest.mark.parametrize("count", [2, 3, 5])
def test_mkl_matmul_gives_each_thread_one_equal_share(threads, count, small_products_to_mkl,
                                                      monkeypatch):
    """The product's rows in ``count`` shares of sizes within one row, one per thread."""
    threads(count)
    shares = []
    monkeypatch.setattr(mkl, "each_block", lambda kernel, a, out, block_bytes:
                        shares.extend(b.stop - b.start for b in blocks.row_blocks(
                            len(a), max(a[:1].nbytes, out[:1].nbytes), block_bytes)))
    mkl.matmul(np.ones((1000, 64), dtype=np.float32), np.ones((64, 64), dtype=np.float32))
    assert len(shares) == count and max(shares) - min(shares) <= 1


def test_a_kernel_gives_the_same_bits_on_any_thread_count_and_block_size(threads):
    """The float32 GELU and the LayerNorm kernel, on 1 and 3 threads and with blocks of
    1 row, 256 KiB and one block of everything: the same values, bit for bit."""
    x = (np.random.default_rng(0).standard_normal((301, 700)) * 3).astype(np.float32)
    results = []
    for count, block_bytes in ((1, blocks.BLOCK_BYTES), (3, blocks.BLOCK_BYTES), (3, 1),
                               (1, 1 << 40)):
        threads(count)
        y, dydx = np.empty_like(x), np.empty_like(x)
        blocks.each_block(elementwise.gelu_erf, x, y, dydx, block_bytes=block_bytes)
        results.append((y, dydx))
    assert len(blocks.row_blocks(301, x[0].nbytes)) > 1
    for y, dydx in results[1:]:
        np.testing.assert_array_equal(y, results[0][0])
        np.testing.assert_array_equal(dydx, results[0][1])


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_kernels_give_the_same_bits_on_one_thread_and_on_two(threads, dtype):
    """Numba's GELU (float32) and LayerNorm with its residual add and skip gradient,
    forward and backward, over more rows than three blocks (the column sums are added
    block by block)."""
    rng = np.random.default_rng(0)
    rows = 3 * blocks.BLOCK_BYTES // (48 * np.dtype(dtype).itemsize) + 5
    x, r, dy, dskip = (rng.standard_normal((rows, 48)).astype(dtype) for _ in range(4))
    weight, bias = rng.standard_normal(48).astype(dtype), rng.standard_normal(48).astype(dtype)
    results = []
    for count in (1, 2):
        threads(count)
        s, xhat, rstd, y = cpu_numba_norm.layer_norm(x, r, weight, bias, 1e-6, keep=True)
        outputs = [s, y, *cpu_numba_norm.layer_norm_backward(dy, xhat, rstd, weight, dskip)]
        if dtype == np.float32:
            outputs += cpu_numba_gelu.gelu(x, bias, train=True)
        results.append(outputs)
    for one, two in zip(*results, strict=True):
        np.testing.assert_array_equal(one, two)


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
def test_tinyvit_numba_turns_the_compiled_kernels_off_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv(cpu_numba.ENVIRONMENT_VARIABLE, "0")
    cpu_numba.set_compiled(None)  # read again
    assert not cpu_numba.compiled()
    monkeypatch.setenv(cpu_numba.ENVIRONMENT_VARIABLE, "1")
    cpu_numba.set_compiled(None)
    assert cpu_numba.compiled()
    monkeypatch.setenv(cpu_numba.ENVIRONMENT_VARIABLE, "off")
    with pytest.raises(ValueError, match=r"TINYVIT_NUMBA: expected 1 \(compiled, where Numba is "
                                         r"installed\) or 0 \(the NumPy blocks\), got 'off'"):
        cpu_numba.set_compiled(None)
    assert cpu_numba.compiled()  # the reading it had
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")  # refused where it would not compile too
    with pytest.raises(ValueError, match="TINYVIT_NUMBA: .* got 'off'"):
        cpu_numba.set_compiled(None)


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
@pytest.mark.parametrize("user_features, decorated_first", [(None, False), ("-avx512f", False),
                                                            (None, True)])
def test_compiled_gelu_uses_512_bit_vectors_where_the_processor_has_avx512(
        tmp_path, user_features, decorated_first):
    """Compiled in a new process (nothing cached): zmm registers in the GELU's machine code
    exactly where the processor has AVX-512, when the user did not set NUMBA_CPU_FEATURES
    and no @njit came before tinyvit's first kernel; otherwise the features are left as
    they were (the user's -avx512f: no zmm; after another @njit, whatever LLVM's tuning
    for the processor prefers, 256-bit vectors on Intel's, 512-bit on AMD's Zen 4)."""
    import os
    import subprocess
    import sys
    script = ("import numpy as np, numba\n"
              + ("@numba.njit\ndef f(a):\n    return a\n" if decorated_first else "")
              + "from numba.core.codegen import get_host_cpu_features\n"
              "from tinyvit.fast import cpu_numba, cpu_numba_gelu\n"
              "cpu_numba_gelu.gelu(np.ones((4, 8), np.float32), None, train=False)\n"
              "kernel = cpu_numba.compile_for_block(cpu_numba_gelu._gelu)\n"
              "print('+avx512f' in get_host_cpu_features().split(','), "
              "'zmm' in kernel.inspect_asm(kernel.signatures[0]), numba.config.CPU_FEATURES)\n")
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    environment.pop("NUMBA_CPU_FEATURES", None)
    environment.pop("NUMBA_CPU_NAME", None)
    if user_features:
        environment["NUMBA_CPU_FEATURES"] = user_features
    run = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True,
                         text=True, check=True)
    avx512, zmm, features = run.stdout.split()
    if user_features:
        assert (zmm, features) == ("False", user_features)
    elif decorated_first:
        assert features == "None"
    else:
        assert zmm == avx512
        assert features.endswith(",-prefer-256-bit") is (avx512 == "True")


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
def test_numba_disable_jit_gives_the_numpy_blocks(monkeypatch):
    """With Numba's compiler off its functions run as Python, where the kernels'
    intrinsics cannot: the fast layers take the NumPy blocks, and set_compiled(True) says
    why it cannot. A value Numba ignores (not a whole number) changes nothing."""
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    cpu_numba.set_compiled(None)  # read again
    assert not cpu_numba.compiled()
    assert not cpu_numba_softmax.takes_block(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"set_compiled\(True\) needs Numba's compiler, which "
                                         r"NUMBA_DISABLE_JIT turns off \(it is '1'\)"):
        cpu_numba.set_compiled(True)
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "false")
    cpu_numba.set_compiled(None)
    assert cpu_numba.compiled()


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
def test_compiled_loops_refuse_arrays_of_another_shape_than_their_inputs():
    """The loops index without bounds checks: each wrapper names the array of a wrong
    shape before a loop could read or write past it."""
    f = np.float32
    x, a = np.ones((4, 8), f), np.ones((2, 3, 5, 5), f)
    calls = {
        "gelu: bias must have shape (8,)": lambda: cpu_numba_gelu.gelu(x, np.ones(9, f), True),
        "layer_norm: r must have shape (4, 8)":
            lambda: cpu_numba_norm.layer_norm(x, np.ones((4, 7), f), np.ones(8, f),
                                              np.ones(8, f), 1e-5, True),
        "layer_norm: weight must have shape (8,)":
            lambda: cpu_numba_norm.layer_norm(x, None, np.ones(16, f), np.ones(8, f), 1e-5,
                                              True),
        "layer_norm_backward: rstd must have shape (4, 1)":
            lambda: cpu_numba_norm.layer_norm_backward(x, x, np.ones((2, 1), f), np.ones(8, f),
                                                       None),
        "layer_norm_backward: dout must have shape (4, 8) (as its input's), got (4, 9)":
            lambda: cpu_numba_norm.layer_norm_backward(np.ones((4, 9), f), x, np.ones((4, 1), f),
                                                       np.ones(8, f), None),
        "layer_norm_backward: dskip must have shape (4, 8)":
            lambda: cpu_numba_norm.layer_norm_backward(x, x, np.ones((4, 1), f), np.ones(8, f),
                                                       np.ones((4, 9), f)),
        "softmax_backward_block: dA must have shape (2, 3, 5, 5)":
            lambda: cpu_numba_softmax.softmax_backward_block(a, np.ones((2, 3, 5, 4), f)),
    }
    for message, call in calls.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


@pytest.mark.parametrize("value", ["0", 1, 1.0])
def test_set_compiled_takes_true_false_or_none(value):
    with pytest.raises(ValueError, match=f"set_compiled: expected True, False or None, got "
                                         f"{re.escape(repr(value))}"):
        cpu_numba.set_compiled(value)


def test_fast_layernorm_refuses_a_wrong_last_axis_and_integers_on_either_route(route):
    norm = cpu.LayerNorm(64)
    with pytest.raises(ValueError, match=r"LayerNorm: expected last axis 64, got input of shape "
                                         r"\(5, 4000\)"):
        norm.forward(np.ones((5, 4000)))
    with pytest.raises(ValueError, match="LayerNorm: expected a float array, got dtype int64"):
        norm.forward(np.ones((5, 64), dtype=np.int64))


def test_float32_gelu_far_from_zero_is_x_or_0_with_slope_1_or_0(route):
    """Beyond |x| = 8, Phi(x) is 1 or 0 to float32 rounding: y = max(x, 0), y' = 1 or 0,
    up to magnitudes where x^2 overflows, and at infinity (no inf * 0 = nan)."""
    x = np.float32([9, 1e4, 1e9, 1e30, np.inf, -9, -1e4, -1e9, -1e30, -np.inf])
    gelu = cpu.GELU()
    y = gelu.forward(x)
    dydx = gelu.backward(np.ones_like(x))
    np.testing.assert_allclose(y, np.maximum(x, 0), rtol=1e-7, atol=1e-12)  # -9 Phi(-9) = -1e-18
    np.testing.assert_allclose(dydx, (x > 0).astype(np.float32), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, dout_shape", [((), ()), ((3, 0), (3, 0)), ((2, 0, 5), (2, 0, 5)),
                                               ((4, 5), (5,)), ((4, 5), (2, 4, 5))])
def test_fast_gelu_takes_the_shapes_the_reference_takes(route, dtype, shape, dout_shape):
    """A 0-d array, no rows or no features, and a dout that broadcasts against y, as the
    reference's backward does."""
    rng = np.random.default_rng(0)
    x, dout = (rng.standard_normal(s).astype(dtype) for s in (shape, dout_shape))
    fast_gelu, reference = cpu.GELU(), layers.GELU()
    pairs = ((fast_gelu.forward(x.copy()), reference.forward(x.copy())),
             (fast_gelu.backward(dout), reference.backward(dout)))
    for ours, theirs in pairs:
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        np.testing.assert_allclose(ours, theirs, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_fast_gelu_backward_takes_a_number_or_another_dtype_as_the_reference(route):
    """dout a Python number, or float64 on a float32 layer: the reference's dout * y',
    its dtype as NumPy promotes it."""
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    for dout in (2.0, np.full((4, 5), 0.5)):
        fast_gelu, reference = cpu.GELU(), layers.GELU()
        fast_gelu.forward(x), reference.forward(x)
        ours, theirs = fast_gelu.backward(dout), reference.backward(dout)
        assert ours.dtype == theirs.dtype
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_layernorm_of_one_feature_gives_beta_and_a_zero_gradient(route, dtype):
    """Over one feature x - mean(x) is 0, so y = beta and dx = 0 exactly: rstd = 1 /
    sqrt(eps) would magnify any rounding of dy gamma - mean(dy gamma) a thousandfold."""
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((70, 1)).astype(dtype) for _ in range(2))
    norm = cpu.LayerNorm(1, dtype=dtype)
    norm.weight.data[...], norm.bias.data[...] = 0.3, 0.25  # dy * 0.3 is rounded
    np.testing.assert_array_equal(norm.forward(x), np.full_like(x, 0.25))
    np.testing.assert_array_equal(norm.backward(dy), np.zeros_like(x))


def test_fast_layernorm_takes_a_read_only_input_as_the_reference(route):
    """A read-only x (a memory-mapped file's, say), with and without the residual add."""
    rng = np.random.default_rng(0)
    x, r = (rng.standard_normal((6, 8)).astype(np.float32) for _ in range(2))
    x.setflags(write=False)
    norm, reference = cpu.LayerNorm(8), layers.LayerNorm(8)
    np.testing.assert_allclose(norm.forward(x), reference.forward(x), rtol=1e-5, atol=1e-5)
    s, y = norm.forward_residual(x, r)
    np.testing.assert_array_equal(s, x + r)
    np.testing.assert_allclose(y, reference.forward(x + r), rtol=1e-5, atol=1e-5)


def test_fast_layernorm_backward_follows_its_forwards_route(route):
    """A big-endian or float16 x takes the NumPy blocks forward; the backward of its xhat
    does too, whatever dtype dout has, and gives the reference's gradient."""
    rng = np.random.default_rng(0)
    for dtype in (">f4", np.float16):
        x, dy = rng.standard_normal((2, 3, 8)).astype(dtype), rng.standard_normal((2, 3, 8))
        norm, reference = cpu.LayerNorm(8), layers.LayerNorm(8)
        norm.forward(x), reference.forward(x)
        dy = dy.astype(np.float32)
        np.testing.assert_allclose(norm.backward(dy), reference.backward(dy), rtol=1e-2,
                                   atol=1e-2)
        np.testing.assert_allclose(norm.weight.grad, reference.weight.grad, rtol=1e-2,
                                   atol=1e-2)


@pytest.mark.parametrize("x_dtype, layer_dtype", [(np.float32, np.float64),
                                                   (np.float64, np.float32)])
def test_fast_layernorm_promotes_mixed_dtypes_as_the_reference(route, x_dtype, layer_dtype):
    """An input of another float dtype than the parameters': y, dx and the parameters'
    gradients of the dtypes, and the values, the reference gives (NumPy's promotion)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8)).astype(x_dtype)
    norm, reference = cpu.LayerNorm(8, dtype=layer_dtype), layers.LayerNorm(8, dtype=layer_dtype)
    ours, theirs = norm.forward(x), reference.forward(x)
    assert ours.dtype == theirs.dtype == np.float64
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    dy = rng.standard_normal(ours.shape)
    ours, theirs = norm.backward(dy), reference.backward(dy)
    assert ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    for mine, its in ((norm.weight, reference.weight), (norm.bias, reference.bias)):
        assert mine.grad.dtype == its.grad.dtype == layer_dtype
        np.testing.assert_allclose(mine.grad, its.grad, rtol=1e-5, atol=1e-5)


def test_fast_gelu_adds_a_bias_as_numpy_broadcasts_it(route):
    """forward(u, b), as MLP calls it: a bias of another length is refused on both routes,
    one of shape (1, D) added as NumPy broadcasts it."""
    u = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="could not be broadcast"):
        cpu.GELU().forward(u.copy(), np.ones(7, np.float32))
    bias = np.linspace(-1, 1, 8, dtype=np.float32)[None]
    np.testing.assert_allclose(cpu.GELU().forward(u.copy(), bias), layers.GELU().forward(u + bias),
                               rtol=1e-6, atol=1e-6)


FIRST_KERNELS_AT_ONCE = """
import threading, time
import numpy as np
import numba  # the user's own code has imported Numba
from tinyvit.fast import cpu, cpu_numba
allow, entered = cpu_numba._allow_512_bit_vectors, []
def set_up_slowly_after_the_first(numba):  # the first set-up ends while the others are in it
    entered.append(numba)
    time.sleep(0.2 if len(entered) > 1 else 0)
    allow(numba)
cpu_numba._allow_512_bit_vectors = set_up_slowly_after_the_first
start, errors = threading.Barrier(4), []
def first_kernel(i):
    start.wait()
    try:
        (cpu.GELU() if i % 2 else cpu.LayerNorm(8)).forward(np.ones((4, 8), np.float32))
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=first_kernel, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


@pytest.mark.skipif(not cpu_numba.INSTALLED, reason="Numba is not installed")
def test_threads_whose_first_compiled_kernels_come_at_once_set_numba_up_once(tmp_path):
    """In a new process, four threads' first kernels at the same moment, Numba's set-up
    slowed for all but the first thread to enter it: none fails."""
    import os
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", FIRST_KERNELS_AT_ONCE], capture_output=True,
                         text=True, env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
                         check=True)
    assert run.stdout.strip() == "[]"


def test_set_compiled_true_without_numba_names_the_extra(monkeypatch):
    monkeypatch.setattr(cpu_numba, "INSTALLED", False)
    cpu_numba.set_compiled(None)  # read again
    assert not cpu_numba.compiled()
    with pytest.raises(ImportError,
                       match=r'set_compiled\(True\) needs Numba: pip install -e "\.\[numba\]"'):
        cpu_numba.set_compiled(True)


def test_the_kernels_read_their_variables_once_until_asked_again(monkeypatch):
    """Read at the first call, not on every one: a variable changed afterwards counts
    from ``check_environment()`` (the trainer's start) or ``set_...(None)`` on, and a bad
    value refused there leaves the kernels with the reading they had."""
    monkeypatch.setattr(mkl, "library_path", lambda: "/lib/libmkl_rt.so.2")
    monkeypatch.setattr(blocks, "available_cores", lambda: 8)  # 3 and 5 threads: no warning
    settings = [(blocks.ENVIRONMENT_VARIABLE, blocks.num_threads, "3", 3, "5", 5),
                (mkl.ENVIRONMENT_VARIABLE, mkl.enabled, "0", False, "1", True)]
    if cpu_numba.INSTALLED:
        settings.append((cpu_numba.ENVIRONMENT_VARIABLE, cpu_numba.compiled, "0", False, "1", True))
    monkeypatch.delenv("NUMBA_DISABLE_JIT", raising=False)
    for variable, setting, first, read_first, then, read_then in settings:
        monkeypatch.setenv(variable, first)
        fast.check_environment()
        assert setting() == read_first, variable
        monkeypatch.setenv(variable, then)
        assert setting() == read_first, variable
        fast.check_environment()
        assert setting() == read_then, variable
        monkeypatch.setenv(variable, "maybe")  # refused: the reading kept stays
        with pytest.raises(ValueError, match=f"{variable}: expected .* got 'maybe'"):
            fast.check_environment()
        assert setting() == read_then, variable
        monkeypatch.setenv(variable, then)
    monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, "maybe")
    with pytest.raises(ValueError, match="TINYVIT_NUM_THREADS: expected .* got 'maybe'"):
        blocks.set_num_threads(None)
    assert blocks.num_threads() == 5


def test_check_environment_refuses_a_bad_variable_that_a_choice_in_code_overrides(
        monkeypatch, threads):
    """A bad value is refused when read, whatever the code chose for now, and named as
    it was written; an empty one is unset, for all three variables."""
    threads(2)
    for variable in (blocks.ENVIRONMENT_VARIABLE, cpu_numba.ENVIRONMENT_VARIABLE,
                     mkl.ENVIRONMENT_VARIABLE):
        monkeypatch.setenv(variable, " maybe ")
        with pytest.raises(ValueError, match=f"{variable}: expected .* got ' maybe '$"):
            fast.check_environment()
        if variable == blocks.ENVIRONMENT_VARIABLE:  # refused before the choice is undone
            with pytest.raises(ValueError, match=f"{variable}: expected .* got ' maybe '$"):
                threads(None)
        monkeypatch.setenv(variable, " ")
        fast.check_environment()
    assert blocks.num_threads() == 2
    threads(None)
    assert blocks.num_threads() == blocks.available_cores()


def test_threads_follow_set_num_threads_then_the_environment_then_the_cores(threads, monkeypatch):
    monkeypatch.setattr(blocks, "available_cores", lambda: 8)  # 3 threads: no warning
    monkeypatch.delenv(blocks.ENVIRONMENT_VARIABLE, raising=False)
    threads(None)  # read again
    assert blocks.num_threads() == blocks.available_cores()
    monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, "3")
    threads(None)
    assert blocks.num_threads() == 3
    threads(1)
    assert blocks.num_threads() == 1
    threads(None)
    assert blocks.num_threads() == 3
    for bad in ("0", "two", "1.5"):
        monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"TINYVIT_NUM_THREADS: expected a whole number "
                                             f"of threads >= 1, got '{bad}'"):
            threads(None)
    with pytest.raises(ValueError, match="set_num_threads: .* got 0"):
        threads(0)


def test_more_threads_than_cores_in_the_environment_is_a_warning(threads, monkeypatch):
    """Accepted (the threads take turns on the cores), with a RuntimeWarning that says
    so; as many threads as cores, or fewer, or a count chosen in code, are silent."""
    cores = blocks.available_cores()
    monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, str(cores + 1))
    with pytest.warns(RuntimeWarning) as caught:
        threads(None)
    assert [str(w.message) for w in caught] == [
        f"TINYVIT_NUM_THREADS={cores + 1} is more than the {cores} CPU cores this process may "
        f"run on: the threads take turns on them, and each kernel is slower than on {cores}"]
    assert blocks.num_threads() == cores + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads(cores + 1)
        monkeypatch.setenv(blocks.ENVIRONMENT_VARIABLE, str(cores))
        threads(None)
    assert blocks.num_threads() == cores


def test_each_block_refuses_arrays_of_different_lengths():
    with pytest.raises(ValueError, match=r"every array needs 3 rows, as the first; "
                                         r"got shapes \[\(3, 2\), \(4,\)\]"):
        blocks.each_block(lambda a, b: None, np.zeros((3, 2)), np.zeros(4))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_runs_its_own_blocks(threads):
    """After the pool has run, a forked child (as multiprocessing's fork start method
    makes) computes with a pool of its own instead of waiting for the parent's threads."""
    import os
    threads(2)
    x = np.arange(1 << 18, dtype=np.float64)
    blocks.each_block(lambda a: a.sum(), x, block_bytes=1 << 12)  # the parent's pool, started
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 if its sums are right
        sums = blocks.each_block(lambda a: float(a.sum()), x, block_bytes=1 << 12)
        os._exit(0 if sum(sums) == float(x.sum()) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


SPIN_PROBE = """
import numpy as np
from tinyvit.fast import blocks, openblas
a = np.random.default_rng(0).standard_normal((300, 300))
before = a @ a
blocks.set_num_threads(2)
blocks.each_block(lambda rows: None, a)  # the pool starts
print(len(openblas.loaded_openblas()), [openblas.thread_timeout(p) for p in
      openblas.loaded_openblas()], bool((a @ a == before).all()))
"""


@pytest.mark.parametrize("users_setting, expected", [(None, 20), ("25", 25)])
def test_the_pool_shortens_openblas_idle_spin_unless_the_user_set_it(users_setting, expected):
    """When the blocks' pool starts, each loaded OpenBLAS restarts its threads with a
    spin of 2^20 cycles (the user's OPENBLAS_THREAD_TIMEOUT wins), and its products
    after the restart are the same bits. In a child process: it changes the process."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if users_setting is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = users_setting
    out = subprocess.run([sys.executable, "-c", SPIN_PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout.split(maxsplit=1)
    if out[0] == "0":
        pytest.skip("NumPy here does not use OpenBLAS")
    assert out[1].strip() == f"{[expected] * int(out[0])} True"


# --------------------------------------------------------------------------- dropout on the CPU


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cpu_dropout_draws_the_reference_mask(dtype):
    """The CPU kernel draws from the generator as the reference does: from the same seed,
    the same outputs and gradients, in dropout's own layer and attention's."""
    layer = layers.Dropout(0.3)
    x, dout = randn(7, 301).astype(dtype), randn(7, 301, seed=1).astype(dtype)
    results = []
    for kernel in (layer, fast.accelerate(layers.Dropout(0.3))):
        layers.seed_dropouts([kernel], 0)
        kernel.forward(x)
        results.append((kernel.forward(x), kernel.backward(dout)))
    (y, dx), (y_fast, dx_fast) = results
    np.testing.assert_array_equal(y_fast, y)
    np.testing.assert_array_equal(dx_fast, dx)
    assert 0.6 < (y != 0).mean() < 0.8


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cls", [layers.Attention, layers.ClassAttention])
def test_cpu_attention_with_dropout_equals_reference(cls, dtype):
    def make():
        layer = jitter(cls(8, 2, attn_dropout=0.25, rng=B.host_rng(0))).astype(dtype)
        layers.seed_dropouts([layer.attn_drop], 3)
        return layer
    x, dout = randn(3, 9, 8).astype(dtype), randn(3, 9, 8, seed=1).astype(dtype)
    dout = dout[:, :1] if cls is layers.ClassAttention else dout
    for ours, theirs in zip(run(fast.accelerate(make()), x, dout), run(make(), x, dout)):
        assert rel_err(ours, theirs) <= TOLERANCE[dtype]


@pytest.mark.parametrize("keep", [False, True])
def test_cpu_attention_in_eval_equals_reference_with_or_without_its_maps(keep):
    """In eval without the maps kept, each block of images has its weights in an array of
    its own (none of the batch's is written): 16 images of 65 tokens are 3 blocks."""
    made = [jitter(layers.Attention(16, 2, rng=B.host_rng(0))) for _ in range(2)]
    ours, theirs = fast.accelerate(made[0]), made[1]
    for layer in (ours, theirs):
        layer.eval()
        layer.keep_attn = keep
    x = randn(16, 65, 16)
    assert rel_err(ours.forward(x), theirs.forward(x)) <= TOLERANCE[np.float64]
    if keep:
        assert rel_err(ours.attn, theirs.attn) <= TOLERANCE[np.float64]
    else:
        assert ours.attn is None and ours.cache is None


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_cpu_attention_output_merges_its_heads_without_a_copy(dropout):
    """Without attention dropout A v is written in the layout of the heads side by side,
    so merge_heads is a view of it; with dropout, Ad v is a new array and merge_heads
    copies it."""
    layer = fast.accelerate(layers.Attention(8, 2, attn_dropout=dropout, rng=B.host_rng(0)))
    q, k, v = layers.split_heads(layer.qkv.forward(randn(3, 9, 8).astype(np.float32)), 2)
    contexts = []
    for attend in (layer.attend, functools.partial(layers.Attention.attend, layer)):
        layers.seed_dropouts([layer.attn_drop], 3)
        contexts.append(attend(q, k, v))  # (B, NH, N, Dh)
    ctx, reference = contexts
    assert rel_err(ctx, reference) <= TOLERANCE[np.float32]
    assert np.shares_memory(layers.merge_heads(ctx), ctx) is (dropout == 0.0)


@pytest.mark.parametrize("spread", [10.0, 1000.0])
def test_one_max_softmax_equals_the_row_max_softmax(spread):
    """Scores within 80 of the global max take one shift; a wider spread falls back
    to the row max (a row far below the global max would otherwise underflow)."""
    scores = np.random.default_rng(0).standard_normal((2, 3, 5, 7))
    scores[0, 0] -= spread
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    ours = elementwise.softmax_inplace(scores.copy())
    np.testing.assert_allclose(ours, expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("extremes", [False, True], ids=["one shift", "row shifts"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_block_is_the_formula_on_either_route(route, dtype, extremes):
    """softmax(S) into S: compiled (Numba) for contiguous float32 blocks, in NumPy for
    float64 and for a strided block, each within rounding of the float64 formula. With
    extremes (so a shift per row): a row spread over 1000, where exp underflows (to
    exp(-87) compiled), -inf, which gives 0 (1e-38 compiled), and a nan, whose row stays
    nan."""
    rng = np.random.default_rng(0)
    scores = 4 * rng.standard_normal((3, 2, 5, 9))
    if extremes:
        scores[0, 0, 0] *= 250
        scores[1, 1, 2, 3] = -np.inf
        scores[2, 0, 4, 5] = np.nan
    with np.errstate(invalid="ignore"):
        expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    strided = np.zeros((3, 2, 5, 18), dtype=dtype)[..., ::2]
    for out in (scores.astype(dtype), strided):
        np.copyto(out, scores)
        compiled = route and dtype == np.float32 and out is not strided
        assert (cpu_numba_softmax.takes_block(out) and out.dtype == np.float32) is compiled
        with np.errstate(invalid="ignore"):
            result = cpu_numba_softmax.softmax_block(out)
        assert result is out and out.dtype == dtype
        assert np.isnan(out[2, 0, 4]).all() == extremes and not np.isnan(out[:2]).any()
        assert not extremes or 0 <= out[1, 1, 2, 3] <= (2e-38 if compiled else 0)
        np.testing.assert_allclose(out, expected, rtol=0, atol={np.float32: 1e-6,
                                                                np.float64: 1e-15}[dtype])


@pytest.mark.parametrize("scale", [1.0, 0.125])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_backward_block_is_the_formula_on_either_route(route, dtype, scale):
    """dS = scale A (dA - sum_j dA_j A_j) into dA: compiled (Numba) for contiguous float
    blocks, in NumPy for a strided one, each within rounding of the float64 formula."""
    rng = np.random.default_rng(0)
    A = elementwise.softmax_inplace(rng.standard_normal((3, 2, 5, 9)))
    dA = rng.standard_normal(A.shape)
    expected = scale * A * (dA - (dA * A).sum(-1, keepdims=True))
    tolerance = {np.float32: 1e-6, np.float64: 1e-15}[dtype]
    strided = np.zeros((3, 2, 5, 18), dtype=dtype)[..., ::2]
    for out in (dA.astype(dtype), strided):
        np.copyto(out, dA)
        assert cpu_numba_softmax.takes_block(A.astype(dtype), out) is (route and out is not strided)
        result = cpu_numba_softmax.softmax_backward_block(A.astype(dtype), out, scale)
        assert result is out and out.dtype == dtype
        np.testing.assert_allclose(out, expected, rtol=0, atol=tolerance)


# (in channels, kernel, stride, padding, input H x W) -> channels-last (C >= Wo)?
CONV_LAYOUTS = {
    (3, 3, 2, 1, (9, 8)): False,  # Wo 4
    (5, 3, 2, 1, (9, 8)): True,
    (8, 3, 1, 1, (9, 7)): True,  # Wo 7, overlapping windows
    (6, (3, 2), (2, 1), (1, 0), (9, 5)): True,  # Wo 4
    (2, 1, 1, 0, (5, 3)): False,  # Wo 3
}


@pytest.mark.parametrize("standardize", [False, True])
@pytest.mark.parametrize("case", CONV_LAYOUTS, ids=str)
def test_conv_in_either_layout_and_blocks_of_one_image_equals_the_reference(case, standardize):
    """Each layout, with blocks of columns small enough for one image each: every
    image is formed, multiplied and back-propagated once (float64, 1e-12)."""
    channels, kernel, stride, padding, size = case
    layer = (channels, 4, kernel, stride, padding)
    options = dict(weight_standardization=standardize, dtype=np.float64)
    reference = jitter(conv.Conv2d(*layer, rng=B.host_rng(0), **options))
    kernel = jitter(cpu_conv.Conv2d(*layer, rng=B.host_rng(0), **options))
    kernel.block_bytes = 1
    x = np.random.default_rng(0).standard_normal((4, channels, *size))
    assert kernel.channels_last(x) == CONV_LAYOUTS[case]
    assert len(kernel.image_blocks(4, 8)) == 4
    dout = np.random.default_rng(1).standard_normal(reference.forward(x).shape)
    for ours, theirs in zip(run(kernel, x, dout), run(reference, x, dout), strict=True):
        assert rel_err(ours, theirs) <= 1e-12


# --------------------------------------------------------------------------- accelerate


def test_a_layer_is_what_its_class_says(backend):
    layer = layers.Attention(8, 2, rng=B.host_rng(0))
    assert type(layer) is layers.Attention and layer.tier == "reference"
    assert repr(layer.qkv) == "Linear(216 parameters; reference tinyvit.nn.layers.Linear)"


@pytest.mark.parametrize("fields", [{}, {"pool": "mean", "stem": ((4, 3, 2),), "patch_size": 1}])
def test_accelerate_swaps_the_layers_and_computes_the_same(backend, fields):
    """The class of every layer with a kernel changes, nothing else: the same
    Parameter objects, the same names, the same logits and gradients (1e-12)."""
    config = {**dict(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8,
                     depth=2, num_heads=2), **fields}
    reference = jitter(tinyvit.ViT(**config))
    model = jitter(tinyvit.ViT(**config))
    parameters = dict(model.named_parameters())
    assert fast.accelerate(model) is model
    assert dict(model.named_parameters()) == parameters  # the same objects
    kernels = fast.kernels()
    for (name, ours), (_, theirs) in zip(model.named_modules(), reference.named_modules()):
        assert type(ours) is kernels.get(type(theirs), type(theirs)), name
        assert ours.tier == ("fast" if type(theirs) in kernels else "reference"), name
    assert "fast kernels of tinyvit.fast." in model.describe_tier()
    assert reference.describe_tier() == "reference layers (tinyvit.nn)"
    assert "fast tinyvit.fast." in repr(model.head)
    x = randn(2, 2, 8, 8)
    dlogits = randn(2, 3, seed=1)
    for ours, theirs in zip(run(model, x, dlogits), run(reference, x, dlogits), strict=True):
        assert rel_err(ours, theirs) <= 1e-12



@pytest.mark.parametrize("part, named", [([layers.GELU()], "list"), (None, "NoneType"),
                                         (layers.GELU, "the class GELU")])
def test_accelerate_refuses_what_is_not_a_module_or_an_optimizer(part, named):
    with pytest.raises(TypeError, match=f"^accelerate: expected a built model, layer or loss "
                                        f"\\(a Module\\) or an optimizer, got {named}$"):
        fast.accelerate(part)


def test_fast_gelu_leaves_its_input_as_it_was_on_either_route(route):
    """``forward(u, bias)`` adds the bias into blocks of its own, not into u (which may be
    read-only, or the caller's to keep)."""
    for dtype in (np.float32, np.float64):
        u = np.linspace(-3, 3, 64, dtype=dtype).reshape(8, 8)
        u.flags.writeable = False
        bias = np.full(8, 0.5, dtype)
        y = cpu.GELU().forward(u, bias)
        np.testing.assert_array_equal(u, np.linspace(-3, 3, 64, dtype=dtype).reshape(8, 8))
        np.testing.assert_allclose(y, layers.GELU().forward(u + bias), rtol=1e-5, atol=1e-6)


def test_for_tier_gives_accelerate_or_the_part_as_built():
    assert fast.for_tier("fast") is fast.accelerate
    part = layers.GELU()
    assert fast.for_tier("reference")(part) is part and type(part) is layers.GELU
    with pytest.raises(ValueError, match="tier must be 'fast' or 'reference', got 'quick'"):
        fast.for_tier("quick")
