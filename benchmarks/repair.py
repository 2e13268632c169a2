"""The repair search measured (tinyvit/gradcheck/repair.py): on set (a), every single-edit
mutant of every reference backward (``mutants.py``), and on set (b), the learner mistakes
of ``mistakes.py``, each through the workbook's check.

    python benchmarks/repair.py mutants [--case Linear ...] [--json FILE]
    python benchmarks/repair.py mistakes [--json FILE]

Prints per case the mutants, the share the check fails, the share repaired at the mutated
line, the share with any passing fix, and the search's median and worst time; the
mutants left unrepaired are listed.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutants as mutant_set  # noqa: E402


def measure_mutants(names, budget, out):
    rows, built, started = [], {}, time.perf_counter()
    for case_name, build, mutant, function in mutant_set.generate():
        if names and case_name not in names:
            continue
        if case_name not in built:
            built[case_name] = mutant_set.Case(build)
        mutant_set.run(built[case_name], mutant, function, budget)
        rows.append(mutant)
        if mutant.outcome in ("fixed", "no fix"):
            mark = "ok" if mutant.right_line and mutant.restores else (
                "fix elsewhere" if mutant.fixed else "NO FIX")
            print(f"{case_name:<20} {mutant.function:<34} {mutant.line:>5} {mutant.rule:<10} "
                  f"{mutant.seconds:5.2f}s {mark}", flush=True)
    summary = summarize(rows)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary, indent=1))
    if out:
        Path(out).write_text(json.dumps({"summary": summary, "mutants": [vars(m) for m in rows]},
                                        indent=1))


def summarize(rows):
    kept = [m for m in rows if m.outcome in ("fixed", "no fix")]
    times = [m.seconds for m in kept]
    share = (lambda n: round(100 * n / len(kept), 1)) if kept else (lambda n: 0.0)
    return {
        "generated": len(rows),
        "raise": sum(m.outcome == "raises" for m in rows),
        "no effect": sum(m.outcome == "no effect" for m in rows),
        "mutants": len(kept),
        "check fails, %": share(sum(m.check_failed for m in kept)),
        "repaired at the right line, %": share(sum(m.right_line and m.restores for m in kept)),
        "any passing fix, %": share(sum(m.fixed for m in kept)),
        "fix restores the reference, % of fixes": round(100 * sum(
            m.restores for m in kept if m.fixed) / max(1, sum(m.fixed for m in kept)), 1),
        "median s": round(statistics.median(times), 3) if times else None,
        "worst s": round(max(times), 3) if times else None,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("set", choices=("mutants", "mistakes"))
    p.add_argument("--case", nargs="+", help="these cases of python -m tinyvit.gradcheck alone")
    p.add_argument("--budget", type=float, default=2.0, help="seconds per search")
    p.add_argument("--json", help="write every result here")
    args = p.parse_args(argv)
    if args.set == "mutants":
        measure_mutants(args.case, args.budget, args.json)


if __name__ == "__main__":
    main()
