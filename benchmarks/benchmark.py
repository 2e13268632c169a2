"""tinyvit against PyTorch eager, its other tier and an older tinyvit: speed, FLOPs, memory.

For each config, every runner (tinyvit's tiers, an older tinyvit, PyTorch) is first checked to
compute the same logits and loss; then their training steps and inference are timed,
interleaved, their matmul GFLOP/s set against the machine's float32 matmul peak, and their
peak memory measured in fresh processes. One table per config and a summary are printed;
``--json FILE`` writes the figures too. Run it as

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py --quick

(the two variables are unset because some machines set them for old OpenBLAS builds, which
makes NumPy run slower kernels than on a user's machine). Every flag, with examples, and what
each module of benchmarks/ holds: benchmarks/README.md. The figures it gave and why it
measures as it does: docs/performance.md.

This file is the command: its flags, and per config the runners built, checked, timed and
measured (runners.py, measure.py, memory.py), then the tables (report.py).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, also when a test loads it

from machine import (  # noqa: E402
    check_kernel_settings,
    machine_report,
    print_machine,
    setup_backends,
    warn_if_busy,
)
from measure import (  # noqa: E402
    add_fractions_of_peak,
    baseline_worker,
    forward_flops,
    matmul_peaks,
    summarize,
    time_interleaved,
)
from memory import memory_worker, peak_memory  # noqa: E402
from report import (  # noqa: E402
    add_ratios,
    describe,
    print_checks,
    print_config,
    print_plan,
    print_summary,
    write_json,
)
from runners import CONFIGS, RUNNER_NAMES, build_runners, check_runners  # noqa: E402
from tinyvit import backend  # noqa: E402


def run_config(name, args):
    """The figures of config ``name``: its runners built, checked and timed, then their
    FLOPs counted and their peak memory measured."""
    print(f"running config {name} (timing, then memory subprocesses)")
    runners = build_runners(name, args)
    try:
        check, times, losses = check_and_time(runners, args)
    finally:
        for r in runners:
            r.close()
    config = CONFIGS[name]
    forward = forward_flops(runners, config, args.batch)
    result = {"config": describe(config), "params": runners[0].model.num_parameters(),
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


def check_and_time(runners, args):
    """Abort unless every runner computes the first one's function, then time them all,
    interleaved: (the check, {(runner name, phase): [ms, ...]}, {runner name: loss after
    the timed training steps})."""
    check = {"against": runners[0].name, "runners": check_runners(runners)}
    print_checks(check)
    for r in runners:
        r.prepare_training()
    times = time_interleaved(runners, args.steps, args.rounds, args.warmup)
    return check, times, {r.name: r.final_loss() for r in runners}


# the flags --quick sets, and their values without it; a flag given beside --quick keeps its value
QUICK = {"configs": "A", "steps": 2, "rounds": 1, "warmup": 1, "memory_steps": 1}
FULL = {"configs": "A,B,C", "steps": 5, "rounds": 3, "warmup": 2, "memory_steps": 3}


def make_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", help="comma-separated config names (A, B, C; default all)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, help="timed steps per round (default 5)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--warmup", type=int,
                   help="untimed steps at the start of every turn (default 2)")
    p.add_argument("--memory-steps", type=int, help="steps per memory subprocess (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="config A, 1 round of 2 steps, 1 warm-up and 1 memory step: a smoke "
                        "test for CI; the flags among these given beside it keep their values")
    p.add_argument("--gpu", action="store_true", help="tinyvit on CuPy against torch on CUDA")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes of each --tiers runner (tinyvit.train.parallel; memory: "
                        "summed over all processes); not the --baseline runner, which keeps "
                        "one process")
    p.add_argument("--tiers", default="fast",
                   help="comma-separated tiers of tinyvit's layers to time, one runner each: "
                        "fast (named tinyvit), reference (tinyvit-reference), graph "
                        "(tinyvit-graph: the fast tier's step and inference captured in CUDA "
                        "graphs; on NumPy the same calls, nothing captured); the first is "
                        "what the other runners are checked against and divided by")
    p.add_argument("--baseline", metavar="DIR", type=Path,
                   help="also time tinyvit from the source tree DIR (holding tinyvit/), e.g. "
                        "a git worktree of an older commit, in one child process with this "
                        "process's BLAS thread count; its memory is not measured")
    p.add_argument("--baseline-label", metavar="LABEL",
                   help="the baseline runner is named tinyvit@LABEL (default: DIR's name)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--memory-worker", help=argparse.SUPPRESS)  # memory.py's child
    p.add_argument("--baseline-worker", type=Path, help=argparse.SUPPRESS)  # the baseline's
    return p


def parse_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    check_kernel_settings(p)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name, least in (("batch", 1), ("steps", 1), ("rounds", 1), ("memory_steps", 1),
                        ("workers", 1), ("warmup", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be at least {least}, "
                    f"got {getattr(args, name)}")
    if args.gpu and args.workers > 1:
        p.error("--workers splits batches over CPU processes; on a GPU tinyvit runs one process")
    args.tiers = parse_tiers(p, args.tiers)
    check_baseline(p, args)
    args.configs = [c.strip().upper() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if not args.configs:
        p.error(f"--configs: expected one or more of {', '.join(CONFIGS)}, got none")
    if unknown:
        p.error(f"unknown config(s) {unknown}; known: {', '.join(CONFIGS)}")
    return args


def parse_tiers(p, text):
    tiers = [t.strip() for t in text.split(",") if t.strip()]
    if not tiers or set(tiers) - set(RUNNER_NAMES) or len(set(tiers)) < len(tiers):
        p.error(f"--tiers: expected distinct names among {', '.join(RUNNER_NAMES)}, "
                f"got {','.join(tiers) or 'none'}")
    return tiers


def check_baseline(p, args):
    """Check the --baseline flags and name the baseline runner."""
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


def json_settings(args):
    """The run's settings, as the JSON records them."""
    settings = {k: getattr(args, k)
                for k in ("configs", "batch", "steps", "rounds", "warmup", "memory_steps",
                          "gpu", "quick", "workers", "tiers", "baseline_label")}
    settings["baseline"] = str(args.baseline.resolve()) if args.baseline else None
    return settings


def run_benchmark(args):
    setup_backends(args.gpu)
    machine = machine_report(args.gpu)
    print_machine(machine)
    repeats = 3 if args.quick else 10
    peak_size, peaks_before = matmul_peaks(args.gpu, repeats)
    print_plan(args, machine, peak_size, repeats, peaks_before)
    results = {name: run_config(name, args) for name in args.configs}
    _, peaks_after = matmul_peaks(args.gpu, repeats)
    peaks = {k: max(v, peaks_after[k]) for k, v in peaks_before.items()}
    add_fractions_of_peak(results, peaks[backend.get_backend()])
    warn_if_busy()
    for name, result in results.items():
        print_config(name, result)
    print_summary(results, peaks)
    if args.json:
        write_json(args.json, machine, json_settings(args), peak_size,
                   {"used": peaks, "before": peaks_before, "after": peaks_after}, results)


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        return memory_worker(args.memory_worker, args.batch, args.memory_steps, args.gpu,
                             args.workers)
    if args.baseline_worker:
        return baseline_worker(args.baseline_worker, args.configs[0], args.batch)
    run_benchmark(args)


if __name__ == "__main__":
    main()
