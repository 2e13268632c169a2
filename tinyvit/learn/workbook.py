"""Writing a workbook: a folder with one file per exercise, each the layer (or function)
with its backward blank between two markers, the forward it differentiates quoted
from the library, and a test that checks it; a README, a pytest.ini and the
workbook's settings. The blanks' solutions are the library's own code, read from it
when asked for (``solution.py``), so they cannot go stale."""

import ast
import inspect
import json
import re
import textwrap
from pathlib import Path

from .checking import MARKER, PROGRESS
from .exercises import BACKPROP, EXERCISES, STEPS, TRACKS, TRAINING, derivation

BEGIN, END = "# ---- your {what} ----", "# ---- end of your {what} ----"
BLANK = 'raise NotImplementedError("exercise {number}: write'  # how a blank's line begins
PYTEST_INI = "[pytest]\npython_files = ex*.py\naddopts = -p no:cacheprovider --tb=short\n"
TOTAL = len(EXERCISES) + 1  # and the training
SHAPE = 30  # a parenthesis this long or shorter (a shape) is kept on one line


def start(folder, data_dir=None):
    """Write a new workbook into ``folder`` (made if missing, refused if it holds files)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty: start a workbook in a new folder, or see "
                              f"where this one stands with python -m tinyvit.learn status {folder}")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise FileNotFoundError(
            f"--data-dir {data_dir} is not a folder: give the folder that holds mnist/ (the "
            "training exercise reads its files), or leave --data-dir out to use $TINYVIT_DATA "
            "or the cache, where the files are downloaded")
    folder.mkdir(parents=True, exist_ok=True)
    for ex in EXERCISES:
        (folder / ex.filename).write_text(render(ex))
    (folder / TRAINING_FILE).write_text(TRAINING_TEMPLATE)
    (folder / "README.md").write_text(readme())
    (folder / "pytest.ini").write_text(PYTEST_INI)
    data_dir = str(Path(data_dir).resolve()) if data_dir else None  # pytest runs in the folder
    (folder / MARKER).write_text(json.dumps({"data_dir": data_dir}, indent=1) + "\n")
    return folder


def _wrap(text, width, prefix=""):
    """``text`` in lines of at most ``width`` characters, each begun with ``prefix``,
    never broken inside a short parenthesis or at a hyphen: a shape such as
    (B, NH, N, Dh) and a link stay whole."""
    kept = re.sub(r"\([^()]{0,%d}\)" % SHAPE, lambda m: m.group(0).replace(" ", "\0"),
                  " ".join(text.split()))
    lines = textwrap.wrap(kept, width - len(prefix), break_on_hyphens=False,
                          break_long_words=False)
    return "\n".join(prefix + line.replace("\0", " ") for line in lines)


def _what(ex):
    """What the blank's markers name: the method written again, or "function"."""
    return ex.method or "function"


def _signature(ex):
    """The learner's def line: the library's own parameters."""
    target = getattr(ex.reference, ex.method) if ex.method else ex.reference
    return f"def {ex.method or ex.yours}{inspect.signature(target)}:"


def _quoted(obj):
    """The source of ``obj`` as comment lines."""
    source = textwrap.dedent(inspect.getsource(obj)).rstrip()
    return "\n".join(f"#     {line}".rstrip() for line in source.splitlines())


def _imports(ex):
    modules = {}
    for module, name in ex.imports:
        modules.setdefault(module, []).append(name)
    return "".join(f"from {m} import {', '.join(sorted(names))}\n" for m, names in modules.items())


def answer(ex):
    """The code the learner writes in: the class (or function) with its backward blank
    between the markers; the same in the exercise's file and in its notebook."""
    what = _what(ex)
    body = _wrap(ex.task, 86, "# ")
    blank = (f"{BEGIN.format(what=what)}\n"
             f"{BLANK.format(number=ex.number)} {ex.yours}"
             f"{'.' + ex.method if ex.method else ''} here\")\n"
             f"{END.format(what=what)}")
    code = textwrap.indent(f"{body}\n{blank}", "    ")
    if ex.method:
        return f"class {ex.yours}({ex.reference.__name__}):\n    {_signature(ex)}\n" \
               + textwrap.indent(code, "    ")
    return f"{_signature(ex)}\n{code}"


def imports(ex):
    """The imports the learner's code needs: the library's layer, and the names it uses."""
    reference = f"from {ex.reference.__module__} import {ex.reference.__name__}\n" \
        if ex.method else ""
    return reference + _imports(ex)


def heading(ex):
    return f"Exercise {ex.number} of {TOTAL}: {ex.title} ({TRACKS[ex.track]})"


def render(ex):
    """The file of an exercise, its blank empty."""
    forward = getattr(ex.forward, "__qualname__", "")
    return f'''"""{heading(ex)}.

{_wrap(ex.intro, 88)}

{_wrap(_how(ex), 88)}
"""

from tinyvit.learn import check
{imports(ex)}
# The forward you differentiate, as tinyvit computes it:
# {ex.forward.__module__}.{forward}
#
{_quoted(ex.forward)}


{answer(ex)}


def test_{ex.name}():
    check({ex.yours}, "{ex.name}")
'''


