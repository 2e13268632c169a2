"""tinyvit against PyTorch eager, its other tier and an older tinyvit: speed, FLOPs, memory.

Training-step and inference speed, matmul FLOP rate and peak memory.

Command (the two variables are unset because some machines set them for old
OpenBLAS builds; with them NumPy runs AVX2 kernels at about half speed, and a
user's machine does not set them; see docs/performance.md):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py

    --configs A,B,C  --batch 128  --steps 5  --rounds 3  --warmup 2  --memory-steps 3
    --quick          config A, a few steps (a CI smoke test, well under 60 s)
    --gpu            tinyvit on CuPy against torch on "cuda", both in plain float32
                     (PyTorch's TF32 off; tinyvit's unless CUPY_TF32=1 is set)
    --workers 2      tinyvit's step and inference split over 2 worker processes, one BLAS
                     thread each (tinyvit.parallel, as train_mnist.py trains on a CPU)
    --tiers fast,reference
                     one tinyvit runner per tier of layers (tinyvit.fast): "tinyvit" (fast,
                     the default) and "tinyvit-reference"
    --baseline DIR   also "tinyvit@LABEL": tinyvit from the source tree DIR (say, a git
                     worktree of an older commit), in one child process (--baseline-label
                     LABEL, default DIR's name; --workers does not apply to it)
    --json FILE      the same figures as JSON

    git worktree add /tmp/before af2d193
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py \\
        --tiers fast,reference --baseline /tmp/before --json tiers.json

The runners: each ``--tiers`` runner builds tinyvit's layers of its tier (a
layer's tier is fixed when it is built; with ``--workers`` each worker builds
its replica in the same tier); the ``--baseline`` runner (below) runs another
source tree's tinyvit; the torch runner, when torch is installed, PyTorch.
Every runner is checked against, and its times divided by, the first tinyvit
runner ("tinyvit", unless ``--tiers`` names reference first) and PyTorch.

What is measured, for each config and runner, with the same float32 batch and
weights (every tinyvit model from seed 0; the torch model is
``tests/torch_reference.torch_vit_from(model, float32)``):

- train step: ``zero_grad``, forward, softmax cross-entropy with label
  smoothing 0.1, backward, AdamW (lr 1e-3, weight decay 0.05 on Linear and
  patch-embedding weights only: tinyvit's flat decay mask, torch param groups);
- inference: tinyvit ``model.eval()`` then ``model.forward(x)``; torch
  ``model.eval()`` under ``torch.inference_mode()``.

Before timing, one batch goes through every model: each one's logits (train
and eval mode) must agree with the first tinyvit runner's to 1e-4 of their scale
and the losses to 1e-5, or the script aborts. Timing then runs interleaved: each
round times ``--steps`` train steps of each runner in turn (tinyvit's tiers, the
baseline, torch), then inference of each, so all see the same machine state;
medians (and min/max) are over all rounds.
Each turn (one runner's steps of one phase in one round) starts with
``--warmup`` untimed steps. The first step after another runner's turn
pays for that turn: on config A with two workers, tinyvit's first training step
took 34 ms after 0.3 s of PyTorch training, 28 ms after 0.3 s of sleep and 25 ms
with nothing in between (PyTorch's threads spin on after its last operation, and
the workers wake from sleep with cold caches), and PyTorch's first step was
3-14% slower than its next ones. A training loop runs its steps back to back,
so no runner's step includes that.
Each step is timed alone (``perf_counter``; on GPU between synchronizations).
All models train on the same batch from the same weights for the same number
of steps, so their final losses are printed side by side: a check that the
backward passes and the AdamW steps agree too.
All use the same thread count: torch.set_num_threads(number of OpenBLAS
threads), and the same allocator settings: this process, like train_mnist.py,
calls ``allocator.keep_freed_memory()`` (glibc keeps freed arrays' pages for reuse).

The ``--baseline`` runner: one process cannot import two packages named
tinyvit, so the baseline runs in a child process, this script with a hidden
flag, started per config, which puts DIR first on ``sys.path``, imports DIR's
tinyvit (``model.ViT``, ``model.ViTConfig``, ``loss.SoftmaxCrossEntropy``,
``loss.loss_and_gradients``, ``optim.AdamW``: what tinyvit has had since
af2d193) and builds the same config (the fields both versions have), seed,
dtype, batch, loss and optimizer as the tinyvit runners, with the same
OpenBLAS thread count (checked) and allocator settings, and its default tier of
layers (``TINYVIT_REFERENCE`` is removed from its environment). It sends its
logits and loss for the check, then, at each of its turns, times the steps
itself exactly as this process does and sends the milliseconds back over a pipe
(one JSON line each way), so the pipe is not timed and the interleaving is the
same as for the other runners. Not with ``--gpu``.

GFLOP/s counts only the model's matmuls, from the config (``matmul_flops``), each
runner its own: under class-token pooling tinyvit's last block, in either tier,
computes the class token's row alone (the other rows never reach the head),
PyTorch's every row. The baseline is counted as the first tinyvit runner: the
same matmuls while its last block also computes the class token's row alone (as
at af2d193; its logits are checked, its FLOPs are not);
the fraction is of the float32 matmul peak of a large square matmul in NumPy
(2048^2, best of 10; CuPy and 8192^2 on GPU), measured before and after the
configs and the higher kept (another process can take a core for a while);
torch's peak is printed for reference. The tables are printed at the end,
once the peak is known.

Peak memory is measured in a fresh subprocess per (runner, config, train or
inference), so that no runner's allocator state nor another's buffers count;
the ``--baseline`` runner's is not measured (shown as "not measured").
The subprocess first runs one throwaway step on a 2-image batch
(so library code paged in on first use and one-time set-up are not counted),
builds the model and the batch, takes its RSS as the baseline and resets the
peak-RSS mark (``/proc/self/clear_refs``; ``ru_maxrss`` cannot serve here, as
in a subprocess it keeps the forked parent's peak), then builds the optimizer
and runs a few steps. The figure is peak RSS (VmHWM) minus the baseline:
activations, gradients, optimizer state and temporaries, not the weights or
the libraries. Where /proc is missing it falls back to ``ru_maxrss`` minus its
value at the baseline. With ``--workers N`` tinyvit's figure is the sum over the
parent and its N workers: the workers are started and run one 2-image
inference before the baseline (each then holds its libraries and its replica
of the weights), and each process's peak growth over its own baseline is
added. Shared pages a worker first touches during the steps (its rows of the
batch, its gradient slot) count in its growth although the parent's baseline
already holds them, so the sum overstates by up to one gradient per worker
(7 MB each on config C). On GPU: CuPy's memory-pool footprint (all blocks
freed first) against ``torch.cuda.max_memory_allocated``, both over the bytes
in use at the baseline (the pool figure includes blocks cached but not in use,
so it is an upper bound where torch's is exact).
"""

