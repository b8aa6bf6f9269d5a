"""One "linear map + normalisation + activation" unit per parameterization.

ResNet, VGG-6 and the one-hidden-layer MLP are written once, in terms of
:class:`Unit`; the variant name picks what a unit is made of (``x`` is the
unit's input, ``φ`` its activation, ``W`` a conv or dense kernel):

===========  ===============================================  =================================
variant      unit                                              reference
===========  ===============================================  =================================
``sp``       ``φ(x W + b)``                                    standard parameterization
``wn``       ``φ(x (g·v/‖v‖) + b)``                            Salimans & Kingma 2016, eq. 2
``wn_mbn``   ``φ(MBN(x (g·v/‖v‖)))``, MBN(t) = t − E[t] + β    Salimans & Kingma 2016, §3
``bn``       ``φ(BN(x W))``                                    Ioffe & Szegedy 2015
``gmp``      ``r ⊙ φ(x U(θ) + λ)``                             Chen & Ge (GmP), eq. 15
``gmp_imn``  ``r ⊙ φ((x − E[x]) U(θ) + λ)`` on hidden inputs   Chen & Ge (GmP), eq. 15–16
===========  ===============================================  =================================

``E[·]`` is the batch mean in train mode and a running mean in eval mode
(``model.train()`` / ``model.eval()``), per channel. Biases in front of a
normalisation are dropped (BN and MBN remove them). Input Mean Normalization
(IMN) is put only in front of a GmP layer whose input is a hidden activation
(``hidden_input=True``), never in front of the data layer — its input is the
(already standardised) data. ``activation="identity"`` gives the bare
pre-activation unit used before a residual addition; for GmP that is
``r ⊙ (x U + λ)``.

Every parameter carries the logical sharding axes of
:mod:`orthojax.nn.sharding` (conv kernels ``(spatial…, fan_in, fan_out)``,
per-unit vectors ``(fan_out,)``), BatchNorm running statistics included.

References:
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP), §4.1–4.2.
  Tim Salimans and Diederik P. Kingma, "Weight normalization", NeurIPS 2016.
  Sergey Ioffe and Christian Szegedy, "Batch normalization", ICML 2015.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax import manifolds
from orthojax.nn import GmPConv
from orthojax.nn import GmPDense
from orthojax.nn import InputMeanNorm
from orthojax.nn import MeanOnlyBatchNorm
from orthojax.nn import WeightNormConv
from orthojax.nn import WeightNormDense
from orthojax.nn import activation_fn
from orthojax.nn import check_choice
from orthojax.nn import StiefelParam
from orthojax.nn import sharding

Initializer = Callable[[jax.Array, Sequence[int], Any], jax.Array]


def _meta(names: tuple[str, ...]) -> dict[str, Any]:
  return sharding.metadata(names)


WEIGHTS = ("euclidean", "stiefel")
"""The ``weights`` a conv network (ResNet, VGG6) takes: plain conv kernels, or every
conv kernel a :class:`~orthojax.nn.StiefelParam`."""


def check_conv_weights(weights: str, plain: bool, where: str) -> None:
  """ValueError for an unknown ``weights``, or ``"stiefel"`` without plain conv kernels
  (``plain`` false: WN / GmP units parameterize their kernels themselves); checked before
  the network is built."""
  check_choice(weights, WEIGHTS, "weights", where=where)
  if weights == "stiefel" and not plain:
    raise ValueError(f"{where}: weights='stiefel' needs plain conv kernels (the bn or sp / "
                     f"none units); WN and GmP units parameterize their kernels themselves")


def put_convs_on_stiefel(model: nnx.Module, weights: str, rngs: nnx.Rngs,
                         param_dtype: Any) -> None:
  """``weights="stiefel"`` (checked by :func:`check_conv_weights`): every ``nnx.Conv``
  kernel of ``model`` becomes a
  :class:`~orthojax.nn.StiefelParam` at a uniformly random point of the Stiefel manifold
  (orthonormal on the tall side of its ``(kh·kw·in, out)`` view, the orthogonal
  initialisation), so that :func:`orthojax.optim.partition` routes the conv kernels to a
  ``stiefel=`` optimizer (Riemannian Adam, Muon, …) and the rest to a Euclidean one.
  """
  if weights != "stiefel":
    return
  stiefel = manifolds.Stiefel()
  for _, module in nnx.iter_modules(model):
    if isinstance(module, nnx.Conv):
      shape = module.kernel[...].shape
      module.kernel = StiefelParam(
          stiefel.random(rngs.params(), shape, param_dtype),
          **_meta(sharding.conv_kernel(len(shape) - 2)))


def batch_norm(num_features: int, *, momentum: float, epsilon: float, zero_scale: bool = False,
               dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs) -> nnx.BatchNorm:
  """``nnx.BatchNorm`` with logical axes on its scale, bias and running statistics."""
  bn = nnx.BatchNorm(num_features, momentum=momentum, epsilon=epsilon, dtype=dtype,
                     param_dtype=param_dtype,
                     scale_init=nnx.initializers.zeros if zero_scale else nnx.initializers.ones,
                     scale_metadata=_meta(sharding.BIAS), bias_metadata=_meta(sharding.BIAS),
                     rngs=rngs)
  bn.mean.set_metadata(**_meta(sharding.BIAS))
  bn.var.set_metadata(**_meta(sharding.BIAS))
  return bn


def linear(in_features: int, out_features: int, *, use_bias: bool = True,
           kernel_init: Initializer = nnx.initializers.lecun_normal(), dtype: Any = None,
           param_dtype: Any = jnp.float32, rngs: nnx.Rngs) -> nnx.Linear:
  """``nnx.Linear`` with logical axes ``(fan_in, fan_out)`` / ``(fan_out,)``."""
  return nnx.Linear(in_features, out_features, use_bias=use_bias, kernel_init=kernel_init,
                    dtype=dtype, param_dtype=param_dtype,
                    kernel_metadata=_meta(sharding.DENSE_KERNEL),
                    bias_metadata=_meta(sharding.BIAS), rngs=rngs)


class Unit(nnx.Module):
  """``[IMN →] linear map [→ norm] [→ φ]`` for one variant (table in the module doc).

  A conv unit when ``kernel_size`` is given (channels-last, ``padding``
  ``k // 2`` on each side unless stated: torchvision's alignment), a dense
  unit otherwise. Sub-modules: ``imn`` (InputMeanNorm or None), ``layer``
  (``nnx.Conv``/``nnx.Linear``, ``WeightNormConv``/``WeightNormDense`` or
  ``GmPConv``/``GmPDense``), ``norm`` (``nnx.BatchNorm``,
  ``MeanOnlyBatchNorm`` or None). GmP layers apply φ themselves
  (``r ⊙ φ(·)``), so the unit's ``act`` is None for them.

  Args:
    variant: one of :attr:`Unit.VARIANTS`.
    in_features, out_features: channels (or features).
    kernel_size: conv window, e.g. ``(3, 3)``; None for a dense unit.
    strides: conv strides.
    padding: conv padding; None for ``k // 2`` per side.
    activation: ``"relu"`` (default), ``"identity"`` / None, or any name or
      callable :func:`orthojax.nn.activation_fn` accepts.
    hidden_input: the input is a hidden activation, so ``gmp_imn`` puts an
      IMN in front (False for the layer that reads the data).
    zero_init_norm: ``bn`` only — initialise the BN scale γ to 0 (the last BN
      of a residual branch, so each block starts as the identity).
    kernel_init: initializer of the sp / bn kernels and of the WN direction v.
    gmp_init_direction, gmp_init_radius: GmP ``init_direction`` and
      ``init_radius`` (see :class:`orthojax.nn.GmPDense`).
    momentum, epsilon: running-statistics decay (BN, MBN, IMN) and BN's ε.
    dtype, param_dtype: computation and parameter dtypes.
    rngs: ``nnx.Rngs``.

  Raises:
    ValueError: unknown ``variant`` or ``activation``.
  """

  VARIANTS = ("sp", "wn", "wn_mbn", "bn", "gmp", "gmp_imn")
  """Every unit kind this class builds (each model accepts a subset)."""


  def __init__(self, variant: str, in_features: int, out_features: int,
               kernel_size: Sequence[int] | None = None, strides: int | Sequence[int] = 1, *,
               padding: Any = None, activation: str | Callable | None = "relu",
               hidden_input: bool = True, zero_init_norm: bool = False,
               kernel_init: Initializer = nnx.initializers.lecun_normal(),
               gmp_init_direction: Any = "gaussian", gmp_init_radius: str = "one",
               momentum: float = 0.99, epsilon: float = 1e-5, dtype: Any = None,
               param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    check_choice(variant, self.VARIANTS, "variant", where="Unit")
    act = activation_fn(activation)
    self.variant = variant
    conv = kernel_size is not None
    if conv:
      kernel_size = tuple(kernel_size)
      if padding is None:
        padding = [(k // 2, k // 2) for k in kernel_size]
      geometry = dict(kernel_size=kernel_size, strides=strides, padding=padding)
    else:
      geometry = {}
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.imn = (InputMeanNorm(in_features, momentum=momentum, dtype=dtype)
                if variant == "gmp_imn" and hidden_input else nnx.data(None))
    self.norm = nnx.data(None)
    self.act = act
    if variant in ("gmp", "gmp_imn"):
      cls = GmPConv if conv else GmPDense
      self.layer = cls(in_features, out_features, **geometry, activation=act,
                       init_direction=gmp_init_direction, init_radius=gmp_init_radius, **common)
      self.act = None
    elif variant in ("wn", "wn_mbn"):
      cls = WeightNormConv if conv else WeightNormDense
      self.layer = cls(in_features, out_features, **geometry, use_bias=variant == "wn",
                       kernel_init=kernel_init, **common)
      if variant == "wn_mbn":
        self.norm = MeanOnlyBatchNorm(out_features, momentum=momentum, **common)
    else:  # sp, bn
      use_bias = variant == "sp"
      if conv:
        self.layer = nnx.Conv(in_features, out_features, **geometry, use_bias=use_bias,
                              kernel_init=kernel_init,
                              kernel_metadata=_meta(sharding.conv_kernel(len(kernel_size))),
                              bias_metadata=_meta(sharding.BIAS), **common)
      else:
        self.layer = linear(in_features, out_features, use_bias=use_bias,
                            kernel_init=kernel_init, **common)
      if variant == "bn":
        self.norm = batch_norm(out_features, momentum=momentum, epsilon=epsilon,
                               zero_scale=zero_init_norm, **common)

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.imn is not None:
      x = self.imn(x)
    y = self.layer(x)
    if self.norm is not None:
      y = self.norm(y)
    if self.act is not None:
      y = self.act(y)
    return y
