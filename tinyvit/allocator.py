"""How this process's C allocator treats the memory of freed arrays: a process
setting, not an array one, so it lives apart from the array backend."""

import ctypes

# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES = 32 << 20  # the largest glibc accepts
_TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory():
    """Let the C allocator keep freed arrays' memory for the next arrays, instead
    of handing it back to the operating system. Process-wide, so tinyvit never
    does it on import: ``train_mnist.py`` and tinyvit's worker processes call it.

    Why: by default glibc's malloc gives a large block its own memory mapping
    and unmaps it on free, and returns free memory at the top of its heap to the
    system; the next array of that size then page-faults each 4 KiB page back
    in, zeroed by the kernel, and a forward and backward allocate and free
    hundreds of temporaries (docs/performance.md has the page faults and the
    time they cost). How: mmap threshold 32 MiB, trim threshold 1 GiB (both
    together: setting one fixes the other at its small default). The cost: a
    process keeps up to its peak memory until it exits.

    Returns True when glibc took both settings; False elsewhere (macOS, Windows,
    musl), where it changes nothing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no C library by that name, or no mallopt in it
        return False
    took_mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    took_trim = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    return bool(took_mmap and took_trim)