import argparse
import dataclasses
import gc
import importlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # torch_reference.py lives with the tests

import tinyvit  # noqa: E402
from tinyvit import allocator, backend  # noqa: E402
from tinyvit.fast import accelerate  # noqa: E402
from tinyvit.models import ViT, ViTConfig  # noqa: E402
from tinyvit.nn.layers import ClassAttentionBlock  # noqa: E402
from tinyvit.nn.loss import SoftmaxCrossEntropy  # noqa: E402
from tinyvit.nn.optim import AdamW  # noqa: E402
from tinyvit.train.gradients import loss_and_gradients  # noqa: E402
from tinyvit.train.parallel import DataParallel  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

try:
    import threadpoolctl
except ImportError:
    threadpoolctl = None

CONFIGS = {
    "A": ViTConfig(image_size=28, patch_size=7, in_channels=1, embed_dim=64, depth=4,
                   num_heads=4, mlp_ratio=2.0, num_classes=10),
    "B": ViTConfig(image_size=28, patch_size=4, in_channels=1, embed_dim=128, depth=6,
                   num_heads=4, mlp_ratio=2.0, num_classes=10),
    "C": ViTConfig(image_size=32, patch_size=4, in_channels=3, embed_dim=192, depth=6,
                   num_heads=3, mlp_ratio=2.0, num_classes=10),
}
LR, WEIGHT_DECAY, LABEL_SMOOTHING = 1e-3, 0.05, 0.1
LOGITS_TOL, LOSS_TOL = 1e-4, 1e-5
COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py"
RUNNER_NAMES = {"fast": "tinyvit", "reference": "tinyvit-reference"}  # tier -> runner's name
TIER_OF = {name: tier for tier, name in RUNNER_NAMES.items()}
NOT_MEASURED = "not measured"  # the baseline's peak memory (see the module docstring)


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def processor_model():
    """The processor's model name with its family and model numbers, which tell its
    generation where the name does not (a virtual machine may say only "AMD EPYC")."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']})"
    return fields["model name"]


def openblas_info():
    """NumPy's OpenBLAS as threadpoolctl sees it (kernel, threads, version), or None."""
    if threadpoolctl is None:
        return None
    found = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    numpy_own = [i for i in found if "numpy" in i.get("filepath", "")]
    return (numpy_own or found or [None])[0]


def blas_threads():
    info = openblas_info()
    if info:
        return info["num_threads"]
    return int(os.environ.get("OPENBLAS_NUM_THREADS", 0)) or len(os.sched_getaffinity(0))


def machine_report(gpu):
    info = openblas_info()
    report = {
        "processor": processor_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch else None,
        "openblas": ({k: info.get(k) for k in ("architecture", "num_threads", "version")}
                     if info else None),
        "threads": {"openblas": blas_threads(),
                    "torch": torch.get_num_threads() if torch else None},
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "cores": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
    }
    if gpu:
        import cupy

        report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        report["cupy"] = cupy.__version__
    return report


def print_machine(report):
    print(f"processor   {report['processor']}")
    if "gpu" in report:
        print(f"gpu         {report['gpu']} (CuPy {report['cupy']})")
    blas = report["openblas"]
    if blas:
        print(f"OpenBLAS    {blas['version']}, kernel {blas['architecture']}, "
              f"{blas['num_threads']} threads")
    else:
        print("OpenBLAS    unknown: threadpoolctl is not installed (pip install threadpoolctl)")
    threads = report["threads"]
    print(f"threads     OpenBLAS {threads['openblas']}, torch {threads['torch'] or '-'}; "
          f"{report['cores']} cores, load average {report['load_average_1min']:.2f}")
    warn_if_busy()
    print(f"versions    Python {report['python']}, NumPy {report['numpy']}, "
          f"PyTorch {report['torch'] or 'not installed'}, "
          f"tinyvit {getattr(tinyvit, '__version__', 'dev')}")
    set_vars = {k: v for k, v in report["env"].items() if v is not None}
    if set_vars:
        shown = ", ".join(f"{k}={v}" for k, v in set_vars.items())
        print(f"WARNING     {shown} is set: OpenBLAS may run slower kernels than on a user's "
              f"machine. The documented command unsets them:\n            {COMMAND}")
    else:
        print("env         OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (as documented)")


def warn_if_busy():
    """Other processes on the cores make both frameworks' threads wait for each other."""
    load, cores = os.getloadavg()[0], os.cpu_count()
    if load > 0.5 * cores:
        print(f"WARNING     load average {load:.2f} on {cores} cores: other work is running, "
              "timings will be noisy (compare medians, or rerun on an idle machine)")


