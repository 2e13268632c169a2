"""tinyvit's Conv2d against torch.nn.Conv2d on the CPU: forward and backward, float32.

Command (the two variables are unset because some machines set them for old
OpenBLAS builds, and with them NumPy's matmuls run slower kernels than a user's
machine gets; see benchmarks/README.md):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/conv_benchmark.py

    --threads 1   BLAS threads of NumPy and torch alike (set before NumPy loads)
    --rounds 5    interleaved rounds; the table shows medians over them
    --batch 128   images per batch
    --json FILE   the same figures as JSON

What is timed, per convolution of the hybrid presets' stems (``PRESETS`` in
tinyvit/models/config.py), with the same float32 input,
weights and upstream gradient in both frameworks (checked to agree first):
forward, then backward (the input's gradient, the weight's and the bias's).
Each round times tinyvit once and torch once, their order alternating round by
round, each turn after one untimed forward and backward (the first call after
the other framework's turn runs slow). tinyvit's backward accumulates into
gradients that exist already; torch's allocates them (its ``.grad`` is reset
each turn, as ``zero_grad(set_to_none=True)`` does in training). The layout
column says how tinyvit's Conv2d ran the shape: the fast tier goes channels-last
where the input has at least as many channels as the output is wide.

Runs without PyTorch too: tinyvit's columns only.

The figures on several processors, the choice of layout (channels-first or
channels-last) and where the time goes: docs/performance.md.
"""

import argparse
import json
import os
import statistics
import sys
import time

COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/conv_benchmark.py"
AGREE_TOL = 1e-4  # relative to each tensor's largest value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="BLAS threads for NumPy and torch")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    return p.parse_args(argv)


ARGS = parse_args(None if __name__ == "__main__" else [])
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = str(ARGS.threads)  # before NumPy loads OpenBLAS

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import openblas_info, processor_model  # noqa: E402
from tinyvit import allocator, backend  # noqa: E402
from tinyvit.fast import accelerate  # noqa: E402
from tinyvit.models import PRESETS  # noqa: E402
from tinyvit.models.config import stem_output_size  # noqa: E402
from tinyvit.nn.conv import Conv2d  # noqa: E402


def stem_shapes():
    """(in channels, height = width, out channels, kernel, stride, padding) of every
    convolution in the hybrid presets' stems, each shape once, in order."""
    shapes = []
    for config in PRESETS.values():
        channels, size = config.in_channels, config.image_size
        for out, kernel, stride in config.stem:
            shape = (channels, size, out, kernel, stride, kernel // 2)
            if shape not in shapes:
                shapes.append(shape)
            channels, size = out, stem_output_size(size, [(out, kernel, stride)], False)
    return shapes


SHAPES = stem_shapes()

try:
    import torch
except ImportError:
    torch = None


def openblas_kernel():
    """The OpenBLAS kernel NumPy runs (needs threadpoolctl), or None."""
    return (openblas_info() or {}).get("architecture")


def make_case(shape, batch):
    """The two convolutions with equal weights, the input and the upstream gradient."""
    C, size, F, k, s, p = shape
    rng = backend.host_rng(0)
    ours = accelerate(Conv2d(C, F, k, s, p, rng=rng, dtype=np.float32))
    x = rng.standard_normal((batch, C, size, size), dtype=np.float32)
    Ho = (size + 2 * p - k) // s + 1
    dout = rng.standard_normal((batch, F, Ho, Ho), dtype=np.float32)
    theirs = None
    if torch:
        theirs = torch.nn.Conv2d(C, F, k, s, p)
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(ours.weight.data))
            theirs.bias.copy_(torch.from_numpy(ours.bias.data))
    return ours, theirs, x, dout


def run_ours(conv, x, dout):
    """(forward ms, backward ms, (y, dx, dweight))."""
    t0 = time.perf_counter()
    y = conv.forward(x)
    t1 = time.perf_counter()
    dx = conv.backward(dout)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1), (y, dx, conv.weight.grad)


def run_theirs(conv, x, dout):
    xt = torch.from_numpy(x).requires_grad_()
    dt = torch.from_numpy(dout)
    conv.weight.grad = conv.bias.grad = None
    t0 = time.perf_counter()
    y = conv(xt)
    t1 = time.perf_counter()
    y.backward(dt)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1), (y.detach().numpy(), xt.grad.numpy(),
                                              conv.weight.grad.numpy())


