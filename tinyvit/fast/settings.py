"""The fast CPU kernels' settings from environment variables (``TINYVIT_NUM_THREADS``,
``TINYVIT_NUMBA``, ``TINYVIT_MKL``): read at the first call that needs one, not on every
call (reading a variable took about 1.5 µs, and the kernels ask per block and per
``Linear``), and read again when asked."""


class EnvironmentSetting:
    """``setting()``: what ``read()`` gave at the first call, ``read`` being a function
    that reads the variable and raises ValueError on a value the kernels would refuse.
    ``read_again()`` reads it now and keeps the new reading; a value refused there leaves
    the reading kept, so the kernels run on as they did."""

    def __init__(self, read):
        self.read, self.reading = read, None

    def __call__(self):
        if self.reading is None:
            self.reading = self.read()
        return self.reading

    def read_again(self):
        self.reading = self.read()
