"""``python -m tinyvit.gradcheck``: what it prints and when it fails."""

import subprocess
import sys

from tinyvit import backend as B
from tinyvit.gradcheck import __main__ as command
from tinyvit.gradcheck import randn
from tinyvit.nn import layers


class BrokenLinear(layers.Linear):
    """A Linear whose backward doubles the input's gradient."""

    def backward(self, dout):
        return 2 * super().backward(dout)


def run(monkeypatch, capsys, cases):
    monkeypatch.setattr(command, "cases", lambda: cases)
    status = command.main()
    return status, capsys.readouterr().out.splitlines()


def test_prints_every_tensor_of_each_tier(monkeypatch, capsys):
    def linear():
        return layers.Linear(4, 3, rng=B.host_rng(0)), (randn(2, 4),), None

    status, out = run(monkeypatch, capsys, [("Linear", linear), ("Tanh", lambda: (
        layers.Tanh(), (randn(2, 4),), None))])
    assert status == 0
    rows = [line.split()[:3] for line in out[2:-1]]
    assert rows == [[tier, "Linear", tensor] for tier in ("reference", "fast")
                    for tensor in ("input", "weight", "bias")] + [
        ["reference", "Tanh", "input"], ["fast", "Tanh", "the"]]
    assert out[-2].endswith("the same classes as the reference")
    assert out[-1].endswith("all within 1e-07")


def test_a_wrong_backward_fails(monkeypatch, capsys):
    def broken():
        return BrokenLinear(4, 3, rng=B.host_rng(0)), (randn(2, 4),), None

    status, out = run(monkeypatch, capsys, [("broken", broken)])
    assert status == 1
    # the fast tier has no kernel for the subclass: only the reference row is checked
    assert [line.split()[:3] for line in out if line.endswith("> 1e-07")] == [
        ["reference", "broken", "input"]]
    assert out[-1].endswith("above 1e-07")


def test_the_whole_command_passes():
    result = subprocess.run([sys.executable, "-m", "tinyvit.gradcheck"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    cases = [name for name, _ in command.cases()]
    checked = {line[11:31].strip() for line in result.stdout.splitlines()[2:-1]}
    assert checked == set(cases)
    assert "patch_embed.backbone.conv1.weight" in result.stdout
