"""Does a compiled route earn its place? The fast tier's float32 GELU and LayerNorm forward
in NumPy blocks, written for numexpr, and compiled by Numba (tinyvit's own
``tinyvit/fast/cpu_numba_*.py``), against PyTorch, interleaved on the same arrays.

    pip install numexpr numba
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/compiled.py

Each route computes the formulas of ``tinyvit/fast/elementwise.py`` (GELU by its erfc
polynomial, LayerNorm from each row's mean and variance), on every core, and must agree with
the blocks to 1e-5 of their scale before it is timed. A route that is not installed is left
out of the table. The arrays are config C's at batch 128, as in benchmarks/ops.py: the MLP's
(8320, 384) and the residual stream's (8320, 192).
"""

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ops import median_ms  # noqa: E402

from machine import check_kernel_settings, machine_report, print_machine, setup_backends, torch  # noqa: E402
from tinyvit.fast import (  # noqa: E402
    blocks,
    cpu,
    cpu_numba,
    cpu_numba_gelu,
    cpu_numba_norm,
    elementwise,
)
from tinyvit.nn.functional import SQRT_HALF  # noqa: E402

C = np.float32(elementwise.ERFC_P * SQRT_HALF)  # t = 1 / (1 + C |x|)
COEFFICIENTS = [np.float32(0.5 * c) for c in elementwise.ERFC_T]  # Phi(-|x|) = exp(-x^2/2) t P(t)
EPS = 1e-6
GELU_ROW, NORM_ROW = "GELU forward (M x 384)", "LayerNorm forward (M x 192)"


def numexpr_routes(threads):
    """numexpr's GELU and LayerNorm, or {} when it is not installed."""
    try:
        import numexpr
    except ImportError:
        return {}
    numexpr.set_num_threads(threads)
    # its constants are float64 and would make every operation float64: pass them as float32
    names = {f"c{i}": c for i, c in enumerate(COEFFICIENTS)} | {"C": C, "one": np.float32(1),
                                                                "zero": np.float32(0),
                                                                "half": np.float32(-0.5)}
    t = "(one / (one + C * abs(x)))"
    poly = "c5"
    for i in range(4, -1, -1):
        poly = f"(c{i} + {t} * {poly})"
    gelu = f"where(x > zero, x, zero) - abs(x) * exp(half * x * x) * {t} * {poly}"

    def gelu_numexpr(x):
        return numexpr.evaluate(gelu, local_dict=names | {"x": x})

    def layer_norm_numexpr(x, w, b):
        mean = x.mean(axis=-1, keepdims=True)
        xc = numexpr.evaluate("x - mean", local_dict={"x": x, "mean": mean})
        var = numexpr.evaluate("sum(xc * xc, axis=1)", local_dict={"xc": xc})[:, None]
        rstd = (1 / np.sqrt(var / x.shape[1] + EPS)).astype(np.float32)
        return numexpr.evaluate("xc * rstd * w + b",
                                local_dict={"xc": xc, "rstd": rstd, "w": w, "b": b})

    return {"numexpr": (gelu_numexpr, layer_norm_numexpr)}


def numba_routes():
    """tinyvit's own compiled kernels (tinyvit/fast/cpu_numba_*.py), or {} without Numba
    or with its compiler turned off (NUMBA_DISABLE_JIT)."""
    if not cpu_numba.INSTALLED or cpu_numba.jit_disabled():
        return {}

    def gelu_numba(x):
        return cpu_numba_gelu.gelu(x, None, train=False)[0]

    def layer_norm_numba(x, w, b):
        return cpu_numba_norm.layer_norm(x, None, w, b, EPS, keep=False)[3]

    return {"Numba (tinyvit.fast.cpu_numba_*)": (gelu_numba, layer_norm_numba)}


def routes(threads):
    """{name: (gelu(x), layer_norm(x, w, b))}: tinyvit's blocks and what is installed, each
    returning a new array, as the layers do."""
    norm = cpu.LayerNorm(192, eps=EPS).eval()

    def gelu_blocks(x):
        y = np.empty_like(x)
        blocks.each_block(lambda x, y: elementwise.gelu_erf(x, y, None), x, y)
        return y

    def layer_norm_blocks(x, w, b):
        norm.weight.data[...], norm.bias.data[...] = w, b
        cpu_numba.set_compiled(False)
        try:
            return norm.forward(x)
        finally:
            cpu_numba.set_compiled(None)

    found = {"tinyvit (NumPy blocks)": (gelu_blocks, layer_norm_blocks)}
    return found | numexpr_routes(threads) | numba_routes()


def main(argv=None):
    p = argparse.ArgumentParser(description="Does a compiled route earn its place? GELU and "
                                "LayerNorm in NumPy blocks, numexpr and Numba against PyTorch.")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per turn (median)")
    p.add_argument("--rows", type=int, default=8320, help="rows of each array (M)")
    args = p.parse_args(argv)
    check_kernel_settings(p)
    for name in ("rounds", "repeats", "rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    setup_backends(gpu=False)
    print_machine(machine_report(gpu=False))
    threads = blocks.num_threads()
    rng = np.random.default_rng(0)
    u = rng.standard_normal((args.rows, 384), dtype=np.float32) * 2
    x = rng.standard_normal((args.rows, 192), dtype=np.float32) + 0.5
    w, b = rng.standard_normal(192, dtype=np.float32), rng.standard_normal(192, dtype=np.float32)
    found = routes(threads)
    calls, expected = {}, {}
    for name, (gelu, norm) in found.items():
        for op, call, arrays in ((GELU_ROW, gelu, (u,)), (NORM_ROW, norm, (x, w, b))):
            out = call(*arrays)  # and, for Numba, compiled
            expected.setdefault(op, out)
            error = np.abs(out - expected[op]).max() / np.abs(expected[op]).max()
            if error > 1e-5:
                sys.exit(f"{name}'s {op} differs from tinyvit's by {error:.1e} of its scale")
            calls[op, name] = lambda call=call, arrays=arrays: call(*arrays)
    if torch is not None:
        F, tu, tx = torch.nn.functional, torch.from_numpy(u), torch.from_numpy(x)
        tw, tb = torch.from_numpy(w), torch.from_numpy(b)
        calls[GELU_ROW, "PyTorch"] = lambda: F.gelu(tu)
        calls[NORM_ROW, "PyTorch"] = lambda: F.layer_norm(tx, (192,), tw, tb, EPS)
    print(f"threads: {threads} for every route; routes: {', '.join(found)}"
          f"{', PyTorch' if torch is not None else ''}")
    times = {key: [] for key in calls}
    for _ in range(args.rounds):
        for key, call in calls.items():
            times[key].append(median_ms(call, args.repeats))
    print(f"M = {args.rows}")
    print("| op, float32 | route | ms | / tinyvit's blocks |")
    print("|---|---|---|---|")
    for (op, name), ts in times.items():
        ms = statistics.median(ts)
        ours = statistics.median(times[op, "tinyvit (NumPy blocks)"])
        print(f"| {op} | {name} | {ms:.2f} | {ms / ours:.2f} |")


if __name__ == "__main__":
    main()
