"""Checks of arguments that name what was expected and what came."""


def check_fields(config, names, valid, expected):
    """A ValueError naming the first field of ``config`` in ``names`` whose value is
    not ``valid``: "<name> must be <expected>, got <value>"."""
    for name in names:
        value = getattr(config, name)
        if not valid(value):
            raise ValueError(f"{name} must be {expected}, got {value}")


def check_float(x, layer):
    """A ValueError unless ``x`` is an array of floats."""
    if x.dtype.kind != "f":
        raise ValueError(f"{layer}: expected a float array, got dtype {x.dtype}")
