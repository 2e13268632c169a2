"""CUDA graphs: the kernel launches of a step recorded once, then replayed as one launch.

At tinyvit's sizes a GPU step waits on the host: it queues a few hundred kernels,
each a few microseconds of Python and driver work, and the GPU runs most of them in
less. A CUDA graph records the launches of one call (stream capture) and replays
them all with one launch, so the host's cost of a step no longer grows with its
kernels.

    step = Captured(function)        # function(*arrays) -> tuple of arrays
    outputs = step(x, target, labels)

Replaying runs the same kernels with the same arguments on the same memory, so a
function to capture keeps to these rules:

- its inputs arrive as arrays, which ``Captured`` copies into arrays of its own
  before each call; values that change from call to call otherwise are read from
  device memory written before the call (``AdamW.schedule``, ``DeviceKeys.seed``);
- it reads nothing back to the host, copies nothing between host and device, and
  waits for nothing;
- it calls neither CuPy's cuBLAS nor cuRAND, which refuse a capture: the GPU
  tier's matmuls go through ``cublas.py``, and its dropout draws in its kernel;
- it takes the same decisions on the host at every call with the same shapes:
  there is one graph per shape of the inputs.

The first ``warmup`` calls of each shape run the function as it is (compiling its
kernels and filling the memory pool), the next captures it, and every call from
then on replays it. The arrays it allocates come from a memory pool of the graph's
own, which keeps them while the graph lives: a replay writes them again. Each call
returns copies of the outputs, so that a replay does not overwrite a result that is
still to be read. On NumPy there is nothing to capture: the function runs on the
copied inputs at every call.
"""

import contextlib

from ..backend import on_cpu, xp

WARMUP = 2  # calls of each shape run as they are before the one that captures


class Captured:
    """``function`` captured into a CUDA graph per shape of its inputs, and replayed."""

    def __init__(self, function, warmup=WARMUP):
        self.function, self.warmup = function, warmup
        self.graphs = {}  # ((shape, dtype) of each input) -> Graph
        self.stream = None if on_cpu() else xp.cuda.Stream(non_blocking=True)

    def __call__(self, *inputs):
        signature = tuple((a.shape, a.dtype.str) for a in inputs)
        if signature not in self.graphs:
            self.graphs[signature] = Graph(inputs)
        graph = self.graphs[signature]
        if self.stream is None:
            graph.copy_inputs(inputs)
            return self.function(*graph.inputs)
        caller = xp.cuda.get_current_stream()
        self.stream.wait_event(caller.record())  # after the work that made the inputs
        with self.stream:
            graph.copy_inputs(inputs)
            outputs = graph.run(self.function, self.stream, self.warmup)
        caller.wait_event(self.stream.record())  # before whatever reads the outputs
        return tuple(a.copy() for a in outputs)

    @property
    def captured(self):
        """How many graphs have been captured (one per shape of the inputs)."""
        return sum(graph.graph is not None for graph in self.graphs.values())


class Graph:
    """One shape of the inputs: the arrays they are copied into, the calls run so far,
    and, once captured, the CUDA graph, its outputs and the memory pool it owns."""

    def __init__(self, inputs):
        self.inputs = tuple(xp.empty_like(a) for a in inputs)
        self.calls, self.graph, self.outputs = 0, None, None
        self.pool = None if on_cpu() else xp.cuda.MemoryPool()

    def copy_inputs(self, inputs):
        for mine, a in zip(self.inputs, inputs):
            mine[...] = a

    def run(self, function, stream, warmup):
        """Call ``function`` (the first ``warmup`` times), capture it (the next), or
        replay it; returns its outputs."""
        with xp.cuda.using_allocator(self.pool.malloc):
            if self.graph is None and self.calls < warmup:
                self.calls += 1
                return function(*self.inputs)
            if self.graph is None:
                stream.begin_capture()
                try:
                    self.outputs = function(*self.inputs)
                except BaseException:
                    with contextlib.suppress(Exception):  # the first error is the one to see
                        stream.end_capture()
                    raise
                self.graph = stream.end_capture()
                self.graph.upload(stream)
        self.graph.launch(stream)
        return self.outputs
