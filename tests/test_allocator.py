"""tinyvit.allocator.keep_freed_memory: freed arrays' memory is reused, not faulted
back in."""

import platform
import subprocess
import sys
import textwrap

import pytest

from tinyvit import allocator

# Three 8 MiB arrays alive at once, then freed, three times over; prints the page
# faults per round after a first round (the allocator's own settling).
_FAULTS = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from tinyvit import allocator
    if sys.argv[1] == "keep":
        assert allocator.keep_freed_memory()
    def round_():
        arrays = [np.ones(2 << 20, dtype=np.float32) for _ in range(3)]
        del arrays
    round_()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        round_()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 3)
    """
)


def _faults_per_round(mode):
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt settings are glibc's")
def test_keep_freed_memory_stops_page_faults_of_new_arrays():
    """By default glibc hands the 24 MiB back at each free, and the next round
    faults its pages in again (6,144 pages of 4 KiB; fewer with huge pages); kept, none."""
    assert _faults_per_round("default") >= 100
    assert _faults_per_round("keep") == 0


def test_keep_freed_memory_is_a_no_op_without_mallopt(monkeypatch):
    class NoMallopt:
        def __init__(self, name):
            pass

    monkeypatch.setattr(allocator.ctypes, "CDLL", NoMallopt)
    assert allocator.keep_freed_memory() is False
