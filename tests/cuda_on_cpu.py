"""The CUDA C of ``tinyvit/fast/kernels`` run on the CPU, to test the kernels' own
code on machines without a GPU.

Each kernel file is compiled by the C++ compiler (g++, C++20) after ``GPU_ON_CPU``, a
header that plays the GPU's part: a thread of the operating system per CUDA thread,
one block after another; a block's threads meet at ``__syncthreads`` (a barrier), a
warp's 32 at each shuffle (a barrier and a slot per thread); ``__shared__`` memory is
a static array, which the block running has to itself (``extern __shared__``, the
memory a launch sizes, is SHARED_BYTES, set to NaN bytes before each launch and
checked after it beyond the size the launch gave); ``atomicAdd`` takes a lock.
After the file, a C function ``launch_NAME(grid, block, arguments)`` per kernel runs
it over the grid. It is slow (a thread per CUDA thread) and meant for small sizes; it
checks what a kernel computes, not how fast, nor what only a GPU would catch (a race
that the barriers here happen to order).

Every array a launch passes is copied between guards, GUARD values on each side, each
marked (NaN for floats, the most negative numbers for integers): a kernel that writes
outside its array changes a guard's bits, which the launch reports, and one that reads
outside it reads a NaN or a huge negative number, which poisons what it computes.
"""

import ctypes
import functools
import re
import shutil
import subprocess

import numpy as np

from tinyvit.fast import compile as cuda

GPU_ON_CPU = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
using std::erf, std::exp, std::log, std::max, std::min, std::nan, std::sqrt;

struct Index { unsigned x = 0, y = 0, z = 0; };
thread_local Index threadIdx, blockIdx;
Index blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static  // one block runs at a time
static std::unique_ptr<std::barrier<>> block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
static unsigned long long warp_slots[1024];
static std::mutex atomic_lock;
#define __syncthreads() block_barrier->arrive_and_wait()

inline unsigned thread_rank() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// v of the lane `offset` away in the butterfly, after every lane of the warp has written its own
template <class V> V __shfl_xor_sync(unsigned, V v, int offset) {
    unsigned t = thread_rank();
    std::memcpy(&warp_slots[t], &v, sizeof v);
    warp_barriers[t / 32]->arrive_and_wait();
    V other;
    std::memcpy(&other, &warp_slots[t ^ offset], sizeof other);
    warp_barriers[t / 32]->arrive_and_wait();  // read before the slots are written again
    return other;
}

// v of lane `source`
template <class V> V __shfl_sync(unsigned mask, V v, int source) {
    return __shfl_xor_sync(mask, v, (thread_rank() % 32) ^ source);
}

#define __syncwarp() warp_barriers[thread_rank() / 32]->arrive_and_wait()

template <class V> V atomicAdd(V* address, V v) {
    std::lock_guard<std::mutex> hold(atomic_lock);
    V old = *address;
    *address = old + v;
    return old;
}

template <class Kernel> void run_grid(Index grid, Index block, Kernel kernel) {
    gridDim = grid, blockDim = block;
    unsigned threads = block.x * block.y * block.z;
    for (unsigned z = 0; z < grid.z; z++) for (unsigned y = 0; y < grid.y; y++)
    for (unsigned x = 0; x < grid.x; x++) {
        block_barrier = std::make_unique<std::barrier<>>(threads);
        warp_barriers.clear();
        for (unsigned w = 0; w < threads / 32; w++)
            warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; t++)
            pool.emplace_back([=] {
                blockIdx = Index{x, y, z};
                threadIdx = Index{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                kernel();
            });
        for (auto& thread : pool) thread.join();
    }
}
"""

SHARED_BYTES = 1 << 18
C_TYPES = {"T": None, "long long": ctypes.c_longlong, "int": ctypes.c_int,
           "double": ctypes.c_double, "unsigned long long": ctypes.c_ulonglong}
FLOATS = {"float32": ctypes.c_float, "float64": ctypes.c_double}


def signatures(name):
    """{function: [C parameter types]} of the ``extern "C" __global__`` functions of
    kernels/<name>.cu."""
    text = (cuda.KERNELS_DIR / f"{name}.cu").read_text()
    found = re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', text)
    return {function: [" ".join(p.split()[:-1]) for p in params.split(",")]
            for function, params in found}


@functools.cache
def compiler():
    """The path of a C++ compiler with C++20's barriers (g++ 11 or later), or None."""
    path = shutil.which("g++")
    if path is None:
        return None
    probe = subprocess.run([path, "-std=c++20", "-fsyntax-only", "-x", "c++", "-"],
                           input="#include <barrier>\nstd::barrier<> b(1);\n", text=True,
                           capture_output=True)
    return path if probe.returncode == 0 else None


