"""``python -m tinyvit.learn``: the workbook of backward passes.

    python -m tinyvit.learn start DIR [--data-dir D]   write a new workbook into DIR
    python -m tinyvit.learn status [DIR]               where each exercise stands
    python -m tinyvit.learn check N [DIR]              check exercise N
    python -m tinyvit.learn hint N [DIR]               the next hint of exercise N
    python -m tinyvit.learn solution N [DIR]           tinyvit's own, after an attempt that ran

DIR defaults to the folder you are in.
"""

import argparse
import sys
import traceback
from pathlib import Path

from .. import cli
from .checking import MARKER, ExerciseFailed, Progress, load_exercise
from .exercises import EXERCISES, TRAINING, by_number
from .hints import next_hint
from .notebook import write_notebooks
from .solution import solution
from .training import changed_since_checked
from .workbook import TRAINING_FILE, start

RAN = ("pass", "fail")  # an attempt that ran: the blank was written


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tinyvit.learn", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    commands = p.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="write a new workbook into DIR")
    begin.add_argument("folder", metavar="DIR")
    begin.add_argument("--data-dir", help="where the MNIST files are, for the training exercise")
    commands.add_parser("status", help="where each exercise stands").add_argument(
        "folder", metavar="DIR", nargs="?", default=".")
    for name, what in (("check", "check exercise N"), ("hint", "the next hint of exercise N"),
                       ("solution", "tinyvit's own code for exercise N")):
        command = commands.add_parser(name, help=what)
        command.add_argument("number", metavar="N", type=int)
        command.add_argument("folder", metavar="DIR", nargs="?", default=".")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    folder = Path(args.folder)
    try:
        if args.command == "start":
            start(folder, args.data_dir)
            write_notebooks(folder)
            print(f"wrote a workbook of {len(EXERCISES) + 1} exercises into {folder}, each a "
                  f".py file and a notebook: cd {folder} && python -m pytest -x, then open "
                  f"{EXERCISES[0].filename}; or jupyter lab {EXERCISES[0].notebook}")
            return 0
        _require_workbook(folder)
        return COMMANDS[args.command](folder, getattr(args, "number", None))
    except (FileExistsError, FileNotFoundError, LookupError, ValueError) as error:
        print(f"python -m tinyvit.learn: error: {error}", file=sys.stderr)
        return 2


def _require_workbook(folder):
    if not (folder / MARKER).is_file():
        raise ValueError(f"{folder} holds no workbook (no {MARKER}): python -m tinyvit.learn "
                         "start DIR writes one")


def _exercise(number):
    if number == TRAINING:
        raise LookupError(f"exercise {TRAINING} has nothing to write: it trains on those of "
                          f"your exercises 1-{TRAINING - 1} that pass (python -m tinyvit.learn "
                          f"check {TRAINING})")
    try:
        return by_number(number)
    except KeyError:
        numbers = sorted([ex.number for ex in EXERCISES] + [TRAINING])
        raise LookupError(f"no exercise {number}: the exercises are {numbers[0]}-"
                          f"{numbers[-1]}") from None


def status(folder, _):
    progress = Progress(folder)
    results = progress.read()
    rows = [(ex.number, ex.filename, ex.title) for ex in EXERCISES]
    rows.append((TRAINING, TRAINING_FILE, "training on your backward passes"))
    marks = {"pass": "PASS", "fail": "FAIL", "blank": "not written", None: "not checked yet"}
    for number, filename, title in sorted(rows):
        mark = marks[results.get(number)]
        if mark in ("PASS", "FAIL") and number != TRAINING and changed_since_checked(
                folder, by_number(number), progress):
            mark += ", changed"  # since its check: check it again
        print(f"{number:>3}  {mark:<16} {filename:<26} {title}")
    passed = sum(result == "pass" for result in results.values())
    print(f"{passed} of {len(rows)} passed")
    return 0


def check(folder, number):
    path = folder / (TRAINING_FILE if number == TRAINING else _exercise(number).filename)
    try:
        module = load_exercise(path)
    except Exception as error:  # the learner's file: a syntax error, a name not defined
        print(_does_not_run(path, error))
        return 1
    tests = [f for name, f in vars(module).items() if name.startswith("test_")]
    try:
        for test in tests:
            test()
    except ExerciseFailed as failure:
        print(failure)
        return 1
    except Exception as error:  # raised by the file's own line (a class renamed): said so
        if Path(traceback.extract_tb(error.__traceback__)[-1].filename).resolve() != \
                path.resolve():
            raise
        print(_does_not_run(path, error))
        return 1
    return 0


def _does_not_run(path, error):
    """One line for an exercise file whose own line raised (as it is imported, or in its
    test function): the line, the error."""
    if isinstance(error, SyntaxError):
        line, message = error.lineno, error.msg
    else:
        ours = [f for f in traceback.extract_tb(error.__traceback__)
                if Path(f.filename).resolve() == path.resolve()]
        line, message = (ours[-1].lineno if ours else None), str(error)
    where = f", line {line}" if line else ""
    return (f"{path}{where}: {type(error).__name__}: {message} (the exercise's file must run "
            "before its backward can be checked)")


def hint(folder, number):
    print(next_hint(folder, _exercise(number)))
    return 0


def show_solution(folder, number):
    ex = _exercise(number)
    if Progress(folder).read().get(number) not in RAN:
        print(f"exercise {number}: the solution comes after an attempt that ran: write your "
              f"{ex.method or 'function'} in {ex.filename} and check it first")
        return 1
    where = f"{ex.reference.__module__}.{ex.reference.__qualname__}"
    print(f"# tinyvit's own: {where}{'.' + ex.method if ex.method else ''}\n")
    print(solution(ex))
    return 0


COMMANDS = {"status": status, "check": check, "hint": hint, "solution": show_solution}


if __name__ == "__main__":
    sys.exit(cli.run(main))
