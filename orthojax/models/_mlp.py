"""One-hidden-layer MLP for UCI regression (GmP paper Table 3).

``x (batch, in_features) → hidden unit (100, φ) → output (out_features)``:

=========  ==========================================  =======================
variant    hidden unit                                 output layer
=========  ==========================================  =======================
``sp``     ``φ(x W₁ + b₁)``                            ``nnx.Linear``
``wn``     ``φ(x (g·v/‖v‖) + b₁)``                     ``WeightNormDense``
``bn``     ``φ(BN(x W₁))``                             ``nnx.Linear``
``gmp``    ``r ⊙ φ(x U(θ) + λ)`` (GmPDense)            ``nnx.Linear``
=========  ==========================================  =======================

The GmP hidden layer has no Input Mean Normalization: its input is the
(standardised) data, which does not drift during training (GmP paper §4.2).
The output layer is never GmP (§4.1); for ``"wn"`` it is weight-normalised,
as in the authors' released UCI code (``uci_regression/uci_regression.py``),
which the paper's Table 3 numbers come from. Defaults follow that code too: Glorot-uniform
kernels (Keras' default), BatchNorm momentum 0.99 and ε = 1e-3.

References:
  Wenlin Chen and Hong Ge (GmP), §5.3, Table 3, Appendix C.3.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax.models._variants import Initializer
from orthojax.models._variants import Unit
from orthojax.models._variants import linear
from orthojax.nn import WeightNormDense
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int


class MLP(nnx.Module):
  """One hidden layer of ``hidden`` units, then a dense output layer.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> MLP(8, variant="gmp", rngs=nnx.Rngs(0))(jnp.ones((5, 8))).shape
    (5, 1)

  Args:
    in_features: input features.
    hidden: hidden units (100 in the paper).
    out_features: outputs (1 for regression).
    variant: ``"sp"``, ``"wn"``, ``"bn"`` or ``"gmp"`` (table above).
    activation: hidden activation, a name (``"relu"``, ``"tanh"`` …) or callable.
    dtype, param_dtype: computation and parameter dtypes.
    kernel_init: sp / bn / output kernel and WN direction initializer.
    gmp_init_direction, gmp_init_radius: GmP initialisation.
    momentum, epsilon: BatchNorm running-statistics decay and ε.
    rngs: ``nnx.Rngs``.

  Attributes:
    hidden: the hidden :class:`orthojax.models.Unit` (its ``layer`` is the
      ``nnx.Linear`` / ``WeightNormDense`` / ``GmPDense``).
    out: the output layer.

  Raises:
    ValueError: unknown ``variant`` or ``activation``.
  """

  VARIANTS = ("sp", "wn", "bn", "gmp")
  """Accepted ``variant`` names (GmP paper Table 3 columns)."""
  INPUT = "flat"
  """The form the trainer feeds data in. ``"flat"`` is flattened to ``(batch, features)``,
  with ``in_features`` their number (``orthojax.train.model_zoo.build``)."""

  def __init__(self, in_features: int, hidden: int = 100, out_features: int = 1, *,
               variant: str = "sp", activation: str | Callable = "relu", dtype: Any = None,
               param_dtype: Any = jnp.float32,
               kernel_init: Initializer = nnx.initializers.glorot_uniform(),
               gmp_init_direction: Any = "gaussian", gmp_init_radius: str = "one",
               momentum: float = 0.99, epsilon: float = 1e-3, rngs: nnx.Rngs):
    check_choice(variant, self.VARIANTS, "variant", where="MLP")
    for name, size in (("in_features", in_features), ("hidden", hidden),
                       ("out_features", out_features)):
      check_positive_int(size, name, where="MLP")
    self.variant = variant
    self.hidden = Unit(variant, in_features, hidden, activation=activation, hidden_input=False,
                       kernel_init=kernel_init, gmp_init_direction=gmp_init_direction,
                       gmp_init_radius=gmp_init_radius, momentum=momentum, epsilon=epsilon,
                       dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    if variant == "wn":
      self.out = WeightNormDense(hidden, out_features, kernel_init=kernel_init, dtype=dtype,
                                 param_dtype=param_dtype, rngs=rngs)
    else:
      self.out = linear(hidden, out_features, kernel_init=kernel_init, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """``(batch, out_features)`` for inputs ``(batch, in_features)``."""
    return self.out(self.hidden(x))
