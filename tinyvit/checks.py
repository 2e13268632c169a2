"""Checks of arguments that name what was expected and what came."""


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


def check_float(x, layer):
    """A ValueError unless ``x`` is an array of floats."""
    if x.dtype.kind != "f":
        raise ValueError(f"{layer}: expected a float array, got dtype {x.dtype}")


def check_images(x, where, channels=None):
    """A ValueError unless ``x`` is a float batch of images (B, C, H, W), with
    ``channels`` channels when that is given."""
    check_float(x, where)
    if x.ndim != 4 or channels not in (None, x.shape[1]):
        expected = "C" if channels is None else channels
        raise ValueError(f"{where}: expected input (B, {expected}, H, W), got shape "
                         f"{tuple(x.shape)}")
