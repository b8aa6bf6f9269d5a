"""Activation functions by name: the one registry every orthojax layer, model and
mean-field function reads.

Names map to elementwise jax functions; ``None`` stands for the identity, so a
layer can skip it (``"identity"`` and ``"linear"`` are the identity).
:func:`orthojax.nn.initializers.resolve_activation` adds what the mean-field
quadrature needs (``φ'`` and kinks) to these same names.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from orthojax.nn._checks import check_choice


def hard_tanh(x: jax.Array) -> jax.Array:
  """``clip(x, −1, 1)``."""
  return jnp.clip(x, -1.0, 1.0)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array] | None] = {
    "tanh": jnp.tanh,
    "hard_tanh": hard_tanh,
    "erf": jax.scipy.special.erf,
    "relu": jax.nn.relu,
    "linear": None,
    "identity": None,
    "leaky_relu": jax.nn.leaky_relu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "elu": jax.nn.elu,
    "sigmoid": jax.nn.sigmoid,
    "softplus": jax.nn.softplus,
}
"""Activation names and their jax functions (``None`` is the identity)."""


def activation_fn(activation: Any, argname: str = "activation", *,
                  where: str | None = None) -> Callable[[jax.Array], jax.Array] | None:
  """``φ`` from a name in :data:`ACTIVATIONS`, a callable, or None.

  Returns None for the identity (None, ``"identity"``, ``"linear"``) so the
  caller can skip it; a callable comes back unchanged.

  Raises:
    ValueError: an unknown name (:func:`~orthojax.nn.check_choice`'s message,
      naming ``argname`` and listing :data:`ACTIVATIONS`).
    TypeError: neither a name, a callable nor None.
  """
  if activation is None or callable(activation):
    return activation
  if not isinstance(activation, str):
    prefix = f"{where}: " if where else ""
    raise TypeError(f"{prefix}{argname} must be a name ({', '.join(ACTIVATIONS)}), a callable "
                    f"or None, got {activation!r}")
  return ACTIVATIONS[check_choice(activation, tuple(ACTIVATIONS), argname, where=where,
                                  also="a callable")]
