"""Peak memory of a runner's training steps or inference, each in a fresh process.

Peak memory is measured in a fresh subprocess per (runner, config, train or inference), so
that no runner's allocator state nor another's buffers count; the ``--baseline`` runner's is
not measured (shown as "not measured"). The subprocess (benchmark.py with
``--memory-worker``) first runs one throwaway step on a 2-image batch (so library code paged
in on first use and one-time set-up are not counted), builds the model and the batch, takes
its RSS as the baseline and resets the peak-RSS mark (``/proc/self/clear_refs``;
``ru_maxrss`` cannot serve here, as in a subprocess it keeps the forked parent's peak), then
builds the optimizer and runs a few steps. The figure is peak RSS (VmHWM) minus the baseline:
activations, gradients, optimizer state and temporaries, not the weights or the libraries.
Where /proc is missing it falls back to ``ru_maxrss`` minus its value at the baseline.

With ``--workers N`` tinyvit's figure is the sum over the parent and its N workers: the
workers are started and run one 2-image inference before the baseline (each then holds its
libraries and its replica of the weights), and each process's peak growth over its own
baseline is added. Shared pages a worker first touches during the steps (its rows of the
batch, its gradient slot) count in its growth although the parent's baseline already holds
them, so the sum overstates by up to one gradient per worker.

On GPU: CuPy's memory-pool footprint (all blocks freed first) against
``torch.cuda.max_memory_allocated``, both over the bytes in use at the baseline (the pool
figure includes blocks cached but not in use, so it is an upper bound where torch's is exact).
"""

import gc
import json
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from machine import setup_backends, torch
from runners import CONFIGS, SCRIPT, BaselineRunner, TinyvitRunner, make_runner

NOT_MEASURED = "not measured"  # the baseline's peak memory


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
    command = [sys.executable, str(SCRIPT), "--memory-worker", f"{framework}:{name}:{phase}",
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


def peak_memory(runner, name, args):
    """{phase: measure_memory's figure} of one runner on config ``name``; NOT_MEASURED
    for the baseline. The two phases' subprocesses run side by side (each figure is its
    own process's, and nothing is timed)."""
    if isinstance(runner, BaselineRunner):
        return NOT_MEASURED
    with ThreadPoolExecutor(2) as pool:
        figures = {phase: pool.submit(measure_memory, runner.name, name, phase, args)
                   for phase in ("train", "infer")}
    return {phase: figure.result() for phase, figure in figures.items()}
