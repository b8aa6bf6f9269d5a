r"""Singular values of input-output Jacobians, exactly or matrix-free.

For a map ``f`` of one example ``x ∈ R^n`` to ``y ∈ R^m`` (inputs and
outputs of any shape, flattened), the Jacobian ``J = ∂y/∂x`` is ``m × n``.
For a deep network ``h^{l+1} = W^l φ(h^l) + b^l`` the Jacobian between two
pre-activation layers is the product (column-vector convention)::

    J_{h^a}^{h^b} = ∏_{l=b−1}^{a} W^l D_l,    D_l = diag φ'(h^l),

whose singular-value spectrum is what dynamical isometry is about
(Pennington, Schoenholz & Ganguli 2017: all singular values near 1; Sokol &
Park 2020: ``λ_max`` of the Fisher grows like ``σ_max(J)²``).

Two methods:

* ``"exact"``: ``jax.jacfwd`` (``n ≤ m``) or ``jax.jacrev`` (``n > m``)
  builds ``J``, ``jnp.linalg.svd(J, compute_uv=False)`` gives every singular
  value. Memory ``m·n``; cost ``min(m, n)`` forward/backward passes plus an
  SVD.
* ``"lanczos"``: ``J`` is never formed. The smaller Gram matrix — ``JᵀJ``
  (``n × n``) if ``n ≤ m``, else ``JJᵀ`` (``m × m``) — is applied as
  ``v ↦ Jᵀ(J v)`` or ``u ↦ J(Jᵀ u)`` with one ``jax.linearize`` (a jvp)
  and its ``jax.linear_transpose`` (a vjp), and
  :func:`~orthojax.analysis.top_eigenvalues` finds its ``k`` extreme
  eigenvalues ``s²``. Both Gram matrices have the same non-zero
  eigenvalues; the smaller one holds all ``min(m, n)`` singular values, so
  the smallest ones are the smallest singular values of ``J`` (not the zero
  eigenvalues of the larger Gram). Cost ~2 passes per Lanczos step.
  Accuracy: ``tol`` is relative on ``s²``, i.e. about ``tol/2`` on ``s``; in
  float32, singular values below ``~sqrt(eps)·s_max ≈ 3·10⁻⁴ s_max`` are not
  resolved through the Gram matrix.

Batches: ``x`` holds a leading batch axis and ``f`` is applied per example
with ``jax.vmap``; each example has its own Jacobian.

References:
  Pennington, Schoenholz & Ganguli, "Resurrecting the sigmoid in deep
  learning through dynamical isometry: theory and practice", NeurIPS 2017.
  Sokol & Park, "Information geometry of orthogonal initializations and
  training", ICLR 2020.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax.analysis import _lanczos
from orthojax.analysis._compile import compiled
from orthojax.analysis._model import model_function
from orthojax.nn import check_choice

METHODS = ("exact", "lanczos")


class JacobianSpectrum(NamedTuple):
  """Singular values of per-example Jacobians.

  With ``per_example=True`` arrays have a leading batch axis ``B``; with
  ``per_example=False`` they do not.

  Attributes:
    largest: ``(B, k)`` the ``k`` largest singular values, descending (all
      ``min(m, n)`` for the exact method with ``k=None``), or None when not
      requested.
    smallest: ``(B, k)`` the ``k`` smallest, ascending, or None.
    largest_mean: ``(k,)`` the batch average of ``largest`` (or None).
    smallest_mean: ``(k,)`` the batch average of ``smallest`` (or None).
    num_iters: ``(B,)`` Lanczos steps used (0 for the exact method).
    converged: ``(B,)`` whether Lanczos met ``tol`` (True for exact).
  """

  largest: jax.Array | None
  smallest: jax.Array | None
  largest_mean: jax.Array | None
  smallest_mean: jax.Array | None
  num_iters: jax.Array
  converged: jax.Array


def _flat_map(f_one: Callable, example_shape: tuple[int, ...]) -> Callable:
  return lambda v: jnp.ravel(f_one(v.reshape(example_shape)))


def _exact(g: Callable, xf: jax.Array, n: int, m: int) -> jax.Array:
  """All singular values of the ``m × n`` Jacobian of ``g`` at ``xf``, descending."""
  jac = jax.jacfwd(g)(xf) if n <= m else jax.jacrev(g)(xf)
  return jnp.linalg.svd(jac.reshape(m, n), compute_uv=False)


def gram_operator(f: Callable, x: jax.Array) -> tuple[Callable[[jax.Array], jax.Array], int, str]:
  r"""The smaller Gram matrix of the Jacobian of ``f`` at one example ``x``, matrix-free.

  ``JᵀJ v = vjp(jvp(v))`` when ``n = x.size ≤ m = f(x).size``, else
  ``JJᵀ u = jvp(vjp(u))``; built from one ``jax.linearize`` and its
  ``jax.linear_transpose`` (one forward pass, then ~2 passes per product).

  Args:
    f: maps one example (any shape) to an output (any shape).
    x: the example.

  Returns:
    ``(matvec, dim, side)``: the operator on flat ``(dim,)`` vectors,
    ``dim = min(m, n)``, and ``side`` ``"JtJ"`` or ``"JJt"``.
  """
  x = jnp.asarray(x)
  g = _flat_map(f, x.shape)
  xf = jnp.ravel(x)
  y, jvp = jax.linearize(g, xf)
  vjp = jax.linear_transpose(jvp, xf)
  n, m = xf.size, y.size
  if n <= m:
    return (lambda v: vjp(jvp(v))[0]), n, "JtJ"
  return (lambda u: jvp(vjp(u)[0])), m, "JJt"


@compiled("x", "key")
def jacobian_singular_values(
    f: Callable | nnx.Module,
    x: Any,
    *,
    method: str = "exact",
    k: int | None = None,
    which: str = "largest",
    per_example: bool = True,
    batched: bool | None = None,
    tol: float = 1e-5,
    max_iters: int | None = None,
    key: Any = None,
) -> JacobianSpectrum:
  r"""Largest and/or smallest singular values of the Jacobian ``∂f(x)/∂x`` per example.

  ``J = ∂ vec f(x) / ∂ vec x`` (``m × n``); for a deep network between two
  layers ``J = ∏ W^l D_l`` (module docstring). ``method="exact"`` forms
  ``J`` (``jax.jacfwd``/``jax.jacrev``) and takes its SVD;
  ``method="lanczos"`` runs Lanczos on the smaller Gram matrix ``JᵀJ`` or
  ``JJᵀ`` applied through ``jvp``/``vjp`` only, and returns
  ``s = sqrt(max(λ, 0))`` of its extreme eigenvalues ``λ``.

  How ``f`` is called:

  * a plain callable maps ONE example to its output (``batched=False``,
    the default);
  * with ``batched=True`` it maps a batch ``(B, *example)`` to
    ``(B, *out)`` with examples independent, and is called on batches of
    one;
  * an ``nnx.Module`` is called in eval mode on a batch of one
    (:func:`model_function`; ``batched`` is forced True). For "up to a
    layer" pass any callable, e.g. :func:`deep_mlp_hidden_map`.

  Args:
    f: the map, see above.
    x: ``(B, *example)`` with ``per_example=True`` (default), or one example
      ``(*example)`` with ``per_example=False``.
    method: ``"exact"`` or ``"lanczos"``.
    k: how many singular values at each requested end; the exact method
      returns all ``min(m, n)`` when None; Lanczos needs ``k`` (default 1).
    which: ``"largest"``, ``"smallest"`` or ``"both"``.
    per_example: whether ``x`` carries a leading batch axis.
    batched: see above.
    tol: Lanczos relative residual tolerance on ``s²``
      (:func:`~orthojax.analysis.top_eigenvalues`).
    max_iters: Lanczos step cap (default ``min(dim, max(2k + 40, 4k))``);
      ``dim`` makes it exact.
    key: PRNG key of the Lanczos start vectors (default ``jax.random.key(0)``).

  Returns:
    A :class:`JacobianSpectrum` (per-example values and batch averages).

  Raises:
    ValueError: unknown ``method``/``which``, ``k`` larger than
      ``min(m, n)``, ``x`` without a batch axis when ``per_example``.
    TypeError: ``f`` not callable.

  References:
    Pennington, Schoenholz & Ganguli 2017; Sokol & Park 2020.
  """
  who = "jacobian_singular_values"
  check_choice(method, METHODS, "method", where=who)
  check_choice(which, _lanczos.WHICH, "which", where=who)
  if isinstance(f, nnx.Module):
    f, batched = model_function(f), True
  elif not callable(f):
    raise TypeError(f"{who}: f must be a callable or an nnx.Module, got {type(f).__name__}")
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  if per_example and x.ndim < 1:
    raise ValueError(f"{who}: per_example=True needs x with a leading batch axis, got a scalar")
  f_one = (lambda xi: f(xi[None])[0]) if batched else f
  example = x[0] if per_example else x
  out = jax.eval_shape(f_one, example)
  n, m = int(example.size), int(math.prod(out.shape))
  if n == 0 or m == 0:
    raise ValueError(f"{who}: empty Jacobian ({m} x {n})")
  dim = min(m, n)
  if k is not None:
    _lanczos._check_k(k, dim, who + f" (Jacobian {m} x {n}, min(m, n) = {dim})")
  elif method == "lanczos":
    k = 1
  want_large = which in ("largest", "both")
  want_small = which in ("smallest", "both")

  if method == "exact":
    def one(xi, _key):
      s = _exact(_flat_map(f_one, xi.shape), jnp.ravel(xi), n, m)
      kk = dim if k is None else k
      return (s[:kk], s[::-1][:kk], jnp.int32(0), jnp.asarray(True))
  else:
    def one(xi, key_i):
      matvec, d, _ = gram_operator(f_one, xi)
      res = _lanczos.top_eigenvalues(matvec, d, k, which=which, tol=tol, max_iters=max_iters,
                                     key=key_i, dtype=xi.dtype)
      s = jnp.sqrt(jnp.maximum(res.values, 0.0))
      large, small = (s[0], s[1]) if which == "both" else (s, s)
      return large, small, res.num_iters, res.converged

  key = jax.random.key(0) if key is None else key
  if per_example:
    large, small, iters, ok = jax.vmap(one, in_axes=(0, None))(x, key)
    mean = lambda v: jnp.mean(v, axis=0)
  else:
    large, small, iters, ok = one(x, key)
    mean = lambda v: v
  large = large if want_large else None
  small = small if want_small else None
  return JacobianSpectrum(large, small, None if large is None else mean(large),
                          None if small is None else mean(small), iters, ok)


def deep_mlp_hidden_map(model: Any, from_layer: int = 1,
                        to_layer: int | None = None) -> Callable[[jax.Array], jax.Array]:
  r"""``h^a ↦ h^b`` of a :class:`~orthojax.models.DeepMLP`, for Jacobians between layers.

  The map is :meth:`orthojax.models.DeepMLP.hidden_map` (its docstring has
  the layer numbering and the Jacobian ``J_{h^a}^{h^b} = ∏ W^lᵀ D_l``);
  analysis sits below models, so this entry point takes any model with such
  a method instead of importing the model class.

  Args:
    model: a :class:`~orthojax.models.DeepMLP` (anything with ``hidden_map``).
    from_layer: ``a``, ``0 ≤ a ≤ L``.
    to_layer: ``b``, ``a < b ≤ L + 1`` (default ``L + 1``).

  Returns:
    ``f(h_a) -> h_b``.

  Raises:
    TypeError: ``model`` has no ``hidden_map`` (is not a DeepMLP).
    ValueError: layers out of range.
  """
  hidden_map = getattr(model, "hidden_map", None)
  if not callable(hidden_map):
    raise TypeError(f"deep_mlp_hidden_map: model must be an orthojax.models.DeepMLP (a model "
                    f"with a hidden_map method), got {type(model).__name__}")
  return hidden_map(from_layer, to_layer)
