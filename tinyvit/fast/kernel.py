"""The mark every kernel of the fast tier carries, on either backend."""


class FastKernel:
    """The mark of a layer of the fast tier (``Module.tier``), mixed into every kernel."""

    tier = "fast"