def check_agreement(ours, theirs, x, dout, label):
    """Abort unless y, dx and dweight agree to AGREE_TOL of their scale."""
    ours.zero_grad()
    mine = run_ours(ours, x, dout)[2]
    other = run_theirs(theirs, x, dout)[2]
    for name, a, b in zip(("y", "dx", "dweight"), mine, other):
        err = float(np.abs(a - b).max() / np.abs(b).max())
        if not err <= AGREE_TOL:
            sys.exit(f"{label}: tinyvit and torch disagree on {name} (relative error {err:.2e})")


def time_shape(shape, batch, rounds):
    ours, theirs, x, dout = make_case(shape, batch)
    label = describe(shape)
    if theirs is not None:
        check_agreement(ours, theirs, x, dout, label)
    runners = [("tinyvit", lambda: run_ours(ours, x, dout))]
    if theirs is not None:
        runners.append(("torch", lambda: run_theirs(theirs, x, dout)))
    times = {name: [] for name, _ in runners}
    for r in range(rounds):
        for name, run in runners if r % 2 == 0 else runners[::-1]:
            run()  # untimed: the first call after the other framework's turn
            forward, backward, _ = run()
            times[name].append((forward, backward))
    result = {name: summarize(t) for name, t in times.items()}
    result["tinyvit"]["layout"] = layout(ours, x)
    return result


def layout(conv, x):
    """The layout the convolution runs x in: the fast tier chooses per call; the
    reference is channels-first."""
    channels_last = getattr(conv, "channels_last", None)
    return "channels-last" if channels_last and channels_last(x) else "channels-first"


def summarize(times):
    forward, backward = zip(*times)
    totals = [f + b for f, b in times]
    return {"forward_ms": statistics.median(forward), "backward_ms": statistics.median(backward),
            "total_ms": statistics.median(totals), "total_min_ms": min(totals),
            "total_max_ms": max(totals)}


def describe(shape):
    C, size, F, k, s, p = shape
    return f"{size}x{size}x{C} -> {F}, {k}x{k} s{s} p{p}"


def print_table(results):
    header = ["shape (batch {})".format(ARGS.batch), "layout", "tinyvit fwd", "bwd", "total"]
    if torch:
        header += ["torch fwd", "bwd", "total", "ratio"]
    rows = []
    for label, result in results.items():
        ours = result["tinyvit"]
        row = [label, ours["layout"]]
        row += [f"{ours[k]:.1f}" for k in ("forward_ms", "backward_ms", "total_ms")]
        if torch:
            theirs = result["torch"]
            row += [f"{theirs[k]:.1f}" for k in ("forward_ms", "backward_ms", "total_ms")]
            row.append(f"{ours['total_ms'] / theirs['total_ms']:.2f}x")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for i, row in enumerate([header] + rows):
        cells = [c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells))
        if i == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    ratio = "; ratio = tinyvit total / torch total (forward + backward)" if torch else ""
    print(f"milliseconds, medians over rounds{ratio}")


def main():
    allocator.keep_freed_memory()  # as train_mnist.py; both frameworks share the process
    if torch:
        torch.set_num_threads(ARGS.threads)
    machine = {
        "processor": processor_model(),
        "openblas_kernel": openblas_kernel(),
        "threads": ARGS.threads,
        "numpy": np.__version__,
        "torch": torch.__version__ if torch else None,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "load_average_1min": os.getloadavg()[0],
    }
    print(f"processor  {machine['processor']}")
    kernel, version = machine["openblas_kernel"] or "unknown", machine["torch"] or "not installed"
    print(f"threads    {ARGS.threads} (NumPy's OpenBLAS, kernel {kernel}; torch {version}); "
          f"load average {machine['load_average_1min']:.2f}")
    set_vars = {k: v for k, v in machine["env"].items() if v is not None}
    if set_vars:
        print(f"WARNING    {set_vars} is set: OpenBLAS may run slower kernels; the documented "
              f"command unsets them:\n           {COMMAND}")
    results = {describe(shape): time_shape(shape, ARGS.batch, ARGS.rounds) for shape in SHAPES}
    print_table(results)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"machine": machine, "batch": ARGS.batch, "rounds": ARGS.rounds,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
