"""``train_mnist.py`` on the synthetic MNIST files that conftest's ``stripes`` writes,
in a process of its own (for the tests that signal or kill a run):

    python tests/train_stripes.py DATA_DIR [train_mnist.py's flags ...]

The files are registered with their checksums first, as ``stripes`` does in the
tests' own process; the exit status is train_mnist.py's.
"""

import dataclasses
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train_mnist  # noqa: E402
from tinyvit import data  # noqa: E402


def main(data_dir, *flags):
    folder = Path(data_dir) / "mnist"
    checksums = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()}
    data.DATASETS["mnist"] = dataclasses.replace(data.DATASETS["mnist"], sha256=checksums)
    return train_mnist.main(["--data-dir", data_dir, *flags])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
