"""tinyvit on one GPU in one command: the tests, the benchmarks and a CIFAR-10 run, timed.

On a machine with one NVIDIA GPU, CuPy (cupy-cuda13x), PyTorch and pytest, from the
repository's root (tinyvit need not be installed: every phase runs with this tree on
PYTHONPATH), three commands of at most 9 minutes each (the phases' allowances below add
up to that): the tests, the batch-128 benchmark and the launch counts; the batch-1024
benchmark; the training:

    python benchmarks/gpu_check.py --out OUT --phases environment fast-tests benchmark-128 \\
        launches gpu-tests
    python benchmarks/gpu_check.py --out OUT2 --phases environment benchmark-1024
    python benchmarks/gpu_check.py --out OUT3 --data-dir data --phases environment cifar10

and where there is no GPU, the same path on NumPy at tiny sizes (CI runs it):

    python benchmarks/gpu_check.py --out OUT --dry-run

The phases, each a child process, in this order (``--phases`` picks some):

    environment     the GPU, its driver, CUDA, CuPy, NumPy, PyTorch, the processor, the
                    cuBLAS library tinyvit's binding found (one product against CuPy's),
                    and a CUDA graph captured and replayed (against its calls run as
                    they are)
    fast-tests      python -m pytest -q tests/test_fast.py: each fast kernel against its
                    reference layer, on NumPy and CuPy
    benchmark-128   benchmarks/benchmark.py --gpu --configs A,B,C --batch 128 --tiers
                    fast,graph (TF32 off in both frameworks): the fast tier, and the fast
                    tier captured in CUDA graphs, against PyTorch eager
    launches        benchmarks/launches.py: kernel launches per training step, the
                    reference tier against the fast tier and the captured fast tier
                    (configs A, B, C at batch 128)
    gpu-tests       python -m pytest -q -m gpu: every test of the suite run on CuPy (in
                    8 processes where pytest-xdist is installed)
    benchmark-1024  benchmark-128's command at batch 1024
    cifar10         CUPY_TF32=1 python train_mnist.py --recipe cifar10-gpu --budget MINUTES,
                    MINUTES what the budget has left (``--recipe`` another recipe,
                    ``--cuda-graph`` with the step captured in a CUDA graph)

They share one budget (``--budget``, 540 s): each phase may run for as long as
``PHASES`` gives it and is killed after that, and a phase that needs more than is left
is skipped, with its reason. ``cifar10`` takes all that is left (train_mnist.py plans
its epochs after the first so that the run ends in time). A failed phase does not stop
the ones after it, with one exception: where the environment phase finds that tinyvit's
cuBLAS binding fails on the GPU (or multiplies wrong), every later phase, all of which run
the GPU tier's matmuls through it, is skipped with that reason; where it finds that
capturing a CUDA graph fails, the benchmark and launch phases leave the graph tier out.
``--dry-run`` runs the same phases at tiny sizes on NumPy: the GPU tests collected and
skipped, tests/test_fast.py on NumPy, ``benchmark.py --quick`` at batches 8 and 64, and
one epoch of MNIST on 512 images from ``--data-dir``.

What it writes in OUT: ``summary.json`` (rewritten after each phase: the date, the
machine, and per phase its command, status ok, failed or skipped with the reason,
seconds and the figures read from its output), ``PHASE.log`` per phase that ran (its
command, then its stdout and stderr), ``environment.json``, ``launches.json``,
``benchmark-128.json`` and ``benchmark-1024.json`` (benchmark.py's own JSON), and
``cifar10/`` (train_mnist.py's metrics.json, curves, confusion matrix and checkpoints).
It prints a line per phase as it ends.

CIFAR-10's binary files are 177 MB. Where a copy to the GPU machine holds at most 64 MiB
(the repository is about 1 MB), they travel in parts of at most 59 MiB, each with its
SHA-256 in a manifest, into ``data/`` (ignored by git):

    python benchmarks/gpu_check.py --split-cifar ../shared/data data/cifar-10-parts
    # copy data/cifar-10-parts/manifest.json with the first part, then one part per copy,
    # into data/cifar-10-parts/ on the GPU machine; then, there, in one command:
    python benchmarks/gpu_check.py --join-cifar data/cifar-10-parts data && \\
        python benchmarks/gpu_check.py --out OUT --data-dir data --phases environment cifar10

``--join-cifar`` checks every part's SHA-256 before it writes anything, then every whole
file's, and that ``data/cifar-10/`` holds the files tinyvit.data reads.
"""

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's tinyvit, installed or not

