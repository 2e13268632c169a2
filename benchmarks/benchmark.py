"""tinyvit against PyTorch eager: training-step and inference speed, FLOP rate, peak memory.

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
    --json FILE      the same figures as JSON

What is measured, for each config, with the same float32 batch and weights
(the torch model is ``tests/torch_reference.torch_vit_from(model, float32)``):

- train step: ``zero_grad``, forward, softmax cross-entropy with label
  smoothing 0.1, backward, AdamW (lr 1e-3, weight decay 0.05 on Linear and
  patch-embedding weights only: tinyvit's flat decay mask, torch param groups);
- inference: tinyvit ``model.eval()`` then ``model.forward(x)``; torch
  ``model.eval()`` under ``torch.inference_mode()``.

Before timing, one batch goes through both models: logits (train and eval
mode) must agree to 1e-4 of their scale and the losses to 1e-5, or the script
aborts. Timing then runs in this process, interleaved: each round times
``--steps`` train steps of tinyvit, then of torch, then inference of each, so
both see the same machine state; medians (and min/max) are over all rounds.
Each turn (one framework's steps of one phase in one round) starts with
``--warmup`` untimed steps. The first step after the other framework's turn
pays for that turn: on config A with two workers, tinyvit's first training step
took 34 ms after 0.3 s of PyTorch training, 28 ms after 0.3 s of sleep and 25 ms
with nothing in between (PyTorch's threads spin on after its last operation, and
the workers wake from sleep with cold caches), and PyTorch's first step was
3-14% slower than its next ones. A training loop runs its steps back to back,
so neither framework's step includes that.
Each step is timed alone (``perf_counter``; on GPU between synchronizations).
Both models train on the same batch from the same weights for the same number
of steps, so their final losses are printed side by side: a check that the
backward passes and the AdamW steps agree too.
Both sides use the same thread count: torch.set_num_threads(number of OpenBLAS
threads), and the same allocator settings: this process, like train_mnist.py,
calls ``allocator.keep_freed_memory()`` (glibc keeps freed arrays' pages for reuse).

GFLOP/s counts only the model's matmuls, from the config (``matmul_flops``), each
framework its own: under class-token pooling tinyvit's last block computes the
class token's row alone (the other rows never reach the head), PyTorch's every row;
the fraction is of the float32 matmul peak of a large square matmul in NumPy
(2048^2, best of 10; CuPy and 8192^2 on GPU), measured before and after the
configs and the higher kept (another process can take a core for a while);
torch's peak is printed for reference. The tables are printed at the end,
once the peak is known.

Peak memory is measured in a fresh subprocess per (framework, config, train or
inference), so that neither framework's allocator state nor the other's
buffers count. The subprocess first runs one throwaway step on a 2-image batch
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
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # torch_reference.py lives with the tests

import tinyvit  # noqa: E402
from tinyvit import allocator, backend  # noqa: E402
from tinyvit.layers import ClassAttentionBlock  # noqa: E402
from tinyvit.loss import SoftmaxCrossEntropy, loss_and_gradients  # noqa: E402
from tinyvit.model import ViT, ViTConfig  # noqa: E402
from tinyvit.optim import AdamW  # noqa: E402
from tinyvit.parallel import DataParallel  # noqa: E402

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


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def processor_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
# The two models, behind one interface
# ---------------------------------------------------------------------------


def make_batch(config, batch):
    """A fixed float32 batch of normalized-looking images and integer labels (host)."""
    rng = np.random.default_rng(1)
    shape = (batch, config.in_channels, config.image_size, config.image_size)
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, config.num_classes, batch)


class TinyvitRunner:
    """tinyvit in this process, or with ``workers > 1`` its training step and inference
    split over worker processes (``tinyvit.parallel``, as ``train_mnist.py`` trains)."""

    name = "tinyvit"

    def __init__(self, config, images, labels, workers=1):
        self.model = ViT(config, seed=0, dtype=np.float32)
        self.x, self.y = backend.to_device(images), backend.to_device(labels)
        self.loss_fn = SoftmaxCrossEntropy(label_smoothing=LABEL_SMOOTHING)
        self.optimizer = None
        self.workers, self.parallel = workers, None

    def decay_names(self):
        """State-dict keys of the parameters AdamW decays (state_dict follows parameters())."""
        return {k for k, p in zip(self.model.state_dict(), self.model.parameters()) if p.decay}

    def start_workers(self):
        """With ``workers > 1``, start them (once)."""
        if self.workers > 1 and self.parallel is None:
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


def build_runners(config, batch, gpu, workers=1):
    images, labels = make_batch(config, batch)
    tv = TinyvitRunner(config, images, labels, workers)
    pt = TorchRunner(tv.model, tv.decay_names(), images, labels, gpu) if torch else None
    return tv, pt


def check_same_function(tv, pt):
    """Abort unless both models give the same logits (train and eval mode) and loss."""
    worst = {}
    for mode in (True, False):
        tv.set_training(mode)
        pt.set_training(mode)
        (a, loss_a), (b, loss_b) = tv.logits_and_loss(), pt.logits_and_loss()
        scale = max(float(np.abs(b).max()), 1e-30)
        rel, dloss = float(np.abs(a - b).max()) / scale, abs(loss_a - loss_b)
        label = "train" if mode else "eval"
        worst[label] = {"logits_rel_diff": rel, "loss_diff": dloss}
        if not (rel < LOGITS_TOL and dloss < LOSS_TOL):
            sys.exit(
                f"ABORT: tinyvit and PyTorch compute different things ({label} mode):\n"
                f"  logits max abs diff / max |logit| = {rel:.3e} (must be < {LOGITS_TOL:g})\n"
                f"  loss: tinyvit {loss_a:.8f}, torch {loss_b:.8f}, diff {dloss:.3e} "
                f"(must be < {LOSS_TOL:g})"
            )
    return worst


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
    runner.set_training(phase == "train")
    fn = runner.train_step if phase == "train" else runner.infer
    return time_calls(fn, n, runner.sync)


def time_interleaved(runners, steps, rounds, warmup):
    """{(framework, phase): [ms, ...]}: each round runs every runner's train steps,
    then every runner's inference, so the frameworks alternate throughout. Every
    turn starts with ``warmup`` untimed steps: the first steps after the other
    framework's turn run slow (its threads may still spin, and the caches hold its
    data), which is a cost of interleaving, not of either framework's step."""
    times = {(r.name, phase): [] for r in runners for phase in ("train", "infer")}
    for _ in range(rounds):
        for phase in ("train", "infer"):
            for r in runners:
                timed_phase(r, phase, warmup)
                times[r.name, phase] += timed_phase(r, phase, steps)
    return times


