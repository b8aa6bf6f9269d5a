"""The manifold interface: parameters in their native layout, maths on tall matrices.

A :class:`Manifold` is a small, immutable, hashable description (so it can be
a static argument and an Optax closure). Its public methods take parameters in
their own layout (Dense ``(in, out)``, conv ``(kh, kw, cin, cout)``, stacks)
plus an optional ``view`` (see :class:`orthojax.linalg.MatrixView`); they turn
the parameter into its tall matrix ``(*batch, n, p)``, call the subclass's
``_method`` on it in at least float32, and map the result back to the
parameter's layout and dtype. Subclasses implement only the tall-matrix maths.
"""

from __future__ import annotations

import abc
from typing import Any, Callable

import jax
import jax.numpy as jnp

from orthojax import linalg


def on_tall(fn: Callable[..., jnp.ndarray], view: Any, out_dtype: Any, *arrays: jnp.ndarray,
            name: str = "parameter", precision: Any = "highest",
            correct: Callable[[jnp.ndarray], jnp.ndarray] | None = None) -> jnp.ndarray:
  """Apply ``fn`` to the tall matrices of same-shaped ``arrays`` and map back.

  The maths runs in at least float32, its products at ``precision``
  (:func:`orthojax.linalg.at_precision`); a point it returns is passed through
  ``correct`` where those products are reduced (:meth:`Manifold.correct`), since the
  constraint holds only to the products' rounding otherwise (about 1e-5 for three
  bfloat16 passes, 1e-3 for one).
  """
  for a in arrays:
    linalg.check_float(a, name)
  lo = linalg.layout(arrays[0].shape, view, name)
  dtype = linalg.compute_dtype(out_dtype)
  talls = [lo.to_tall(jnp.asarray(a, dtype)) for a in arrays]
  out = linalg.at_precision(fn, precision)(*talls)
  if correct is not None:
    out = linalg.reduced(precision)(correct, out)
  return lo.from_tall(out).astype(out_dtype)


