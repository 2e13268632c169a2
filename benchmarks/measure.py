"""How fast the runners compute: their matmul FLOPs, the machine's float32 matmul peak, and
their steps' times, interleaved; also the body of the baseline runner's child process, which
times its steps as this process does.

Timing runs interleaved: each round times ``--steps`` train steps of each runner in turn
(tinyvit's tiers, the baseline, torch), then inference of each, so all see the same machine
state; medians (and min/max) are over all rounds. Each turn (one runner's steps of one phase
in one round) starts with ``--warmup`` untimed steps: the first step after another runner's
turn pays for that turn (that runner's threads spin on after its last operation, the caches
hold its data, worker processes wake from sleep with cold caches), and a training loop, which
runs its steps back to back, does not. Each step is timed alone (``perf_counter``; on GPU
between synchronizations). All models train on the same batch from the same weights for the
same number of steps, so their final losses are printed side by side: a check that the
backward passes and the AdamW steps agree too.

GFLOP/s counts only the model's matmuls, from the config (``matmul_flops``), each runner its
own: under class-token pooling tinyvit's last block, in either tier, computes the class
token's row alone (the other rows never reach the head), PyTorch's every row. The baseline is
counted as the first tinyvit runner, which assumes that its last block too computes the class
token's row alone: its logits are checked, its FLOPs are not. The fraction is of the float32
matmul peak of a large square matmul in NumPy (2048^2, best of 10; CuPy and 8192^2 on GPU),
measured before and after the configs and the higher kept (another process can take a core
for a while); torch's peak is printed for reference.
"""

import json
import statistics
import sys
import time

import numpy as np

from machine import blas_threads, torch, torch_sync
from runners import CONFIGS, BaselineRunner, BaselineSteps, TinyvitRunner, import_baseline
from tinyvit import allocator, backend
from tinyvit.nn.layers import ClassAttentionBlock


def matmul_flops(config, batch, last_block_rows=None):
    """Floating-point operations (2 per multiply-add) of the model's matmuls in one
    forward pass of ``batch`` images, in the letters of docs/backprop.md: B batch, N
    tokens (N - 1 patches and the class token), D embed_dim, Dm = int(mlp_ratio * D),
    C channels, P patch, K classes, and Q query tokens in a block (Q = N, or fewer in
    a last block that computes only Q tokens' outputs: ``last_block_rows``, None for N):

        patch embedding   2 B (N-1) (C P^2) D
        per block         2 B N D (3D)        qkv       (every token: all are keys and values)
                        + 2 B Q N D           q k^T     (all heads: NH Dh = D)
                        + 2 B Q N D           attn x v
                        + 2 B Q D D           proj
                        + 2 B Q D Dm + 2 B Q Dm D   fc1, fc2
        head              2 B D K

        forward = patch + depth blocks + head.

    A training step counts 3 x forward: each matmul's forward plus two in the
    backward (the gradients of both operands). LayerNorm, softmax, GELU, the
    loss and AdamW are not counted.
    """
    c = config
    N, D, Dm = c.num_patches + 1, c.embed_dim, int(c.embed_dim * c.mlp_ratio)

    def block(Q):
        return 2 * batch * D * (N * 3 * D + Q * (2 * N + D + 2 * Dm))

    patch = 2 * batch * (N - 1) * (c.in_channels * c.patch_size**2) * D
    last = block(last_block_rows or N)
    head = 2 * batch * D * c.num_classes
    return patch + (c.depth - 1) * block(N) + last + head


def forward_flops(runners, config, batch):
    """{runner name: matmul FLOPs of one forward}. torch computes every token in
    every block; tinyvit's last block, under class-token pooling, only the class
    token's row (the rest never reaches the head), in either tier. The baseline is
    counted as the first tinyvit runner (the module docstring says why)."""
    flops = {}
    for r in runners:
        if isinstance(r, TinyvitRunner):
            last_rows = 1 if isinstance(r.model.blocks[-1], ClassAttentionBlock) else None
            flops[r.name] = matmul_flops(config, batch, last_rows)
        elif isinstance(r, BaselineRunner):
            flops[r.name] = flops[runners[0].name]
        else:
            flops[r.name] = matmul_flops(config, batch)
    return flops


def best_gflops(matmul, n, sync, repeats):
    """GFLOP/s of the fastest of ``repeats`` n x n x n matmuls (after one warm-up)."""
    matmul()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul()
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def matmul_peaks(gpu, repeats):
    """Float32 square-matmul peaks: tinyvit's array backend and torch (for reference)."""
    n = 8192 if gpu else 2048
    host = np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)
    a, b = backend.to_device(host[0]), backend.to_device(host[1])
    peaks = {backend.get_backend(): best_gflops(lambda: a @ b, n, backend.synchronize, repeats)}
    if torch:
        device = "cuda" if gpu else "cpu"
        ta, tb = torch.from_numpy(host[0]).to(device), torch.from_numpy(host[1]).to(device)
        peaks["torch"] = best_gflops(lambda: ta @ tb, n, torch_sync(gpu), repeats)
    return n, peaks


def summarize(ms, flops, batch):
    median = statistics.median(ms)
    return {"median_ms": median, "min_ms": min(ms), "max_ms": max(ms), "samples": len(ms),
            "images_per_s": batch / median * 1e3, "gflops": flops / median / 1e6}


def add_fractions_of_peak(results, peak):
    for result in results.values():
        for name in result["runners"]:
            for phase in ("train", "infer"):
                result[name][phase]["fraction_of_peak"] = result[name][phase]["gflops"] / peak


def time_calls(fn, n, sync):
    """Milliseconds of each of ``n`` calls of ``fn``, each between synchronizations."""
    times = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def timed_phase(runner, phase, n):
    if hasattr(runner, "time_phase"):  # a runner in another process times its steps there
        return runner.time_phase(phase, n)
    runner.set_training(phase == "train")
    fn = runner.train_step if phase == "train" else runner.infer
    return time_calls(fn, n, runner.sync)


def time_interleaved(runners, steps, rounds, warmup):
    """{(runner name, phase): [ms, ...]}: each round runs every runner's train steps,
    then every runner's inference, so the runners alternate throughout. Every
    turn starts with ``warmup`` untimed steps: the first steps after another
    runner's turn run slow (its threads may still spin, and the caches hold its
    data), which is a cost of interleaving, not of any runner's step."""
    times = {(r.name, phase): [] for r in runners for phase in ("train", "infer")}
    for _ in range(rounds):
        for phase in ("train", "infer"):
            for r in runners:
                timed_phase(r, phase, warmup)
                times[r.name, phase] += timed_phase(r, phase, steps)
    return times


def baseline_worker(root, name, batch):
    """Child-process body of ``--baseline`` (``runners.BaselineRunner``): build config
    ``name`` from the tree ``root`` and serve the runner's commands until the end of stdin."""
    replies = sys.stdout
    sys.stdout = sys.stderr  # whatever the baseline prints must not mix with the replies
    allocator.keep_freed_memory()  # the same allocator settings as the parent
    steps = BaselineSteps(import_baseline(root), CONFIGS[name], batch)

    def reply(message):
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    reply({"blas_threads": blas_threads()})
    for line in sys.stdin:
        command = json.loads(line)
        if command["do"] == "logits":
            steps.set_training(command["training"])
            logits, loss = steps.logits_and_loss()
            reply({"logits": logits.tolist(), "loss": loss})
        else:
            ms = timed_phase(steps, command["do"], command["n"])
            loss = None if steps.last_loss is None else float(steps.last_loss)
            reply({"ms": ms, "loss": loss})
