"""Every command ends quietly when its output's reader has gone (``... | head``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinyvit import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [["-m", "tinyvit.learn"], ["-m", "tinyvit.gradcheck"], ["-m", "tinyvit.inspect"],
            ["-m", "tinyvit.convert"], ["train_mnist.py"]]


def run_into_closed_pipe(arguments, unbuffered=False):
    """(status, stderr) of python ``arguments`` writing into a pipe nobody reads, its
    standard output buffered as Python buffers a pipe's (or not: PYTHONUNBUFFERED)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        environment["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)  # before the command starts: its first write finds no reader
    try:
        done = subprocess.run([sys.executable, *arguments], stdout=write_end, env=environment,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[-1])
def test_a_command_whose_reader_has_gone_ends_quietly(command):
    """--help: argparse writes the help and ends by SystemExit, the flush after it fails."""
    status, stderr = run_into_closed_pipe([*command, "--help"])
    assert (status, stderr) == (cli.BROKEN_PIPE, "")


@pytest.mark.parametrize("unbuffered", [False, True])
def test_lines_written_before_the_reader_went_end_quietly_too(unbuffered):
    status, stderr = run_into_closed_pipe(
        ["-c", "import sys; from tinyvit import cli; "
               "sys.exit(cli.run(lambda: print('x' * 100_000) or 3))"], unbuffered)
    assert (status, stderr) == (cli.BROKEN_PIPE, "")


def test_a_command_that_is_read_returns_its_own_status():
    done = subprocess.run([sys.executable, "-c", "import sys; from tinyvit import cli; "
                           "sys.exit(cli.run(lambda: print('read') or 3))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, "read\n", "")