# ---------------------------------------------------------------------------
# Peak memory, in a fresh process per (framework, config, phase)
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
    images, labels = make_batch(config, batch)
    runner = TinyvitRunner(config, images, labels, workers)
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
    """Subprocess body: build one framework's model and batch, set the baseline,
    run a few steps of one phase, print the peak growth as JSON."""
    framework, name, phase = spec.split(":")
    setup_backends(gpu)
    config = CONFIGS[name]
    one_step(make_runner(framework, config, 2, gpu), phase)  # page in code, one-time setup
    gc.collect()
    runner = make_runner(framework, config, batch, gpu, workers)
    pids = []
    if framework == "tinyvit" and workers > 1:
        runner.start_workers()
        runner.parallel.forward(runner.x[:2])  # the workers page in their code
        pids = [p.pid for p in runner.parallel.processes]
    if not gpu:
        meter = HostMemory(pids)
    else:
        meter = CupyMemory() if framework == "tinyvit" else TorchCudaMemory()
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
        for framework in ("tinyvit", "torch"):
            for phase in ("train", "infer"):
                s = get(result, framework, phase)
                if s is not None:
                    s["fraction_of_peak"] = s["gflops"] / peak


def run_config(name, args):
    config = CONFIGS[name]
    print(f"running config {name} (timing, then memory subprocesses)")
    tv, pt = build_runners(config, args.batch, args.gpu, args.workers)
    runners = [tv] + ([pt] if pt else [])
    check = check_same_function(tv, pt) if pt else None
    if not check:
        print("  (PyTorch not found: no cross-check, tinyvit alone)")
    else:
        print("  same function: logits rel diff {:.1e} (train) {:.1e} (eval), loss diff {:.1e}"
              .format(check["train"]["logits_rel_diff"], check["eval"]["logits_rel_diff"],
                      check["train"]["loss_diff"]))
    for r in runners:
        r.prepare_training()
    try:
        times = time_interleaved(runners, args.steps, args.rounds, args.warmup)
    finally:
        tv.close()
    # torch computes every token in every block; tinyvit's last block, under class-token
    # pooling, only the class token's row (the rest never reaches the head)
    last_rows = 1 if isinstance(tv.model.blocks[-1], ClassAttentionBlock) else None
    forward = {"tinyvit": matmul_flops(config, args.batch, last_rows),
               "torch": matmul_flops(config, args.batch)}
    result = {"config": describe(config), "params": tv.model.num_parameters(), "batch": args.batch,
              "forward_matmul_flops": forward,
              "train_matmul_flops": {k: 3 * v for k, v in forward.items()},
              "check": check}
    for r in runners:
        result[r.name] = {
            "train": summarize(times[r.name, "train"], 3 * forward[r.name], args.batch),
            "infer": summarize(times[r.name, "infer"], forward[r.name], args.batch),
            "peak_memory": {phase: measure_memory(r.name, name, phase, args)
                            for phase in ("train", "infer")},
        }
    if pt and hasattr(pt, "last_loss"):
        result["loss_after_training"] = {"steps": args.rounds * (args.warmup + args.steps),
                                         "tinyvit": float(backend.to_host(tv.last_loss)),
                                         "torch": pt.last_loss.item()}
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
    return None if a is None or b is None else a / b


def get(result, framework, *keys):
    """result[framework][k1][k2]..., or None where torch is absent or memory failed."""
    value = result.get(framework)
    for k in keys:
        value = None if value is None else value.get(k)
    return value


