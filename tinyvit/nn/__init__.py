"""The building blocks of a model, each with its forward and its hand-written
backward: ``module.py`` (the contract), ``layers.py`` (the transformer's layers),
``conv.py`` (a convolutional stem's layers), ``loss.py``, ``optim.py``, and the
math they share (``functional.py``, ``init.py``, ``resample.py``). These are the
reference tier: the code to read, and the code that runs unless a model is given
to ``tinyvit.fast.accelerate``."""
