"""The report of a gradient check: a row per tensor with PASS or FAIL, the rows
grouped by layer, each layer linked to the section of docs/backprop.md that
derives its backward, and under each failing row what is wrong."""

from ..models import ViT
from ..models.hybrid import ConvStem, HybridEmbed
from ..nn import conv, layers
from ..nn.loss import SoftmaxCrossEntropy
from .answer import not_found, said

BACKPROP = "docs/backprop.md"
# the section of docs/backprop.md that derives each layer's backward (isinstance: a fast
# kernel has its reference layer's)
SECTIONS = (
    (layers.ClassAttentionBlock, "ClassAttentionBlock"),
    (layers.Block, "The pre-norm encoder block"),
    (layers.ClassAttention, "ClassAttention: the class token's query alone"),
    (layers.Attention, "Multi-head self-attention"),
    (layers.PatchEmbed, "Patchify and the patch embedding"),
    (layers.Patchify, "Patchify moves entries"),
    (layers.Linear, "Linear"),
    (layers.LayerNorm, "LayerNorm"),
    (layers.GELU, "GELU"),
    (layers.Tanh, "Tanh"),
    (layers.Dropout, "Dropout"),
    (layers.MLP, "MLP"),
    (layers.Residual, "Residual connections: gradients add up"),
    (layers.PreLogits, "Pooling and the head"),
    (conv.Conv2d, "Conv2d as a matmul on im2col columns"),
    (conv.BatchNorm2d, "BatchNorm2d"),
    (conv.GroupNorm, "GroupNorm"),
    (conv.ReLU, "ReLU"),
    (conv.MaxPool2d, "MaxPool2d"),
    (ConvStem, "Convolutional stem"),
    (HybridEmbed, "Convolutional stem"),
    (SoftmaxCrossEntropy, "Softmax cross-entropy"),
    (ViT, "Class token and position embedding"),
)


def anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces
    as hyphens."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def section(module):
    """``docs/backprop.md#...`` for a layer, or None for one the page does not derive."""
    for kind, heading in SECTIONS:
        if isinstance(module, kind):
            return f"{BACKPROP}#{anchor(heading)}"
    return None


class GradCheckReport:
    """The per-tensor results of ``gradient_check``; ``str()`` prints them grouped by
    layer, with PASS or FAIL at ``tol`` and the findings under each failure."""

    def __init__(self, checks, h, tol, module, search=None):
        self.checks, self.h, self.tol = checks, h, tol
        self.layers = dict(module.named_modules())
        self.module = module
        self.search = search  # the repair search's, where a gradient failed

    @property
    def fix(self):
        """The repair search's ``Fix`` (None where it found none, or none ran)."""
        return self.search.fix if self.search is not None else None

    @property
    def max_rel_err(self):
        return max(c.rel_err for c in self.checks)

    @property
    def passed(self):
        return all(c.passed(self.tol) for c in self.checks)

    def __getitem__(self, name):
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def groups(self):
        """(layer path, its module, its checks), in the order of the checks: the input
        with the module itself, each parameter with the layer that holds it."""
        grouped = {}
        for c in self.checks:
            path = "" if c.name == "input" or "." not in c.name else c.name.rsplit(".", 1)[0]
            grouped.setdefault(path, []).append(c)
        return [(path, self.layers[path], checks) for path, checks in grouped.items()]

    def __str__(self):
        lines = []
        for path, layer, checks in self.groups():
            link = section(layer)
            title = f"{path} ({type(layer).__name__})" if path else type(layer).__name__
            lines.append(title + (f"   {link}" if link else ""))
            for c in checks:
                name = c.name[len(path) + 1:] if path else c.name
                result = "PASS" if c.passed(self.tol) else "FAIL"
                measured = (f"rel_err {c.rel_err:.1e}  worst {c.where}: {c.analytic:.6g} vs "
                            f"{c.numeric:.6g}") if c.problem is None else "not compared"
                if result == "FAIL" and c.problem is None and c.rel_err <= self.tol:
                    measured += ", the values right"  # the failure is said below them
                if c.problem is None and c.rel_err > self.tol and c.within_noise():
                    untold = "" if c.passed(self.tol) else (
                        "; the differences cannot tell it right or wrong here (a large output "
                        "over a small gradient?)")
                    measured += (f", {abs(c.analytic - c.numeric):.1e} apart, within the "
                                 f"rounding of the differences ({c.noise:.1e}){untold}")
                lines.append(f"  {result}  {name:<14}{str(c.shape):<14}{measured}")
                lines += [f"        {finding}" for finding in c.findings]
        lines += self._repair()
        passed = sum(c.passed(self.tol) for c in self.checks)
        lines.append(f"{passed} of {len(self.checks)} tensors passed (tol {self.tol:g}, "
                     f"h {self.h:g}; computed vs expected at the worst entry)")
        return "\n".join(lines)

    def _repair(self):
        """The fix the search found, or how far it looked."""
        if self.search is None:
            return []
        if self.fix is not None:
            return said(self.fix, self.search, section_of=self._section_of)
        if not self.search.sources:
            return ["no edit was tried: no function the backward ran could be edited (a lambda, "
                    "a builtin, code typed at a prompt, or code the forward runs too); what "
                    "differs is measured under each failing gradient"]
        return [f"{not_found(self.search, 'makes every gradient right')}; what differs is "
                "measured under each failing gradient"]

    def _section_of(self, edit):
        layers = [m for m in edit.scope.selves if m is not None]
        return section(layers[0] if layers else self.module)

    def assert_ok(self, tol=None):
        """Raise AssertionError, with the whole report, unless every tensor passes at
        ``tol`` (default: the check's)."""
        if tol is not None:
            self.tol = tol
        if not self.passed:
            raise AssertionError(f"gradient check failed:\n{self}")
        return self
