"""tinyvit.backend: switching backend says what is missing and changes nothing."""

import sys

import pytest

from tinyvit import backend as B


def test_set_backend_says_what_is_missing_and_changes_nothing(monkeypatch):
    active = B.get_backend()
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError, GPU or not
    with pytest.raises(B.BackendError, match=r"^backend 'cupy' needs CuPy: install it with"):
        B.set_backend("cupy")
    assert B.get_backend() == active
    assert not B.cupy_available()
    with pytest.raises(ValueError,
                       match=r"^backend must be one of \('numpy', 'cupy'\), got 'torch'$"):
        B.set_backend("torch")
