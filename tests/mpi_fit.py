"""A training run of tests/test_distributed.py, in one process or in each process
that mpiexec starts:

    [mpiexec -n N] python tests/mpi_fit.py DATA_DIR OUT_DIR [FIELD=VALUE ...]

trains the tiny ViT of the tests on the synthetic MNIST files in DATA_DIR (as
conftest's ``stripes`` writes them; registered here with their checksums), with
TrainConfig fields given as FIELD=VALUE (JSON, or a plain string). The other
settings, read before the run:
``dtype`` (default float64), ``steps`` (stop after that many, as a Ctrl-C does)
and ``resume`` (a checkpoint). Every process prints its pid first, and a line for
each checkpoint or metrics file it writes; the exit status is train_mnist.py's.
"""

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

from tinyvit import data
from tinyvit.backend import default_dtype
from tinyvit.train import TrainConfig, fit, loop
from tinyvit.train.distributed import launched

TINY = dict(data_dir=None, out_dir=None, model_overrides={"embed_dim": 16, "depth": 1,
                                                          "num_heads": 2},
            epochs=2, batch_size=32, eval_batch_size=50, log_every=3, lr=1e-2,
            warmup_epochs=0.5, max_shift=1, workers=1, optimizer="sgd")


def report_writes(rank):
    """Each checkpoint and metrics file written, printed with the process's rank."""
    for name in ("save_checkpoint", "write_metrics"):
        write = getattr(loop, name)

        def logged(path, *args, _write=write, _name=name):
            print(f"{_name} by process {rank}", flush=True)
            return _write(path, *args)
        setattr(loop, name, logged)


def main(data_dir, out_dir, *settings):
    rank, _ = launched()
    print(f"pid of process {rank}: {os.getpid()}", flush=True)
    report_writes(rank)
    folder = Path(data_dir) / "mnist"
    checksums = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()}
    data.DATASETS["mnist"] = dataclasses.replace(data.DATASETS["mnist"], sha256=checksums)
    fields = dict(TINY, data_dir=data_dir, out_dir=out_dir)
    for setting in settings:
        name, value = setting.split("=", 1)
        try:
            fields[name] = json.loads(value)
        except json.JSONDecodeError:  # a plain string: dtype=float32, backend=cupy
            fields[name] = value
    dtype, steps, resume = (fields.pop(k, None) for k in ("dtype", "steps", "resume"))
    with default_dtype(dtype or "float64"):
        try:
            fit(TrainConfig(**fields), resume=resume, stop_after_steps=steps)
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
