"""The library's optimizers, in one table: name, constructor, manifolds, keeps-the-manifold.

Everything that asks about an orthojax optimizer reads :data:`OPTIMIZER_TABLE`: the
config's registry (:data:`orthojax.train.registry.OPTIMIZERS`, by name) and its checks
(which parameter group may name which optimizer), and the trainer, which owner-shards
every optimizer of the table (:func:`orthojax.optim.shard_update`; they are all per-leaf
matrix updates). Every row's constructor takes ``views`` and ``bucket``
(:data:`orthojax.linalg.BUCKETS`), which the trainer's config sections set.

Whether a row keeps its parameters on their manifold is what its constructor returns
(a :class:`orthojax.optim.ManifoldTransformation`: :mod:`orthojax.optim._keeps`); the
``keeps_manifold`` column reads it from a transformation the constructor builds.

Adding an optimizer is adding a row: its public name ``oj.optim.<name>`` is the row's
constructor.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import optax

from orthojax.optim import _alias
from orthojax.optim import _cayley
from orthojax.optim import _fused
from orthojax.optim import _fused_momentum
from orthojax.optim import _landing
from orthojax.optim import _manifold_muon
from orthojax.optim import _muon
from orthojax.optim._keeps import keeps_manifold

Constructor = Callable[..., optax.GradientTransformation]


@dataclasses.dataclass(frozen=True)
class OptimizerEntry:
  """One optimizer of the library.

  Attributes:
    name: its name in a config section and in ``oj.optim``.
    constructor: the public constructor (``oj.optim.<name>``).
    manifolds: the manifold parameter groups it may update (``"stiefel"``,
      ``"oblique"``: the labels :func:`orthojax.nn.manifold_labels` gives).
  """

  name: str
  constructor: Constructor
  manifolds: tuple[str, ...]

  @functools.cached_property
  def keeps_manifold(self) -> bool:
    """Its update keeps those parameters on their manifold (it ends in a retraction or is
    a manifold method): what its constructor returns says so
    (:func:`orthojax.optim.keeps_manifold`). False for an orthogonalized Euclidean step
    (Muon): a manifold group may name it, and its parameters then leave the manifold;
    only an optimizer that does not keep it may serve Euclidean parameters."""
    return keeps_manifold(self.constructor(1e-3))


_BOTH = ("stiefel", "oblique")
_STIEFEL = ("stiefel",)

OPTIMIZER_TABLE: tuple[OptimizerEntry, ...] = (
    OptimizerEntry("rsgd", _alias.rsgd, _BOTH),
    OptimizerEntry("radam", _alias.radam, _BOTH),
    OptimizerEntry("projected_gradient", _alias.projected_gradient, _BOTH),
    OptimizerEntry("cayley_sgd", _cayley.cayley_sgd, _STIEFEL),
    OptimizerEntry("cayley_adam", _cayley.cayley_adam, _STIEFEL),
    OptimizerEntry("landing", _landing.landing, _STIEFEL),
    OptimizerEntry("muon", _muon.muon, _STIEFEL),
    OptimizerEntry("stiefel_muon", _muon.stiefel_muon, _STIEFEL),
    OptimizerEntry("manifold_muon", _manifold_muon.manifold_muon, _STIEFEL),
    OptimizerEntry("fused_stiefel_adam", _fused.fused_stiefel_adam, _STIEFEL),
    OptimizerEntry("fused_stiefel_momentum", _fused_momentum.fused_stiefel_momentum, _STIEFEL),
)
"""The library's optimizers (see the module docstring), in the order configs list them."""

_BY_NAME = {entry.name: entry for entry in OPTIMIZER_TABLE}


def optimizer_entry(name: str) -> OptimizerEntry | None:
  """The row of the optimizer called ``name``, or None (not one of the library's)."""
  return _BY_NAME.get(name)


rsgd = _BY_NAME["rsgd"].constructor
radam = _BY_NAME["radam"].constructor
projected_gradient = _BY_NAME["projected_gradient"].constructor
cayley_sgd = _BY_NAME["cayley_sgd"].constructor
cayley_adam = _BY_NAME["cayley_adam"].constructor
landing = _BY_NAME["landing"].constructor
muon = _BY_NAME["muon"].constructor
stiefel_muon = _BY_NAME["stiefel_muon"].constructor
manifold_muon = _BY_NAME["manifold_muon"].constructor
fused_stiefel_adam = _BY_NAME["fused_stiefel_adam"].constructor
fused_stiefel_momentum = _BY_NAME["fused_stiefel_momentum"].constructor
