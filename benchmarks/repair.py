"""The repair search measured (tinyvit/gradcheck/repair.py): on set (a), every single-edit
mutant of every reference backward (``mutants.py``), and on set (b), the learner mistakes
of ``mistakes.py``, each through the workbook's check.

    python benchmarks/repair.py mutants [--case Linear ...] [--part I/N] [--json FILE]
    python benchmarks/repair.py mutants --retry FILE... [--part I/N] [--json FILE]
    python benchmarks/repair.py summary FILE... [--retried FILE...]
    python benchmarks/repair.py mistakes [--file SET] [--json FILE]

Prints per case the mutants, the share the check fails, the share repaired at the mutated
line, the share with any passing fix, and the search's median and worst time; the
mutants left unrepaired are listed. ``--retry`` runs again only the mutants an earlier
run found no fix for (on a quieter machine, or with a larger ``--budget``): the search's
order does not depend on time, so a mutant fixed once is fixed again, and ``summary``
merges the two runs.
"""

import argparse
import importlib.util
import json
import linecache
import os
import re
import statistics
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

from tinyvit.gradcheck.answer import TAKEN_OUT
from tinyvit.learn import ExerciseFailed
from tinyvit.learn.exercises import by_name
from tinyvit.learn.workbook import BEGIN, render, start

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutants as mutant_set  # noqa: E402


def measure_mutants(names, budget, out, part=(0, 1), retry=()):
    """Every mutant (of the cases ``names``, or all), or the ``part`` (i, n) of them whose
    number is i modulo n: two processes on two cores each take one half. With ``retry``
    (JSON files of an earlier run), only the mutants they found no fix for."""
    rows, built, started = [], {}, time.perf_counter()
    unfixed = {_key(m) for m in _rows(retry) if m["outcome"] == "no fix"}
    if retry:
        names = sorted({m[0] for m in unfixed})
    chosen = (m for m in mutant_set.generate(names) if not retry or _key(vars(m[2])) in unfixed)
    for number, (case_name, build, mutant, function) in enumerate(chosen):
        if number % part[1] != part[0]:
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


def _key(row):
    """What tells one mutant from another: its case, function, rule and changes."""
    return (row["case"], row["function"], row["rule"], json.dumps(row["changes"]))


def _rows(files):
    return [row for f in files for row in json.loads(Path(f).read_text())["mutants"]]


def summary_of(files, retried=()):
    """The summary of the mutants of ``files`` (the parts of one run), each mutant it
    found no fix for replaced by its row in ``retried`` (runs of ``--retry``) where it
    has one; with a summary per case."""
    again = {}
    for row in _rows(retried):
        again.setdefault(_key(row), []).append(row)
    merged = [mutant_set.Mutant(**(again[_key(row)].pop(0) if row["outcome"] == "no fix"
                                   and again.get(_key(row)) else row)) for row in _rows(files)]
    summary = summarize(merged)
    for case in dict.fromkeys(m.case for m in merged):
        summary[case] = summarize([m for m in merged if m.case == case])
    print(json.dumps(summary, indent=1))


def measure_mistakes(out, path=None):
    """Each mistake of mistakes.py (or of the file ``path``, written alike) in its exercise
    of a new workbook, checked as a learner's pytest would: the check must fail; a fix,
    where one is printed, is put into the file as printed and the check run again, which
    must pass."""
    spec = importlib.util.spec_from_file_location(
        "mistake_set", path or Path(__file__).resolve().parent / "mistakes.py")
    mistake_set = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mistake_set)
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        workbook = Path(folder) / "workbook"
        start(workbook)
        cwd = os.getcwd()
        os.chdir(workbook)  # as pytest runs in it: files are named as the learner sees them
        try:
            for number, mistake in enumerate(mistake_set.MISTAKES):
                row = run_mistake(workbook, mistake, f"m{number}")
                rows.append(row)
                print(f"{mistake.exercise:<18} {row['seconds']:5.2f}s {row['verdict']:<24} "
                      f"{mistake.what}", flush=True)
        finally:
            os.chdir(cwd)
    searches = [r["search_s"] for r in rows if r["search_s"] is not None]
    summary = {"mistakes": len(rows), **{
        key: sum(r["verdict"] == key for r in rows) for key in VERDICTS},
        "searches": len(searches),
        "search median s": round(statistics.median(searches), 2),
        "search worst s": round(max(searches), 2),
        "check median s": round(statistics.median(r["seconds"] for r in rows), 2),
        "check worst s": round(max(r["seconds"] for r in rows), 2),
        "wall_s": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary, indent=1))
    if out:
        Path(out).write_text(json.dumps({"summary": summary, "mistakes": rows}, indent=1))


VERDICTS = ("fixed at the right line", "fixed elsewhere", "named", "not caught", "fix wrong")
FIX_LINE = re.compile(r"^ {6}line (\d+) of (\S+) \(([^)]*)\):(.*)$")
SEARCHED = re.compile(r"(?:edits? of the code|tried|found) in (?:the )?([\d.]+) s")


