"""What a wrong gradient's difference from the right one is, measured, where no edit of one
or two fixes it: the difference written as a combination of values the backward had at
hand (``dout``, the arrays it named, the derivation's terms), when one or two of them
give it exactly (least squares, its residual at rounding); and where it sits: which
entries, and along which axes only some indices differ (rows, heads, columns).

    yours minus the right one = -1 x dout (to 3e-16)
    it differs at 40 of 80 entries: only at index 1 of axis 1 (of 2)
"""

import itertools

import numpy as np  # the measurement works on host copies

from ..backend import is_array, to_host

EXACT = 1e-6  # a combination that leaves at most this (relative) of the difference is exact
TERMS = 40  # values offered to the least squares at most
ROUNDING = 1e-9  # below this share of the largest entry, an entry is right


def measured(computed, expected, values, tol, where=True):
    """Lines that say how ``computed`` differs from ``expected`` (host arrays of one shape):
    the combination of ``values`` [(label, array)] it is, if one or two give it; then
    (unless ``where`` is False: the finding before it say enough) where it differs."""
    difference = computed - expected
    found = []
    combination = _combination(difference, values)
    if combination:
        found.append(combination)
    return found + (_where(difference, expected, tol) if where else [])


def _combination(difference, values):
    """"yours minus the right one = a x dout + b x g" for the one or two values that give
    the difference exactly, or None."""
    scale = float(np.abs(difference).max())
    if scale == 0:
        return None
    columns = []
    for label, value in values:
        value = to_host(value) if is_array(value) else value
        try:
            column = np.broadcast_to(value, difference.shape).reshape(-1)
        except ValueError:
            continue
        if np.abs(column).max() > 0 and np.isfinite(column).all():
            columns.append((label, column.astype(np.float64)))
        if len(columns) == TERMS:
            break
    target = difference.reshape(-1)
    for size in (1, 2):
        best = None
        for chosen in itertools.combinations(columns, size):
            A = np.stack([c for _, c in chosen], axis=1)
            coefficients, *_ = np.linalg.lstsq(A, target, rcond=None)
            residual = float(np.abs(A @ coefficients - target).max()) / scale
            if residual <= EXACT and (best is None or residual < best[0]):
                best = (residual, chosen, coefficients)
        if best:
            residual, chosen, coefficients = best
            terms = " + ".join(f"{_number(c)} x {label}" for (label, _), c in
                               zip(chosen, coefficients))
            return f"yours minus the right one = {terms} (exactly, to {residual:.0e})"
    return None


def _number(c):
    return f"{c:.3g}" if abs(c - round(c)) > 1e-6 else f"{round(c)}"


def _where(difference, expected, tol):
    """How many entries differ, and the axes along which only some indices do."""
    scale = max(float(np.abs(expected).max()), float(np.abs(difference).max()))
    wrong = np.abs(difference) > max(tol, ROUNDING) * scale
    count = int(wrong.sum())
    if count == 0:
        return []
    head = f"it differs at {count} of {wrong.size} entries"
    if difference.ndim == 0:
        return [head]
    parts = []
    for axis in range(difference.ndim):
        others = tuple(a for a in range(difference.ndim) if a != axis)
        bad = np.flatnonzero(wrong.any(axis=others) if others else wrong)
        n = difference.shape[axis]
        if 0 < len(bad) < n:
            parts.append(f"only at index {_listed(bad)} of axis {axis} (of {n})")
    if not parts and count < wrong.size:
        first = tuple(int(i) for i in np.argwhere(wrong)[0])
        parts.append(f"the first at {first}")
    return [head + (": " + "; ".join(parts) if parts else ", all of them")]


def _listed(indices, most=6):
    shown = ", ".join(str(int(i)) for i in indices[:most])
    return shown + (f" and {len(indices) - most} more" if len(indices) > most else "")