from tinyvit.data import DATASETS  # noqa: E402
from tinyvit.data.fetch import CHUNK_BYTES, file_digest  # noqa: E402
from tinyvit.files import atomic_write  # noqa: E402

CIFAR_MARGIN_S = 30  # of the cifar10 phase's time: starting Python and CuPy, the final report
THRESHOLDS = (0.85, 0.88, 0.90)  # test accuracies whose first elapsed seconds are recorded
DRY_BATCH_DIVISOR = 16  # the dry run's benchmark batches: 128 / 16 and 1024 / 16
PART_MIB = 59  # CIFAR-10's parts: two 30.7 MB batch files each, under a 64 MiB copy
XDIST_WORKERS = 8  # the gpu tests' processes, which share the GPU
PRODUCTS_AGREE = 1e-2  # the environment's checks, relative: TF32's rounding is 1e-3, a wrong
#                       product's error its whole size
UNSET_FOR_BENCHMARK = ("CUPY_TF32", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


class Skip(Exception):
    """A phase that cannot run, and why."""


class PartsError(ValueError):
    """Parts of a dataset, or the files joined from them, are not what their manifest says."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A child process: its arguments ("python" is this interpreter) and the environment
    variables it sets (None: unset)."""

    argv: list
    env: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        """The command as a person would type it."""
        changes = [f"-u {k}" for k, v in self.env.items() if v is None]
        changes += [f"{k}={v}" for k, v in self.env.items() if v is not None]
        return " ".join((["env", *changes] if changes else []) + [shlex.join(self.argv)])


@dataclasses.dataclass(frozen=True)
class Phase:
    """A step of the check: ``command(args, timeout)`` gives its Command (or raises Skip),
    ``figures(args, log)`` reads what it wrote (None where it wrote nothing). It needs
    ``seconds`` of the budget and is killed after them, or with ``rest`` after all the
    budget that is left."""

    name: str
    seconds: float
    command: object
    figures: object
    rest: bool = False


# --------------------------------------------------------------------------- the phases


def environment_command(args, timeout):
    return Command(["python", "benchmarks/gpu_check.py", "--environment",
                    str(args.out / "environment.json")] + (["--dry-run"] if args.dry_run else []))


def environment_figures(args, log):
    path = args.out / "environment.json"
    return json.loads(path.read_text()) if path.is_file() else None


def gpu_tests_command(args, timeout):
    """The suite's gpu tests (on the dry run too: there they are collected and skipped),
    in XDIST_WORKERS processes where pytest-xdist is installed."""
    workers = ["-n", str(XDIST_WORKERS)] if importlib.util.find_spec("xdist") else []
    return Command(["python", "-m", "pytest", "-q", "-m", "gpu", *workers])


def fast_tests_command(args, timeout):
    numpy_only = ["-k", "not cupy"] if args.dry_run else []
    return Command(["python", "-m", "pytest", "-q", "tests/test_fast.py", *numpy_only])


PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?)\b")
PYTEST_SECONDS = re.compile(r" in ([\d.]+)s\b")


def launches_command(args, timeout):
    return Command(["python", "benchmarks/launches.py", "--json", str(args.out / "launches.json"),
                    "--tiers", ",".join(tiers(args, ("reference", "fast", "graph")))]
                   + (["--dry-run"] if args.dry_run else []))


def tiers(args, wanted):
    """The tiers of ``wanted`` that this GPU runs: all, or all but the graph tier where
    the environment phase found that capturing a CUDA graph fails."""
    return [t for t in wanted if t != "graph" or not args.graph_problem]


def launches_figures(args, log):
    path = args.out / "launches.json"
    return json.loads(path.read_text()) if path.is_file() else None


