"""What tinyvit's commands share: ``run(main)``, their entry point.

A command whose output is piped into one that stops reading early
(``python -m tinyvit.learn status | head -3``) would end in a BrokenPipeError
traceback at its next write. ``run`` ends it quietly instead, with the status a shell
gives a program that a closed pipe stopped (128 + SIGPIPE's 13), as ``cat`` or ``ls``
end there.
"""

import os
import sys

BROKEN_PIPE = 128 + 13


def run(main):
    """What ``main()`` returns, for ``sys.exit``; BROKEN_PIPE where standard output's
    reader closed it, also when main ends by SystemExit (argparse's --help does)."""
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()  # the last buffered lines fail here, not in Python's exit
    except BrokenPipeError:
        # Python flushes standard output once more as it exits: into os.devnull, that
        # flush cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
