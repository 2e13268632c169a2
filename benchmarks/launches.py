"""Kernel launches per training step on a GPU: tinyvit's reference tier against its fast tier
and the fast tier captured in a CUDA graph (and the fast tier's per inference forward, with
the names of its kernels).

    python benchmarks/launches.py --json launches.json   # on a GPU: configs A, B, C, batch 128
    python benchmarks/launches.py --dry-run              # no GPU: the same steps on NumPy

A step is the benchmark's (``runners.TinyvitRunner.train_step``: forward, label-
smoothed cross-entropy, backward, AdamW), on one tier's layers, loss and optimizer.
The CUDA profiler (CUPTI, through PyTorch's ``torch.profiler``, which records every
kernel the process launches: CuPy's, cuBLAS's and tinyvit's own) counts the kernels,
memory copies and memsets of ``--steps`` steps after UNCOUNTED that are not counted; a
step's launches are their count divided by the steps. A step of a few hundred small
kernels is bound by the host that launches them, which is what the fused kernels of
``tinyvit/fast/kernels`` cut. The "graph" tier's step is the fast tier's captured in a CUDA
graph (``tinyvit.fast.graphs``, captured before the counted steps): the profiler counts the
kernels the GPU runs, which are the fast tier's and the copies of the inputs, while the host
queues one graph launch for all of them. The dry run takes the same steps on NumPy and
counts nothing (there is no GPU to count on).
"""

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, also when a test loads it

from machine import setup_backends, torch  # noqa: E402
from runners import CONFIGS, TinyvitRunner, make_batch  # noqa: E402
from tinyvit import backend  # noqa: E402
from tinyvit.fast.graphs import WARMUP  # noqa: E402

TIERS = ("reference", "fast", "graph")
UNCOUNTED = WARMUP + 1  # steps first: compiling CuPy's kernels, the pool, a graph's capture
NAME_CHARS = 100  # of a kernel's name in the JSON


def kind(name):
    """What a CUDA event of the profiler is, by its name."""
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def launches_per_step(step, steps, gpu, names=False):
    """{kind: launches per step} of ``step()`` after UNCOUNTED steps (None on the dry
    run), and with ``names`` each kernel's name and launches per step."""
    for _ in range(UNCOUNTED):
        step()
    backend.synchronize()
    if not gpu:
        for _ in range(steps):
            step()
        return None
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            step()
        backend.synchronize()
    events = [event.name for event in profile.events()
              if event.device_type == torch.autograd.DeviceType.CUDA]
    counts = collections.Counter(kind(name) for name in events)
    result = {k: counts[k] / steps for k in ("kernel", "memcpy", "memset")}
    if names:
        result["names"] = {name[:NAME_CHARS]: n / steps
                           for name, n in collections.Counter(events).most_common()}
    return result


def measure(config_names, batch, steps, gpu, tiers=TIERS):
    """{config: {tier: launches per training step}, and the fast tier's per inference
    forward ("fast-infer"), with its kernels' names."""
    result = {}
    for name in config_names:
        images, labels = make_batch(CONFIGS[name], batch)
        result[name] = {}
        for tier in tiers:
            runner = TinyvitRunner(CONFIGS[name], images, labels, tier=tier)
            runner.prepare_training()
            result[name][tier] = launches_per_step(runner.train_step, steps, gpu,
                                                   names=tier == "fast")
            if tier == "fast":
                runner.set_training(False)
                result[name]["fast-infer"] = launches_per_step(runner.infer, steps, gpu,
                                                               names=True)
            runner.close()
        counts = {tier: r and {k: v for k, v in r.items() if k != "names"}
                  for tier, r in result[name].items()}
        print(f"config {name}, batch {batch}: {counts}", flush=True)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="A,B,C", help="comma-separated config names (A, B, C)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="counted steps per tier")
    p.add_argument("--dry-run", action="store_true", help="NumPy, config A, batch 8: nothing "
                                                          "counted")
    p.add_argument("--tiers", default=",".join(TIERS),
                   help=f"comma-separated tiers to count (default {','.join(TIERS)})")
    p.add_argument("--json", metavar="FILE", help="write the counts as JSON")
    args = p.parse_args(argv)
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if not tiers or set(tiers) - set(TIERS):
        p.error(f"--tiers: expected names among {', '.join(TIERS)}, got {args.tiers}")
    gpu = not args.dry_run
    if gpu and torch is None:
        p.error("counting needs PyTorch's profiler: install a CUDA build of torch")
    setup_backends(gpu)
    configs, batch = (["A"], 8) if args.dry_run else (args.configs.split(","), args.batch)
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        p.error(f"--configs: expected names of {sorted(CONFIGS)}, got {unknown}")
    result = {"batch": batch, "steps": args.steps, "backend": backend.get_backend(),
              "configs": measure(configs, batch, args.steps, gpu, tiers)}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