def pytest_figures(args, log):
    """The counts of pytest's last summary line, its seconds, and its FAILED and ERROR lines."""
    lines = log.read_text(errors="replace").splitlines()
    summary = next((line for line in reversed(lines)
                    if PYTEST_COUNT.search(line) and PYTEST_SECONDS.search(line)), None)
    if summary is None:
        return None
    figures = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for count, outcome in PYTEST_COUNT.findall(summary):
        figures["errors" if outcome.startswith("error") else outcome] = int(count)
    figures["pytest_s"] = float(PYTEST_SECONDS.search(summary).group(1))
    figures["failures"] = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return figures


def benchmark(batch):
    """The command and figures of benchmark.py at ``batch`` on the GPU (configs A, B and
    C), or quick on the CPU at batch / DRY_BATCH_DIVISOR; CUPY_TF32 is unset, and --gpu
    turns PyTorch's TF32 off."""
    name = f"benchmark-{batch}"

    def command(args, timeout):
        sizes = (["--quick", "--batch", str(batch // DRY_BATCH_DIVISOR)] if args.dry_run
                 else ["--gpu", "--configs", "A,B,C", "--batch", str(batch)])
        return Command(["python", "benchmarks/benchmark.py", *sizes, "--tiers",
                        ",".join(tiers(args, ("fast", "graph"))),
                        "--json", str(args.out / f"{name}.json")],
                       dict.fromkeys(UNSET_FOR_BENCHMARK))

    def figures(args, log):
        path = args.out / f"{name}.json"
        return benchmark_figures(json.loads(path.read_text()), args) if path.is_file() else None

    return command, figures


def benchmark_figures(result, args):
    """benchmark.py's JSON as the docs' tables show it: per config, each framework's
    medians, rates and peaks, and tinyvit's time over PyTorch's."""
    tf32 = ("none: float32 on the CPU" if args.dry_run
            else "off in both frameworks (CUPY_TF32 unset; benchmark.py --gpu turns PyTorch's off)")
    return {"tf32": tf32,
            "matmul_peak_gflops": rounded(result["matmul_peak_gflops"]["used"], 0),
            "configs": {name: config_figures(config) for name, config in result["configs"].items()}}


def config_figures(config):
    figures = {"batch": config["batch"], "params": config["params"]}
    for runner in config["runners"]:
        r = config[runner]
        figures[runner] = {
            "train_ms": rounded(r["train"]["median_ms"], 2),
            "infer_ms": rounded(r["infer"]["median_ms"], 2),
            "train_images_per_s": rounded(r["train"]["images_per_s"], 0),
            "train_gflops": rounded(r["train"]["gflops"], 0),
            "train_fraction_of_peak": rounded(r["train"]["fraction_of_peak"], 3),
            "peak_mb": {phase: rounded(r["peak_memory"][phase].get("peak_mb"), 1)
                        for phase in ("train", "infer")},
        }
    for runner in ("tinyvit", "tinyvit-graph"):
        ratios = config.get(runner, {}).get("ratio_to", {}).get("torch")
        if ratios:
            figures[f"{runner}_over_torch"] = {k: rounded(ratios[k], 2)
                                               for k in ("train_ms", "infer_ms")}
    if "torch" in config["check"]["runners"]:
        figures["logits_rel_diff"] = config["check"]["runners"]["torch"]["train"]["logits_rel_diff"]
    return figures


def rounded(value, digits):
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return None if value is None else round(value, digits)


def cifar10_command(args, timeout):
    """The cifar10-gpu recipe for what the budget has left, or on the dry run one epoch of
    MNIST on NumPy; a Skip when the data is not under --data-dir."""
    dataset = "mnist" if args.dry_run else "cifar10"
    problem = layout_problem(args.data_dir / DATASETS[dataset].folder, dataset)
    if problem:
        join = "" if args.dry_run else " (join its parts with --join-cifar first)"
        raise Skip(f"no {dataset} under --data-dir {args.data_dir}{join}: {problem}")
    common = ["--data-dir", str(args.data_dir), "--out", str(args.out / "cifar10")]
    if args.dry_run:
        return Command(["python", "train_mnist.py", "--dataset", "mnist", *common,
                        "--train-subset", "512", "--test-subset", "200", "--epochs", "1",
                        "--backend", "numpy", "--workers", "1"])
    minutes = math.floor((timeout - CIFAR_MARGIN_S) / 6) / 10
    graph = ["--cuda-graph"] if args.cuda_graph else []
    return Command(["python", "train_mnist.py", "--recipe", args.recipe, *common, *graph,
                    "--budget", f"{minutes:g}"], {"CUPY_TF32": "1"})


def cifar10_figures(args, log):
    path = args.out / "cifar10" / "metrics.json"
    return training_figures(json.loads(path.read_text())["epochs"]) if path.is_file() else None


def training_figures(rows):
    """From metrics.json's rows: the final and best test accuracy, images/s, the epochs,
    and the elapsed seconds (metrics.json's: training and test evaluations) of the first
    evaluated epoch at or above each of THRESHOLDS (None: never)."""
    evaluated = [row for row in rows if row["test_acc"] is not None]
    later = [row["images_per_s"] for row in rows[1:]]  # the first epoch compiles CuPy's kernels
    figures = {
        "epochs": len(rows),
        "final_test_acc": rows[-1]["test_acc"],
        "best_test_acc": max((row["test_acc"] for row in evaluated), default=None),
        "images_per_s": {"first_epoch": rounded(rows[0]["images_per_s"], 0),
                         "median_after_first": rounded(statistics.median(later), 0)
                         if later else None},
        "elapsed_s": rounded(rows[-1]["elapsed_s"], 1),
        "reached": {f"{t:.0%}": first_reaching(evaluated, t) for t in THRESHOLDS},
        "evaluated_epochs": [row["epoch"] for row in evaluated],
    }
    if len(evaluated) < len(rows):
        figures["note"] = evaluation_note(figures["evaluated_epochs"], len(rows))
    return figures


def first_reaching(evaluated, accuracy):
    """The epoch and elapsed seconds of the first row at or above ``accuracy``, or None."""
    row = next((row for row in evaluated if row["test_acc"] >= accuracy), None)
    return row and {"epoch": row["epoch"], "elapsed_s": rounded(row["elapsed_s"], 1)}


def evaluation_note(epochs, total):
    gap = max(b - a for a, b in zip([0, *epochs], epochs))
    return (f"the test set was evaluated after {len(epochs)} of the {total} epochs (eval_every): "
            f"a threshold reached in an unevaluated epoch counts at the next evaluated one, up "
            f"to {gap - 1} epochs later")


# Each phase's seconds: its time on an H100 (docs/performance.md, "The phases' times") with
# room to spare for the runner and the tier timed since. cifar10 needs time for its first
# epoch, which compiles CuPy's kernels, and a few more.
PHASES = [
    Phase("environment", 30, environment_command, environment_figures),
    Phase("fast-tests", 60, fast_tests_command, pytest_figures),
    Phase("benchmark-128", 180, *benchmark(128)),
    Phase("launches", 60, launches_command, launches_figures),
    Phase("gpu-tests", 200, gpu_tests_command, pytest_figures),
    Phase("benchmark-1024", 240, *benchmark(1024)),
    Phase("cifar10", 150, cifar10_command, cifar10_figures, rest=True),
]


# --------------------------------------------------------------------------- running them


def timeout_for(phase, left):
    """The seconds ``phase`` may run with ``left`` seconds of the budget; Skip if too few."""
    if left < phase.seconds:
        raise Skip(f"needs {phase.seconds:.0f} s of the budget, {max(left, 0):.0f} s left")
    return left if phase.rest else phase.seconds


def run_phase(phase, args, left, blocked=None):
    """Run ``phase`` within ``left`` seconds, unless ``blocked`` says why it cannot run:
    its record for summary.json."""
    record = {"name": phase.name, "command": None, "status": "skipped", "reason": None,
              "exit_status": None, "seconds": 0.0, "timeout_s": None, "log": None,
              "figures": None}
    try:
        if blocked:
            raise Skip(blocked)
        timeout = timeout_for(phase, left)
        command = phase.command(args, timeout)
    except Skip as skip:
        record["reason"] = str(skip)
        return record
    log = args.out / f"{phase.name}.log"
    start = time.monotonic()
    code = run_logged(command, log, timeout)
    record.update(command=str(command), exit_status=code, log=log.name,
                  seconds=round(time.monotonic() - start, 1), timeout_s=round(timeout))
    record["status"], record["reason"] = outcome(code, timeout, log)
    try:
        record["figures"] = phase.figures(args, log)
    except (KeyError, ValueError, TypeError) as error:  # one phase's odd output ends no run
        record["reason"] = "; ".join(filter(None, [record["reason"],
                                                   f"its figures unreadable: {error!r}"]))
    return record


def outcome(code, timeout, log):
    if code is None:
        return "failed", f"killed after its {timeout:.0f} s"
    if code:
        return "failed", f"exit status {code} (see {log.name})"
    return "ok", None


def run_logged(command, log, timeout):
    """Run ``command`` from the repository's root with its output in ``log``; its exit
    status, or None when it ran past ``timeout`` seconds and it and its children were
    killed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name, value in command.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    argv = command.argv
    if argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    with open(log, "w") as out:
        out.write(f"$ {command}\n\n")
        out.flush()
        start = time.monotonic()
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # its own group: killed with its children
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # past its time, or this process interrupted
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                out.write(f"\ngpu_check.py: killed it after {time.monotonic() - start:.0f} s\n")


# the environment phase's checks, each (what its error means, what its difference means):
# "cublas", tinyvit's cuBLAS binding, which all the GPU tier's matmuls go through (where it
# fails, the phases after would spend their minutes failing); "graph", a CUDA graph's capture
# and replay (where it fails, the graph tier cannot be timed)
CHECKS = {"cublas": ("tinyvit's cuBLAS binding failed",
                     "tinyvit's cuBLAS binding's product differs from CuPy's by {:.1e} of its "
                     "largest entry"),
          "graph": ("capturing a CUDA graph failed",
                    "a replayed CUDA graph differs from its calls by {:.1e} of their largest "
                    "value")}


def environment_problem(records, check):
    """Why the environment phase's ``check`` (a key of CHECKS) failed, from its figures
    among ``records``; None where it passed, or before the phase ran."""
    found = environment_found(records)
    failed, differs = CHECKS[check]
    if f"{check}_error" in found:
        return f"{failed}: {found[check + '_error']} (environment.json)"
    if found.get(f"{check}_difference", 0.0) > PRODUCTS_AGREE:
        return f"{differs.format(found[check + '_difference'])} (environment.json)"
    return None


def environment_found(records):
    """The environment phase's figures among ``records`` ({} before it ran)."""
    return next((r["figures"] for r in records if r["name"] == "environment" and r["figures"]),
                {})


def machine_fields(records):
    """The host, and the GPU and processor that the environment phase found."""
    found = environment_found(records)
    return {"host": platform.node(), "platform": platform.platform(),
            "gpu": found.get("gpu"), "processor": found.get("processor")}


def check(args, argv):
    """Run the phases asked for within the budget; write summary.json after each. Returns
    the exit status: 1 if a phase failed, or tinyvit's cuBLAS binding did (which skips
    the phases after the environment's)."""
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    summary = {"date": time.strftime("%Y-%m-%d"), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "command": shlex.join(["python", "benchmarks/gpu_check.py", *argv]),
               "dry_run": args.dry_run, "budget_s": args.budget, "spent_s": 0.0,
               "machine": machine_fields([]), "phases": []}
    for phase in (p for p in PHASES if p.name in args.phases):
        args.graph_problem = environment_problem(summary["phases"], "graph")
        record = run_phase(phase, args, args.budget - (time.monotonic() - start),
                           environment_problem(summary["phases"], "cublas"))
        summary["phases"].append(record)
        summary["machine"] = machine_fields(summary["phases"])
        summary["spent_s"] = round(time.monotonic() - start, 1)
        with atomic_write(args.out / "summary.json") as f:
            f.write(json.dumps(summary, indent=1).encode())
        print_record(record, args.out)
    print(f"wrote {args.out / 'summary.json'}")
    return int(any(r["status"] == "failed" for r in summary["phases"])
               or environment_problem(summary["phases"], "cublas") is not None)


def print_record(record, out):
    """The phase's name, status, seconds, exit status and log (or why it was skipped)."""
    line = f"{record['name']:<15} {record['status']:<8}"
    if record["log"]:
        code = "-" if record["exit_status"] is None else record["exit_status"]
        line += f" {record['seconds']:6.1f} s  exit {code}  {out / record['log']}"
    if record["reason"]:
        line += f"  ({record['reason']})"
    print(line, flush=True)


# --------------------------------------------------------------------------- environment


def environment(path, dry_run):
    """Write the machine's GPU, driver, CUDA and versions to ``path`` (None where absent);
    exit status 1 when the GPU run finds no GPU."""
    # torch (imported by machine) and CuPy are imported here, in the child, never in the parent
    import numpy

    from machine import processor_model, torch

    found = {**gpu_fields(), "driver": nvidia_driver(), "numpy": numpy.__version__,
             "torch": torch.__version__ if torch else None,
             "torch_cuda": torch.version.cuda if torch else None,
             "python": platform.python_version(), "processor": processor_model(),
             "cores": os.cpu_count()}
    path.write_text(json.dumps(found, indent=1))
    for key, value in found.items():
        print(f"{key:<15} {value}")
    if found["gpu"] is None and not dry_run:
        cupy = found["cupy"] or "not installed: pip install cupy-cuda13x"
        print(f"expected a GPU that CuPy sees, found none (CuPy {cupy}); --dry-run runs the "
              "phases without one", file=sys.stderr)
        return 1
    return 0


def gpu_fields():
    """CuPy's version, the GPU's name and memory, and CUDA's driver and runtime versions."""
    fields = dict.fromkeys(("cupy", "gpu", "gpu_memory_gib", "cuda_driver", "cuda_runtime"))
    try:
        import cupy
    except ImportError:
        return fields
    fields["cupy"], runtime = cupy.__version__, cupy.cuda.runtime
    try:
        properties = runtime.getDeviceProperties(0)
    except runtime.CUDARuntimeError as error:
        print(f"CuPy sees no GPU: {error}")
        return fields
    return {**fields, "gpu": properties["name"].decode(),
            "gpu_memory_gib": round(properties["totalGlobalMem"] / 2**30, 1),
            "cuda_driver": cuda_version(runtime.driverGetVersion()),
            "cuda_runtime": cuda_version(runtime.runtimeGetVersion()), **cublas_fields(cupy),
            **graph_fields(cupy)}


def cublas_fields(cupy):
    """tinyvit's cuBLAS binding (tinyvit/fast/cublas.py) on this GPU, which the GPU
    tier's matmuls go through: the library it found and one product's largest
    difference from CuPy's (relative to its largest entry), or the error that stopped it."""
    from tinyvit import backend
    from tinyvit.fast import cublas

    try:
        with backend.using_backend("cupy"):
            a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4) / 7
            b = cupy.arange(20, dtype=cupy.float32).reshape(4, 5) / 3
            difference = relative_difference(cublas.matmul(a, b), a @ b)
            return {"cublas_library": cublas.current_handle().lib._name,
                    "cublas_difference": difference}
    except Exception as error:  # recorded, so that the run shows it first
        return {"cublas_error": f"{type(error).__name__}: {error}"}


def graph_fields(cupy):
    """tinyvit's CUDA graphs (tinyvit/fast/graphs.py) on this GPU: a cuBLAS product and
    an elementwise kernel captured, then replayed, against the same calls run as they
    are (the largest difference, relative), or the error that stopped the capture."""
    from tinyvit import backend
    from tinyvit.fast import cublas
    from tinyvit.fast.graphs import WARMUP, Captured

    try:
        with backend.using_backend("cupy"):
            step = Captured(lambda a, b: (cublas.matmul(a, b) * 2 + 1,))
            a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4) / 7
            for k in range(WARMUP + 2):  # run as they are, captured, then replayed
                b = cupy.arange(20, dtype=cupy.float32).reshape(4, 5) / (k + 1)
                (out,) = step(a, b)
            if step.captured != 1:
                return {"graph_error": f"expected 1 graph captured, got {step.captured}"}
            return {"graph_captured": step.captured,
                    "graph_difference": relative_difference(out, a @ b * 2 + 1)}
    except Exception as error:  # recorded: the benchmark and launch phases then leave it out
        return {"graph_error": f"{type(error).__name__}: {error}"}


