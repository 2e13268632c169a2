"""A workbook for learning backprop by doing: every backward pass of the Vision
Transformer (and of the hybrid's stem) as an exercise, checked against tinyvit's own.

    python -m tinyvit.learn start workbook     # write the exercises into ./workbook
    cd workbook && python -m pytest -x         # check them, up to the first that fails
    jupyter lab ex01_linear.ipynb              # or work in the notebooks

``exercises.py`` lists them, ``workbook.py`` writes them, ``notebook.py`` writes their
notebooks, whose cells call ``cells.py``; ``checking.py`` checks one (``check``),
``training.py`` trains on them (``check_training``), ``hints.py`` holds their hints,
``solution.py`` tinyvit's code for each, ``pictures.py`` draws where a layer sits and how
a gradient differs; ``steps.py`` holds the two backward passes written the long way that
two exercises ask for.
"""

from .checking import ExerciseFailed, check
from .training import check_training

__all__ = ["ExerciseFailed", "check", "check_training"]
