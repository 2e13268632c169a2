"""Shared fixtures: every test that takes ``backend`` runs once per array backend.

The CuPy run is marked ``gpu`` and skipped unless CuPy imports and sees a GPU,
so the same test body checks both backends (no copied GPU test files).
"""

import pytest

from tinyvit import backend as B

_HAS_GPU = B.cupy_available()


@pytest.fixture(
    params=[
        "numpy",
        pytest.param(
            "cupy",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not _HAS_GPU, reason="CuPy with a CUDA GPU not available"),
            ],
        ),
    ]
)
def backend(request):
    """Activate one backend for the test, float64 by default, and restore after."""
    with B.using_backend(request.param), B.default_dtype("float64"):
        yield request.param
