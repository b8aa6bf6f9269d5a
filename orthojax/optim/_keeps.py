"""Which transformations keep a manifold parameter on its manifold.

A transformation *keeps* its leaves on their manifold when its update ends in a
retraction (:func:`orthojax.optim.retract`, and with it ``rsgd``, ``radam``,
``projected_gradient`` on a manifold, ``stiefel_muon``) or is a manifold method of its
own (``cayley_sgd``, ``cayley_adam``, the fused Stiefel Adam) — or, for ``landing``, is
pulled back to it at every step. Which optimizers do is said once, in the library's
table (:data:`orthojax.optim.OPTIMIZER_TABLE`): the constructors of its rows that keep,
and ``retract``, :func:`mark` what they return. :func:`keeps_manifold` finds such a
mark anywhere inside a transformation (an ``optax.chain``, an owner-sharded wrapper), by
following the closures of its ``update``. :func:`orthojax.optim.partition` uses it to
report a ``StiefelParam`` or ``ObliqueParam`` routed to a transformation that would let
it drift.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable
import weakref

import optax

_MARKED: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()


def mark(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx``, recorded as keeping its leaves on their manifold."""
  _MARKED.add(tx.update)
  return tx


def keeps_manifold(tx: optax.GradientTransformation, depth: int = 24) -> bool:
  """Whether a marked transformation is part of ``tx`` (the module docstring)."""
  seen: set[int] = set()

  def search(obj: Any, depth: int) -> bool:
    if depth < 0 or id(obj) in seen:
      return False
    seen.add(id(obj))
    if isinstance(obj, types.FunctionType):
      if obj in _MARKED:
        return True
      cells = []
      for cell in obj.__closure__ or ():
        try:
          cells.append(cell.cell_contents)
        except ValueError:   # an empty cell
          pass
      return any(search(c, depth - 1) for c in cells)
    if isinstance(obj, functools.partial):
      return search(obj.func, depth - 1) or any(search(a, depth - 1) for a in obj.args)
    if isinstance(obj, (tuple, list)):   # GradientTransformations are NamedTuples
      return any(search(x, depth - 1) for x in obj)
    if isinstance(obj, dict):
      return any(search(x, depth - 1) for x in obj.values())
    return False

  return search(getattr(tx, "update", tx), depth)