def relative_difference(computed, expected):
    """The largest difference between two arrays, relative to expected's largest entry."""
    return float(abs(computed - expected).max() / abs(expected).max())


def cuda_version(number):
    return f"{number // 1000}.{number % 1000 // 10}"  # 13000 -> "13.0"


def nvidia_driver():
    """The NVIDIA driver's version, as nvidia-smi gives it, or None."""
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.split("\n")[0].strip() or None


# --------------------------------------------------------------------------- CIFAR-10 in parts


def layout_problem(folder, dataset):
    """None if ``folder`` holds every file of a layout of ``dataset`` that tinyvit.data
    reads; else what is missing from its first layout."""
    layouts = DATASETS[dataset].layouts
    names = [[name for split in layout.splits.values() for name in split] for layout in layouts]
    missing = [[name for name in files if not (folder / layout.subfolder / name).is_file()]
               for layout, files in zip(layouts, names)]
    if all(missing):
        return (f"expected {folder / layouts[0].subfolder} holding {', '.join(names[0])}; "
                f"missing {', '.join(missing[0])}")
    return None


def read_range(pieces, start, size):
    """Chunks of the bytes [start, start + size) of ``pieces``, (path, bytes) pairs laid
    end to end."""
    offset = 0
    for path, length in pieces:
        low, high = max(start, offset), min(start + size, offset + length)
        if low < high:
            with open(path, "rb") as f:
                f.seek(low - offset)
                while low < high:
                    chunk = f.read(min(CHUNK_BYTES, high - low))
                    if not chunk:
                        raise PartsError(f"{path}: expected {length} bytes, it ends before")
                    yield chunk
                    low += len(chunk)
        offset += length


