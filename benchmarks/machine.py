"""The machine a benchmark runs on: the processor, NumPy's OpenBLAS and its threads, the load,
and the set-up both frameworks share (the array backend, thread counts, float32 settings and
the allocator). Also PyTorch, imported once here: ``torch`` is None where it is not installed,
and the benchmarks then time tinyvit alone."""

import os
import platform
import sys

import numpy as np

import tinyvit
from tinyvit import allocator, backend
from tinyvit.fast import blocks, check_environment, cpu_numba, mkl, openblas

try:
    import torch
except ImportError:
    torch = None

try:
    import threadpoolctl
except ImportError:
    threadpoolctl = None

COMMAND = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/benchmark.py"


def processor_model():
    """The processor's model name with its family and model numbers, which tell its
    generation where the name does not (a virtual machine may say only "AMD EPYC")."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']})"
    return fields["model name"]


def openblas_info():
    """NumPy's OpenBLAS as threadpoolctl sees it (kernel, threads, version), or None."""
    if threadpoolctl is None:
        return None
    found = [i for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
    numpy_own = [i for i in found if "numpy" in i.get("filepath", "")]
    return (numpy_own or found or [None])[0]


def blas_threads():
    info = openblas_info()
    if info:
        return info["num_threads"]
    return int(os.environ.get("OPENBLAS_NUM_THREADS", 0)) or len(os.sched_getaffinity(0))


def machine_report(gpu):
    info = openblas_info()
    report = {
        "processor": processor_model(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch else None,
        "openblas": ({k: info.get(k) for k in ("architecture", "num_threads", "version")}
                     if info else None),
        "threads": {"openblas": blas_threads(),
                    "torch": torch.get_num_threads() if torch else None},
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "openblas_idle_spin_log2_cycles": int(os.environ.get(openblas.VARIABLE)
                                              or openblas.SPIN_LOG2_CYCLES),
        "cores": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
    }
    if not gpu:
        report["cpu_kernels"] = cpu_kernels()
    if gpu:
        import cupy

        report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        report["cupy"] = cupy.__version__
    return report


def check_kernel_settings(parser):
    """The kernels' variables (``TINYVIT_NUM_THREADS``, ``TINYVIT_NUMBA``, ``TINYVIT_MKL``)
    read now: a bad value ends the script with one line naming it, before any work."""
    try:
        check_environment()
    except ValueError as error:
        parser.error(str(error))


def cpu_kernels():
    """How tinyvit's fast CPU kernels run in this process: their threads, and the routes
    ``TINYVIT_NUMBA`` and ``TINYVIT_MKL`` (or the code) chose."""
    return {"threads": blocks.num_threads(), "numba": cpu_numba.compiled(),
            "mkl": mkl.enabled()}


def describe_cpu_kernels(kernels):
    numba = ("compiled by Numba (TINYVIT_NUMBA=0: in NumPy blocks)" if kernels["numba"]
             else "in NumPy blocks")
    blas = "MKL (TINYVIT_MKL=0: NumPy's BLAS)" if kernels["mkl"] else "NumPy's BLAS"
    return (f"tinyvit threads {kernels['threads']}; GELU, LayerNorm and the softmax {numba}; "
            f"Linear's products by {blas}")


def print_machine(report):
    print(f"processor   {report['processor']}")
    if "gpu" in report:
        print(f"gpu         {report['gpu']} (CuPy {report['cupy']})")
    blas = report["openblas"]
    if blas:
        print(f"OpenBLAS    {blas['version']}, kernel {blas['architecture']}, "
              f"{blas['num_threads']} threads")
    else:
        print("OpenBLAS    unknown: threadpoolctl is not installed (pip install threadpoolctl)")
    threads = report["threads"]
    print(f"threads     OpenBLAS {threads['openblas']}, torch {threads['torch'] or '-'}; "
          f"{report['cores']} cores, load average {report['load_average_1min']:.2f}")
    warn_if_busy()
    print(f"versions    Python {report['python']}, NumPy {report['numpy']}, "
          f"PyTorch {report['torch'] or 'not installed'}, "
          f"tinyvit {getattr(tinyvit, '__version__', 'dev')}")
    print_openblas_variables(report["env"])
    print(f"OpenBLAS's idle threads spin 2^{report['openblas_idle_spin_log2_cycles']} cycles once "
          "tinyvit's blocks run on threads (tinyvit.fast.openblas; OpenBLAS's own: 2^28)")
    if "cpu_kernels" in report:
        print(f"kernels     {describe_cpu_kernels(report['cpu_kernels'])}")


def print_openblas_variables(env):
    """Warn where the variables that make OpenBLAS pick older kernels are set."""
    set_vars = {k: v for k, v in env.items() if v is not None}
    if set_vars:
        shown = ", ".join(f"{k}={v}" for k, v in set_vars.items())
        print(f"WARNING     {shown} is set: OpenBLAS may run slower kernels than on a user's "
              f"machine. The documented command unsets them:\n            {COMMAND}")
    else:
        print("env         OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (as documented)")


def warn_if_busy():
    """Other processes on the cores make both frameworks' threads wait for each other."""
    load, cores = os.getloadavg()[0], os.cpu_count()
    if load > 0.5 * cores:
        print(f"WARNING     load average {load:.2f} on {cores} cores: other work is running, "
              "timings will be noisy (compare medians, or rerun on an idle machine)")


def setup_backends(gpu):
    """Select the array backend and give torch the same thread count as OpenBLAS
    (``torch.set_num_threads``), and keep freed memory in this process as
    train_mnist.py does (``allocator.keep_freed_memory``: glibc keeps freed arrays'
    pages for reuse, for both frameworks, which share the process); exit with a clear
    message when GPU mode lacks CuPy or CUDA."""
    allocator.keep_freed_memory()
    if gpu:
        try:
            backend.set_backend("cupy")
        except backend.BackendError as e:
            sys.exit(f"--gpu: {e}")
        if torch and not torch.cuda.is_available():
            sys.exit(f"--gpu: PyTorch {torch.__version__} sees no CUDA device (a CPU-only build?); "
                     "install a CUDA build of torch, or drop --gpu")
        if torch:  # plain float32 as tinyvit computes it: cuDNN's convolutions default to TF32
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    elif torch:
        torch.set_num_threads(blas_threads())


def torch_sync(gpu):
    """What waits for torch's device: CUDA's synchronize, or nothing on the CPU."""
    return torch.cuda.synchronize if gpu else (lambda: None)