def launcher(function, parameters):
    """The C of ``launch_<function>``: the grid, the block, then the kernel's parameters."""
    declared = ", ".join(f"{p} a{i}" for i, p in enumerate(parameters))
    passed = ", ".join(f"a{i}" for i in range(len(parameters)))
    return (f'extern "C" void launch_{function}(unsigned gx, unsigned gy, unsigned gz, '
            f"unsigned bx, unsigned by, unsigned bz, {declared}) {{\n"
            f"    run_grid(Index{{gx, gy, gz}}, Index{{bx, by, bz}},\n"
            f"             [=] {{ {function}({passed}); }});\n"
            "}\n")


@functools.cache
def library(name, dtype, folder):
    """kernels/<name>.cu for ``dtype`` compiled for the CPU into ``folder``, loaded."""
    dynamic = re.search(r"extern __shared__ [\w ]+ (\w+)\[\];", cuda.source(name, dtype))
    source = re.sub(r"extern __shared__ ([\w ]+) (\w+)\[\];",
                    rf"static \1 \2[{SHARED_BYTES}] __attribute__((aligned(16)));",
                    cuda.source(name, dtype))
    code = GPU_ON_CPU + source + "\n" + "".join(
        launcher(f, p) for f, p in signatures(name).items())
    if dynamic:  # where the launches' shared memory is, for its guard
        code += f'extern "C" void* dynamic_shared() {{ return {dynamic[1]}; }}\n'
    path = folder / f"{name}_{dtype}.so"
    result = subprocess.run([compiler(), "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                             "-x", "c++", "-", "-o", str(path)], input=code, text=True,
                            capture_output=True)
    if result.returncode:
        raise RuntimeError(f"kernels/{name}.cu for {dtype} on the CPU:\n{result.stderr}")
    return ctypes.CDLL(str(path))


def c_value(c_type, value, dtype):
    """``value`` as ctypes passes it for a parameter of C type ``c_type`` (an array:
    its guarded copy, ``Guarded``)."""
    t = c_type.replace("const ", "")
    if t.endswith("*"):
        return ctypes.c_void_p(value.inside.ctypes.data)
    return (FLOATS[dtype] if t == "T" else C_TYPES[t])(value.item())


GUARD = 256  # values on each side of an array
# per float size: a quiet NaN (read, it poisons what it meets), its low bits free for a mark
QUIET_NAN = {4: 0x7FC00000, 8: 0x7FF8000000000000}


class Guarded:
    """A copy of ``array`` between two guards of GUARD values, each marked with the
    argument's number and its place: a NaN for floats (with that mark in its low
    bits), the most negative integers for integers. Comparing the guards' bits after
    the launch tells a write outside the array, even of a NaN read from another."""

    def __init__(self, array, number):
        self.array = array
        bits = np.dtype(f"u{array.itemsize}")
        marks = np.arange(2 * GUARD, dtype=bits) + bits.type(number << 12)
        floats = array.dtype.kind == "f"
        first = QUIET_NAN[array.itemsize] if floats else 1 << (8 * array.itemsize - 1)
        self.guards = (marks + bits.type(first)).view(array.dtype)
        self.buffer = np.concatenate([self.guards[:GUARD], array.reshape(-1), self.guards[GUARD:]])
        self.inside = self.buffer[GUARD:GUARD + array.size]

    def copy_back(self, where):
        """The array given its values again; an AssertionError if a guard changed."""
        guards = np.concatenate([self.buffer[:GUARD], self.buffer[GUARD + self.array.size:]])
        assert guards.tobytes() == self.guards.tobytes(), (
            f"{where} wrote outside its array of {self.array.size} values")
        self.array.reshape(-1)[...] = self.inside


def cpu_kernel(name, function, dtype, folder):
    """A stand-in for a compiled kernel: ``(grid, block, args)`` runs its CUDA C here,
    on guarded copies of its arrays."""
    parameters = signatures(name)[function]
    lib = library(name, str(dtype), folder)
    run = getattr(lib, f"launch_{function}")
    shared = None
    if hasattr(lib, "dynamic_shared"):
        lib.dynamic_shared.restype = ctypes.c_void_p
        shared = lib.dynamic_shared()

    def launch(grid, block, args, shared_mem=0):
        assert shared_mem <= SHARED_BYTES
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        args = [Guarded(a, i) if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
        if shared:  # all NaN (every byte 0xFF) before: what is read unwritten poisons
            ctypes.memset(shared, 0xFF, SHARED_BYTES)
        run(*(ctypes.c_uint(n) for n in grid + block),
            *(c_value(p, a, str(dtype)) for p, a in zip(parameters, args)))
        if shared:
            beyond = ctypes.string_at(shared + shared_mem, SHARED_BYTES - shared_mem)
            assert beyond == b"\xff" * len(beyond), (
                f"{function} wrote past the {shared_mem} bytes of shared memory it was given")
        for i, a in enumerate(args):
            if isinstance(a, Guarded):
                a.copy_back(f"{function} (argument {i})")

    return launch
