"""Muon through ``optax.contrib.muon``, with dimension numbers from the matrix view.

``optax.contrib.muon`` orthogonalizes only 2-D leaves unless it is given
``muon_weight_dimension_numbers``; conv kernels and scanned stacks then go to
its Adam branch *silently*. :func:`muon_dimension_numbers` derives those
numbers from orthojax's matrix view instead (Dense and conv kernels inferred,
stacks from explicit views), and raises for a leaf whose layout is ambiguous
rather than guess. :func:`muon` is ``optax.contrib.muon`` with them filled in,
and with the leaves that share a matrix shape orthogonalized together
(:func:`scale_by_muon`: one batched program per bucket, not one per leaf).

:func:`stiefel_muon` keeps weights *on* the Stiefel manifold: the Muon
direction (Newton–Schulz-orthogonalized momentum, an ambient step) followed by
the Newton–Schulz polar retraction, a projected-gradient method that needs
matmuls only.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers

from orthojax import linalg
from orthojax.linalg import leaf_names, map_views, unzip, views_for
from orthojax.manifolds import Stiefel
from orthojax.optim._checks import (check_bucket, check_decay, check_rate, check_static,
                                     injected)
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._riemannian import retract


_QUINTIC = (3.4445, -4.7750, 2.0315)   # optax.contrib.muon's default (Jordan's quintic)
_FROM_VIEWS = "from views"

MUON_PRECISION = {"cpu": "highest", "gpu": "bf16", "tpu": "bf16"}
"""Muon's ``precision=None`` per backend (:data:`orthojax.linalg.PRECISIONS`): float32
on a CPU, one bfloat16 pass on the tensor cores of a GPU or TPU, as Jordan et al. run
the Newton–Schulz iteration (it holds no constraint: the quintic's own spread of singular
values, about [0.68, 1.2], is far wider than bfloat16's rounding)."""


def to_muon(view: Any) -> MuonDimensionNumbers:
  """A :class:`orthojax.linalg.MatrixView` as optax ``MuonDimensionNumbers``."""
  return MuonDimensionNumbers(reduction_axis=view.reduction_axis, output_axis=view.output_axis)


def muon_dimension_numbers(params: Any, views: Any = None) -> Any:
  """Per-leaf ``MuonDimensionNumbers`` (None = Adam) from the matrix view.

  Leaves of rank < 2 (biases, scales) get None, i.e. optax's Adam branch.
  Rank 2 and 4 are Dense and conv kernels. Other ranks need an explicit view
  (``views``), otherwise a ValueError names the leaf. In a ``views`` tree, a
  leaf ``False`` sends that parameter to Adam explicitly.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  return treedef.unflatten(_dims(leaves, leaf_names(params), views_for(params, views)))


def _dims(leaves, names, views):
  out = []
  for p, name, view in zip(leaves, names, views):
    if view is False or p.ndim < 2:
      out.append(None)
    else:
      view = linalg.infer_view(p.shape, name) if view is None else view
      linalg.layout(p.shape, view, name)  # validates, naming the leaf
      out.append(to_muon(view))
  return out


def ns_schedule(ns_coeffs: Any, ns_steps: int) -> Any:
  """``ns_coeffs`` as ``optax.contrib.scale_by_muon`` takes it: a preset name becomes its
  triples — optax's own names (``"standard"``, ``"dion"``) as ``optax.contrib.muon``
  resolves them, and orthojax's (:data:`orthojax.linalg.NS_PRESETS`, e.g.
  ``"polar_express"``) as their first ``ns_steps`` per-step triples (the last one
  repeated where the preset is shorter); anything else is passed through unchanged.

  Raises:
    ValueError: an unknown preset name, listing both libraries' names.
  """
  optax_presets = getattr(optax.contrib._muon, "_NS_COEFFS_PRESET_DICT", {})  # pylint: disable=protected-access
  if not isinstance(ns_coeffs, str):
    return ns_coeffs
  if ns_coeffs in optax_presets:
    return optax_presets[ns_coeffs]
  if ns_coeffs not in linalg.NS_PRESETS:
    raise ValueError(f"muon: unknown ns_coeffs={ns_coeffs!r}; choose one of "
                     f"{sorted(set(optax_presets) | set(linalg.NS_PRESETS))} or give "
                     f"(a, b, c) triples")
  coeffs = linalg.NS_PRESETS[ns_coeffs].coeffs
  return tuple(coeffs[min(i, len(coeffs) - 1)] for i in range(int(ns_steps)))


def scale_by_muon(
    *,
    views: Any = None,
    ns_coeffs: Any = _QUINTIC,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    mu_dtype: Any = None,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = "frobenius",
    bucket: str = "pad",
    precision: str | None = None,
) -> optax.GradientTransformation:
  """``optax.contrib.scale_by_muon``, one batched program per bucket of matrices.

  The momentum, its Nesterov look-ahead and the bias corrections are optax's own
  (``optax.contrib.scale_by_muon``'s tree functions); the Newton–Schulz orthogonalization
  is :func:`orthojax.linalg.newton_schulz` with optax's coefficients, run on the Gram matrix
  where that costs fewer multiply-adds (rectangular matrices: a conv kernel's long side;
  ``_muon_direction``), and optax's own for its other preconditionings or an injected
  schedule. What also differs is how they run over many leaves: by default (``bucket="pad"``) leaves whose matrix views
  share dtype and small side are stacked (:func:`orthojax.linalg.map_views`: the long
  side zero-padded) and orthogonalized by one batched chain of kernels, where optax runs
  one chain per leaf (a GPU launch cost per leaf; Jordan's Muon and Dion batch them the
  same way). The state is optax's ``MuonState`` with its momentum per leaf, so the two
  are interchangeable, and the results equal optax's to rounding (batched products, the
  Gram iteration).
  ``bucket="per_leaf"`` runs leaf by leaf, ``"shape"`` stacks equal shapes only. The
  other arguments (``ns_coeffs``, ``ns_steps``, ``beta``, ``eps``,
  ``mu_dtype``, ``nesterov``, ``adaptive``, ``preconditioning``) are
  ``optax.contrib.scale_by_muon``'s; ``ns_coeffs`` also takes orthojax's preset names.

  Args:
    views: per-leaf matrix views (:func:`muon_dimension_numbers`); a leaf whose
      view is ``False`` passes through unchanged. None (default): those the parameters'
      Variables record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the
      state (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    bucket: how the matrices are stacked (:data:`orthojax.linalg.BUCKETS`).
    precision: of the orthogonalization's products (:data:`orthojax.linalg.PRECISIONS`;
      None: :data:`MUON_PRECISION`'s entry for the backend, bfloat16 on tensor cores).
  """
  check_decay("scale_by_muon", beta, "beta")
  check_bucket("scale_by_muon", bucket)
  linalg.check_precision("scale_by_muon", precision)
  options = dict(ns_coeffs=ns_schedule(ns_coeffs, ns_steps), ns_steps=ns_steps, beta=beta,
                 eps=eps, mu_dtype=mu_dtype, nesterov=nesterov, adaptive=adaptive,
                 preconditioning=preconditioning)
  return views_from_init(lambda v: _scale_by_muon(options, v, bucket, precision), views)


def _scale_by_muon(options: dict[str, Any], views: Any, bucket: str, precision: Any
                   ) -> optax.GradientTransformation:
  one_chain_per_leaf = optax.contrib.scale_by_muon(**options)
  # optax scales an adaptive update by a sum over the whole leaf, which a stack of leaves
  # would mix: those run leaf by leaf.
  bucket = "per_leaf" if options["adaptive"] else bucket
  # orthojax's Newton–Schulz for optax's default preconditioning and a schedule known when
  # the program is built (optax.inject_hyperparams hands numbers over as arrays).
  own_newton_schulz = (options["preconditioning"] == "frobenius"
                       and not injected(options["ns_steps"])
                       and not any(injected(c) for c in jax.tree.leaves(options["ns_coeffs"])))

  def update_fn(updates, state, params=None):
    del params

    def stacked(g, mu, *, view):
      if own_newton_schulz:
        return _muon_direction(g, mu, state.count, view, options)
      dims = to_muon(view)
      out, new = optax.contrib.scale_by_muon(**options, weight_dimension_numbers=dims).update(
          g, state._replace(mu=mu))
      return out, new.mu

    pairs = linalg.at_precision(
        lambda g, mu: map_views(stacked, g, mu, views=_map_views_views(views),
                                default=lambda g, mu: (g, mu), bucket=bucket),
        precision, default=MUON_PRECISION)(updates, state.mu)
    new_updates, mu = unzip(pairs, updates)
    return new_updates, state._replace(count=optax.safe_increment(state.count), mu=mu)

  return optax.GradientTransformation(one_chain_per_leaf.init, update_fn)


_RESTART_EVERY = 2   # Gram Newton–Schulz forms X_k anew every 2 steps (see _muon_direction)


def _muon_direction(g, mu, count, view, options):
  """``optax.contrib.scale_by_muon``'s update of one leaf (or bucket) with Frobenius
  preconditioning — the momentum, its Nesterov look-ahead and bias corrections by optax's
  own tree functions — orthogonalized by :func:`orthojax.linalg.newton_schulz`, on the
  Gram matrix where that costs fewer multiply-adds
  (:func:`orthojax.linalg.newton_schulz_multiply_adds`: a long side above about 1.5× the
  short one; a 3 × 3 conv kernel's 9× costs 1.46× fewer, per device where the view's rows
  are split over devices, ``row_blocks``). The Gram iteration restarts every
  2 steps in every dtype: a momentum of low rank (a language model's, a small batch's) has
  singular values near 0, which the accumulated polynomial must raise by orders of
  magnitude, and without restarts its float32 rounding reached 2.5e-4 of the largest entry
  on a small transformer (within 1e-4 with them, as tests/models/test_transformer.py
  holds it). The same direction as optax's to rounding. Returns ``(update, new
  momentum)``."""
  beta = options["beta"]
  mu = optax.tree.update_moment(g, mu, beta, 1)
  count = optax.safe_increment(count)
  if options["nesterov"]:
    mu_hat = (beta * optax.tree.bias_correction(mu, beta, optax.safe_increment(count))
              + (1 - beta) * optax.tree.bias_correction(g, beta, count))
  else:
    mu_hat = optax.tree.bias_correction(mu, beta, count)
  lo = linalg.layout(mu_hat.shape, view)
  coeffs = _coefficient_rows(options["ns_coeffs"], options["ns_steps"])
  cost = functools.partial(linalg.newton_schulz_multiply_adds, lo.fan_in, lo.fan_out,
                           len(coeffs), row_blocks=lo.row_blocks)
  gram = cost(gram=True, restart_every=_RESTART_EVERY) < cost()
  direction = linalg.newton_schulz(
      lo.to_matrix(mu_hat), steps=len(coeffs), coeffs=coeffs, eps=options["eps"],
      gram=gram, restart_every=_RESTART_EVERY if gram else None, row_blocks=lo.row_blocks)
  return lo.from_matrix(direction).astype(g.dtype), optax.tree.cast(mu, options["mu_dtype"])


def _coefficient_rows(ns_coeffs: Any, ns_steps: int) -> tuple[tuple[float, ...], ...]:
  """The per-step triples optax's Muon runs: one triple ``ns_steps`` times, or the last
  ``ns_steps`` rows of a table."""
  rows = np.asarray(ns_coeffs, dtype=np.float64)
  if rows.ndim == 1:
    return (tuple(float(v) for v in rows),) * int(ns_steps)
  return tuple(tuple(float(v) for v in row) for row in rows[-int(ns_steps):])


def _map_views_views(views: Any) -> Any:
  """:func:`muon_dimension_numbers` as ``map_views`` reads views: a leaf that Muon does
  not orthogonalize (None there) is ``False`` (passed through), not "infer"; the others
  as ``MatrixView`` s that keep their ``row_blocks``."""
  def resolve(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    per_leaf = views_for(tree, views)
    dims = _dims(leaves, leaf_names(tree), per_leaf)
    return treedef.unflatten([
        False if d is None else linalg.MatrixView(
            d.reduction_axis, d.output_axis, row_blocks=getattr(v, "row_blocks", 1))
        for d, v in zip(dims, per_leaf)])
  return resolve


def scale_by_shape(*, views: Any = None,
                   consistent_rms: float | None = None) -> optax.GradientTransformation:
  r"""Muon's per-matrix update scale, from the matrix view (``optax.contrib.muon``'s).

  ``sqrt(max(1, fan_out / fan_in))`` (Jordan's width transfer) or, with
  ``consistent_rms``, ``sqrt(max(fan_in, fan_out)) · consistent_rms`` (Liu et al.,
  "Muon is scalable for LLM training", arXiv:2502.16982, eq. 4: the update's RMS
  matches AdamW's). A leaf whose view is ``False`` passes through.
  """
  def scale(u, *, view):
    lo = linalg.layout(u.shape, view)
    if consistent_rms is None:
      factor = math.sqrt(max(1.0, lo.fan_out / lo.fan_in))
    else:
      factor = math.sqrt(max(lo.fan_in, lo.fan_out)) * consistent_rms
    return factor * u

  def update_fn(updates, state, params=None):
    del params
    return map_views(scale, updates, views=_map_views_views(views)), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = _QUINTIC,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = "frobenius",
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    consistent_rms: float | None = None,
    views: Any = None,
    muon_weight_dimension_numbers: Any = _FROM_VIEWS,
    bucket: str = "pad",
    precision: str | None = None,
) -> optax.GradientTransformation:
  """``optax.contrib.muon`` with dimension numbers from the matrix view, bucketed.

  The same partition as ``optax.contrib.muon`` — Muon (momentum, Newton–Schulz,
  the shape scale, decoupled weight decay, the rate) on the leaves with a matrix
  view, AdamW on the rest — with the same arguments, defaults and state, so
  it equals optax's to rounding. Two differences: the dimension numbers come
  from ``views`` (:func:`muon_dimension_numbers`; conv kernels inferred, stacks
  from their views), and same-shape matrices are orthogonalized together
  (:func:`scale_by_muon`). ``ns_coeffs`` also takes orthojax's Newton–Schulz
  presets by name (``ns_schedule``): ``muon(lr, ns_coeffs="polar_express")``
  runs the Polar Express schedule (Amsel, Persson, Musco & Gower 2025,
  Algorithm 1) for ``ns_steps`` steps.

  Every other argument (``ns_coeffs``, ``ns_steps``, ``beta``, ``eps``, ``weight_decay``,
  ``weight_decay_mask``, ``mu_dtype``, ``nesterov``, ``adaptive``, ``preconditioning``,
  ``adam_b1``, ``adam_b2``, ``adam_eps_root``, ``adam_weight_decay``,
  ``adam_learning_rate``, ``consistent_rms``) is ``optax.contrib.muon``'s, with its default.

  Args:
    learning_rate: Muon's rate, a float or an Optax schedule.
    views: per-leaf views (see :func:`muon_dimension_numbers`); None (default): those the
      parameters' Variables record, read at ``init`` on the ``nnx.Optimizer`` path and
      kept in the state (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    muon_weight_dimension_numbers: not taken: they are derived from ``views``.
    bucket: how the matrices are stacked (:func:`scale_by_muon`).
    precision: of the orthogonalization's products (:func:`scale_by_muon`).
  """
  check_rate("muon", learning_rate)
  for name, value in (("beta", beta), ("adam_b1", adam_b1), ("adam_b2", adam_b2)):
    check_decay("muon", value, name)
  if muon_weight_dimension_numbers != _FROM_VIEWS:
    raise ValueError("muon: pass views=..., not muon_weight_dimension_numbers (derived from them)")
  if adam_learning_rate is not None:
    check_rate("muon", adam_learning_rate, "adam_learning_rate")
  check_bucket("muon", bucket)
  linalg.check_precision("muon", precision)
  muon_options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps,
                      mu_dtype=mu_dtype, nesterov=nesterov, adaptive=adaptive,
                      preconditioning=preconditioning, bucket=bucket, precision=precision)
  adam = optax.adamw(
      learning_rate=learning_rate if adam_learning_rate is None else adam_learning_rate,
      b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root,
      weight_decay=adam_weight_decay, mu_dtype=mu_dtype, nesterov=nesterov)

  def build(views):
    def labels(params):
      dims = muon_dimension_numbers(params, views)
      return jax.tree.map(lambda d: "adam" if d is None else "muon", dims,
                          is_leaf=lambda d: d is None or isinstance(d, MuonDimensionNumbers))

    return optax.partition(
        {"muon": optax.chain(
            scale_by_muon(views=views, **muon_options),
            scale_by_shape(views=views, consistent_rms=consistent_rms),
            optax.add_decayed_weights(weight_decay, weight_decay_mask),
            optax.scale_by_learning_rate(learning_rate)),
         "adam": adam},
        labels)

  return views_from_init(build, views)


def stiefel_muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta: float = 0.95,
    ns_steps: int = 5,
    nesterov: bool = True,
    retraction_steps: int = 8,
    views: Any = None,
    bucket: str = "pad",
    precision: str | None = None,
) -> optax.GradientTransformation:
  """Muon steps kept on the Stiefel manifold by a Newton–Schulz retraction.

  ``W <- NS_polar(W - lr * NS_quintic(momentum))`` per matrix, all matmuls.
  Every leaf it sees must be a matrix parameter (use :func:`partition` to
  route biases elsewhere).

  Args:
    learning_rate: a float or an Optax schedule.
    beta, ns_steps, nesterov: as ``optax.contrib.scale_by_muon``.
    retraction_steps: cubic Newton–Schulz steps of the retraction.
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    bucket: how the matrices are stacked (:data:`orthojax.linalg.BUCKETS`).
    precision: of the products (:data:`orthojax.linalg.PRECISIONS`), the direction's and
      the retraction's. None: each its own per backend — the direction Muon's
      (:data:`MUON_PRECISION`), the retraction the manifold's
      (:class:`orthojax.manifolds.Stiefel`: three
      bfloat16 passes and a float32 correction on tensor cores).

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation`.
  """
  check_rate("stiefel_muon", learning_rate)
  check_decay("stiefel_muon", beta, "beta")
  check_static("stiefel_muon", retraction_steps, "retraction_steps")
  check_bucket("stiefel_muon", bucket)
  linalg.check_precision("stiefel_muon", precision)
  manifold = Stiefel("newton_schulz", ns_steps=retraction_steps, precision=precision)

  def build(views):
    def dims(params):
      leaves, treedef = jax.tree_util.tree_flatten(params)
      names = leaf_names(params)
      flat = _dims(leaves, names, views_for(params, views))
      bad = [n for n, d in zip(names, flat) if d is None]
      if bad:
        raise ValueError(f"stiefel_muon: leaves {bad} are not matrices; route them to a "
                         "Euclidean optimizer with orthojax.optim.partition")
      return treedef.unflatten(flat)

    return keeping(optax.chain(
        scale_by_muon(ns_steps=ns_steps, beta=beta, nesterov=nesterov, views=dims,
                      bucket=bucket, precision=precision),
        optax.scale_by_learning_rate(learning_rate),
        retract(manifold, views, bucket=bucket)))

  return views_from_init(build, views)
