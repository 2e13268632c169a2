"""What a workbook's notebook calls from its cells. Jupyter runs a notebook in its own
folder, the workbook, so progress, hints and pictures go where the ``.py`` files' go.

    check(MyLinear)     the staged check; a failure is printed (the same paragraph as in
                        pytest) with the picture of your gradient minus the right one
    compare(MyLinear)   your gradients against the library's on the first case, a table
    hint(1, 2)          the hints of exercise 1 up to level 2 (of 3)
    where(1)            the ViT's block diagram with the exercise's layer highlighted
    train()             the training exercise, with its loss curves and gradient norms
"""

import re
from pathlib import Path

from PIL import Image

from . import checking, pictures
from .exercises import by_number
from .hints import next_hint
from .training import check_training


def check(yours, exercise=None):
    """``tinyvit.learn.check``, its failure printed and its picture shown."""
    try:
        checking.check(yours, exercise)
    except checking.ExerciseFailed as failure:  # the hint is a cell of this notebook
        print(re.sub(rf"{re.escape(checking.HINT_COMMAND)} (\d+)",
                     r"the cell hint(\1, 1) below", str(failure)))
        if getattr(failure, "picture", None) is not None:
            _show(Image.open(failure.picture))


def compare(yours, exercise=None):
    """Your gradients against the library's on the exercise's first case, a row each:
    exact, close, largest difference, shape (backprop ninja's cmp)."""
    print("\n".join(checking.comparison(yours, exercise)))


def hint(number, level=None):
    """Exercise ``number``'s hints up to ``level`` (1 to 3): a cell run again, or the whole
    notebook run again, shows no more than it names. Without a level, one more than before."""
    print(next_hint(Path.cwd(), by_number(number), level))


def where(number):
    """The block diagram of exercise ``number``'s layer (a PIL image: Jupyter shows it)."""
    return pictures.where(by_number(number))


def train():
    """The training exercise in the workbook the notebook runs in, its picture shown."""
    folder = Path.cwd()
    try:
        check_training(folder)
    except checking.ExerciseFailed as failure:
        print(failure)
    picture = folder / pictures.TRAINING_PICTURE
    if picture.is_file():
        _show(Image.open(picture))


def _show(image):
    """Show ``image`` in the notebook (IPython's display), or say where it is."""
    try:
        from IPython.display import display
    except ImportError:
        print(f"(a picture: {getattr(image, 'filename', '')})")
        return
    display(image)
