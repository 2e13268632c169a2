"""Checks of arguments that name what was expected and what came."""

import dataclasses
import math
import numbers

NUMBER_TYPES = {int: numbers.Integral, float: numbers.Real}  # a field's type -> what it takes


def check_number_types(config):
    """Make each int, float and bool field of the dataclass ``config`` a Python value of
    its type (NumPy's numbers too, which JSON cannot write), or raise a ValueError naming
    the first that is not one: an int field takes any integer, a float field any finite
    real number, a bool field True or False; none takes a string, and only a bool field
    a bool."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.type is bool:
            if type(value).__name__ not in ("bool", "bool_"):  # NumPy's is bool_
                raise ValueError(f"{field.name} must be True or False, got {value!r} "
                                 f"({type_name(value)})")
            setattr(config, field.name, bool(value))
        kind = NUMBER_TYPES.get(field.type)
        if kind is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"{field.name} must be {'an int' if field.type is int else 'a number'}"
                             f", got {value!r} ({type_name(value)})")
        if not math.isfinite(value):
            raise ValueError(f"{field.name} must be a finite number, got {value}")
        setattr(config, field.name, field.type(value))


def type_name(x):
    """``list``, ``float``; ``torch.Tensor`` for a type from outside Python itself."""
    module = type(x).__module__.split(".")[0]
    return type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"


def check_array(x, where, what):
    """A ValueError unless ``x`` is an array as NumPy's and CuPy's are (a shape, and a
    dtype of NumPy's kinds: not a list, a number or another library's tensor):
    "<where>: expected <what>, got <its type>"."""
    if not (hasattr(x, "shape") and hasattr(getattr(x, "dtype", None), "kind")):
        raise ValueError(f"{where}: expected {what}, got {type_name(x)}")


def check_gradient_shape(dout, where, name, what, shape):
    """A ValueError unless the upstream gradient ``dout`` (called ``name``) is an array of
    ``shape``, which is ``what`` ("the output's shape"): "<where>: expected <name> of
    <what> <shape>, got <its shape>"."""
    check_array(dout, where, f"{name}, an array of {what} {shape}")
    if tuple(dout.shape) != tuple(shape):
        raise ValueError(f"{where}: expected {name} of {what} {shape}, got {tuple(dout.shape)}")


def check_fields(config, names, valid, expected):
    """A ValueError naming the first field of ``config`` in ``names`` whose value is
    not ``valid``: "<name> must be <expected>, got <value>"."""
    for name in names:
        value = getattr(config, name)
        if not valid(value):
            raise ValueError(f"{name} must be {expected}, got {value}")


def check_label_range(labels, num_classes, where):
    """A ValueError unless the integer ``labels`` (a non-empty array) are in
    [0, num_classes). Reads their smallest and largest values: on a GPU, a wait
    for the device."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ValueError(f"{where}labels must be in [0, {num_classes - 1}] for {num_classes} "
                         f"classes, got labels in [{low}, {high}]")


def check_distributions(targets, where, tolerance=1e-2):
    """A ValueError unless every row of the soft ``targets`` (B, K) is a distribution:
    no entry below 0, a sum of 1 (to ``tolerance``). Reads their values: on a GPU, a
    wait for the device."""
    if targets.size == 0:
        return
    low, sums = float(targets.min()), targets.sum(axis=-1)
    worst = float(sums.ravel()[int(abs(sums - 1).argmax())])
    if low < 0 or abs(worst - 1) > tolerance:
        raise ValueError(f"{where}soft targets must be distributions (each row's entries at "
                         f"least 0, summing to 1), got entries down to {low:.4g} and a row "
                         f"summing to {worst:.4g}")


def check_float(x, layer):
    """A ValueError unless ``x`` is an array of floats."""
    if x.dtype.kind != "f":
        raise ValueError(f"{layer}: expected a float array, got dtype {x.dtype}")


def check_images(x, where, channels=None, size=None):
    """A ValueError unless ``x`` is a float batch of images (B, C, H, W), with
    ``channels`` channels and ``size`` x ``size`` pixels where those are given."""
    C = "C" if channels is None else channels
    H, W = ("H", "W") if size is None else (size, size)
    expected = f"(B, {C}, {H}, {W})"
    check_array(x, where, f"an array of images {expected}")
    check_float(x, where)
    if (x.ndim != 4 or channels not in (None, x.shape[1])
            or size is not None and tuple(x.shape[2:]) != (size, size)):
        raise ValueError(f"{where}: expected input {expected}, got shape {tuple(x.shape)}")
