"""ResNet-18/34/50/101 (v1.5) with BN, WN+MBN, GmP+IMN or no normalisation.

Shapes follow torchvision / the flax ImageNet example (v1.5: in a bottleneck
block the stride sits on the 3×3 conv), channels-last:

=======  ============================  =======================  ===========================
stage    output (224×224 input)        ResNet-18 / 34 (basic)   ResNet-50 / 101 (bottleneck)
=======  ============================  =======================  ===========================
stem     112×112 → 56×56 (max-pool)    as for 50 / 101          7×7/2 conv 64, norm, ReLU, 3×3/2 max-pool (pad 1)
conv2_x  56×56                         [3×3, 64]×2 × (2 | 3)    [1×1 64, 3×3 64, 1×1 256] × 3
conv3_x  28×28                         [3×3, 128]×2 × (2 | 4)   [1×1 128, 3×3 128, 1×1 512] × 4
conv4_x  14×14                         [3×3, 256]×2 × (2 | 6)   [… 256, … 1024] × (6 | 23)
conv5_x  7×7                           [3×3, 512]×2 × (2 | 3)   [1×1 512, 3×3 512, 1×1 2048] × 3
head     1×1                           as for 50 / 101          global average pool, ``nnx.Linear`` classifier
=======  ============================  =======================  ===========================

The first block of stages 3–5 has stride 2; a block whose shape changes
gets a projection shortcut (1×1 strided conv + norm), otherwise the
identity. Each conv is a :class:`orthojax.models._variants.Unit`; a block
computes ``ReLU(branch(x) + shortcut(x))``, so the last unit of the branch
and the projection have no activation of their own. Trainable ``nnx.Param``
counts of the ``"bn"`` nets equal torchvision's: 11,689,512 (18),
21,797,672 (34), 25,557,032 (50), 44,549,160 (101) with 1000 classes.

Variants (``norm``):

* ``"bn"``: conv (no bias) → BatchNorm → ReLU (momentum 0.9, ε = 1e-5). The
  scale γ of the *last* BN of each residual branch starts at 0, as in the
  flax ImageNet example (and Goyal et al. 2017): every block starts as the
  identity map (plus ReLU), which eases early training of deep ResNets.
  Projection-shortcut BNs start at γ = 1.
* ``"wn_mbn"``: weight-normalised conv (no bias) → mean-only BN (learned
  bias β) → ReLU (Salimans & Kingma 2016), the GmP paper's WN+MBN baseline.
* ``"gmp_imn"``: every conv is a :class:`orthojax.nn.GmPConv`
  ``z = r ⊙ φ(conv(x, U(θ)) + λ)``; an :class:`orthojax.nn.InputMeanNorm`
  sits in front of every GmP conv whose input is a hidden activation, i.e.
  all but the stem (whose input is the image). The classifier stays a plain
  ``nnx.Linear`` (GmP paper §4.1: the output layer is not reparameterised).
  **Residual handling:** the ReLU of the last conv of a block comes *after*
  the addition, so that conv is a GmP conv with the identity activation,
  ``r ⊙ (conv(x, U) + λ)``, and the ReLU follows the addition — the unit is
  then exactly a reparameterised standard conv (``w = r u``, ``b = r λ``)
  and the block computes the same function class as the standard block.
  Projection shortcuts are GmP convs with the identity activation too, each
  with its own IMN (so #IMN = #GmP − 1). The identity shortcut carries the
  block input *uncentred*, as the BN net carries its post-ReLU input; IMN
  centres only what enters a GmP conv. (The authors' released ResNet-34
  code instead centres the whole stream once after every block's ReLU and
  feeds the centred stream to both the branch and the shortcut.)
* ``"none"``: conv with bias → ReLU, no normalisation (the sp unit).

Every conv has ``padding = k // 2`` on each side and the max-pool pads 1, as
torchvision, so feature-map alignment matches its checkpoints.
``dtype=jnp.bfloat16`` runs the network in bfloat16 (parameters stay
``param_dtype``; normalisation statistics and GmP directions are computed
in float32); the logits are returned in float32.

References:
  Kaiming He, Xiangyu Zhang, Shaoqing Ren and Jian Sun, "Deep residual
  learning for image recognition", CVPR 2016.
  Priya Goyal et al., "Accurate, large minibatch SGD: training ImageNet in
  1 hour", 2017 (zero-γ init of the last BN of each block).
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP), §4, Table 1.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax.models._variants import Initializer
from orthojax.models._variants import Unit
from orthojax.models._variants import check_conv_weights
from orthojax.models._variants import linear
from orthojax.models._variants import put_convs_on_stiefel
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int

_UNIT_VARIANT = {"bn": "bn", "wn_mbn": "wn_mbn", "gmp_imn": "gmp_imn", "none": "sp"}

LAYOUTS: dict[int, tuple[str, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
}
"""depth -> (block kind, blocks per stage)."""

_WIDTHS = (64, 128, 256, 512)


class BasicBlock(nnx.Module):
  """``ReLU(conv3×3(ReLU(conv3×3/s(x))) + shortcut(x))`` (ResNet-18/34).

  Attributes: ``conv1``, ``conv2`` and ``proj`` (projection Unit or None).
  """

  expansion = 1

  def __init__(self, in_features: int, width: int, stride: int, make_unit):
    self.conv1 = make_unit(in_features, width, (3, 3), stride)
    self.conv2 = make_unit(width, width, (3, 3), 1, activation="identity", zero_init_norm=True)
    self.proj = (make_unit(in_features, width, (1, 1), stride, activation="identity")
                 if stride != 1 or in_features != width else nnx.data(None))

  def __call__(self, x: jax.Array) -> jax.Array:
    y = self.conv2(self.conv1(x))
    shortcut = self.proj(x) if self.proj is not None else x
    return jax.nn.relu(y + shortcut)


class Bottleneck(nnx.Module):
  """``ReLU(conv1×1(ReLU(conv3×3/s(ReLU(conv1×1(x))))) + shortcut(x))``, 4× expansion (v1.5).

  Attributes: ``conv1``, ``conv2``, ``conv3`` and ``proj`` (Unit or None).
  """

  expansion = 4

  def __init__(self, in_features: int, width: int, stride: int, make_unit):
    out = width * self.expansion
    self.conv1 = make_unit(in_features, width, (1, 1), 1)
    self.conv2 = make_unit(width, width, (3, 3), stride)
    self.conv3 = make_unit(width, out, (1, 1), 1, activation="identity", zero_init_norm=True)
    self.proj = (make_unit(in_features, out, (1, 1), stride, activation="identity")
                 if stride != 1 or in_features != out else nnx.data(None))

  def __call__(self, x: jax.Array) -> jax.Array:
    y = self.conv3(self.conv2(self.conv1(x)))
    shortcut = self.proj(x) if self.proj is not None else x
    return jax.nn.relu(y + shortcut)


class ResNet(nnx.Module):
  """ResNet v1.5 for ``(batch, H, W, in_features)`` images (table in the module doc).

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> model = ResNet(18, norm="gmp_imn", num_classes=10, rngs=nnx.Rngs(0))
    >>> model(jnp.ones((2, 32, 32, 3))).shape
    (2, 10)

  Args:
    depth: 18, 34, 50 or 101.
    norm: ``"bn"``, ``"wn_mbn"``, ``"gmp_imn"`` or ``"none"`` (see module doc).
    num_classes: classifier outputs.
    in_features: image channels.
    dtype: computation dtype (e.g. ``jnp.bfloat16``); None infers it from
      the inputs and parameters. Logits are returned in float32.
    param_dtype: parameter dtype.
    kernel_init: initializer of the bn / none conv kernels and of the WN
      directions (default LeCun normal: ``nnx.Conv``'s default, which the
      flax ImageNet example trains to 76 % top-1 with BN).
    gmp_init_direction, gmp_init_radius: GmP initialisation (``"gaussian"``:
      directions uniform on the sphere; ``"one"``: r = 1, the paper).
    momentum: running-statistics decay (BN, MBN and IMN); 0.9 as the flax
      ImageNet example.
    weights: ``"euclidean"`` (plain conv kernels) or ``"stiefel"``: every conv kernel
      a :class:`~orthojax.nn.StiefelParam`, orthogonally initialised, for a Stiefel
      optimizer on the convs (``config.optimizer.stiefel``); norm ``bn`` or ``none``.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Attributes:
    stem: the 7×7/2 :class:`~orthojax.models.Unit`.
    layers: ``nnx.List`` of stages, each an ``nnx.List`` of blocks.
    classifier: ``nnx.Linear``.

  Raises:
    ValueError: unknown ``depth``, ``norm`` or ``weights`` (the message lists the choices).
  """

  NORMS = ("bn", "wn_mbn", "gmp_imn", "none")
  """Accepted ``norm`` names."""
  INPUT = "image"
  """The form the trainer feeds data in. ``"image"`` is ``(batch, height, width,
  channels)``, with ``in_features`` the channels (``orthojax.train.model_zoo.build``)."""

  def __init__(self, depth: int = 50, norm: str = "bn", num_classes: int = 1000, *,
               in_features: int = 3, dtype: Any = None, param_dtype: Any = jnp.float32,
               kernel_init: Initializer = nnx.initializers.lecun_normal(),
               gmp_init_direction: Any = "gaussian", gmp_init_radius: str = "one",
               momentum: float = 0.9, weights: str = "euclidean", rngs: nnx.Rngs):
    check_choice(depth, tuple(LAYOUTS), "depth")
    check_choice(norm, self.NORMS, "norm", where="ResNet")
    check_positive_int(num_classes, "num_classes", where="ResNet")
    check_positive_int(in_features, "in_features", where="ResNet")
    check_conv_weights(weights, norm in ("bn", "none"), "ResNet")
    self.depth, self.norm, self.dtype = depth, norm, dtype
    variant = _UNIT_VARIANT[norm]

    def make_unit(cin, cout, kernel_size, stride, **kw):
      return Unit(variant, cin, cout, kernel_size, stride, kernel_init=kernel_init,
                  gmp_init_direction=gmp_init_direction, gmp_init_radius=gmp_init_radius,
                  momentum=momentum, epsilon=1e-5, dtype=dtype, param_dtype=param_dtype,
                  rngs=rngs, **kw)

    kind, counts = LAYOUTS[depth]
    block_cls = BasicBlock if kind == "basic" else Bottleneck
    self.stem = make_unit(in_features, 64, (7, 7), 2, hidden_input=False)
    stages, features = [], 64
    for stage, (width, count) in enumerate(zip(_WIDTHS, counts)):
      blocks = []
      for i in range(count):
        stride = 2 if stage > 0 and i == 0 else 1
        blocks.append(block_cls(features, width, stride, make_unit))
        features = width * block_cls.expansion
      stages.append(nnx.List(blocks))
    self.layers = nnx.List(stages)
    self.num_features = features
    self.classifier = linear(features, num_classes, dtype=dtype, param_dtype=param_dtype,
                             rngs=rngs)
    put_convs_on_stiefel(self, weights, rngs, param_dtype)

  def features(self, x: jax.Array) -> jax.Array:
    """The pooled ``(batch, num_features)`` features before the classifier."""
    if self.dtype is not None:
      x = jnp.asarray(x, self.dtype)
    x = self.stem(x)
    x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage in self.layers:
      for block in stage:
        x = block(x)
    return jnp.mean(x, axis=(1, 2))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits ``(batch, num_classes)`` in float32 for images ``(batch, H, W, C)``."""
    return self.classifier(self.features(x)).astype(jnp.float32)


def _constructor(depth: int):
  def build(norm: str = "bn", num_classes: int = 1000, **kwargs) -> ResNet:
    return ResNet(depth, norm, num_classes, **kwargs)

  build.__name__ = build.__qualname__ = f"ResNet{depth}"
  build.__doc__ = (f"ResNet-{depth}: ``ResNet({depth}, norm, num_classes, **kwargs)`` "
                   "(see :class:`ResNet`).")
  build.INPUT = ResNet.INPUT
  return build


ResNet18 = _constructor(18)
ResNet34 = _constructor(34)
ResNet50 = _constructor(50)
ResNet101 = _constructor(101)