def run_mistake(workbook, mistake, tag):
    """One mistake: its verdict, the search's time, the paragraph."""
    ex = by_name(mistake.exercise)
    path = workbook / ex.filename
    blank = render(ex)
    path.write_text(_with_body(blank, ex, mistake.body))
    first = _first_body_line(path.read_text(), ex)
    started = time.perf_counter()
    paragraph = _failure(path, ex, tag)
    seconds = time.perf_counter() - started
    searched = SEARCHED.search(paragraph or "")
    row = {"exercise": mistake.exercise, "what": mistake.what, "seconds": round(seconds, 2),
           "search_s": float(searched.group(1)) if searched else None, "paragraph": paragraph}
    if paragraph is None:
        row["verdict"] = "not caught"
        return row
    fixes = _printed_fixes(paragraph)
    if not fixes:
        row["verdict"] = "named"
        return row
    text = path.read_text().splitlines()
    for line, before, after in sorted(fixes, reverse=True):  # the lines below move first
        if " ".join(x.strip() for x in text[line - 1:line - 1 + len(before)]) != " ".join(
                x.strip() for x in before):
            row["verdict"] = "fix wrong"
            return row
        indent = text[line - 1][:len(text[line - 1]) - len(text[line - 1].lstrip())]
        text[line - 1:line - 1 + len(before)] = [indent + a for a in after]
    path.write_text("\n".join(text) + "\n")
    if _failure(path, ex, tag + "_fixed") is not None:
        row["verdict"] = "fix wrong"
        return row
    lines = {line - first + 1 for line, _, _ in fixes}
    row["verdict"] = ("fixed at the right line" if lines & set(mistake.right)
                      else "fixed elsewhere")
    return row


def run_right(workbook, mistake, tag):
    """Whether the mistake's body with its ``right`` lines put in passes its exercise."""
    ex = by_name(mistake.exercise)
    lines = mistake.body.strip("\n").splitlines()
    for number, text in mistake.right.items():
        lines[number - 1] = text
    path = workbook / ex.filename
    path.write_text(_with_body(render(ex), ex, "\n".join(lines)))
    return _failure(path, ex, tag) is None


def _with_body(text, ex, body):
    begin = BEGIN.format(what=ex.method or "function")
    head, rest = text.split(begin)
    blank, tail = rest.split("\n", 2)[1], rest.split("\n", 2)[2]
    indent = blank[:len(blank) - len(blank.lstrip())]
    lines = textwrap.dedent(body.strip("\n")).splitlines()
    return head + begin + "\n" + "\n".join(indent + line if line else "" for line in lines) \
        + "\n" + tail


def _first_body_line(text, ex):
    begin = BEGIN.format(what=ex.method or "function")
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip() == begin) + 1


def _failure(path, ex, tag):
    """The paragraph the exercise's check fails with, or None where it passes."""
    module_name = f"workbook_{path.stem}_{tag}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    sys.modules[module_name] = module
    linecache.checkcache(str(path))
    # compiled from the text written just now: a cached .pyc of the same size written in
    # the same second would pass for it
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    try:
        getattr(module, f"test_{ex.name}")()
    except ExerciseFailed as failure:
        return str(failure)
    return None


def _printed_fixes(paragraph):
    """[(line, the lines before, the lines after)] of the fix a paragraph prints: "line N of
    FILE (F): before  ->  after" on one line, or the lines below it (8 spaces in, the first
    of the fix's lines marked "->")."""
    lines = paragraph.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = FIX_LINE.match(line)
        if not match:
            continue
        number, rest = int(match.group(1)), match.group(4)
        if rest.strip():
            before, after = rest.strip().split("  ->  ")
            found.append((number, [before], [] if after == TAKEN_OUT else [after]))
            continue
        before, after, j = [], [], i + 1
        while not lines[j].startswith("         -> "):
            before.append(lines[j][12:])
            j += 1
        after.append(lines[j][12:])
        while j + 1 < len(lines) and lines[j + 1].startswith(" " * 12):
            j += 1
            after.append(lines[j][12:])
        found.append((number, before, [] if after == [TAKEN_OUT] else after))
    return found


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
    p.add_argument("set", choices=("mutants", "mistakes", "summary"))
    p.add_argument("files", nargs="*", help="summary: the JSON files of a run's parts")
    p.add_argument("--retried", nargs="+", default=(),
                   help="summary: the JSON files of its --retry run")
    p.add_argument("--case", nargs="+", help="these cases of python -m tinyvit.gradcheck alone")
    p.add_argument("--budget", type=float, default=2.0, help="seconds per search")
    p.add_argument("--json", help="write every result here")
    p.add_argument("--file", help="mistakes: another set, written as mistakes.py is")
    p.add_argument("--part", default="0/1", help="mutants: the part i/n of them to run")
    p.add_argument("--retry", nargs="+", default=(),
                   help="mutants: only those these JSON files of a run found no fix for")
    args = p.parse_args(argv)
    if args.set == "mutants":
        measure_mutants(args.case, args.budget, args.json,
                        tuple(int(k) for k in args.part.split("/")), args.retry)
    elif args.set == "summary":
        summary_of(args.files, args.retried)
    else:
        measure_mistakes(args.json, args.file)


if __name__ == "__main__":
    main()