TRAINING_FILE = f"ex{TRAINING:02d}_training.py"
TRAINING_TEMPLATE = f'''"""Exercise {TRAINING} of {TOTAL}: training on your own backward passes.

The MNIST preset (mean-pooled), built from your classes of exercises 1-19 that pass
their checks where the model has such a layer (the library's elsewhere), trains for
{STEPS} steps in float64 beside the same model of the library's layers, from the same
weights on the same batches: the two loss curves must be the same. Nothing to write:
it runs once any of exercises 1-19 passes, and says which layers are yours; the curves
and each part's gradient norm are drawn to ex{TRAINING:02d}_training.png. It takes a few
minutes on a laptop's CPU (two models, in float64), in every `python -m pytest` of the
workbook once an exercise passes; `python -m pytest -k "not training"` leaves it out. The
MNIST files come from the data_dir of learn.json, else $TINYVIT_DATA, else the cache (or a
download).
"""

from pathlib import Path

from tinyvit.learn import check_training


def test_training():
    check_training(Path(__file__).parent)
'''


def _how(ex):
    """The file's paragraph on how to write, run and check the exercise."""
    return (f"Write {ex.yours}{'.' + ex.method if ex.method else ''} between the markers, then "
            f"run `python -m pytest {ex.filename}` in this folder (or `python -m tinyvit.learn "
            f"check {ex.number}`). Stuck: `python -m tinyvit.learn hint {ex.number}`; after an "
            f"attempt that ran, `python -m tinyvit.learn solution {ex.number}` prints tinyvit's "
            f"own. The derivation: {derivation(ex.section)}.")


def reference_source(ex):
    """The library's own code for an exercise: its method's or function's source."""
    target = getattr(ex.reference, ex.method) if ex.method else ex.reference
    return textwrap.dedent(inspect.getsource(target))


def fill(text, ex):
    """``text`` (an exercise's file) with its blank filled by the library's own code,
    as a learner who got it right would have it (the names it uses imported)."""
    body = textwrap.dedent("\n".join(_body(reference_source(ex))))
    begin, end = BEGIN.format(what=_what(ex)), END.format(what=_what(ex))
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    indent = head.splitlines()[-1]  # the blank's indent, before the marker
    filled = head + begin + "\n" + textwrap.indent(body, indent) + "\n" + indent + end + tail
    module = ex.reference.__module__
    return filled.replace("from tinyvit.learn import check\n",
                          f"from tinyvit.learn import check\nfrom {module} import *  # noqa\n", 1)


def _body(source):
    """The lines of a def's source from its first statement after the docstring."""
    function = ast.parse(source).body[0]
    statements = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return source.splitlines()[statements[0].lineno - 1:]


def readme():
    rows = "\n".join(f"| {ex.number} | `{ex.filename}` | {ex.title} | {TRACKS[ex.track]} |"
                     for ex in EXERCISES if ex.number < TRAINING)
    stem = "\n".join(f"| {ex.number} | `{ex.filename}` | {ex.title} | {TRACKS[ex.track]} |"
                     for ex in EXERCISES if ex.number > TRAINING)
    return f"""# A workbook of backward passes

Every backward pass of a Vision Transformer, written by you, checked against tinyvit's own.
Each file holds one exercise: a layer (or a function) whose forward is given, quoted from
tinyvit, and whose backward is blank between two markers, with every array's shape in the
comments. Do them in order: each one's layers are the next one's parts.

    python -m pytest                      # every exercise, stopping nowhere
    python -m pytest -x                   # up to the first that fails
    python -m pytest ex01_linear.py       # one exercise
    python -m tinyvit.learn check 1       # the same
    python -m tinyvit.learn status        # where you stand
    python -m tinyvit.learn hint 1        # a hint; again for the next one
    python -m tinyvit.learn solution 1    # tinyvit's own, after an attempt that ran

run in this folder; elsewhere, give it as the last argument (`check 1 DIR`).

A check runs in stages and stops at the first that fails: the blank is written; every
gradient has its array's shape and dtype; gradients accumulate (two backward passes double
them); what the derivation says must hold (rows that sum to zero); your values against
tinyvit's own (every intermediate first, where an exercise keeps them); central differences
in float64, at several shapes, batch 1 and odd sizes among them; float32 kept. A failure
says, in one paragraph, the fix where one edit or two of your own lines make every case
right (searched among the mistakes learners make, and checked before it is said), which
gradient, where in it, what it looks like (a mean taken for a sum, a scale or a term
missing, a transpose, a sign, a broken invariant) and which section of docs/backprop.md
derives it; where it compared your gradient with tinyvit's, the difference is drawn beside
the file (`ex01_linear.difference.png`: yours minus the right one, the worst entries outlined).

Each exercise is also a notebook (`ex01_linear.ipynb`, `jupyter lab ex01_linear.ipynb`): the
derivation beside the blank, the picture of where the layer sits (`ex01_linear.where.png`), a
check cell, a hint cell and a cell that compares your numbers with tinyvit's. Write an exercise
in either; the training exercise takes your class from the one you wrote last.

The derivations: {BACKPROP if BACKPROP.is_file() else "docs/backprop.md in tinyvit's repository"},
one section per layer.

| # | file | exercise | track |
|---|---|---|---|
{rows}
| {TRAINING} | `{TRAINING_FILE}` | training the MNIST preset on your layers, {STEPS} steps \
(a few minutes) | {TRACKS["vit"]} |
{stem}

Your progress is kept in `{PROGRESS}`; the data folder for exercise {TRAINING} in `{MARKER}`.
"""
