"""Muon through ``optax.contrib.muon``, with dimension numbers from the matrix view.

``optax.contrib.muon`` orthogonalizes only 2-D leaves unless it is given
``muon_weight_dimension_numbers``; conv kernels and scanned stacks then go to
its Adam branch *silently*. :func:`muon_dimension_numbers` derives those
numbers from orthojax's matrix view instead (Dense and conv kernels inferred,
stacks from explicit views), and raises for a leaf whose layout is ambiguous
rather than guess. :func:`muon` is ``optax.contrib.muon`` with them filled in.

:func:`stiefel_muon` keeps weights *on* the Stiefel manifold: the Muon
direction (Newton–Schulz-orthogonalized momentum, an ambient step) followed by
the Newton–Schulz polar retraction, a projected-gradient method that needs
matmuls only.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from orthojax import linalg
from orthojax.linalg import leaf_names, views_for
from orthojax.manifolds import Stiefel
from orthojax.optim._checks import check_rate
from orthojax.optim._recorded import reads_recorded_views
from orthojax.optim._riemannian import retract
from orthojax.optim._sharded import owner_sharded


def to_muon(view: Any) -> MuonDimensionNumbers:
  """A :class:`orthojax.linalg.MatrixView` as optax ``MuonDimensionNumbers``."""
  return MuonDimensionNumbers(reduction_axis=view.reduction_axis, output_axis=view.output_axis)


def muon_dimension_numbers(params: Any, views: Any = None) -> Any:
  """Per-leaf ``MuonDimensionNumbers`` (None = Adam) from the matrix view.

  Leaves of rank < 2 (biases, scales) get None, i.e. optax's Adam branch.
  Rank 2 and 4 are Dense and conv kernels. Other ranks need a view — explicit
  (``views``) or recorded by the leaf's Variable (``views`` None) — otherwise a
  ValueError names the leaf. A view ``False`` (in a ``views`` tree, or a
  Variable's ``matrix_view=False``) sends that parameter to Adam.
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
  """``ns_coeffs`` as ``optax.contrib.muon`` takes it: an orthojax preset name that optax
  does not know (:data:`orthojax.linalg.NS_PRESETS`, e.g. ``"polar_express"``) becomes its
  first ``ns_steps`` per-step triples (the last one repeated where the preset is shorter);
  anything else is passed through unchanged.

  Raises:
    ValueError: an unknown preset name, listing both libraries' names.
  """
  optax_presets = getattr(optax.contrib._muon, "_NS_COEFFS_PRESET_DICT", {})  # pylint: disable=protected-access
  if not isinstance(ns_coeffs, str) or ns_coeffs in optax_presets:
    return ns_coeffs
  if ns_coeffs not in linalg.NS_PRESETS:
    raise ValueError(f"muon: unknown ns_coeffs={ns_coeffs!r}; choose one of "
                     f"{sorted(set(optax_presets) | set(linalg.NS_PRESETS))} or give "
                     f"(a, b, c) triples")
  coeffs = linalg.NS_PRESETS[ns_coeffs].coeffs
  return tuple(coeffs[min(i, len(coeffs) - 1)] for i in range(int(ns_steps)))


@owner_sharded
@reads_recorded_views
def muon(learning_rate: optax.ScalarOrSchedule, *, views: Any = None,
         **kwargs: Any) -> optax.GradientTransformation:
  """``optax.contrib.muon`` with dimension numbers derived from the matrix view.

  ``ns_coeffs`` also takes orthojax's Newton–Schulz presets by name
  (``ns_schedule`` below): ``muon(lr, ns_coeffs="polar_express")`` runs the Polar Express
  schedule (Amsel, Persson, Musco & Gower 2025, Algorithm 1) for ``ns_steps`` steps.

  Args:
    learning_rate: as ``optax.contrib.muon``.
    views: per-leaf views (see :func:`muon_dimension_numbers`). None (default): the
      views the parameters' Variables record where ``init`` gets them
      (``nnx.Optimizer(model, tx, wrt=nnx.Param)``; :class:`RecordedViewsState`), so
      GmP's angles, embeddings, heads and stacked scales (``matrix_view=False``) go
      to Adam as with ``views=oj.nn.matrix_views(model)``; inferred for bare arrays,
      where every 2-D leaf is orthogonalized.
    **kwargs: any other ``optax.contrib.muon`` argument.
  """
  check_rate("muon", learning_rate)
  if "muon_weight_dimension_numbers" in kwargs:
    raise ValueError("muon: pass views=..., not muon_weight_dimension_numbers (derived from them)")
  if "ns_coeffs" in kwargs:
    kwargs["ns_coeffs"] = ns_schedule(kwargs["ns_coeffs"], kwargs.get("ns_steps", 5))
  return optax.contrib.muon(
      learning_rate,
      muon_weight_dimension_numbers=lambda params: muon_dimension_numbers(params, views),
      **kwargs)


@owner_sharded
@reads_recorded_views
def stiefel_muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta: float = 0.95,
    ns_steps: int = 5,
    nesterov: bool = True,
    retraction_steps: int = 8,
    views: Any = None,
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
      record, on the ``nnx.Optimizer`` path (:class:`orthojax.optim.RecordedViewsState`),
      else inferred.
  """
  check_rate("stiefel_muon", learning_rate)
  def dims(params):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    names = leaf_names(params)
    flat = _dims(leaves, names, views_for(params, views))
    bad = [n for n, d in zip(names, flat) if d is None]
    if bad:
      raise ValueError(f"stiefel_muon: leaves {bad} are not matrices; route them to a "
                       "Euclidean optimizer with orthojax.optim.partition")
    return treedef.unflatten(flat)

  return optax.chain(
      optax.contrib.scale_by_muon(ns_steps=ns_steps, beta=beta, nesterov=nesterov,
                                  weight_dimension_numbers=dims),
      optax.scale_by_learning_rate(learning_rate),
      retract(Stiefel("newton_schulz", ns_steps=retraction_steps), views),
  )
