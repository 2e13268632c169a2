"""The cases ``python -m tinyvit.gradcheck`` checks: every layer, the loss and two
small whole models (a ViT and a hybrid), each built with random parameters off their
neat initial values and a random input, in float64 (under ``default_dtype``)."""

from .. import backend
from ..models import ViT
from ..models.hybrid import ConvStem
from ..nn import conv, layers
from ..nn.loss import SoftmaxCrossEntropy
from .inputs import jitter, randn, seeded_dropout

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
