"""``python -m tinyvit.gradcheck``: every layer, the loss and two small whole models
(a ViT and a hybrid) checked against central differences, in float64, on both tiers.

For each case it prints the max relative error (``gradient_check``) of the input's
gradient and of every parameter's, then exits with status 1 if any is above 1e-7.
A case runs on the fast tier too (``tinyvit.fast.accelerate``) when the fast tier
has a kernel for it or for one of its parts; otherwise both tiers run the same code.
"""

import sys

from .. import backend
from ..fast import accelerate
from ..models import ViT
from ..models.hybrid import ConvStem
from ..nn import conv, layers
from ..nn.loss import SoftmaxCrossEntropy
from . import gradient_check, jitter, randn, seeded_dropout

TOL = 1e-7
TINY_VIT = dict(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8,
                depth=2, num_heads=2)
TINY_HYBRID = dict(TINY_VIT, image_size=12, patch_size=1, stem=((4, 3, 2), (4, 3, 1)))


def cases():
    """(name, build): build() returns (module, inputs, before_forward)."""
    rng = backend.host_rng(0)
    x = randn(2, 5, 8)  # (B, N, D)
    images = randn(2, 3, 7, 7)  # (B, C, H, W)

    def dropout():
        layer = layers.Dropout(0.3)
        return layer, (x,), seeded_dropout(layer)

    def block_with_dropout():
        block = jitter(layers.Block(8, 2, 2.0, dropout=0.2, attn_dropout=0.1, rng=rng))
        return block, (x,), seeded_dropout(block)

    return [
        ("Linear", lambda: (jitter(layers.Linear(8, 6, rng=rng)), (x,), None)),
        ("Patchify", lambda: (layers.Patchify(4), (randn(2, 2, 8, 8),), None)),
        ("PatchEmbed", lambda: (jitter(layers.PatchEmbed(4, 2, 8, rng=rng)),
                                (randn(2, 2, 8, 8),), None)),
        ("LayerNorm", lambda: (jitter(layers.LayerNorm(8)), (x,), None)),
        ("GELU", lambda: (layers.GELU(), (2 * x,), None)),
        ("GELU tanh", lambda: (layers.GELU("tanh"), (2 * x,), None)),
        ("Tanh", lambda: (layers.Tanh(), (2 * x,), None)),
        ("Dropout", dropout),
        ("Attention", lambda: (jitter(layers.Attention(8, 2, rng=rng)), (x,), None)),
        ("ClassAttention", lambda: (jitter(layers.ClassAttention(8, 2, rng=rng)), (x,), None)),
        ("MLP", lambda: (jitter(layers.MLP(8, 16, rng=rng)), (x,), None)),
        ("Residual", lambda: (layers.Residual(jitter(layers.Linear(8, 8, rng=rng))), (x,), None)),
        ("Block", lambda: (jitter(layers.Block(8, 2, 2.0, rng=rng)), (x,), None)),
        ("Block with dropout", block_with_dropout),
        ("ClassAttentionBlock", lambda: (jitter(layers.ClassAttentionBlock(8, 2, 2.0, rng=rng)),
                                         (x,), None)),
        ("PreLogits", lambda: (jitter(layers.PreLogits(8, 6, rng=rng)), (x[:, 0],), None)),
        ("Conv2d 3x3 s2 p1", lambda: (jitter(conv.Conv2d(3, 4, 3, 2, 1, rng=rng)),
                                      (images,), None)),
        ("Conv2d WS", lambda: (jitter(conv.Conv2d(3, 4, 3, 1, 1, bias=False,
                                                  weight_standardization=True, rng=rng)),
                               (images,), None)),
        ("BatchNorm2d", lambda: (jitter(conv.BatchNorm2d(3)), (images,), None)),
        ("GroupNorm", lambda: (jitter(conv.GroupNorm(2, 4)), (randn(2, 4, 3, 5),), None)),
        ("ReLU", lambda: (conv.ReLU(), (images,), None)),
        ("MaxPool2d", lambda: (conv.MaxPool2d(3, 2, 1), (images,), None)),
        ("ConvStem", lambda: (jitter(ConvStem(3, ((4, 3, 2), (4, 3, 1)), rng=rng), scale=0.1),
                              (images,), None)),
        ("SoftmaxCrossEntropy", lambda: (SoftmaxCrossEntropy(0.1),
                                         (randn(4, 5), backend.xp.asarray([0, 3, 1, 4])), None)),
        ("ViT", lambda: (jitter(ViT(**TINY_VIT)), (randn(2, 2, 8, 8),), None)),
        ("hybrid ViT", lambda: (jitter(ViT(**TINY_HYBRID), scale=0.1),
                                (randn(2, 2, 12, 12),), None)),
    ]


def classes(module):
    return [type(m) for _, m in module.named_modules()]


def report(name, tier_name, case):
    """Check one built case; print a line per tensor and return the worst error."""
    module, inputs, before_forward = case
    checked = gradient_check(module, *inputs, before_forward=before_forward)
    for c in checked.checks:
        flag = "" if c.rel_err <= TOL else f"  > {TOL:g}"
        print(f"{tier_name:<10} {name:<20} {c.name:<40} {c.rel_err:9.2e}{flag}")
    return checked.max_rel_err


def main():
    print(f"backend {backend.get_backend()}, float64, h = 1e-5, bar {TOL:g}")
    print(f"{'tier':<10} {'case':<20} {'tensor':<40} {'rel_err':>9}")
    worst = 0.0
    with backend.default_dtype("float64"):
        for name, build in cases():
            reference, fast = build(), build()
            accelerate(fast[0])
            worst = max(worst, report(name, "reference", reference))
            if classes(fast[0]) == classes(reference[0]):
                print(f"{'fast':<10} {name:<20} the same classes as the reference")
            else:
                worst = max(worst, report(name, "fast", fast))
    ok = worst <= TOL
    print(f"worst relative error {worst:.2e}: {'all within' if ok else 'above'} {TOL:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