# ---------------------------------------------------------------------------
# FLOPs and the matmul peak
# ---------------------------------------------------------------------------


def matmul_flops(config, batch, last_block_rows=None):
    """Floating-point operations (2 per multiply-add) of the model's matmuls in one
    forward pass of ``batch`` images. With T = (image/P)^2 patches, N = T + 1
    tokens, D embed_dim, M = int(mlp_ratio * D), C channels, P patch, K classes,
    L depth, B batch, and Q query tokens in a block (Q = N, or fewer in a last
    block that computes only Q tokens' outputs: ``last_block_rows``, None for N):

        patch embedding   2 B T (C P^2) D
        per block         2 B N D (3D)        qkv       (every token: all are keys and values)
                        + 2 B Q N D           q k^T     (all heads: H Dh = D)
                        + 2 B Q N D           attn x v
                        + 2 B Q D D           proj
                        + 2 B Q D M + 2 B Q M D   fc1, fc2
        head              2 B D K

        forward = patch + L blocks + head.

    A training step counts 3 x forward: each matmul's forward plus two in the
    backward (the gradients of both operands). LayerNorm, softmax, GELU, the
    loss and AdamW are not counted.
    """
    c = config
    T = c.num_patches
    N, D, M = T + 1, c.embed_dim, int(c.embed_dim * c.mlp_ratio)

    def block(Q):
        return 2 * batch * D * (N * 3 * D + Q * (2 * N + D + 2 * M))

    patch = 2 * batch * T * (c.in_channels * c.patch_size**2) * D
    last = block(last_block_rows or N)
    head = 2 * batch * D * c.num_classes
    return patch + (c.depth - 1) * block(N) + last + head


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


def torch_sync(gpu):
    return torch.cuda.synchronize if gpu else (lambda: None)


# ---------------------------------------------------------------------------
# The runners, behind one interface
# ---------------------------------------------------------------------------


def make_batch(config, batch):
    """A fixed float32 batch of normalized-looking images and integer labels (host)."""
    rng = np.random.default_rng(1)
    shape = (batch, config.in_channels, config.image_size, config.image_size)
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, config.num_classes, batch)


class TinyvitRunner:
    """tinyvit's layers of one tier ("fast" or "reference") in this process, or with
    ``workers > 1`` its training step and inference split over worker processes
    (``tinyvit.parallel``, as ``train_mnist.py`` trains)."""

    def __init__(self, config, images, labels, workers=1, tier="fast"):
        self.tier, self.name = tier, RUNNER_NAMES[tier]
        self.model = ViT(config, seed=0, dtype=np.float32)
        if tier == "fast":
            accelerate(self.model)
        self.x, self.y = backend.to_device(images), backend.to_device(labels)
        self.loss_fn = SoftmaxCrossEntropy(label_smoothing=LABEL_SMOOTHING)
        self.optimizer = None
        self.workers, self.parallel = workers, None

    def decay_names(self):
        """State-dict keys of the parameters AdamW decays (state_dict follows parameters())."""
        return {k for k, p in zip(self.model.state_dict(), self.model.parameters()) if p.decay}

    def start_workers(self):
        """With ``workers > 1``, start them (once)."""
        if self.workers > 1 and self.parallel is None:  # the workers run the model's tier
            self.parallel = DataParallel(self.model, self.workers, len(self.x)).__enter__()
            self.targets = self.loss_fn.targets(self.y, self.model.config.num_classes, self.x.dtype)

    def prepare_training(self):
        self.optimizer = AdamW(self.model, lr=LR, weight_decay=WEIGHT_DECAY)
        self.start_workers()

    def close(self):
        if self.parallel is not None:
            self.parallel.__exit__(None, None, None)

    def set_training(self, mode):
        self.model.train(mode)

    def train_step(self):
        if self.parallel is None:
            loss, _ = loss_and_gradients(self.model, self.loss_fn, self.x, self.y, seed=0)
        else:  # the workers' gradients, combined in the model's gradient buffer
            loss, _ = self.parallel.gradients(self.x, self.targets)
        self.optimizer.step()
        self.last_loss = loss
        return loss

    def infer(self):
        return (self.model.forward(self.x) if self.parallel is None
                else self.parallel.forward(self.x))

    def logits_and_loss(self):
        """Host logits and loss of a forward in the current mode (for the check)."""
        logits = self.model.forward(self.x)
        return backend.to_host(logits), float(backend.to_host(self.loss_fn.forward(logits, self.y)))

    def final_loss(self):
        return float(backend.to_host(self.last_loss))

    sync = staticmethod(backend.synchronize)


