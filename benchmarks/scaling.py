"""Data parallelism across processes: measured on one machine, modelled across many.

    python benchmarks/scaling.py --out one.json                 # one process
    mpiexec -n 2 python benchmarks/scaling.py --out two.json    # two processes (MPI)
    python benchmarks/scaling.py --model one.json two.json      # the tables, and the model

(docs/performance.md runs the first two in turn three times, interleaved, and
gives ``--model`` all six files: each figure is then the median of its three.)

Each run times, for every CPU recipe of train_mnist.py, the trainer's step on
random images at the recipe's batch (``Trainer.step``: under mpiexec the batch
is split over the processes and the gradient all-reduced, ``tinyvit/train/
distributed.py``), and in one process the same step at the batch split N ways
for N = 2 to 64: the compute a machine does when N of them share the batch.
Under mpiexec it also times an Allreduce of each recipe's float32 gradient
(GPU recipes included: their size, not their step). ``--model`` prints the
measured tables and the model of a step across N machines like this one:

    step(N) = compute(B / N) + allreduce(N),
    allreduce(N) = 2 (N - 1) / N * gradient bytes / link + 2 (N - 1) * latency

(a ring Allreduce: each machine sends and receives 2 (N - 1) / N of the
gradient in 2 (N - 1) messages), for links of 10, 25 and 100 Gbit/s.
"""

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # train_mnist.py's RECIPES

import train_mnist  # noqa: E402
from layer_profile import make_batches  # noqa: E402
from machine import check_kernel_settings, processor_model  # noqa: E402
from tinyvit import allocator, backend  # noqa: E402
from tinyvit.train import build_model  # noqa: E402
from tinyvit.train.distributed import communicator, launched  # noqa: E402
from tinyvit.train.step import Trainer  # noqa: E402

SHARES = (2, 4, 8, 16, 32, 64)  # N: the batch split N ways
LINKS = (10, 25, 100)  # Gbit/s
LATENCY = 25e-6  # seconds per message between machines: MPI over TCP on Ethernet
GAIN = 1.1  # doubling N stops paying once the step gets less than this much faster


def recipe_config(name, batch=None):
    """A recipe's TrainConfig (NumPy, fast tier, one process's worth of workers)."""
    config = train_mnist.make_config(train_mnist.parse_args(["--recipe", name])[0])
    return dataclasses.replace(config, backend="numpy", workers=1,
                               batch_size=batch or config.batch_size)


def cpu_recipes():
    return [name for name, recipe in train_mnist.RECIPES.items()
            if recipe.get("backend", "numpy") == "numpy"]


def step_ms(config, steps):
    """Median ms of the trainer's step over ``steps`` steps, after 2 untimed ones."""
    trainer = Trainer(config, build_model(config)[0])
    batches = make_batches(config, config.batch_size * (steps + 2))
    with trainer:
        times = []
        for index, (x, y) in enumerate(batches.epoch(0)):
            start = time.perf_counter()
            float(trainer.step(x, y, config.lr, (0, 0, index))[0])
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times[2:])


def allreduce_ms(parameters, repeats=30):
    """Median ms of an Allreduce of ``parameters`` float32 values over the processes."""
    world, buffer, times = communicator(), np.ones(parameters, dtype=np.float32), []
    for _ in range(repeats + 3):
        world.barrier()
        start = time.perf_counter()
        world.sum(buffer)
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times[3:])


@functools.cache
def parameters_of(name):
    """A recipe's parameter count (its model built once)."""
    return build_model(recipe_config(name))[0].num_parameters()


def measure(steps):
    """This run's figures: per CPU recipe its step (and in one process its step at
    each share of the batch); under mpiexec each recipe's Allreduce."""
    rank, size = launched()
    result = {"processes": size, "processor": processor_model(),
              "date": time.strftime("%Y-%m-%d"), "recipes": {}}
    for name in cpu_recipes():
        config = recipe_config(name)
        figures = {"batch": config.batch_size, "step_ms": step_ms(config, steps)}
        if size == 1:
            figures["share_ms"] = {n: step_ms(recipe_config(name, config.batch_size // n), steps)
                                   for n in SHARES if config.batch_size // n >= 1}
        result["recipes"][name] = figures
        if rank == 0:
            print(f"{name}: {figures}", flush=True)
    if size > 1:
        result["allreduce_ms"] = {name: allreduce_ms(parameters_of(name))
                                  for name in train_mnist.RECIPES}
    return result if rank == 0 else None


def ring_allreduce_s(nbytes, n, gbit_s):
    return 2 * (n - 1) / n * nbytes * 8 / (gbit_s * 1e9) + 2 * (n - 1) * LATENCY


def median_run(runs):
    """One run's figures, each the median of the runs'."""
    first = runs[0]
    if isinstance(first, dict):
        return {key: median_run([run[key] for run in runs]) for key in first}
    return statistics.median(runs) if isinstance(first, float) else first


def print_model(one, two):
    """The measured tables, then the modelled speed-up of each recipe's step."""
    print(f"measured: {one['processor']}, {one['date']}")
    print("| recipe | batch | parameters | 1 process, ms | 2 processes, ms | speed-up | "
          "Allreduce, ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in train_mnist.RECIPES:
        parameters = parameters_of(name)
        ar = two["allreduce_ms"][name]
        if name in one["recipes"]:
            a, b = one["recipes"][name]["step_ms"], two["recipes"][name]["step_ms"]
            batch = one["recipes"][name]["batch"]
            print(f"| `{name}` | {batch} | {parameters:,} | {a:.1f} | {b:.1f} | {a / b:.2f} | "
                  f"{ar:.2f} |")
        else:
            print(f"| `{name}` | | {parameters:,} | (GPU) | | | {ar:.2f} |")
    print()
    print(f"model: speed-up of a step over 1 machine; latency {1e6 * LATENCY:.0f} us a message")
    print("| recipe | link | " + " | ".join(f"N={n}" for n in SHARES) + " | stops gaining at |")
    print("|---|---|" + "---:|" * len(SHARES) + "---|")
    for name, figures in one["recipes"].items():
        nbytes = 4 * parameters_of(name)
        for link in LINKS:
            speedups = {}
            for n, compute in figures["share_ms"].items():
                step = compute / 1e3 + ring_allreduce_s(nbytes, int(n), link)
                speedups[int(n)] = figures["step_ms"] / 1e3 / step
            cells = [f"{speedups[n]:.1f}" if n in speedups else "" for n in SHARES]
            print(f"| `{name}` | {link} Gbit/s | " + " | ".join(cells) +
                  f" | {stops_gaining(speedups, figures['batch'])} |")


def stops_gaining(speedups, batch):
    """The N after which doubling N gives less than GAIN more speed."""
    counts = sorted(speedups)
    for n, doubled in zip(counts, counts[1:]):
        if speedups[doubled] < GAIN * speedups[n]:
            return f"N={n} ({batch // n} images a machine)"
    return f"beyond N={counts[-1]}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write this run's figures to this JSON file")
    p.add_argument("--steps", type=int, default=12, help="timed steps per measurement")
    p.add_argument("--model", nargs="+", metavar="JSON",
                   help="print the tables and the model from one- and two-process runs")
    args = p.parse_args(argv)
    check_kernel_settings(p)
    if args.model:
        runs = [json.loads(Path(path).read_text()) for path in args.model]
        print_model(*(median_run([r for r in runs if (r["processes"] > 1) == two])
                      for two in (False, True)))
        return
    allocator.keep_freed_memory()
    backend.set_backend("numpy")
    result = measure(args.steps)
    if result is not None and args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