def write_hashed(chunks, path, expected=None):
    """Write ``chunks`` to ``path`` whole or not at all; their SHA-256, which must be
    ``expected`` when given (else PartsError, and ``path`` is left as it was)."""
    digest = hashlib.sha256()
    with atomic_write(path) as f:
        for chunk in chunks:
            digest.update(chunk)
            f.write(chunk)
        if expected and digest.hexdigest() != expected:
            raise PartsError(f"{path}: expected SHA-256 {expected} (the manifest's), got "
                             f"{digest.hexdigest()} from the parts")
    return digest.hexdigest()


def split_cifar(data_dir, parts_dir, part_mib):
    """Cut the files of ``data_dir``/cifar-10, end to end, into parts of at most
    ``part_mib`` MiB in ``parts_dir``, with manifest.json: each file's and each part's
    size and SHA-256."""
    folder = data_dir / DATASETS["cifar10"].folder
    problem = layout_problem(folder, "cifar10")
    if problem:
        raise PartsError(f"--split-cifar: {problem}")
    held = sorted(p.name for p in parts_dir.iterdir()) if parts_dir.exists() else []
    if held:
        raise PartsError(f"--split-cifar: expected a new or empty folder for the parts, got "
                         f"{parts_dir} holding {', '.join(held)}")
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    files = [{"path": p.relative_to(folder).as_posix(), "bytes": p.stat().st_size,
              "sha256": file_digest(p)} for p in paths]
    part_bytes = int(part_mib * 2**20)
    total = sum(f["bytes"] for f in files)
    pieces = [(p, f["bytes"]) for p, f in zip(paths, files)]
    parts = []
    for index, start in enumerate(range(0, total, part_bytes)):
        name = f"{folder.name}.part{index + 1:02d}"
        size = min(part_bytes, total - start)
        sha = write_hashed(read_range(pieces, start, size), parts_dir / name)
        parts.append({"name": name, "bytes": size, "sha256": sha})
    manifest = {"folder": folder.name, "part_bytes": part_bytes, "files": files, "parts": parts}
    (parts_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {len(parts)} parts of {folder} ({total / 2**20:.1f} MiB in {len(files)} files) "
          f"and manifest.json to {parts_dir}:")
    for part in parts:
        print(f"  {part['name']}  {part['bytes']:,} bytes")