class TorchRunner:
    name = "torch"

    def __init__(self, tinyvit_model, decay_names, images, labels, gpu):
        from torch_reference import torch_vit_from

        self.device = "cuda" if gpu else "cpu"
        self.model = torch_vit_from(tinyvit_model, torch.float32).to(self.device)
        self.x = torch.from_numpy(images).to(self.device)
        self.y = torch.from_numpy(labels).to(self.device)
        self.decay_names = decay_names
        self.sync = torch_sync(gpu)
        self.optimizer = None

    def close(self):
        """Nothing to stop: torch runs in this process."""

    def prepare_training(self):
        params = dict(self.model.named_parameters())
        unknown = self.decay_names - set(params)
        if unknown:
            raise RuntimeError(
                f"decayed tinyvit parameters missing from the torch model: {sorted(unknown)}"
            )
        decay = [p for n, p in params.items() if n in self.decay_names]
        no_decay = [p for n, p in params.items() if n not in self.decay_names]
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
                  {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=LR)

    def set_training(self, mode):
        self.model.train(mode)

    def train_step(self):
        self.model.zero_grad()
        loss = F.cross_entropy(self.model(self.x), self.y, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.optimizer.step()
        self.last_loss = loss
        return loss

    def infer(self):
        with torch.inference_mode():
            return self.model(self.x)

    def logits_and_loss(self):
        with torch.no_grad():
            logits = self.model(self.x)
            loss = F.cross_entropy(logits, self.y, label_smoothing=LABEL_SMOOTHING)
        return logits.cpu().numpy(), float(loss)

    def final_loss(self):
        return self.last_loss.item()


def build_runners(name, args):
    """The runners of config ``name``, in the order they take turns: one tinyvit
    runner per tier of ``--tiers``, the ``--baseline`` tree's, then torch's (with
    the first tinyvit runner's weights)."""
    config = CONFIGS[name]
    images, labels = make_batch(config, args.batch)
    runners = [TinyvitRunner(config, images, labels, args.workers, t) for t in args.tiers]
    if args.baseline:
        runners.append(BaselineRunner(args.baseline, args.baseline_label, name, args.batch))
    if torch:
        first = runners[0]
        runners.append(TorchRunner(first.model, first.decay_names(), images, labels, args.gpu))
    return runners


def check_same_function(a, b):
    """Abort unless runners ``a`` and ``b`` give the same logits (train and eval
    mode) and loss; return the largest differences."""
    worst = {}
    for mode in (True, False):
        a.set_training(mode)
        b.set_training(mode)
        (logits_a, loss_a), (logits_b, loss_b) = a.logits_and_loss(), b.logits_and_loss()
        scale = max(float(np.abs(logits_b).max()), 1e-30)
        rel, dloss = float(np.abs(logits_a - logits_b).max()) / scale, abs(loss_a - loss_b)
        label = "train" if mode else "eval"
        worst[label] = {"logits_rel_diff": rel, "loss_diff": dloss}
        if not (rel < LOGITS_TOL and dloss < LOSS_TOL):
            sys.exit(
                f"ABORT: {a.name} and {b.name} compute different things ({label} mode):\n"
                f"  logits max abs diff / max |logit| = {rel:.3e} (must be < {LOGITS_TOL:g})\n"
                f"  loss: {a.name} {loss_a:.8f}, {b.name} {loss_b:.8f}, diff {dloss:.3e} "
                f"(must be < {LOSS_TOL:g})"
            )
    return worst


def check_runners(runners):
    """{name: largest differences} of every runner against the first, or abort."""
    return {r.name: check_same_function(runners[0], r) for r in runners[1:]}


# ---------------------------------------------------------------------------
# Timing, interleaved
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# The baseline: tinyvit from another source tree, in a child process
# ---------------------------------------------------------------------------


class BaselineRunner:
    """tinyvit from the source tree ``root`` (``--baseline``), timed in a child
    process: this script with ``--baseline-worker``, which imports that tree's
    tinyvit (one process cannot hold two packages named tinyvit). One JSON line
    per command goes to its stdin and one reply comes back on its stdout:

        {"do": "train" | "infer", "n": k}    -> {"ms": [k step times], "loss": latest}
        {"do": "logits", "training": mode}   -> {"logits": [[...], ...], "loss": loss}

    The child times each step itself, as ``time_calls`` does, so that neither the
    pipe nor this process's waiting is counted. Its errors go to this process's
    stderr."""

    def __init__(self, root, label, config_name, batch):
        self.name = f"tinyvit@{label}"
        self.training, self.last_loss = True, None
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(blas_threads())}  # this process's count
        env.pop("TINYVIT_REFERENCE", None)  # a tree that reads it builds its default layers
        command = [sys.executable, __file__, "--baseline-worker", str(root),
                   "--configs", config_name, "--batch", str(batch)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        threads = self._receive("its start")["blas_threads"]
        if threads != blas_threads():
            self.close()
            raise RuntimeError(f"{self.name}: expected {blas_threads()} BLAS thread(s) in the "
                               f"baseline process, as in this one; got {threads}")

    def _receive(self, what):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the baseline process exited (rc "
                               f"{self.process.wait()}) instead of answering {what} "
                               "(its error, if any, is printed above)")
        return json.loads(line)

    def _ask(self, command):
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the child is gone: _receive reports it
        return self._receive(command)

    def set_training(self, mode):
        self.training = mode  # sent with the next logits command

    def prepare_training(self):
        """Nothing to do: the child builds its optimizer when it starts."""

    def time_phase(self, phase, n):
        reply = self._ask({"do": phase, "n": n})
        self.last_loss = reply["loss"]
        return reply["ms"]

    def logits_and_loss(self):
        reply = self._ask({"do": "logits", "training": self.training})
        return np.array(reply["logits"], dtype=np.float32), reply["loss"]

    def final_loss(self):
        return self.last_loss

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()  # end of input: the child's loop ends
            self.process.wait()


# where a source tree keeps what the baseline builds: the ViT and its config, the loss,
# AdamW and loss_and_gradients; the packages by layer, then the flat package before them
BASELINE_LAYOUTS = (
    {"model": "tinyvit.models", "loss": "tinyvit.nn.loss", "optim": "tinyvit.nn.optim",
     "gradients": "tinyvit.train.gradients"},
    {"model": "tinyvit.model", "loss": "tinyvit.loss", "optim": "tinyvit.optim",
     "gradients": "tinyvit.loss"},
)


def import_baseline(root):
    """The modules of the source tree ``root`` that the baseline builds from
    (``BASELINE_LAYOUTS``), in place of this tree's, and the tree's ``fast``
    package (only the baseline's child calls this: afterwards ``import tinyvit``
    means the baseline's)."""
    for name in [m for m in sys.modules if m == "tinyvit" or m.startswith("tinyvit.")]:
        del sys.modules[name]  # this tree's, imported at the top of the script
    sys.path.insert(0, str(root))
    package = importlib.import_module("tinyvit")
    found, expected = Path(package.__file__).resolve().parent, (Path(root) / "tinyvit").resolve()
    if found != expected:
        raise RuntimeError(f"--baseline: expected tinyvit imported from {expected}, got {found}")
    layout = next((layout for layout in BASELINE_LAYOUTS
                   if importlib.util.find_spec(layout["model"]) is not None), None)
    if layout is None:
        raise RuntimeError(f"--baseline: {root} keeps its ViT in none of "
                           f"{', '.join(layout['model'] for layout in BASELINE_LAYOUTS)}")
    modules = {role: importlib.import_module(name) for role, name in layout.items()}
    return types.SimpleNamespace(**modules, fast=importlib.import_module("tinyvit.fast"))


def baseline_config(config_class, config):
    """``config`` as the baseline's ``config_class``: the fields both versions have.
    A field the baseline lacks keeps its meaning only at its default; where that
    changes the model, the logits check catches it."""
    theirs = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in dataclasses.asdict(config).items() if k in theirs})