def print_config(name, result):
    def row(label, key_path, spec=".1f", with_ratio=True):
        a, b = get(result, "tinyvit", *key_path), get(result, "torch", *key_path)
        return [label, fmt(a, spec), fmt(b, spec), fmt(ratio(a, b), ".2f") if with_ratio else ""]

    def spread(phase):
        return [f"{phase} ms, min / max"] + [
            "-" if get(result, f, phase) is None
            else f"{get(result, f, phase, 'min_ms'):.1f} / {get(result, f, phase, 'max_ms'):.1f}"
            for f in ("tinyvit", "torch")] + [""]

    def rate(phase):
        cells = []
        for f in ("tinyvit", "torch"):
            s = get(result, f, phase)
            cells.append("-" if s is None
                         else f"{s['gflops']:.1f} ({100 * s['fraction_of_peak']:.0f}%)")
        return [f"{phase} GFLOP/s (% peak)", *cells, ""]

    rows = []
    for phase in ("train", "infer"):
        rows += [row(f"{phase} ms, median", (phase, "median_ms")), spread(phase),
                 row(f"{phase} images/s", (phase, "images_per_s"), ".0f", False), rate(phase)]
    for phase in ("train", "infer"):
        rows.append(row(f"{phase} peak memory MB", ("peak_memory", phase, "peak_mb")))
    print(f"\nconfig {name}: {result['config']}, batch {result['batch']}")
    flops = result["forward_matmul_flops"]
    print(f"  {result['params']:,} parameters; matmul FLOPs per batch, forward (train step 3x): "
          f"tinyvit {flops['tinyvit'] / 1e9:.2f} G, PyTorch {flops['torch'] / 1e9:.2f} G")
    print(render(rows, ["", "tinyvit", "PyTorch", "tinyvit/PyTorch"], "lrrr"))
    trained = result.get("loss_after_training")
    # the same steps on the same batch from the same weights: a check of backward + AdamW
    if trained:
        print(f"  loss after {trained['steps']} train steps on the batch: "
              f"tinyvit {trained['tinyvit']:.5f}, "
              f"PyTorch {trained['torch']:.5f}")


def print_summary(results, peaks):
    groups = [("", ["config"]), ("train ms", ["tinyvit", "torch", "ratio"]),
              ("infer ms", ["tinyvit", "torch", "ratio"]),
              ("train GFLOP/s (% peak)", ["tinyvit", "torch"]),
              ("peak MB train", ["tinyvit", "torch"]), ("peak MB infer", ["tinyvit", "torch"])]
    header = [col for _, cols in groups for col in cols]
    rows = []
    for name, r in results.items():
        row = [name]
        for phase in ("train", "infer"):
            a, b = get(r, "tinyvit", phase, "median_ms"), get(r, "torch", phase, "median_ms")
            row += [fmt(a), fmt(b), fmt(ratio(a, b), ".2f")]
        for f in ("tinyvit", "torch"):
            s = get(r, f, "train")
            row.append("-" if s is None
                       else f"{s['gflops']:.0f} ({100 * s['fraction_of_peak']:.0f}%)")
        for phase in ("train", "infer"):
            row += [fmt(get(r, f, "peak_memory", phase, "peak_mb")) for f in ("tinyvit", "torch")]
        rows.append(row)
    print("\nsummary (ratio = tinyvit / PyTorch time: above 1, tinyvit is slower; % of the "
          f"{backend.get_backend()} matmul peak; peaks, best of start and end: "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()) + ")")
    print(render(rows, header, "l" + "r" * (len(header) - 1), [(t, len(c)) for t, c in groups]))


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
                   help="tinyvit's worker processes "
                        "(tinyvit.parallel; memory: summed over all processes)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, least in (("batch", 1), ("steps", 1), ("rounds", 1), ("memory_steps", 1),
                        ("workers", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be at least {least}, "
                    f"got {getattr(args, name)}")
    if args.gpu and args.workers > 1:
        p.error("--workers splits batches over CPU processes; on a GPU tinyvit runs one process")
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
    setup_backends(args.gpu)
    report = machine_report(args.gpu)
    print_machine(report)
    if torch is None:
        print("PyTorch not found: timing tinyvit alone (to compare, pip install torch==2.13.0)")
    repeats = 3 if args.quick else 10
    n, peaks_before = matmul_peaks(args.gpu, repeats)
    print(f"float32 matmul peak ({n}x{n}, best of {repeats}): "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks_before.items())
          + " (measured again at the end)")
    print(f"timing: {args.rounds} interleaved round(s); each turn {args.warmup} untimed step(s), "
          f"then {args.steps} timed; "
          f"memory: fresh subprocess per framework, config and phase, {args.memory_steps} step(s)")
    if args.workers > 1:
        print(f"tinyvit runs {args.workers} worker processes of one BLAS thread each "
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
                              "gpu", "quick", "workers")}
        payload = {"machine": report, "settings": settings, "matmul_peak_size": n,
                   "matmul_peak_gflops": {"used": peaks, "before": peaks_before,
                                          "after": peaks_after},
                   "configs": results}
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