def checked_parts(parts_dir):
    """manifest.json of ``parts_dir`` and its parts' paths, each part's size and SHA-256
    checked; PartsError naming the first part missing or different."""
    path = parts_dir / "manifest.json"
    if not path.is_file():
        raise PartsError(f"--join-cifar: expected {path}, written by --split-cifar; no such file")
    manifest = json.loads(path.read_text())
    names = [part["name"] for part in manifest["parts"]]
    for part in manifest["parts"]:
        part_path = parts_dir / part["name"]
        if not part_path.is_file():
            raise PartsError(f"--join-cifar: {part_path} is missing; manifest.json lists "
                             f"{len(names)} parts: {', '.join(names)}")
        size, sha = part_path.stat().st_size, file_digest(part_path)
        if (size, sha) != (part["bytes"], part["sha256"]):
            raise PartsError(f"--join-cifar: {part_path}: expected {part['bytes']} bytes with "
                             f"SHA-256 {part['sha256']}, got {size} bytes with SHA-256 {sha}; "
                             "copy this part again")
    return manifest, [(parts_dir / part["name"], part["bytes"]) for part in manifest["parts"]]


def join_cifar(parts_dir, data_dir):
    """Join the parts of ``parts_dir`` back into ``data_dir``/cifar-10, checking every
    part, every whole file and the layout tinyvit.data reads."""
    manifest, pieces = checked_parts(parts_dir)
    folder = data_dir / manifest["folder"]
    start = 0
    for entry in manifest["files"]:
        write_hashed(read_range(pieces, start, entry["bytes"]), folder / entry["path"],
                     expected=entry["sha256"])
        start += entry["bytes"]
    problem = layout_problem(folder, "cifar10")
    if problem:
        raise PartsError(f"--join-cifar: the joined files are not CIFAR-10 as tinyvit.data "
                         f"reads it: {problem}")
    print(f"joined {len(pieces)} parts into {len(manifest['files'])} files in {folder}, every "
          f"SHA-256 as in the manifest; train on them with --data-dir {data_dir}")


