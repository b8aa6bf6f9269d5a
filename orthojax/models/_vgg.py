"""VGG-6 for 32×32 images (ImageNet32), the GmP paper's ablation network (Table 2).

Six 3×3 conv units in three VGG blocks (Simonyan & Zisserman 2014 style),
global average pooling and a dense classifier:

======  ==================  ======================================
block   output (32×32 in)   layers
======  ==================  ======================================
1       16×16×128           3×3 conv 128, 3×3 conv 128, 2×2/2 max-pool
2       8×8×256             3×3 conv 256, 3×3 conv 256, 2×2/2 max-pool
3       4×4×512             3×3 conv 512, 3×3 conv 512, 2×2/2 max-pool
head    num_classes         global average pool, dense classifier
======  ==================  ======================================

Source of the layout: the GmP paper (Appendix C.2) names VGG-6 on
ImageNet32 (Chrabaszcz et al. 2017: ImageNet at 32×32, 1000 classes) but
gives no layer list; the list above is the one in the authors' released
code (``imagenet32/imagenet32.py`` of Wenlin-Chen/geometric-parameterization):
"SAME" 3×3 convs, 2×2/2 max-pools, global average pooling, a 1000-way
dense layer. With ``variant="sp"`` and 1000 classes it has 5,089,384
parameters (4,576,384 in the convs).

Variants (each conv is a :class:`orthojax.models._variants.Unit`):

* ``"sp"``: conv with bias → ReLU; ``nnx.Linear`` classifier.
* ``"wn"``: weight-normalised conv with bias → ReLU; weight-normalised
  classifier (:class:`orthojax.nn.WeightNormDense`), as the released code.
* ``"wn_mbn"``: WN conv → mean-only BN (learned β) → ReLU; WN classifier.
* ``"bn"``: conv (no bias: BN removes it) → BatchNorm → ReLU; ``nnx.Linear``.
* ``"gmp"``: GmP conv ``r ⊙ ReLU(conv(x, U) + λ)``; ``nnx.Linear``.
* ``"gmp_imn"``: as ``"gmp"`` with an :class:`orthojax.nn.InputMeanNorm` in
  front of convs 2–6 (five IMNs: every GmP layer whose input is a hidden
  activation). The released code also mean-centres the last conv's output
  before the classifier; for a linear classifier that only shifts its bias
  (exactly so in eval mode), so it is left out here, as the paper's rule
  ("IMN for intermediate GmP layers") reads.

Initialisation defaults follow the released Keras code: Glorot-uniform
kernels for sp / bn and WN directions (Keras' default), zero biases; GmP
directions uniform on the sphere (``"gaussian"``) with r = 1 (the paper;
pass ``gmp_init_radius="norm"`` for the released code's ``r = ‖w‖`` of a
Glorot sample together with ``gmp_init_direction="glorot"``). Running
statistics use momentum 0.99 and BN ε = 1e-3 (Keras defaults).

References:
  Wenlin Chen and Hong Ge (GmP), §5.2, Table 2, Appendix C.2.
  Patryk Chrabaszcz, Ilya Loshchilov and Frank Hutter, "A downsampled variant
  of ImageNet as an alternative to the CIFAR datasets", 2017.
  Karen Simonyan and Andrew Zisserman, "Very deep convolutional networks for
  large-scale image recognition", ICLR 2015.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax.models._variants import Initializer
from orthojax.models._variants import Unit
from orthojax.models._variants import check_conv_weights
from orthojax.models._variants import linear
from orthojax.models._variants import put_convs_on_stiefel
from orthojax.nn import WeightNormDense
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int


class VGG6(nnx.Module):
  """VGG-6 (table in the module doc) for ``(batch, 32, 32, in_features)`` images.

  Any spatial size divisible by 8 works (global average pooling).

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> model = VGG6("gmp_imn", num_classes=10, widths=(8, 16, 32), rngs=nnx.Rngs(0))
    >>> model(jnp.ones((2, 32, 32, 3))).shape
    (2, 10)

  Args:
    variant: ``"sp"``, ``"wn"``, ``"wn_mbn"``, ``"bn"``, ``"gmp"`` or
      ``"gmp_imn"`` (see module doc).
    num_classes: classifier outputs (1000 for ImageNet32).
    in_features: image channels.
    widths: channels of the three blocks (the paper's ``(128, 256, 512)``).
    dtype, param_dtype: computation and parameter dtypes.
    kernel_init: sp / bn kernel and WN direction initializer (Glorot uniform).
    gmp_init_direction, gmp_init_radius: GmP initialisation.
    momentum: running-statistics decay; ``epsilon``: BN's ε.
    weights: ``"euclidean"`` or ``"stiefel"`` (every conv kernel a
      :class:`~orthojax.nn.StiefelParam`, as :class:`~orthojax.models.ResNet`'s; variant
      ``sp`` or ``bn``).
    rngs: ``nnx.Rngs``.

  Attributes:
    convs: ``nnx.List`` of the six units (:class:`~orthojax.models.Unit`).
    classifier: ``nnx.Linear`` (``WeightNormDense`` for the WN variants).

  Raises:
    ValueError: unknown ``variant`` or ``weights`` (the message lists the choices).
  """

  VARIANTS = Unit.VARIANTS
  """Accepted ``variant`` names (GmP paper Table 2 rows): every :class:`Unit` kind."""
  INPUT = "image"
  """The form the trainer feeds data in. ``"image"`` is ``(batch, height, width,
  channels)``, with ``in_features`` the channels (``orthojax.train.model_zoo.build``)."""

  def __init__(self, variant: str = "gmp_imn", num_classes: int = 1000, *,
               in_features: int = 3, widths: Sequence[int] = (128, 256, 512),
               dtype: Any = None, param_dtype: Any = jnp.float32,
               kernel_init: Initializer = nnx.initializers.glorot_uniform(),
               gmp_init_direction: Any = "gaussian", gmp_init_radius: str = "one",
               momentum: float = 0.99, epsilon: float = 1e-3, weights: str = "euclidean",
               rngs: nnx.Rngs):
    check_choice(variant, self.VARIANTS, "variant", where="VGG6")
    check_positive_int(num_classes, "num_classes", where="VGG6")
    check_positive_int(in_features, "in_features", where="VGG6")
    check_conv_weights(weights, variant in ("sp", "bn"), "VGG6")
    self.variant, self.dtype = variant, dtype
    convs, cin = [], in_features
    for width in widths:
      for _ in range(2):
        convs.append(Unit(variant, cin, width, (3, 3), 1, padding="SAME",
                          hidden_input=bool(convs), kernel_init=kernel_init,
                          gmp_init_direction=gmp_init_direction,
                          gmp_init_radius=gmp_init_radius, momentum=momentum,
                          epsilon=epsilon, dtype=dtype, param_dtype=param_dtype, rngs=rngs))
        cin = width
    self.convs = nnx.List(convs)
    if variant in ("wn", "wn_mbn"):
      self.classifier = WeightNormDense(cin, num_classes, kernel_init=kernel_init, dtype=dtype,
                                        param_dtype=param_dtype, rngs=rngs)
    else:
      self.classifier = linear(cin, num_classes, kernel_init=kernel_init, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
    put_convs_on_stiefel(self, weights, rngs, param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits ``(batch, num_classes)`` in float32."""
    if self.dtype is not None:
      x = jnp.asarray(x, self.dtype)
    for i, conv in enumerate(self.convs):
      x = conv(x)
      if i % 2 == 1:
        x = nnx.max_pool(x, (2, 2), strides=(2, 2))
    return self.classifier(jnp.mean(x, axis=(1, 2))).astype(jnp.float32)
