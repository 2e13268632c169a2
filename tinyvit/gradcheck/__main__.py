"""``python -m tinyvit.gradcheck``: every layer, the loss and two small whole models (a
ViT and a hybrid) checked against central differences, in float64, on both tiers.

    python -m tinyvit.gradcheck                              # everything, both tiers
    python -m tinyvit.gradcheck --layer LayerNorm Attention  # those cases alone
    python -m tinyvit.gradcheck --tier reference --backend cupy

For each case and tier it prints a row per tensor (the input's gradient, then each
parameter's, grouped by layer, each layer with its section of docs/backprop.md):
PASS or FAIL at 1e-7, the relative error, and under a failure what is wrong. A case
runs on the fast tier (``tinyvit.fast.accelerate``) when the fast tier has a kernel
for it or for one of its parts; otherwise both tiers run the same code. It ends
with how many tensors passed, and exits with status 1 if one failed.
"""

import argparse
import sys

from .. import backend, cli
from ..fast import accelerate
from . import gradient_check
from .cases import cases

TOL = 1e-7
TIERS = {"both": ("reference", "fast"), "reference": ("reference",), "fast": ("fast",)}


def parse_args(argv):
    with backend.using_backend("numpy"):  # the names alone: main draws the cases' inputs
        names = [name for name, _ in cases()]  # again, on the backend chosen
    p = argparse.ArgumentParser(prog="python -m tinyvit.gradcheck", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", nargs="+", action="extend", metavar="NAME",
                   help="check these cases alone (several allowed; in any case of letters; "
                        "quote a name with spaces; a name that is no case's, Conv2d, selects "
                        f"each case it begins): {', '.join(names)}")
    p.add_argument("--tier", choices=TIERS, default="both",
                   help="the reference layers, their fast kernels, or both (default)")
    p.add_argument("--backend", choices=backend.BACKENDS,
                   help="the array backend (default: the one TINYVIT_BACKEND names, numpy "
                        "where it is unset)")
    args = p.parse_args(argv)
    try:
        args.backend = args.backend or backend.environment_backend()
    except ValueError as error:  # TINYVIT_BACKEND's value
        p.error(str(error))
    chosen = {given: selected(given, names) for given in args.layer or ()}
    unknown = [given for given, found in chosen.items() if not found]
    if unknown:
        p.error(f"no case named {', '.join(unknown)}; the cases: {', '.join(names)}")
    args.layer = [name for found in chosen.values() for name in found]
    return args


def selected(given, names):
    """The cases ``--layer given`` names, in any case of letters: the one of that name, or
    else each whose name is it and more words (Conv2d: "Conv2d 3x3 s2 p1", "Conv2d WS")."""
    given = given.lower()
    same = [name for name in names if name.lower() == given]
    return same or [name for name in names if name.lower().startswith(given + " ")]


def check(name, tier, case):
    """Check one built case, print its report; returns (tensors passed, tensors)."""
    module, inputs, before_forward = case
    report = gradient_check(module, *inputs, before_forward=before_forward, tol=TOL)
    print(f"== {name} ({tier})")
    for line in str(report).splitlines()[:-1]:  # its last line counts its own tensors
        print(f"  {line}")
    return sum(c.passed(TOL) for c in report.checks), len(report.checks)


def classes(module):
    return [type(m) for _, m in module.named_modules()]


def main(argv=None):
    args = parse_args(argv)
    try:
        backend.set_backend(args.backend)
    except backend.BackendError as e:
        sys.exit(f"python -m tinyvit.gradcheck: {e}")
    print(f"backend {backend.get_backend()}, float64, h = 1e-5, tol {TOL:g}")
    passed = total = 0
    with backend.default_dtype("float64"):
        for name, build in cases():
            if args.layer and name not in args.layer:
                continue
            reference = build()
            for tier in TIERS[args.tier]:
                case = reference if tier == "reference" else build()
                if tier == "fast":
                    accelerate(case[0])
                    if classes(case[0]) == classes(reference[0]) and "reference" in TIERS[
                            args.tier]:
                        print(f"== {name} (fast): no fast kernel, the reference's layers as "
                              "checked above")
                        continue
                ok, count = check(name, tier, case)
                passed, total = passed + ok, total + count
    print(f"{passed} of {total} tensors passed ({'all' if passed == total else 'not all'} "
          f"within {TOL:g})")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(cli.run(main))