class BaselineSteps:
    """In the baseline's child: TinyvitRunner's training step and inference, with
    the same config, seed, dtype, batch, loss and optimizer, on the baseline's
    modules (``package``), on the CPU in one process."""

    def __init__(self, package, config, batch):
        self.model = package.model.ViT(baseline_config(package.model.ViTConfig, config), seed=0,
                                       dtype=np.float32)
        if hasattr(package.fast, "accelerate"):  # a tree whose models start as reference layers
            package.fast.accelerate(self.model)
        self.x, self.y = make_batch(config, batch)
        self.loss_fn = package.loss.SoftmaxCrossEntropy(label_smoothing=LABEL_SMOOTHING)
        self.optimizer = package.optim.AdamW(self.model, lr=LR, weight_decay=WEIGHT_DECAY)
        self.loss_and_gradients = package.gradients.loss_and_gradients
        self.last_loss = None

    def set_training(self, mode):
        self.model.train(mode)

    def train_step(self):
        loss, _ = self.loss_and_gradients(self.model, self.loss_fn, self.x, self.y, seed=0)
        self.optimizer.step()
        self.last_loss = loss

    def infer(self):
        return self.model.forward(self.x)

    def logits_and_loss(self):
        logits = self.model.forward(self.x)
        return logits, float(self.loss_fn.forward(logits, self.y))

    def sync(self):
        """NumPy computes synchronously: nothing to wait for."""


def baseline_worker(root, name, batch):
    """Child-process body of ``--baseline``: build config ``name`` from the tree
    ``root`` and serve BaselineRunner's commands until the end of stdin."""
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


# ---------------------------------------------------------------------------
# Peak memory, in a fresh process per (runner, config, phase)
# ---------------------------------------------------------------------------


