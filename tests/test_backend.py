"""tinyvit.backend: switching backend says what is missing and changes nothing."""

import os
import sys

import numpy as np
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


def test_float_dtype_takes_names_and_types_and_names_what_it_refuses():
    assert B.float_dtype("float64") is np.float64 and B.float_dtype(np.float32) is np.float32
    assert B.float_dtype(None) is B.get_default_dtype()
    with B.default_dtype("float64"):
        assert B.float_dtype(None) is np.float64
    with pytest.raises(ValueError, match=r"^dtype must be float32 or float64, got int32$"):
        B.float_dtype("int32")


def test_unpooled_bytes_come_from_no_memory_pool(backend):
    """A CUDA graph's private pool may go before the array (cuBLAS's workspace) does."""
    a = B.unpooled_bytes(1000)
    assert a.shape == (1000,) and a.dtype == np.uint8 and B.is_array(a)
    if not B.on_cpu():
        pool = B.xp.cuda.MemoryPool()
        with B.xp.cuda.using_allocator(pool.malloc):
            B.unpooled_bytes(1 << 20)
        assert pool.total_bytes() == 0


def test_tinyvit_backend_takes_any_case_and_a_bad_value_is_named_at_first_use():
    """Read where the backend is first needed, not at import: ``import tinyvit`` works
    whatever the variable says, and a backend chosen in code wins over it."""
    import subprocess

    def run(value, code):
        env = {**os.environ, "TINYVIT_BACKEND": value}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True)

    assert run("NumPy", "import tinyvit; print(tinyvit.backend.get_backend())").stdout == "numpy\n"
    chosen = run("abc", "import tinyvit; tinyvit.set_backend('numpy'); print(tinyvit.backend.xp)")
    assert chosen.stdout == "<tinyvit array module: numpy>\n"
    bad = run("abc", "import tinyvit; print('imported'); tinyvit.ViT()")
    assert bad.stdout == "imported\n"
    assert bad.stderr.splitlines()[-1] == ("ValueError: TINYVIT_BACKEND: expected numpy or cupy "
                                           "(in any case), got 'abc'")


def test_using_backend_before_any_choice_leaves_the_variable_to_decide(monkeypatch):
    monkeypatch.setattr(B, "_active", None)  # as imported: nothing chosen yet
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")
    with B.using_backend("numpy"):
        assert B.on_cpu()
    with pytest.raises(ValueError, match=r"^TINYVIT_BACKEND: expected numpy or cupy"):
        B.get_backend()
