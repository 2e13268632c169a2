"""tinyvit's fast CPU kernels op by op against the same op in PyTorch eager, interleaved.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/ops.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/ops.py --rounds 5 --batch 64

Each row is one op on float32 arrays of a batch of 128 images of 65 tokens (config C of
benchmark.py: M = 8320 rows, D = 192, the MLP 384 wide, 3 heads of 64; the attention rows
with 4 heads of 32 over 65 tokens, 512 (image, head) products of 65 x 32 by 32 x 65), or one
fast kernel's forward and backward against the same layer of ``tests/torch_reference.py``.
The two run in turns, round after round, and the table
gives each one's median, their ratio (tinyvit's time over PyTorch's), the bytes the op must
move at least (each input read and each output written once) and the fraction of the
measured memory bandwidth that makes, or for a product the fraction of the measured float32
GEMM throughput. The bandwidth is the best of a large add (three arrays of 64 MiB) by
NumPy on every core through ``tinyvit.fast.blocks`` and by PyTorch; the GEMM throughput is
the best 2048 x 2048 product of either. Rows marked "before" time the code of the whole
arrays, one NumPy operation after another, that the kernels replaced; two rows time the
reference tier's layer; rows "by NumPy's BLAS" time a Linear's product as NumPy does it,
where the fast Linear's goes to MKL (``tinyvit/fast/mkl.py``), and the row "in NumPy
blocks" the softmax as the blocks compute it, where the fast one is compiled
(``tinyvit/fast/cpu_numba_*.py``; otherwise it times the row above's code again). GELU's
training forward computes y and y' where PyTorch's computes y alone; its row "forward +
backward" times the work a training step does.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # torch_reference.py

from machine import check_kernel_settings, machine_report, print_machine, setup_backends, torch  # noqa: E402
from tinyvit.fast import (  # noqa: E402
    accelerate,
    blocks,
    cpu,
    cpu_attention,
    cpu_numba_softmax,
    elementwise,
)
from tinyvit.nn import layers  # noqa: E402

MiB = 1 << 20


def median_ms(fn, repeats):
    """The median of ``repeats`` timed calls of fn, after one untimed; ``fn.setup()``,
    where fn has one (``in_place``), runs before each call, outside the timer."""
    setup = getattr(fn, "setup", lambda: None)
    setup()
    fn()
    times = []
    for _ in range(repeats):
        setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def in_place(setup, fn):
    """fn, which overwrites its input, with the ``setup`` that restores it."""
    fn.setup = setup
    return fn


def bandwidth_and_gemm(repeats):
    """(bytes/s, FLOP/s): the best of NumPy in blocks over the cores and of PyTorch."""
    a, b = (np.random.default_rng(i).standard_normal(16 * MiB, dtype=np.float32) for i in (0, 1))
    c = np.empty_like(a)
    ta, tb, tc = (torch.from_numpy(v) for v in (a, b, c))
    best_add = min(median_ms(lambda: blocks.each_block(lambda a, b, c: np.add(a, b, out=c),
                                                       a, b, c), repeats),
                   median_ms(lambda: torch.add(ta, tb, out=tc), repeats))
    m = np.random.default_rng(2).standard_normal((2048, 2048), dtype=np.float32)
    tm = torch.from_numpy(m)
    best_gemm = min(median_ms(lambda: m @ m, repeats), median_ms(lambda: tm @ tm, repeats))
    return 3 * a.nbytes / (best_add / 1e3), 2 * 2048**3 / (best_gemm / 1e3)


def ops(batch):
    """(name, tinyvit's call, PyTorch's call, bytes moved, matmul FLOPs) of every op."""
    F = torch.nn.functional
    rng = np.random.default_rng(0)

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    M, D, Dm = batch * 65, 192, 384
    x, r, u, dy = randn(M, D), randn(M, D), randn(M, Dm), randn(M, Dm)
    bias = randn(Dm)
    tx, tr, tu, tdy, tbias = (torch.from_numpy(v) for v in (x, r, u, dy, bias))
    size = 4 * M * Dm  # bytes of one (M, Dm) array
    table = []

    gelu, torch_gelu = cpu.GELU(), torch.nn.GELU()
    gelu_reference = layers.GELU()

    def gelu_train():
        gelu.train().forward(u)
        gelu.cache = None

    table += [
        ("GELU forward, eval (M x Dm)", lambda: gelu.eval().forward(u), lambda: F.gelu(tu),
         2 * size, 0),
        ("  the reference tier's GELU", lambda: gelu_reference.eval().forward(u),
         lambda: F.gelu(tu), 2 * size, 0),
        ("GELU forward, training: y and y'", gelu_train,
         lambda: F.gelu(tu), 3 * size, 0),
        ("GELU backward", gelu_backward(gelu, u, dy),
         lambda: torch.ops.aten.gelu_backward(tdy, tu), 3 * size, 0),
        ("GELU forward + backward, training", lambda: gelu_round_trip(gelu, u, dy),
         lambda: torch_round_trip(torch_gelu, tu, tdy), 5 * size, 0),
        ("bias + GELU forward, eval", bias_gelu(gelu, u, bias),
         lambda: F.gelu(tu + tbias), 2 * size, 0),
    ]
    norm, norm_reference = cpu.LayerNorm(D), layers.LayerNorm(D)
    tnorm = torch.nn.LayerNorm(D, eps=1e-6)
    nsize = 4 * M * D
    table += [
        ("LayerNorm forward, eval (M x D)", lambda: norm.eval().forward(x), lambda: tnorm(tx),
         2 * nsize, 0),
        ("  the reference tier's LayerNorm", lambda: norm_reference.eval().forward(x),
         lambda: tnorm(tx), 2 * nsize, 0),
        ("LayerNorm backward", norm_backward(norm, x, r), torch_norm_backward(tnorm, tx, tr),
         3 * nsize, 0),
        ("LayerNorm forward + backward", lambda: norm_round_trip(norm, x, r),
         lambda: torch_round_trip(tnorm, tx, tr), 5 * nsize, 0),
        ("residual add + LayerNorm, eval", lambda: norm.eval().forward_residual(x, r),
         lambda: tnorm(tx + tr), 4 * nsize, 0),
    ]
    B, NH, N, Dh = batch, 4, 65, 32
    q, k, v = randn(B, NH, N, Dh), randn(B, NH, N, Dh), randn(B, NH, N, Dh)
    scores, dA = randn(B, NH, N, N), randn(B, NH, N, N)
    A = elementwise.softmax_inplace(scores.copy())
    tq, tk, tv, ts, tA, tdA = (torch.from_numpy(a) for a in (q, k, v, scores, A, dA))
    ssize, scale = scores.nbytes, Dh**-0.5
    table += [
        ("softmax(scale * S) (B x NH x N x N)", lambda: scaled_softmax(scores, scale),
         lambda: torch.softmax(ts * scale, -1), 2 * ssize, 0),
        ("  in NumPy blocks", lambda: scaled_softmax(scores, scale, elementwise.softmax_inplace),
         lambda: torch.softmax(ts * scale, -1), 2 * ssize, 0),
        ("  before: one pass per step", lambda: scaled_softmax_before(scores, scale),
         lambda: torch.softmax(ts * scale, -1), 2 * ssize, 0),
        ("softmax backward, in place", softmax_backward(A, dA),
         lambda: torch._softmax_backward_data(tdA, tA, -1, torch.float32), 3 * ssize, 0),
    ]
    attention = cpu.Attention(NH * Dh, NH, rng=np.random.default_rng(0))
    products = 2 * B * NH * N * N * Dh
    table += [
        (f"q k^T: {B * NH} products (B x NH)", lambda: blocked_scores(q, k),
         lambda: tq @ tk.transpose(-2, -1), q.nbytes + k.nbytes + ssize, products),
        ("  before: one batched matmul", lambda: q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2)),
         lambda: tq @ tk.transpose(-2, -1), q.nbytes + k.nbytes + ssize, products),
        ("attention core forward", lambda: attention_forward(attention, q, k, v),
         lambda: torch_attention(tq, tk, tv, scale), 4 * q.nbytes + ssize, 2 * products),
        ("  before: whole arrays", lambda: attention_before(q, k, v, scale),
         lambda: torch_attention(tq, tk, tv, scale), 4 * q.nbytes + ssize, 2 * products),
        ("attention core forward + backward", lambda: attention_round_trip(attention, q, k, v),
         lambda: torch_attention_round_trip(tq, tk, tv, scale), 10 * q.nbytes + 3 * ssize,
         6 * products),
    ]
    drop = cpu.Dropout(0.1, rng=np.random.default_rng(0))
    keep = torch.rand(M, Dm) >= 0.1
    table += [("dropout p=0.1 forward, training (M x Dm)", lambda: drop.forward(u),
               lambda: F.dropout(tu, 0.1, training=True), 3 * size, 0),
              ("dropout p=0.1 backward", in_place(lambda: drop.forward(u),
                                                  lambda: drop.backward(dy)),
               lambda: torch.ops.aten.native_dropout_backward(tdy, keep, 1 / 0.9), 3 * size, 0),
              ("bias gradient: dy summed over rows", lambda: cpu.Linear.column_sum(dy),
               lambda: tdy.sum(0), size, 0)]
    table += adamw_rows()
    table += linear_rows(x, dy)
    return table + layer_rows(randn(batch, 65, D), randn(batch, 65, D))


def linear_rows(x, dy):
    """A Linear's three products, (M, D) to (M, Dm), by the fast Linear's route (MKL or
    NumPy's BLAS: ``mkl.enabled()``) and by NumPy's, against PyTorch's nn.Linear's."""
    (M, D), Dm = x.shape, dy.shape[1]
    W = np.random.default_rng(1).standard_normal((Dm, D), dtype=np.float32)
    tx, tdy, tW = (torch.from_numpy(a) for a in (x, dy, W))
    flops, moved = 2 * M * D * Dm, x.nbytes + W.nbytes + dy.nbytes
    rows = []
    for name, product, a, b, theirs in (
            ("Linear forward (M x D) (D x Dm)", "x W^T", x, W.T,
             lambda: torch.nn.functional.linear(tx, tW)),
            ("Linear backward", "dW = dy^T x", dy.T, x, lambda: torch.mm(tdy.t(), tx)),
            ("Linear backward", "dx = dy W", dy, W, lambda: torch.mm(tdy, tW))):
        rows += [(f"{name}, {product}", lambda a=a, b=b: cpu.product(a, b), theirs, moved, flops),
                 (f"  {product} by NumPy's BLAS", lambda a=a, b=b: a @ b, theirs, moved, flops)]
    return rows


def layer_rows(x, dy):
    """Forward + backward of the fast kernels of config C's encoder block against the same
    layers of tests/torch_reference.py (the FLOPs are their matmuls')."""
    from torch_reference import TorchAttention, TorchBlock, TorchMlp

    B, N, D = x.shape
    rng = np.random.default_rng(0)
    fast = {"MLP": accelerate(layers.MLP(D, 2 * D, rng=rng)),
            "Attention": accelerate(layers.Attention(D, 3, rng=rng)),
            "Block": accelerate(layers.Block(D, 3, 2.0, rng=rng))}
    theirs = {"MLP": TorchMlp(D, 2 * D), "Attention": TorchAttention(D, 3, True),
              "Block": TorchBlock(D, 3, 2.0, True)}
    M = B * N
    mlp, attention = 2 * 2 * M * D * 2 * D, 2 * M * D * 4 * D + 2 * 2 * B * N * N * D
    flops = {"MLP": 3 * mlp, "Attention": 3 * attention, "Block": 3 * (mlp + attention)}
    tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
    return [(f"{name} forward + backward (fast kernel)",
             lambda layer=layer: round_trip(layer, x, dy),
             lambda name=name: torch_round_trip(theirs[name], tx, tdy), 0, flops[name])
            for name, layer in fast.items()]


def round_trip(layer, x, dy):
    layer.zero_grad()
    layer.forward(x)
    layer.backward(dy)


def bias_gelu(gelu, u, bias):
    """fc1's bias added inside GELU (eval) on a copy of u, refreshed untimed: the
    blocks add it in place."""
    work = np.empty_like(u)
    return in_place(lambda: np.copyto(work, u), lambda: gelu.eval().forward(work, bias))


def gelu_backward(gelu, u, dy):
    """GELU's backward on a copy of u's derivative, refreshed untimed: it scales its
    cache in place."""
    y, derivative = np.empty_like(u), np.empty_like(u)
    blocks.each_block(elementwise.gelu_erf, u, y, derivative)
    cache = np.empty_like(u)

    def setup():
        np.copyto(cache, derivative)
        gelu.train().cache = cache

    return in_place(setup, lambda: gelu.backward(dy))


def gelu_round_trip(gelu, u, dy):
    gelu.train().forward(u)
    gelu.backward(dy)


def norm_backward(norm, x, dy):
    """LayerNorm's backward after a training forward, run untimed before each call (the
    backward takes the forward's cache)."""
    return in_place(lambda: norm.train().forward(x), lambda: norm.backward(dy))


def torch_norm_backward(module, x, dy):
    """PyTorch's LayerNorm backward alone, from its forward's mean and 1/std."""
    D = x.shape[-1]
    _, mean, rstd = torch.native_layer_norm(x, [D], module.weight, module.bias, module.eps)
    return lambda: torch.ops.aten.native_layer_norm_backward(
        dy, x, [D], mean, rstd, module.weight, module.bias, [True, True, True])


def norm_round_trip(norm, x, dy):
    norm.train()
    norm.forward(x)
    norm.backward(dy)


def torch_round_trip(module, x, dy):
    x = x.detach().requires_grad_()
    module(x).backward(dy)


def scaled_softmax(scores, scale, softmax=cpu_numba_softmax.softmax_block):
    out = np.empty_like(scores)

    def block(s, out):
        np.multiply(s, scale, out=out)
        softmax(out)

    blocks.each_block(block, scores, out)
    return out


def scaled_softmax_before(scores, scale):
    s = scores * scale
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def softmax_backward(A, dA):
    """The attention backward's softmax step on a copy of dA, refreshed untimed."""
    dS = np.empty_like(dA)
    return in_place(lambda: np.copyto(dS, dA),
                    lambda: blocks.each_block(cpu_numba_softmax.softmax_backward_block, A, dS,
                                              block_bytes=cpu_attention.ATTENTION_BLOCK_BYTES))


def blocked_scores(q, k):
    S = np.empty((*q.shape[:3], k.shape[2]), dtype=q.dtype)

    def block(q, k, S):
        np.matmul(q, np.ascontiguousarray(k.transpose(0, 1, 3, 2)), out=S)

    blocks.each_block(block, q, k, S, block_bytes=cpu_attention.ATTENTION_BLOCK_BYTES)
    return S


def attention_forward(attention, q, k, v):
    attention.eval()
    return attention.attend(q, k, v)


def attention_round_trip(attention, q, k, v):
    attention.train()
    ctx = attention.attend(q, k, v)
    B, NH, N, Dh = q.shape
    dq, dk, dv = np.empty((3, B, NH, N, Dh), dtype=q.dtype)
    attention.attend_backward_into(attention._take_cache(), ctx, dq, dk, dv)


def attention_before(q, k, v, scale):
    S = (q * scale) @ np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    return scaled_softmax_before(S, 1.0) @ v


def torch_attention(q, k, v, scale):
    return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v


def torch_attention_round_trip(q, k, v, scale):
    q, k, v = (a.detach().requires_grad_() for a in (q, k, v))
    ctx = torch_attention(q, k, v, scale)
    ctx.backward(ctx.detach())


def adamw_rows(count=2_700_000):
    """AdamW's update of ``count`` parameters (config C has 2.7 M), in one flat buffer."""
    from tinyvit.nn.module import Module, Parameter

    class Flat(Module):
        def __init__(self):
            super().__init__()
            self.w = Parameter(np.zeros(count, dtype=np.float32), decay=True)

    model = Flat()
    optimizer = cpu.AdamW(model, lr=1e-3, weight_decay=0.05)
    optimizer.grad[...] = np.random.default_rng(3).standard_normal(count, dtype=np.float32)
    optimizer.advance()
    p = torch.zeros(count, requires_grad=True)
    p.grad = torch.from_numpy(optimizer.grad.copy())
    torch_optimizer = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.05)
    # reads p, g, decay, m, v and writes p, m, v
    return [("AdamW update (2.7 M parameters)", optimizer.update, torch_optimizer.step,
             8 * 4 * count, 0)]


def run(rounds, repeats, batch):
    table = ops(batch)
    times = {name: ([], []) for name, *_ in table}
    assert len(times) == len(table), "each row's name is its key: no two alike"
    for _ in range(rounds):
        for name, ours, theirs, _, _ in table:
            times[name][0].append(median_ms(ours, repeats))
            times[name][1].append(median_ms(theirs, repeats))
    return table, {name: tuple(statistics.median(t) for t in pair)
                   for name, pair in times.items()}


def print_table(table, medians, bandwidth, gemm):
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s, float32 GEMM {gemm / 1e9:.0f} GFLOP/s "
          "(the best of NumPy's and PyTorch's)")
    print("| op, float32 | tinyvit ms | PyTorch ms | ratio | MB moved | tinyvit's share of "
          "bandwidth (GEMM) | PyTorch's |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _, moved, flops in table:
        ours, theirs = medians[name]

        def share(ms):
            if flops:
                return f"{flops / (ms / 1e3) / gemm:.0%} GEMM"
            return f"{moved / (ms / 1e3) / bandwidth:.0%}"

        print(f"| {name} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x | "
              f"{moved / 1e6:.0f} | {share(ours)} | {share(theirs)} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (with 3, a row under "
                   "a millisecond moved by half its value between runs: docs/performance.md)")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per turn (median)")
    p.add_argument("--batch", type=int, default=128, help="images of 65 tokens")
    args = p.parse_args(argv)
    check_kernel_settings(p)
    for name in ("rounds", "repeats", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if torch is None:
        sys.exit("benchmarks/ops.py compares with PyTorch: pip install torch")
    setup_backends(gpu=False)
    print_machine(machine_report(gpu=False))
    bandwidth, gemm = bandwidth_and_gemm(args.repeats)
    table, medians = run(args.rounds, args.repeats, args.batch)
    print_table(table, medians, bandwidth, gemm)


if __name__ == "__main__":
    main()
