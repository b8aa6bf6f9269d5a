"""The oblique manifold: every column of the tall matrix has unit norm.

Ob(n, p) = {W in R^{n x p} : diag(W^T W) = 1}, a product of p unit spheres
S^{n-1}. Columns are those of the tall matrix view (the fan-in vector of
every output unit for a tall kernel), following orthojax's one tall-side
convention, so that Stiefel(n, p) is a subset of Ob(n, p) for every shape.

* tangent projection, per column: ``g - w (w^T g)``;
* exponential map, per column (the sphere's geodesic, Absil et al. 2008,
  Example 5.4.1; Sokol & Park's Appendix A.6.3 prints it with w and xi
  swapped): ``Exp_w(xi) = w cos||xi|| + (xi/||xi||) sin||xi||``;
* "normalize" retraction: ``(w + xi) / ||w + xi||``.

Sokol & Park (ICLR 2020, Appendix A.6.3) train ``W = s V`` with V on
this manifold and a Euclidean scale ``s``.
"""

from __future__ import annotations

import jax.numpy as jnp

from orthojax.manifolds._base import Manifold, gaussian


def _col_dot(a, b):
  return jnp.sum(a * b, axis=-2, keepdims=True)


class Oblique(Manifold):
  """Unit-norm columns (of the tall matrix view).

  Args:
    retraction: "exp" (the sphere's exponential map; default) or "normalize".

  Its maths is column by column (no matrix products), so it runs at float32 on every
  backend and takes no ``precision``.
  """

  RETRACTIONS = ("exp", "normalize")
  """Accepted ``retraction`` names."""

  def __init__(self, retraction: str = "exp"):
    if retraction not in self.RETRACTIONS:
      raise ValueError(f"Oblique: unknown retraction={retraction!r}; choose one of {self.RETRACTIONS}")
    self.retraction = retraction

  def _project(self, w, v):
    return v - w * _col_dot(w, v)

  def _retract(self, w, v):
    if self.retraction == "normalize":
      y = w + v
      return y / jnp.sqrt(_col_dot(y, y))
    # ||xi|| per column; the double where keeps sqrt's infinite slope at 0 out
    # of the gradient (cos and sinc are flat there, so the zeroed term is exact).
    t2 = _col_dot(v, v)
    nonzero = t2 > 0
    t = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, t2, 1.0)), 0.0)
    # sin(t)/t via sinc, smooth (and differentiable) at t = 0.
    y = w * jnp.cos(t) + v * jnp.sinc(t / jnp.pi)
    # cos/sin keep the norm only up to rounding; renormalising costs O(np) and
    # stops drift over long runs.
    return y / jnp.sqrt(_col_dot(y, y))

  def _closest(self, w):
    return w / jnp.sqrt(_col_dot(w, w))

  def _defect(self, w):
    return jnp.sqrt(jnp.sum(jnp.square(jnp.sum(w * w, axis=-2) - 1.0), axis=-1))

  def _random(self, key, batch_shape, n, p, dtype):
    z = gaussian(key, batch_shape, n, p, dtype)
    return z / jnp.sqrt(_col_dot(z, z))