class Manifold(abc.ABC):
  """A Riemannian submanifold of matrices, applied per matrix of a parameter.

  ``precision`` (a subclass's argument; :data:`orthojax.linalg.PRECISIONS` or None): the
  precision of its matrix products. None takes :data:`orthojax.linalg.MANIFOLD_PRECISION`'s
  entry for the backend the program is compiled for: float32 on a CPU, three bfloat16
  passes on the tensor cores of a GPU or TPU. Where the products are reduced, every
  point a method returns is corrected at float32 (:meth:`correct`), so the constraint
  still holds at float32 rounding; tangent vectors carry the products' own rounding.
  """

  precision: Any = "highest"

  # -- tall-matrix maths, (..., n, p) with n >= p, float32 or wider ------------
  @abc.abstractmethod
  def _project(self, w, v): ...

  def _egrad_to_rgrad(self, w, g):
    return self._project(w, g)

  @abc.abstractmethod
  def _retract(self, w, v): ...

  def _retract_for(self, w, v, dtype):
    """``_retract`` for a point stored in ``dtype`` (the parameter's dtype).

    A subclass whose retraction carries the rounding error of a low-precision
    ``w`` forward (Stiefel's Cayley transform) removes it here.
    """
    del dtype
    return self._retract(w, v)

  @abc.abstractmethod
  def _closest(self, w): ...

  def _reorthonormalize(self, w):
    """``_closest`` for a point that drifted only a little from the manifold."""
    return self._closest(w)

  def _reorthonormalize_step(self, w):
    """A clean-up cheap enough for every step, with no loop or branch (default: the full
    one, for manifolds where that is already so: the oblique manifold's normalisation)."""
    return self._reorthonormalize(w)

  def _correct(self, w):
    """The float32 correction of a point computed with reduced-precision products
    (default: the per-step clean-up at float32)."""
    return linalg.at_precision(self._reorthonormalize_step, "highest")(w)

  @abc.abstractmethod
  def _defect(self, w): ...

  @abc.abstractmethod
  def _random(self, key, batch_shape, n, p, dtype): ...

  # -- public API in the parameter's own layout --------------------------------
  def project(self, w, v, *, view=None):
    """Orthogonal projection of ``v`` onto the tangent space at ``w``."""
    return on_tall(self._project, view, jnp.result_type(w, v), w, v, precision=self.precision)

  def egrad_to_rgrad(self, w, g, *, view=None):
    """Euclidean gradient -> Riemannian gradient under the manifold's metric.

    Equal to :meth:`project` for the embedded (Euclidean) metric.
    """
    return on_tall(self._egrad_to_rgrad, view, jnp.result_type(w, g), w, g,
                   precision=self.precision)

  def retract(self, w, v, *, view=None, stored_dtype=None):
    """The retraction ``R_w(v)`` of a tangent vector ``v`` at ``w``.

    For a point stored below float32 a subclass may also remove the rounding
    error it carries (Stiefel's Cayley retraction: see
    :func:`orthojax.manifolds.polish`).

    Args:
      w, v: the point and the step, in the parameter's layout.
      view: their matrix view.
      stored_dtype: the dtype the point is stored in, where ``w`` is a wider copy of it
        (a fused optimizer's float32 working copy); default ``w``'s.
    """
    stored = jnp.result_type(w) if stored_dtype is None else jnp.dtype(stored_dtype)
    return on_tall(lambda a, b: self._retract_for(a, b, stored), view, jnp.result_type(w, v),
                   w, v, **self._point_options())

  def transport(self, w_new, v, *, view=None):
    """Vector transport by projection: ``v`` (tangent elsewhere) onto ``T_{w_new}``.

    Absil, Mahony & Sepulchre (2008), "Optimization Algorithms on Matrix
    Manifolds", §8.1.3; Sokol & Park (ICLR 2020), Appendix A.6.2.
    """
    return self.project(w_new, v, view=view)

  def orthonormalize(self, w, *, view=None):
    """The closest point of the manifold to ``w`` (polar factor, unit columns)."""
    return on_tall(self._closest, view, w.dtype, w, **self._point_options())

  def reorthonormalize(self, w, *, view=None):
    """:meth:`orthonormalize` for an iterate that drifted from the manifold.

    The periodic clean-up of ``reorthonormalize_every``: the same point to
    rounding for the full-rank ``w`` an optimizer's iterate is, computed with
    matrix products where the manifold allows (Stiefel: Newton–Schulz, not an
    SVD: :func:`~orthojax.manifolds.reorthonormalize_newton_schulz`).
    """
    return on_tall(self._reorthonormalize, view, w.dtype, w, **self._point_options())

  def reorthonormalize_step(self, w, *, view=None):
    """The clean-up of ``reorthonormalize_every=1``: cheap enough for every step, with no
    loop or branch for a GPU to wait on, and enough for an iterate that leaves the
    manifold by a little each step (Stiefel: one Newton–Schulz step,
    :func:`~orthojax.manifolds.newton_schulz_step`). Where the products are reduced
    it is :meth:`correct`, itself such a step (with a float32 Gram matrix)."""
    # Where the products are reduced, the correction every point gets is such a step.
    step = lambda y: on_tall(self._reorthonormalize_step, view, w.dtype, y, precision="highest")
    return linalg.reduced(self.precision)(lambda y: self.correct(y, view=view), w,
                                          otherwise=step)

  def correct(self, w, *, view=None):
    """``w`` corrected at float32 where this manifold's products are reduced, ``w`` itself
    where they run at float32: what every method that returns a point applies, for a
    point a caller computed with :func:`orthojax.linalg.at_precision` at this manifold's
    ``precision`` (the fused optimizers' retraction). Stiefel: one Newton–Schulz step
    whose Gram matrix is formed at float32 (:func:`~orthojax.manifolds.corrected_newton_schulz_step`)."""
    return on_tall(lambda y: y, view, w.dtype, w, **self._point_options())

  def _point_options(self):
    return dict(precision=self.precision, correct=self._correct)

  def defect(self, w, *, view=None):
    """Distance from the manifold per batch matrix (0 on the manifold)."""
    linalg.check_float(w)
    lo = linalg.layout(w.shape, view)
    tall = lo.to_tall(jnp.asarray(w, linalg.compute_dtype(w.dtype)))
    return linalg.at_precision(self._defect, "highest")(tall)

  def random(self, key, shape, dtype=jnp.float32, *, view=None):
    """A random point of ``shape`` (uniform / Haar where that is defined)."""
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"random: dtype must be floating, got {jnp.dtype(dtype)}")
    lo = linalg.layout(shape, view)
    tall = self._random(key, lo.batch_shape, lo.n, lo.p, linalg.compute_dtype(dtype))
    return lo.from_tall(tall).astype(dtype)

  # -- value semantics: equal configurations are equal (and hash alike) ---------
  def __hash__(self):
    return hash((type(self), tuple(sorted(vars(self).items()))))

  def __eq__(self, other):
    return type(self) is type(other) and vars(self) == vars(other)

  def __repr__(self):
    args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
    return f"{type(self).__name__}({args})"


def gaussian(key, batch_shape, n, p, dtype):
  return jax.random.normal(key, tuple(batch_shape) + (n, p), dtype)
