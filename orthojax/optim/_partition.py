"""Route constrained leaves to a manifold optimizer and the rest elsewhere."""

from __future__ import annotations

import sys
from typing import Any, Callable
import warnings

import jax
import optax

from orthojax.optim._keeps import keeps_manifold


def _variable_labels(tree: Any) -> Any | None:
  """Labels from Flax NNX Variable types, or None if ``tree`` holds no Variables.

  Duck-typed through ``sys.modules`` so this layer never imports Flax: a
  model or State can only reach here if the caller already imported it.
  """
  nnx = sys.modules.get("flax.nnx")
  if nnx is None:
    return None
  if isinstance(tree, nnx.Module):
    tree = nnx.state(tree, nnx.Param)
  is_variable = lambda x: isinstance(x, nnx.Variable)
  if not any(map(is_variable, jax.tree.leaves(tree, is_leaf=is_variable))):
    return None
  return jax.tree.map(lambda v: getattr(type(v), "manifold_label", "") or "euclidean",
                      tree, is_leaf=is_variable)


def _as_pure_dict_for(labels: Any, params: Any) -> Any:
  """Labels read from a model are an NNX ``State``; params a trainer keeps as plain
  dicts (``nnx.to_pure_dict``, as orthojax's trainer and Orbax checkpoints do) get
  them as a plain dict too, so one ``partition(model, ...)`` serves both."""
  nnx = sys.modules.get("flax.nnx")
  if nnx is not None and isinstance(labels, nnx.State) and not isinstance(params, nnx.State):
    return nnx.to_pure_dict(labels)
  return labels


def partition(param_labels: Any | Callable[[Any], Any], /,
              **transforms: optax.GradientTransformation) -> optax.GradientTransformation:
  """``optax.partition`` with labels checked up front.

  Example, routing by Variable type (``orthojax.nn.StiefelParam`` /
  ``ObliqueParam`` leaves get ``"stiefel"`` / ``"oblique"``, every other
  ``nnx.Param`` ``"euclidean"``)::

      tx = oj.optim.partition(model,
          stiefel=oj.optim.radam(1e-3, views=oj.nn.matrix_views(model)),
          euclidean=optax.adam(1e-3))
      optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  or by an explicit label function::

      labels = lambda params: jax.tree.map_with_path(
          lambda path, p: "stiefel" if p.ndim == 2 and "head" not in jax.tree_util.keystr(path)
          else "euclidean", params)
      tx = oj.optim.partition(labels,
          stiefel=oj.optim.radam(1e-3, manifold=oj.manifolds.Stiefel("cayley")),
          euclidean=optax.adamw(1e-3))

  Args:
    param_labels: an ``nnx.Module`` or a State of its Variables (labels
      read from the Variable types, for ``wrt=nnx.Param``; use
      ``oj.nn.manifold_labels(model, wrt)`` for another filter), a tree of
      label strings with the structure of the params (a prefix is allowed),
      or a callable ``params -> labels``.
    **transforms: one Optax transformation per label.

  Returns:
    An ``optax.GradientTransformation``. Each transform sees only its own
    leaves; the others arrive masked (``optax.MaskedNode``), which every
    orthojax transform passes through.

  Raises:
    ValueError: no transforms, or a label with no transform (when labels are
      first computed, i.e. at ``init``).

  Warns (``UserWarning``), naming the leaves, when labels read from a model send its
  ``StiefelParam`` / ``ObliqueParam`` leaves to a transformation that does not keep
  them on their manifold (:func:`orthojax.optim.keeps_manifold`: ``muon``, ``adam``, an
  undeclared ``optax.chain`` … rather than ``radam``, ``stiefel_muon``, …).
  """
  if not transforms:
    raise ValueError("partition: give at least one transform, e.g. stiefel=..., euclidean=...")
  for name, tx in transforms.items():
    if not isinstance(tx, optax.GradientTransformation):
      raise TypeError(f"partition: {name}= must be an optax.GradientTransformation, got {tx!r}")

  from_variables = _variable_labels(param_labels)
  if from_variables is not None:
    param_labels = from_variables
    _report_drift(from_variables, transforms)

  def labels_fn(params):
    labels = param_labels(params) if callable(param_labels) else param_labels
    labels = _as_pure_dict_for(labels, params)
    unknown = sorted({str(label) for label in jax.tree.leaves(labels)} - set(transforms))
    if unknown:
      raise ValueError(f"partition: labels {unknown} have no transform; transforms are given "
                       f"for {sorted(transforms)}")
    return labels

  return optax.partition(transforms, labels_fn)


def _report_drift(labels: Any, transforms: dict[str, optax.GradientTransformation]) -> None:
  """Warn when a manifold group's transformation would let its leaves leave the manifold."""
  for label, manifold in (("stiefel", "Stiefel"), ("oblique", "oblique")):
    tx = transforms.get(label)
    if tx is None or keeps_manifold(tx):
      continue
    leaves = [jax.tree_util.keystr(path) for path, leaf in
              jax.tree_util.tree_flatten_with_path(labels)[0] if leaf == label]
    if leaves:
      shown = ", ".join(leaves[:4]) + (f" and {len(leaves) - 4} more" if len(leaves) > 4 else "")
      warnings.warn(
          f"partition: {label}= does not keep its leaves on the {manifold} manifold (it "
          f"neither retracts nor is a manifold method): {shown} will drift off it. Use "
          f"oj.optim.radam, rsgd, cayley_adam or landing — oj.optim.stiefel_muon for Muon "
          f"on the manifold — or make them plain nnx.Param (a chain of your own that keeps "
          f"them: declare it, oj.optim.ManifoldTransformation(*chain)).", UserWarning,
          stacklevel=3)

