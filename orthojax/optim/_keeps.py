"""Which transformations keep a manifold parameter on its manifold: declared by their type.

A transformation *keeps* its leaves on their manifold when its update ends in a
retraction (``rsgd``, ``radam``, ``projected_gradient``, ``stiefel_muon``, the fused
Stiefel paths) or is a manifold method of its own (``cayley_sgd``, ``cayley_adam``) — or,
for ``landing``, is pulled back to it at every step. Those constructors say so by what they
return: a :class:`ManifoldTransformation`. That type is the one declaration;
:data:`orthojax.optim.OPTIMIZER_TABLE`'s ``keeps_manifold`` column reads it, and
:func:`orthojax.optim.partition` asks :func:`keeps_manifold` to report a ``StiefelParam``
or ``ObliqueParam`` routed to a transformation that would let it drift.

A chain of your own is a plain ``optax`` transformation: ``optax.chain`` does not say
what its links do, and whether the chain keeps depends on its *last* link
(``optax.chain(optax.clip(1.0), rsgd(lr))`` keeps, ``optax.chain(rsgd(lr),
optax.scale(2.0))`` does not). Declare one that keeps yourself::

    tx = oj.optim.ManifoldTransformation(*optax.chain(optax.clip(1.0), oj.optim.rsgd(1e-2)))
"""

from __future__ import annotations

import optax

from orthojax.optim._recorded import INFERRED, ViewsFromInit


class ManifoldTransformation(optax.GradientTransformationExtraArgs):
  """An ``optax.GradientTransformationExtraArgs`` whose update keeps its leaves on their
  manifold (module docstring): ``ManifoldTransformation(init, update)``."""


def keeping(tx: optax.GradientTransformation) -> ManifoldTransformation:
  """``tx``, declared to keep its leaves on their manifold."""
  tx = optax.with_extra_args_support(tx)
  return ManifoldTransformation(tx.init, tx.update)


def keeps_manifold(tx: optax.GradientTransformation) -> bool:
  """Whether ``tx`` is declared to keep its leaves on their manifold.

  A transformation whose views are read at ``init`` (built with ``views=None``:
  :class:`orthojax.optim.ViewsFromInit`) keeps when the one it builds does.
  """
  if isinstance(tx, ViewsFromInit):
    return keeps_manifold(tx.with_views(INFERRED))
  return isinstance(tx, ManifoldTransformation)