def _proc_status_kb(field, pid="self"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/{pid}/status")


class HostMemory:
    """Peak RSS growth over a baseline, in MB (see the module docstring), summed
    over this process and the processes ``pids`` (tinyvit's workers).

    On Linux it reads VmHWM, the peak RSS of a process's own address space,
    after resetting it: ``ru_maxrss`` is no good in a subprocess, as it also
    keeps the peak of the forked parent's pages before exec (here, the parent's
    whole RSS). Elsewhere it falls back to ``ru_maxrss``, which cannot be reset
    and sees this process only.
    """

    def __init__(self, pids=()):
        self.pids = ["self", *pids]

    def start(self):
        try:
            self.baseline_kb = sum(_proc_status_kb("VmRSS", pid) for pid in self.pids)
            for pid in self.pids:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")  # reset VmHWM to the current RSS
            self.method = "VmHWM (reset at baseline) - VmRSS at baseline"
            if len(self.pids) > 1:
                self.method += f", summed over {len(self.pids)} processes"
        except OSError:
            if len(self.pids) > 1:
                raise RuntimeError("worker processes' memory needs Linux's /proc") from None
            self.baseline_kb = self._maxrss_kb()
            self.method = "ru_maxrss - ru_maxrss at baseline"

    def peak_mb(self):
        if self.method.startswith("ru_"):
            return (self._maxrss_kb() - self.baseline_kb) / 1024
        return (sum(_proc_status_kb("VmHWM", pid) for pid in self.pids) - self.baseline_kb) / 1024

    @staticmethod
    def _maxrss_kb():
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1024 if sys.platform == "darwin" else peak  # bytes on macOS


class CupyMemory:
    def start(self):
        import cupy

        self.pool = cupy.get_default_memory_pool()
        self.pool.free_all_blocks()
        self.baseline = self.pool.used_bytes()
        self.method = "CuPy pool footprint"

    def peak_mb(self):
        return (self.pool.total_bytes() - self.baseline) / 2**20


class TorchCudaMemory:
    def start(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.baseline = torch.cuda.memory_allocated()
        self.method = "torch.cuda.max_memory_allocated"

    def peak_mb(self):
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - self.baseline) / 2**20


def make_runner(framework, config, batch, gpu, workers=1):
    """The runner named ``framework`` ("torch" or a tinyvit tier's runner name)."""
    images, labels = make_batch(config, batch)
    runner = TinyvitRunner(config, images, labels, workers, TIER_OF.get(framework, "fast"))
    if framework == "torch":
        runner = TorchRunner(runner.model, runner.decay_names(), images, labels, gpu)
    return runner


def one_step(runner, phase):
    """One train step (building the optimizer on the first) or one inference."""
    runner.set_training(phase == "train")
    if phase == "infer":
        return runner.infer()
    if runner.optimizer is None:
        runner.prepare_training()
    return runner.train_step()


def memory_worker(spec, batch, steps, gpu, workers):
    """Subprocess body: build one runner's model and batch, set the baseline,
    run a few steps of one phase, print the peak growth as JSON."""
    framework, name, phase = spec.split(":")
    setup_backends(gpu)
    config = CONFIGS[name]
    one_step(make_runner(framework, config, 2, gpu), phase)  # page in code, one-time setup
    gc.collect()
    runner = make_runner(framework, config, batch, gpu, workers)
    pids = []
    tinyvit_runner = isinstance(runner, TinyvitRunner)
    if tinyvit_runner and workers > 1:
        runner.start_workers()
        runner.parallel.forward(runner.x[:2])  # the workers page in their code
        pids = [p.pid for p in runner.parallel.processes]
    if not gpu:
        meter = HostMemory(pids)
    else:
        meter = CupyMemory() if tinyvit_runner else TorchCudaMemory()
    runner.sync()
    meter.start()
    try:
        for _ in range(steps):
            one_step(runner, phase)
        runner.sync()
        print("MEMORY " + json.dumps({"peak_mb": meter.peak_mb(), "method": meter.method}))
    finally:
        if pids:
            runner.close()


def measure_memory(framework, name, phase, args):
    """Peak memory growth in MB from a fresh subprocess, or None (with its error shown)."""
    command = [sys.executable, __file__, "--memory-worker", f"{framework}:{name}:{phase}",
               "--batch", str(args.batch), "--memory-steps", str(args.memory_steps),
               "--workers", str(args.workers)]
    command += ["--gpu"] if args.gpu else []
    done = subprocess.run(command, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("MEMORY "):
            return json.loads(line[len("MEMORY "):])
    print(f"  (memory subprocess {framework}:{name}:{phase} failed, rc {done.returncode}:\n"
          f"{done.stderr.strip()[-2000:]})")
    return None


# ---------------------------------------------------------------------------
# One config
# ---------------------------------------------------------------------------


def summarize(ms, flops, batch):
    median = statistics.median(ms)
    return {"median_ms": median, "min_ms": min(ms), "max_ms": max(ms), "samples": len(ms),
            "images_per_s": batch / median * 1e3, "gflops": flops / median / 1e6}


def add_fractions_of_peak(results, peak):
    for result in results.values():
        for name in result["runners"]:
            for phase in ("train", "infer"):
                result[name][phase]["fraction_of_peak"] = result[name][phase]["gflops"] / peak


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


def peak_memory(runner, name, args):
    if isinstance(runner, BaselineRunner):
        return NOT_MEASURED
    return {phase: measure_memory(runner.name, name, phase, args) for phase in ("train", "infer")}


def ratio_references(names):
    """The runners whose times (and memory) the others are divided by: the first
    tinyvit runner when there are several, and torch."""
    tinyvits = [n for n in names if n != "torch"]
    first = tinyvits[:1] if len(tinyvits) > 1 else []
    return first + (["torch"] if "torch" in names else [])


def ratios_to(result, name, ref):
    """Runner ``name``'s median times and peak memory over runner ``ref``'s."""
    ratios = {}
    for phase in ("train", "infer"):
        ratios[f"{phase}_ms"] = ratio(get(result, name, phase, "median_ms"),
                                      get(result, ref, phase, "median_ms"))
        ratios[f"{phase}_peak_mb"] = ratio(get(result, name, "peak_memory", phase, "peak_mb"),
                                           get(result, ref, "peak_memory", phase, "peak_mb"))
    return ratios


def add_ratios(result):
    """Each tinyvit runner's ``ratio_to`` every reference runner but itself (above 1:
    slower, more memory)."""
    references = ratio_references(result["runners"])
    for name in result["runners"]:
        if name != "torch":
            result[name]["ratio_to"] = {ref: ratios_to(result, name, ref)
                                        for ref in references if ref != name}


def print_checks(check):
    if not check["runners"]:
        print(f"  ({check['against']} alone: no cross-check)")
    for name, worst in check["runners"].items():
        print(f"  same function as {check['against']}, {name}: logits rel diff "
              f"{worst['train']['logits_rel_diff']:.1e} (train) "
              f"{worst['eval']['logits_rel_diff']:.1e} (eval), "
              f"loss diff {worst['train']['loss_diff']:.1e}")


def run_config(name, args):
    config = CONFIGS[name]
    print(f"running config {name} (timing, then memory subprocesses)")
    runners = build_runners(name, args)
    try:
        check = {"against": runners[0].name, "runners": check_runners(runners)}
        print_checks(check)
        for r in runners:
            r.prepare_training()
        times = time_interleaved(runners, args.steps, args.rounds, args.warmup)
        losses = {r.name: r.final_loss() for r in runners}
    finally:
        for r in runners:
            r.close()
    forward = forward_flops(runners, config, args.batch)
    first = runners[0]
    result = {"config": describe(config), "params": first.model.num_parameters(),
              "batch": args.batch, "runners": [r.name for r in runners],
              "forward_matmul_flops": forward,
              "train_matmul_flops": {k: 3 * v for k, v in forward.items()},
              "check": check,
              # the same steps on the same batch from the same weights: a check of backward
              # and AdamW
              "loss_after_training": {"steps": args.rounds * (args.warmup + args.steps),
                                      **losses}}
    for r in runners:
        result[r.name] = {
            "train": summarize(times[r.name, "train"], 3 * forward[r.name], args.batch),
            "infer": summarize(times[r.name, "infer"], forward[r.name], args.batch),
            "peak_memory": peak_memory(r, name, args),
        }
    add_ratios(result)
    return result


def describe(c):
    return (f"{c.image_size}x{c.image_size}x{c.in_channels}, patch {c.patch_size}, "
            f"dim {c.embed_dim}, depth {c.depth}, heads {c.num_heads}, "
            f"mlp_ratio {c.mlp_ratio:g}, {c.num_classes} classes")


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


def render(rows, header, align, groups=None):
    """An aligned text table. ``align``: 'l' or 'r' per column; ``groups``:
    optional (title, number of columns) pairs, centred over their columns."""
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(align))]
    spans, first = [], 0
    for title, n in groups or []:
        last = first + n - 1
        widths[last] += max(0, len(title) - (sum(widths[first:last + 1]) + 2 * (n - 1)))
        spans.append(title.center(sum(widths[first:last + 1]) + 2 * (n - 1)))
        first = last + 1

    def line(cells):
        return "  " + "  ".join(cells).rstrip()

    def row_line(row):
        return line(str(v).ljust(w) if a == "l" else str(v).rjust(w)
                    for v, w, a in zip(row, widths, align))

    rule = "  " + "-" * (sum(widths) + 2 * (len(widths) - 1))
    top = [line(spans)] if groups else []
    return "\n".join(top + [row_line(header), rule] + [row_line(r) for r in rows])


def fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def ratio(a, b):
    return None if a is None or not b else a / b  # a peak memory growth can be 0


def get(result, runner, *keys):
    """result[runner][k1][k2]..., or None where the runner is absent or memory failed
    or was not measured."""
    value = result.get(runner)
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def display(name):
    return "PyTorch" if name == "torch" else name


def memory_cell(result, runner, phase):
    if result[runner]["peak_memory"] == NOT_MEASURED:
        return NOT_MEASURED
    return fmt(get(result, runner, "peak_memory", phase, "peak_mb"))


def spread_cell(stats):
    return f"{stats['min_ms']:.1f} / {stats['max_ms']:.1f}"


def rate_cell(stats):
    return f"{stats['gflops']:.1f} ({100 * stats['fraction_of_peak']:.0f}%)"


def print_config(name, result):
    """One column per runner; the ratio rows divide each tinyvit runner's figure by
    the reference runner's named in the row."""
    names, references = result["runners"], ratio_references(result["runners"])

    def row(label, cell):
        return [label] + [cell(n) for n in names]

    def ratio_rows(label, key):
        return [row(f"{label} / {display(ref)}",
                    lambda n: "" if n in (ref, "torch")
                    else fmt(result[n]["ratio_to"][ref][key], ".2f"))
                for ref in references]

    rows = []
    for phase in ("train", "infer"):
        rows += [row(f"{phase} ms, median", lambda n: fmt(result[n][phase]["median_ms"])),
                 row(f"{phase} ms, min / max", lambda n: spread_cell(result[n][phase])),
                 row(f"{phase} images/s", lambda n: fmt(result[n][phase]["images_per_s"], ".0f")),
                 row(f"{phase} GFLOP/s (% peak)", lambda n: rate_cell(result[n][phase])),
                 *ratio_rows(f"{phase} ms", f"{phase}_ms")]
    for phase in ("train", "infer"):
        rows.append(row(f"{phase} peak memory MB", lambda n: memory_cell(result, n, phase)))
    for phase in ("train", "infer"):
        rows += ratio_rows(f"{phase} peak MB", f"{phase}_peak_mb")
    print(f"\nconfig {name}: {result['config']}, batch {result['batch']}")
    flops = result["forward_matmul_flops"]
    print(f"  {result['params']:,} parameters; matmul FLOPs per batch, forward (train step 3x): "
          + ", ".join(f"{display(n)} {flops[n] / 1e9:.2f} G" for n in names))
    print(render(rows, [""] + [display(n) for n in names], "l" + "r" * len(names)))
    trained = result["loss_after_training"]
    print(f"  loss after {trained['steps']} train steps on the batch: "
          + ", ".join(f"{display(n)} {trained[n]:.5f}" for n in names))


