"""Writing an exercise as a Jupyter notebook, generated from the same exercise as its
``.py`` file (never kept by hand): a title and what you derive, the where-it-sits
picture, the derivation (docs/backprop.md's section, read now, so the two agree), the
forward given, the backward blank between the same markers, a check cell, a hint cell,
and the comparison of your numbers with the library's.

The notebook is nbformat 4 JSON, written without Jupyter's packages; its cells call
``tinyvit/learn/cells.py``. The cells with the learner's code carry the tags "setup"
and "answer": the training exercise reads a class written in a notebook from them.
"""

import functools
import inspect
import json
import re
import textwrap

from . import pictures
from .exercises import EXERCISES, TRAINING, derivation_text
from .solution import solution
from .workbook import TOTAL, TRAINING_FILE, answer, heading, imports

NBFORMAT = {"nbformat": 4, "nbformat_minor": 5}
KERNEL = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"}}
LINK = re.compile(r"\[([^\]]+)\]\((?!https?:)([^)]*)\)")  # a link inside tinyvit's repository


def write_notebooks(folder):
    """Beside a new workbook's files: each exercise's notebook and where-it-sits picture,
    and the training exercise's notebook."""
    for ex in EXERCISES:
        (folder / ex.notebook).write_text(exercise_notebook(ex))
        pictures.where(ex, folder / f"{ex.filename[:-3]}.where.png")
    (folder / TRAINING_FILE.replace(".py", ".ipynb")).write_text(training_notebook())


def exercise_notebook(ex):
    """The notebook of exercise ``ex`` as JSON text."""
    what = f"{ex.yours}.{ex.method}" if ex.method else ex.yours
    cells = [
        _markdown(f"# {heading(ex)}\n\n{ex.intro}\n\nYou derive and write **{what}**: the "
                  "backward pass of the forward below. Run the cells from the top; write "
                  "between the markers of the code cell, then run the check cell."),
        _code("from tinyvit.learn.cells import check, compare, hint, where\n" + imports(ex),
              "setup"),
        _code(f"where({ex.number})  # where the layer sits in the ViT, and its shapes"),
        _markdown(_local(_without_code(derivation_text(ex.section), ex))),
        _markdown("## The forward, given\n\nAs tinyvit computes it "
                  f"(`{ex.forward.__module__}.{getattr(ex.forward, '__qualname__', '')}`):"
                  f"\n\n```python\n{_source(ex.forward)}```"),
        _markdown("## Your backward"),
        _code(answer(ex), "answer"),
        _markdown("## The check\n\nThe same staged check as `python -m pytest "
                  f"{ex.filename}`: the first failure says why, with the fix where one is "
                  "found, and draws your gradient minus the right one."),
        _code(f"check({ex.yours})"),
        _markdown("## Stuck?\n\nThree hints, each saying more: the shapes, then the chain "
                  "rule with one term left for you, then the formula. The cell shows them up "
                  "to the level it names: change the 1 to 2, then to 3, for more."),
        _code(f"hint({ex.number}, 1)"),
        _markdown("## Compare with the numbers (optional)\n\nYour gradients against the "
                  "library's on the check's first case, one row each: exact, close, largest "
                  "difference."),
        _code(f"compare({ex.yours})"),
    ]
    return _notebook(cells)


def training_notebook():
    """The notebook of the training exercise."""
    cells = [
        _markdown(f"# Exercise {TRAINING} of {TOTAL}: training on your own backward passes\n\n"
                  "The MNIST preset trains beside the same model of the library's layers, "
                  "from the same weights on the same batches, with your layers wherever "
                  "your exercise passed its check and the library's elsewhere: the loss "
                  f"curves must be the same. The same as `python -m pytest {TRAINING_FILE}`."),
        _code("from tinyvit.learn.cells import train"),
        _code("train()  # the loss curves and each part's gradient norm"),
    ]
    return _notebook(cells)


def _notebook(cells):
    for number, cell in enumerate(cells):
        cell["id"] = f"cell-{number}"
    return json.dumps({"cells": cells, "metadata": KERNEL, **NBFORMAT}, indent=1) + "\n"


def _markdown(text):
    return {"cell_type": "markdown", "metadata": {}, "source": _lines(text)}


def _code(text, tag=None):
    return {"cell_type": "code", "execution_count": None,
            "metadata": {"tags": [tag]} if tag else {}, "outputs": [], "source": _lines(text)}


def _lines(text):
    """A cell's source as nbformat keeps it: lines, each but the last with its newline."""
    return text.rstrip("\n").splitlines(keepends=True)


def _local(markdown):
    """The section with its links into tinyvit's repository as their text and path (a
    notebook sits in the workbook, where those relative links lead nowhere)."""
    def said(match):
        text, target = match.groups()
        path = target.lstrip("./").split("#")[0]
        named = path and not path.endswith(".md") and text.strip("`") != path
        return f"{text} ({path})" if named else text  # not `a/b.py` (a/b.py)

    return LINK.sub(said, markdown)


CODE = re.compile(r"^```python\n.*?^```\n", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")  # `code` in a sentence
ASSIGNED = re.compile(r"^\w+ \+?= ")  # "dS = ": the name a formula is given
SHORTEST = 12  # shorter inline code is a name or a call (`dout`, `xp.exp`), not an answer
DOTTED = re.compile(r"^[\w.]+$")  # a name, an attribute, a function: `self.attn_drop`
NAME = re.compile(r"[A-Za-z_]\w*")
FORMULA = re.compile(r"[-+*/@]")  # arithmetic: a formula, where a call or a name is not


def _without_code(markdown, ex):
    """The derivation with the library's code for the exercises left out: its blocks of
    code, and the code in its sentences that is a piece of any exercise's solution (the
    softmax's `A * (dA - ...)`, in the section ex10 and ex11 share; a transpose's axes), or a
    formula in the names of ``ex``'s solution but for one (`(xp.exp(log_probs) - t) * (dout /
    B)`, where the code writes log_probs.shape[0] for B). They are the answer, which the
    workbook keeps until an attempt has run; names of functions and attributes stay."""
    every = _every_solution()
    names = set(NAME.findall(solution(ex)))

    def answer(text):
        if len(text) < SHORTEST or DOTTED.match(text):
            return False
        own = set(NAME.findall(text))
        formula = FORMULA.search(text) and len(own) >= 3 and len(own - names) <= 1
        return "".join(text.split()) in every or bool(formula)

    def said(match):
        return "(code left out)" if answer(ASSIGNED.sub("", match.group(1))) else match.group(0)

    return INLINE.sub(said, CODE.sub(
        f"*(The library's code for this step is left out here: it is the answer. After an "
        f"attempt that ran, `python -m tinyvit.learn solution {ex.number}` shows it.)*\n",
        markdown))


@functools.cache
def _every_solution():
    """Every exercise's solution, blanks taken out, in one string: read once for the 23
    notebooks of a workbook."""
    return "".join("".join(solution(ex).split()) for ex in EXERCISES if ex.number != TRAINING)


def _source(obj):
    return textwrap.dedent(inspect.getsource(obj))
