"""Gradient checking: hand-written backward passes against central finite differences,
with a diagnosis of what a wrong one got wrong.

    from tinyvit.gradcheck import assert_gradients, randn

    def test_my_layer():
        assert_gradients(MyLayer(8), randn(2, 5, 8))

``check.py`` checks, ``diagnose.py`` says what is wrong, ``report.py`` prints the
report; ``python -m tinyvit.gradcheck`` checks every layer of tinyvit.
"""

from ..backend import default_dtype, to_device, xp
from .check import gradient_check, numeric_gradient
from .inputs import jitter, randn, seeded_dropout


def assert_gradients(module, x, *args, tol=1e-7, jitter_scale=0.2, seed=0, before_forward=None):
    """Check ``module``'s backward in float64 and raise AssertionError with the report
    (PASS or FAIL per tensor, and what is wrong) unless every gradient is right.

    The module is converted to float64 in place, as is ``x``, and its parameters
    are moved off their initial values (``jitter``: unit gammas and zero biases could
    hide a backward that mixes them up; ``jitter_scale=0`` keeps them). It runs the
    module as built: the reference layers of ``tinyvit.nn`` unless it was given to
    ``tinyvit.fast.accelerate``. Returns the report."""
    module.astype(xp.float64)
    if jitter_scale:
        jitter(module, jitter_scale)
    with default_dtype("float64"):
        x = to_device(x, dtype=xp.float64)
        report = gradient_check(module, x, *args, seed=seed, before_forward=before_forward,
                                tol=tol)
    return report.assert_ok()


__all__ = ["assert_gradients", "gradient_check", "jitter", "numeric_gradient", "randn",
           "seeded_dropout"]
