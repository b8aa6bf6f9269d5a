r"""Singular-value statistics of every weight matrix, for logging during training.

Each selected parameter is read through the orthojax matrix view
(:mod:`orthojax.linalg`): a Dense kernel ``(in, out)`` as it is, a conv
kernel ``(kh, kw, cin, cout)`` as ``(kh·kw·cin, cout)``, a scanned stack
``(L, in, out)`` as ``L`` matrices. Each matrix is taken on its *tall* side,
``V`` of shape ``(n, p)`` with ``n ≥ p``, and its ``p`` singular values
``s_1 ≥ … ≥ s_p`` give::

    sv_mean, sv_std, sv_min, sv_max     of s_1 … s_p
    cond               = s_max / s_min             (inf when s_min = 0)
    gain       g       = sqrt(mean s_i²) = ‖V‖_F / √p   (the RMS singular value)
    defect             = ‖VᵀV − I_p‖_F             (0 iff V has orthonormal columns)
    defect_normalized  = ‖VᵀV / g² − I_p‖_F        (0 iff V = g · orthonormal)

so a gain-adjusted orthogonal matrix ``g Q`` (Hlav's gain-adjusted init) has
``sv_mean = sv_min = sv_max = g``, ``sv_std = 0``, ``defect_normalized = 0``.

A stacked leaf (batch axes in its view) is reduced per matrix, then over
the stack: the distribution statistics (``sv_mean``, ``sv_std``, ``sv_min``,
``sv_max``, ``gain``) are those of all the stack's singular values pooled —
the band of Hlav's Figure 7 — while ``cond``,
``defect`` and ``defect_normalized`` are the worst (largest) over the
stack. ``per_matrix=True`` also returns each per-matrix statistic as an
array over the stack.

Numerics: arithmetic in at least float32 (:func:`orthojax.linalg.compute_dtype`),
Gram matrices at ``Precision.HIGHEST``; singular values by
``jnp.linalg.svd(compute_uv=False)``.

References:
  Ester Hlav, "Dynamic isometry as a consequence of weight orthogonality
  for faster and better convergence" (Columbia University), Figure 7.
  Pennington, Schoenholz & Ganguli 2017 (dynamical isometry).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orthojax import linalg
from orthojax.analysis._compile import compiled_call
from orthojax.nn import matrix_views

SV_STATS = ("sv_mean", "sv_std", "sv_min", "sv_max")
"""The singular-value statistics: mean, standard deviation, smallest, largest."""
STATS = (*SV_STATS, "cond", "gain", "defect", "defect_normalized")
"""Every statistic :func:`spectrum_stats` records."""


def path_name(path: tuple[Any, ...]) -> str:
  """A key path as ``"a/b/0"`` (dict keys, sequence indices, attribute names)."""
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    elif isinstance(k, jax.tree_util.FlattenedIndexKey):
      parts.append(str(k.key))
    else:
      parts.append(str(k))
  return "/".join(parts) or "params"


def matrix_stats(w: jax.Array, view: Any = None) -> dict[str, jax.Array]:
  r"""Per-matrix singular-value statistics of one parameter (module docstring).

  Args:
    w: a parameter in its native layout.
    view: its :class:`~orthojax.linalg.MatrixView` (None: inferred for 2-D
      and 4-D arrays).

  Returns:
    ``{stat: array of the view's batch shape}`` for every name in ``STATS``,
    plus ``"singular_values"`` ``(*batch, p)`` descending.

  Raises:
    TypeError: non-floating ``w``.
    ValueError: fewer than 2 axes, or an ambiguous/malformed view.
  """
  linalg.check_float(w, "w")
  w = jnp.asarray(w)
  lay = linalg.layout(w.shape, view, "w")
  t = lay.to_tall(w).astype(linalg.compute_dtype(w.dtype))
  return _stats_of_tall(t)


def _stats_of_tall(t: jax.Array) -> dict[str, jax.Array]:
  p = t.shape[-1]
  s = jnp.linalg.svd(t, compute_uv=False)
  gram = jnp.einsum("...ni,...nj->...ij", t, t, precision=jax.lax.Precision.HIGHEST)
  eye = jnp.eye(p, dtype=t.dtype)
  gain2 = jnp.mean(s * s, axis=-1)
  safe = jnp.where(gain2 > 0, gain2, 1.0)
  s_min, s_max = jnp.min(s, axis=-1), jnp.max(s, axis=-1)
  return {
      "sv_mean": jnp.mean(s, axis=-1),
      "sv_std": jnp.std(s, axis=-1),
      "sv_min": s_min,
      "sv_max": s_max,
      "cond": jnp.where(s_min > 0, s_max / jnp.where(s_min > 0, s_min, 1.0), jnp.inf),
      "gain": jnp.sqrt(gain2),
      "defect": jnp.linalg.norm(gram - eye, axis=(-2, -1)),
      "defect_normalized": jnp.linalg.norm(gram / safe[..., None, None] - eye, axis=(-2, -1)),
      "singular_values": s,
  }


def _pooled(per: dict[str, jax.Array]) -> dict[str, jax.Array]:
  s = per["singular_values"]
  return {
      "sv_mean": jnp.mean(s),
      "sv_std": jnp.std(s),
      "sv_min": jnp.min(s),
      "sv_max": jnp.max(s),
      "cond": jnp.max(per["cond"]),
      "gain": jnp.sqrt(jnp.mean(s * s)),
      "defect": jnp.max(per["defect"]),
      "defect_normalized": jnp.max(per["defect_normalized"]),
  }


def _params_and_views(params: Any, views: Any) -> tuple[Any, Any]:
  """An ``nnx.Module`` or ``nnx.State`` becomes its pure ``nnx.Param`` dict (+ metadata views)."""
  if isinstance(params, nnx.Module):
    state = nnx.state(params, nnx.Param)
    if views is None:
      views = matrix_views(params)
    return nnx.to_pure_dict(state), views
  if isinstance(params, nnx.State):
    return nnx.to_pure_dict(params), matrix_views(params) if views is None else views
  return params, views


def spectrum_stats(params: Any, *, views: Any = None, mask: Any = None,
                   per_matrix: bool = False) -> dict[str, jax.Array]:
  r"""Singular-value statistics of every selected weight, as a flat ``{name: value}`` dict.

  Keys are ``"<leaf path>/<stat>"`` with the path's keys joined by ``/``
  (``"readout/kernel/sv_mean"``) and ``stat`` in ``STATS`` (module
  docstring); values are scalars (stacks reduced as described there), plus
  ``"<leaf path>/per_matrix/<stat>"`` arrays over the stack when
  ``per_matrix`` and the leaf has batch axes. Pure and jit-able (keys are
  static).

  Args:
    params: a parameter pytree (e.g. the trainer's pure-dict
      ``state.params``), an ``nnx.State``, or an ``nnx.Module`` (its
      ``nnx.Param`` state; views then default to the Variables'
      ``matrix_view`` metadata, :func:`orthojax.nn.matrix_views`).
    views: per-leaf matrix views (None, one view, a partial tree, or a
      callable; see :func:`orthojax.linalg.map_views`). 3-D leaves (stacks
      vs 1-D convs) need one, e.g. ``{"kernels": MatrixView.stacked()}``.
    mask: which leaves (None: every leaf with at least 2 axes; a bool, a
      partial tree of bools, or a callable; see :func:`orthojax.linalg.mask_for`).
    per_matrix: also return per-matrix arrays for stacked leaves.

  Returns:
    ``dict[str, jax.Array]``.

  Raises:
    TypeError: a selected leaf is not floating point; a bad views/mask entry.
    ValueError: a selected leaf with fewer than 2 axes or an ambiguous view
      (the message names the leaf).
  """
  params, views = _params_and_views(params, views)
  return compiled_call(lambda p: _spectrum_stats(p, views, mask, per_matrix), params)


def _spectrum_stats(params: Any, views: Any, mask: Any, per_matrix: bool) -> dict[str, jax.Array]:
  pairs = jax.tree_util.tree_flatten_with_path(params)[0]
  per_view = linalg.views_for(params, views)
  selected = linalg.mask_for(params, mask)
  out: dict[str, jax.Array] = {}
  for (path, leaf), view, keep in zip(pairs, per_view, selected):
    if not keep or view is False:
      continue
    name = path_name(path)
    linalg.check_float(leaf, name)
    lay = linalg.layout(jnp.shape(leaf), view, name)
    t = lay.to_tall(jnp.asarray(leaf)).astype(linalg.compute_dtype(leaf.dtype))
    per = _stats_of_tall(t)
    for stat, value in _pooled(per).items():
      out[f"{name}/{stat}"] = value
    if per_matrix and lay.batch_shape:
      for stat in STATS:
        out[f"{name}/per_matrix/{stat}"] = per[stat]
  return out


def spectrum_hook(every_n: int | None = None, *, views: Any = None, mask: Any = None,
                  per_matrix: bool = False, prefix: str = ""
                  ) -> Callable[[int, Any], dict[str, float]]:
  r"""A training hook ``hook(step, model) -> dict[str, float]`` logging :func:`spectrum_stats`.

  Matches :func:`orthojax.train.train`'s ``hooks=`` (called on the schedule of
  ``config.hooks`` with the model; a parameter pytree is accepted too; the
  returned scalars go to the metrics log). :func:`spectrum_stats` is
  compiled once per parameter structure with ``jax.jit``. Per-matrix arrays
  become one scalar per matrix, keyed ``".../per_matrix/<stat>/<i>"``.

  Args:
    every_n: if set, return ``{}`` unless ``step % every_n == 0`` (further
      thinning on top of the trainer's own schedule).
    views: as in :func:`spectrum_stats` (e.g. the ``views`` tree the trainer
      builds from ``orthojax.nn.matrix_views``).
    mask: as in :func:`spectrum_stats`.
    per_matrix: as in :func:`spectrum_stats`.
    prefix: prepended to every key (e.g. ``"spectrum/"``).

  Returns:
    The hook.

  Raises:
    ValueError: ``every_n`` not a positive int.
  """
  if every_n is not None and (isinstance(every_n, bool) or not isinstance(every_n, int)
                              or every_n < 1):
    raise ValueError(f"spectrum_hook: every_n must be a positive int or None, got {every_n!r}")
  compiled = jax.jit(lambda p: spectrum_stats(p, views=views, mask=mask, per_matrix=per_matrix))

  def hook(step: int, params: Any) -> dict[str, float]:   # params: a model or a pytree
    if every_n is not None and int(step) % every_n != 0:
      return {}
    params, _ = _params_and_views(params, None)
    values = jax.device_get(compiled(params))
    out: dict[str, float] = {}
    for key, value in values.items():
      value = np.asarray(value)
      if value.ndim == 0:
        out[prefix + key] = float(value)
      else:
        for idx in np.ndindex(value.shape):
          out[prefix + key + "/" + ",".join(map(str, idx))] = float(value[idx])
    return out

  return hook
