"""Two whole commands timed in turn, from outside, and their ratio taken pair by pair.

    python benchmarks/paired.py -n 5 "COMMAND A" "COMMAND B"

runs each command (a shell line) once untimed, then A, B, A, B, ... ``-n`` times
each, and prints, for each, the wall seconds (from its start to its exit, start-up
included) and the CPU seconds (user + system of the processes it waited for) as
median (min-max), then the ratio A/B of each pair's wall seconds the same way.
Taking the ratio pair by pair keeps it meaningful while the machine's speed drifts;
quote the median. A command that fails stops the timing with its exit status.
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time


def timed(command):
    """(wall seconds, CPU seconds) of one run of the shell line ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, shell=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"paired.py: exit status {done.returncode} from: {command}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", help="command A, one shell line")
    p.add_argument("b", help="command B, the baseline")
    p.add_argument("-n", "--runs", type=int, default=5, help="timed runs of each (default 5)")
    args = p.parse_args(argv)
    for command in (args.a, args.b):
        timed(command)  # the warm-up: files cached, the interpreter's bytecode written
    runs = {"A": [], "B": []}
    for _ in range(args.runs):
        runs["A"].append(timed(args.a))
        runs["B"].append(timed(args.b))
    for name in runs:
        wall, cpu = zip(*runs[name])
        print(f"{name}: wall s {spread(wall)}, cpu s {spread(cpu)}")
    print(f"A/B wall, pair by pair: {spread([a[0] / b[0] for a, b in zip(runs['A'], runs['B'])])}")


if __name__ == "__main__":
    main()