def print_summary(results, peaks):
    """One row per config and runner."""
    references = ratio_references(next(iter(results.values()))["runners"])
    ratio_columns = [f"/ {display(ref)}" for ref in references]
    groups = [("", ["config", "runner"]), ("train ms", ["median", *ratio_columns]),
              ("infer ms", ["median", *ratio_columns]), ("train", ["GFLOP/s (% peak)"]),
              ("peak MB", ["train", "infer"])]
    header = [col for _, cols in groups for col in cols]
    rows = []
    for config, r in results.items():
        for name in r["runners"]:
            row = [config, display(name)]
            for phase in ("train", "infer"):
                row.append(fmt(r[name][phase]["median_ms"]))
                row += ["" if ref == name or name == "torch"
                        else fmt(r[name]["ratio_to"][ref][f"{phase}_ms"], ".2f")
                        for ref in references]
            row.append(rate_cell(r[name]["train"]))
            row += [memory_cell(r, name, phase) for phase in ("train", "infer")]
            rows.append(row)
    print("\nsummary (/ X = median time over X's: above 1, slower than X; % of the "
          f"{backend.get_backend()} matmul peak; peaks, best of start and end: "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()) + ")")
    print(render(rows, header, "ll" + "r" * (len(header) - 2), [(t, len(c)) for t, c in groups]))


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def setup_backends(gpu):
    """Select the array backend and torch's threads, and keep freed memory in this
    process as train_mnist.py does (both frameworks share it); exit with a clear
    message when GPU mode lacks CuPy or CUDA."""
    allocator.keep_freed_memory()
    if gpu:
        try:
            backend.set_backend("cupy")
        except backend.BackendError as e:
            sys.exit(f"--gpu: {e}")
        if torch and not torch.cuda.is_available():
            sys.exit(f"--gpu: PyTorch {torch.__version__} sees no CUDA device (a CPU-only build?); "
                     "install a CUDA build of torch, or drop --gpu")
        if torch:  # plain float32 as tinyvit computes it: cuDNN's convolutions default to TF32
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    elif torch:
        torch.set_num_threads(blas_threads())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="A,B,C", help="comma-separated config names (A, B, C)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every turn")
    p.add_argument("--memory-steps", type=int, default=3, help="steps per memory subprocess")
    p.add_argument("--quick", action="store_true", help="config A, few steps: a smoke test for CI")
    p.add_argument("--gpu", action="store_true", help="tinyvit on CuPy against torch on CUDA")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes of each --tiers runner (tinyvit.parallel; memory: "
                        "summed over all processes); not the --baseline runner, which keeps "
                        "one process")
    p.add_argument("--tiers", default="fast",
                   help="comma-separated tiers of tinyvit's layers to time, one runner each: "
                        "fast (named tinyvit), reference (tinyvit-reference); the first is "
                        "what the other runners are checked against and divided by")
    p.add_argument("--baseline", metavar="DIR", type=Path,
                   help="also time tinyvit from the source tree DIR (holding tinyvit/), e.g. "
                        "a git worktree of an older commit, in one child process with this "
                        "process's BLAS thread count; its memory is not measured")
    p.add_argument("--baseline-label", metavar="LABEL",
                   help="the baseline runner is named tinyvit@LABEL (default: DIR's name)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    p.add_argument("--baseline-worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, least in (("batch", 1), ("steps", 1), ("rounds", 1), ("memory_steps", 1),
                        ("workers", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be at least {least}, "
                    f"got {getattr(args, name)}")
    if args.gpu and args.workers > 1:
        p.error("--workers splits batches over CPU processes; on a GPU tinyvit runs one process")
    args.tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    tiers = set(args.tiers)
    if not tiers or tiers - set(RUNNER_NAMES) or len(tiers) < len(args.tiers):
        p.error(f"--tiers: expected distinct names among {', '.join(RUNNER_NAMES)}, "
                f"got {','.join(args.tiers) or 'none'}")
    for flag, root in (("--baseline", args.baseline), ("--baseline-worker", args.baseline_worker)):
        if root and not (root / "tinyvit" / "__init__.py").is_file():
            p.error(f"{flag}: expected a source tree holding tinyvit/__init__.py, got {root}")
    if args.baseline_label and not args.baseline:
        p.error(f"--baseline-label names the --baseline runner; got {args.baseline_label!r} "
                "without --baseline")
    if args.baseline and args.gpu:
        p.error("--baseline runs its child on the CPU; drop --gpu to time it")
    if args.baseline:
        args.baseline_label = args.baseline_label or args.baseline.resolve().name
    if args.quick:
        args.configs, args.steps, args.rounds, args.warmup, args.memory_steps = "A", 2, 1, 1, 1
    args.configs = [c.strip().upper() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown config(s) {unknown}; known: {', '.join(CONFIGS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        return memory_worker(args.memory_worker, args.batch, args.memory_steps, args.gpu,
                             args.workers)
    if args.baseline_worker:
        return baseline_worker(args.baseline_worker, args.configs[0], args.batch)
    setup_backends(args.gpu)
    report = machine_report(args.gpu)
    print_machine(report)
    if torch is None:
        print("PyTorch not found: no PyTorch runner (to compare, pip install torch==2.13.0)")
    repeats = 3 if args.quick else 10
    n, peaks_before = matmul_peaks(args.gpu, repeats)
    print(f"float32 matmul peak ({n}x{n}, best of {repeats}): "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks_before.items())
          + " (measured again at the end)")
    print(f"timing: {args.rounds} interleaved round(s); each turn {args.warmup} untimed step(s), "
          f"then {args.steps} timed; "
          f"memory: fresh subprocess per runner, config and phase, {args.memory_steps} step(s)")
    print("tinyvit runners: " + ", ".join(RUNNER_NAMES[t] for t in args.tiers)
          + (f"; tinyvit@{args.baseline_label} from {args.baseline} in a child process of "
             f"its own (memory {NOT_MEASURED})" if args.baseline else ""))
    if args.workers > 1:
        print(f"each tier's runner uses {args.workers} worker processes of one BLAS thread each "
              "(tinyvit.parallel); its memory figures are summed over them and the parent")
    print()
    results = {name: run_config(name, args) for name in args.configs}
    _, peaks_after = matmul_peaks(args.gpu, repeats)
    peaks = {k: max(v, peaks_after[k]) for k, v in peaks_before.items()}
    add_fractions_of_peak(results, peaks[backend.get_backend()])
    warn_if_busy()
    for name, result in results.items():
        print_config(name, result)
    print_summary(results, peaks)
    if args.json:
        settings = {k: getattr(args, k)
                    for k in ("configs", "batch", "steps", "rounds", "warmup", "memory_steps",
                              "gpu", "quick", "workers", "tiers", "baseline_label")}
        settings["baseline"] = str(args.baseline.resolve()) if args.baseline else None
        payload = {"machine": report, "settings": settings, "matmul_peak_size": n,
                   "matmul_peak_gflops": {"used": peaks, "before": peaks_before,
                                          "after": peaks_after},
                   "configs": results}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
