r"""Deep linear networks (Saxe, McClelland & Ganguli 2014).

``y = x W_1 W_2 ⋯ W_D`` — ``D = depth`` bias-free linear layers, no
nonlinearity. The end-to-end map is linear, but gradient descent on the
factors has the nonlinear learning dynamics Saxe et al. solve exactly: with
orthogonal (isometric) initialisation the time to learn is independent of
depth, with scaled Gaussian initialisation it grows with depth (Saxe et al. 2014).

Layers: an optional input kernel ``(in_features, width)`` (when
``in_features`` is given and differs from ``width``), a stack of square
kernels ``(n, width, width)`` applied with ``jax.lax.scan`` (logical axes
``("layers", "fan_in", "fan_out")``), and an optional output kernel
``(width, out_features)``; ``n`` is ``depth`` minus the end layers, so the
product always has ``depth`` factors.

Initialisation with ``scale = g``:

* ``"orthogonal"``: ``g Q`` with ``Q`` Haar orthonormal on the tall side
  (:func:`orthojax.nn.initializers.orthogonal`): every singular value of
  every factor is ``g``, and for square layers every singular value of the
  product is ``g^D`` (dynamical isometry at ``g = 1``);
* ``"gaussian"``: ``N(0, g²/fan_in)`` (:func:`orthojax.nn.initializers.gaussian`):
  the mean squared singular value of a square product is ``g^{2D}``, but the
  spectrum spreads with depth (the product of ``D`` Ginibre matrices).

References:
  Saxe, McClelland & Ganguli, "Exact solutions to the nonlinear dynamics of
  learning in deep linear neural networks", ICLR 2014.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from orthojax.linalg import MatrixView
from orthojax.models._deep_mlp import DeepMLP
from orthojax.nn import check_choice
from orthojax.nn import check_positive_int
from orthojax.nn import initializers
from orthojax.nn import sharding


class DeepLinear(nnx.Module):
  r"""A product of ``depth`` linear layers with a scanned square stack.

  Attributes:
    in_kernel: ``(in_features, width)`` or None (the first factor is square).
    kernels: ``(n, width, width)`` stacked square factors, or None when both
      ends are rectangular and ``depth = 2`` (an empty stack: zero-size arrays
      cannot be checkpointed).
    out_kernel: ``(width, out_features)`` or None.

  Args:
    depth: number of factors ``D ≥ 1`` (``≥ 2`` when both ends are rectangular).
    width: hidden width.
    in_features: input size (None: ``width``).
    out_features: output size (None: ``width``).
    init: ``"gaussian"`` or ``"orthogonal"``.
    scale: the gain ``g`` (module docstring).
    dtype: computation dtype (None: promote).
    param_dtype: parameter dtype.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: unknown ``init``, or too small a ``depth``.
  """

  INITS = DeepMLP.INITS
  """Accepted ``init`` names (those of :class:`DeepMLP`)."""
  INPUT = "flat"
  """The form the trainer feeds data in. ``"flat"`` is flattened to ``(batch, features)``,
  with ``in_features`` their number (``orthojax.train.model_zoo.build``)."""

  def __init__(self, depth: int, width: int, in_features: int | None = None,
               out_features: int | None = None, *, init: str = "gaussian", scale: float = 1.0,
               dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    check_choice(init, self.INITS, "init", where="DeepLinear")
    for name, size in (("width", width), ("in_features", in_features),
                       ("out_features", out_features)):
      if size is not None:
        check_positive_int(size, name, where="DeepLinear")
    depth, width = int(depth), int(width)
    has_in = in_features is not None and int(in_features) != width
    has_out = out_features is not None and int(out_features) != width
    if depth < max(1, has_in + has_out):
      raise ValueError(f"DeepLinear: depth must be >= {max(1, has_in + has_out)} "
                       f"(in_features={in_features}, out_features={out_features}, "
                       f"width={width}), got {depth}")
    self.depth, self.width, self.init, self.scale = depth, width, init, float(scale)
    self.dtype = dtype

    def make(view):
      if init == "orthogonal":
        return initializers.orthogonal(self.scale, view)
      return initializers.gaussian(self.scale, view)

    meta = sharding.metadata(sharding.DENSE_KERNEL)
    self.in_kernel = (nnx.Param(make(None)(rngs.params(), (int(in_features), width), param_dtype),
                                **meta) if has_in else None)
    n = depth - has_in - has_out
    self.kernels = nnx.Param(
        make(MatrixView.stacked())(rngs.params(), (n, width, width), param_dtype),
        matrix_view=MatrixView.stacked(),
        **sharding.metadata(sharding.stacked(sharding.DENSE_KERNEL))) if n else None
    self.out_kernel = (nnx.Param(make(None)(rngs.params(), (width, int(out_features)),
                                            param_dtype), **meta) if has_out else None)

  def _params(self) -> tuple[jax.Array | None, jax.Array, jax.Array | None]:
    arrays = [None if v is None else v[...]
              for v in (self.in_kernel, self.kernels, self.out_kernel)]
    present = dtypes.promote_dtype([a for a in arrays if a is not None], dtype=self.dtype)
    it = iter(present)
    return tuple(None if a is None else next(it) for a in arrays)

  def _apply(self, h: jax.Array) -> jax.Array:
    w_in, w, w_out = self._params()
    h = jnp.asarray(h, next(a for a in (w_in, w, w_out) if a is not None).dtype)
    if w_in is not None:
      h = h @ w_in
    if w is not None:
      h, _ = jax.lax.scan(lambda carry, w_l: (carry @ w_l, None), h, w)
    return h if w_out is None else h @ w_out

  def end_to_end(self) -> jax.Array:
    """The product ``W_1 ⋯ W_D``, ``(in_features, out_features)``."""
    rows = self.width if self.in_kernel is None else self.in_kernel.shape[0]
    dtype = next(v for v in (self.in_kernel, self.kernels, self.out_kernel) if v is not None)
    return self._apply(jnp.eye(rows, dtype=dtype[...].dtype))

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x W_1 ⋯ W_D`` for inputs ``(*batch, in_features)``."""
    return self._apply(x)