# --------------------------------------------------------------------------- the command


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="folder for summary.json and the phases' files")
    mode.add_argument("--split-cifar", nargs=2, type=Path, metavar=("DATA_DIR", "PARTS_DIR"),
                      help="cut DATA_DIR/cifar-10's files into parts in PARTS_DIR")
    mode.add_argument("--join-cifar", nargs=2, type=Path, metavar=("PARTS_DIR", "DATA_DIR"),
                      help="join PARTS_DIR's parts back into DATA_DIR/cifar-10, checked")
    mode.add_argument("--environment", type=Path, help=argparse.SUPPRESS)  # the phase's child
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data",
                   help="folder holding cifar-10/ (mnist/ on the dry run); default ../shared/data")
    p.add_argument("--dry-run", action="store_true",
                   help="the same phases at tiny sizes on NumPy, where there is no GPU")
    p.add_argument("--budget", type=float, default=540, help="seconds for all the phases")
    p.add_argument("--phases", nargs="+", choices=[phase.name for phase in PHASES],
                   default=[phase.name for phase in PHASES],
                   help="the phases to run, always in the order listed")
    p.add_argument("--part-mib", type=float, default=PART_MIB,
                   help="the most MiB of a part for --split-cifar")
    p.add_argument("--recipe", default="cifar10-gpu",
                   help="the cifar10 phase's recipe of train_mnist.py (default cifar10-gpu)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="the cifar10 phase trains with its step captured in a CUDA graph")
    p.set_defaults(graph_problem=None)  # check() sets it from the environment phase's figures
    args = p.parse_args(argv)
    for name in ("budget", "part_mib"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be above 0, got {getattr(args, name):g}")
    if args.out:
        args.out, args.data_dir = args.out.resolve(), args.data_dir.resolve()
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.environment:
        return environment(args.environment, args.dry_run)
    try:
        if args.split_cifar:
            split_cifar(*args.split_cifar, args.part_mib)
        elif args.join_cifar:
            join_cifar(*args.join_cifar)
        else:
            return check(args, argv)
    except PartsError as error:
        print(f"gpu_check.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
