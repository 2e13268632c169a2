"""``assert_gradients`` in a learner's own pytest: a layer of their own (an RMSNorm)
checked in three lines of their test file, run by pytest in a folder of their own."""

import subprocess
import sys
import textwrap

RMSNORM = '''
from tinyvit.backend import xp
from tinyvit.nn.module import Module, Parameter


class RMSNorm(Module):
    """y = gamma * x / rms(x), rms(x) = sqrt(mean(x^2) + eps) over the last axis."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(xp.ones(dim))

    def forward(self, x):
        rinv = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        self.cache = (x, rinv)
        return self.weight.data * x * rinv

    def backward(self, dout):
        x, rinv = self._take_cache()
        self.weight.grad += (dout * x * rinv).reshape(-1, x.shape[-1]).sum(axis=0)
        g = dout * self.weight.data
        return rinv * (g - x * rinv**2 * (g * x).mean(axis=-1, keepdims=True)){bug}
'''

LEARNERS_TEST = '''
from my_layers import RMSNorm
from tinyvit.gradcheck import assert_gradients, randn


def test_rmsnorm():
    assert_gradients(RMSNorm(8), randn(2, 5, 8))
'''


def run_pytest(folder, bug):
    (folder / "my_layers.py").write_text(textwrap.dedent(RMSNORM).format(bug=bug))
    (folder / "test_my_layers.py").write_text(textwrap.dedent(LEARNERS_TEST))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_my_layers.py"], cwd=folder, capture_output=True, text=True,
                          timeout=300)


def test_a_right_layer_passes_in_the_learners_pytest(tmp_path):
    result = run_pytest(tmp_path, bug="")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_a_wrong_layer_fails_with_the_report_and_the_diagnosis(tmp_path):
    result = run_pytest(tmp_path, bug=" * 2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gradient check failed" in result.stdout
    assert "FAIL  input" in result.stdout and "PASS  weight" in result.stdout
    assert ("computed/expected = 2 everywhere: a factor of 2 too many: a value added 2 times, "
            "or a 1/2 left out\n") in result.stdout
