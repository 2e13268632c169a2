"""Stopping a run when asked: Ctrl-C (SIGINT) and SIGTERM, which ``kill``, systemd,
Slurm and Docker send, are handled alike.

A signal only raises a flag (``Stop.requested``); the training loop looks at it
between steps, so the step in flight finishes and the optimizer's update is
never cut in half. Then the loop raises ``Stopped`` (a KeyboardInterrupt) and
``fit`` saves ``last.npz``. Evaluation changes nothing, so there the signal
stops it at once (``Stop.interrupting``). A signal that comes while
``last.npz`` is being saved does not cut the file short: it is told to wait
(``Stop.saving``), and the save goes on to the end.

Under mpiexec the flag travels to every process in the step's small Allreduce
(``distributed.MPIParallel``), so that they all stop at the same step.
"""

import signal
import sys
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The run stopped between two steps because it was asked to by ``signum``."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stop:
    """SIGINT and SIGTERM inside ``with Stop() as stop:``: a request to stop.

    ``requested``: the number of the first signal received, or None."""

    def __init__(self):
        self.requested, self._mode, self._saving = None, "flag", None
        self._handlers, self._depth = {}, 0  # ``with`` may nest: the outermost installs

    def __enter__(self):
        self._depth += 1
        main = threading.current_thread() is threading.main_thread()  # where handlers run
        if self._depth == 1 and main:
            for sig in SIGNALS:
                self._handlers[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)
            self._handlers.clear()

    def check(self):
        """Raise ``Stopped`` if a signal asked to stop (between two steps)."""
        if self.requested is not None:
            raise Stopped(self.requested)

    @contextmanager
    def interrupting(self):
        """Inside: a signal stops the block at once (for code that changes nothing)."""
        self.check()
        self._mode = "raise"
        try:
            yield
        finally:
            self._mode = "flag"

    @contextmanager
    def saving(self, path):
        """Inside: a signal waits for the file ``path`` to be written whole."""
        self._mode, self._saving = "wait", path
        try:
            yield
        finally:
            self._mode, self._saving = "flag", None

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self._mode == "wait":
            print(f"\n{name}: still saving {self._saving}; the run stops once it is whole",
                  file=sys.stderr, flush=True)
            return
        if self._mode == "raise":
            self.requested = self.requested or signum
            raise Stopped(signum)
        if self.requested is not None:
            print(f"\n{name}: already stopping, after the step in flight", file=sys.stderr,
                  flush=True)
        self.requested = self.requested or signum
