"""The library's optimizers, in one table: name, constructor, manifolds, keeps-the-manifold.

Everything that asks about an orthojax optimizer reads :data:`OPTIMIZER_TABLE`: the
config's registry (:data:`orthojax.train.registry.OPTIMIZERS`, by name) and its checks
(which parameter group may name which optimizer), :func:`orthojax.optim.partition`
(through :func:`orthojax.optim.keeps_manifold`: the constructor of a row that keeps
marks what it builds), and the trainer, which owner-shards every optimizer of the
table (:func:`orthojax.optim.shard_update`; they are all per-leaf matrix updates).

Adding an optimizer is adding a row: its public name ``oj.optim.<name>`` is the row's
constructor.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import optax

from orthojax.optim import _alias
from orthojax.optim import _cayley
from orthojax.optim import _fused
from orthojax.optim import _fused_momentum
from orthojax.optim import _landing
from orthojax.optim import _muon
from orthojax.optim import _riemannian
from orthojax.optim._keeps import mark

Constructor = Callable[..., optax.GradientTransformation]


@dataclasses.dataclass(frozen=True)
class OptimizerEntry:
  """One optimizer of the library.

  Attributes:
    name: its name in a config section and in ``oj.optim``.
    constructor: the public constructor (``oj.optim.<name>``).
    manifolds: the manifold parameter groups it may update (``"stiefel"``,
      ``"oblique"``: the labels :func:`orthojax.nn.manifold_labels` gives).
    keeps_manifold: its update keeps those parameters on their manifold (it ends in a
      retraction or is a manifold method). False for an orthogonalized Euclidean step
      (Muon): a manifold group may name it, and its parameters then leave the
      manifold; only an optimizer that does not keep it may serve Euclidean parameters.
  """

  name: str
  constructor: Constructor
  manifolds: tuple[str, ...]
  keeps_manifold: bool


def _marking(constructor: Constructor) -> Constructor:
  """``constructor`` whose transformations :func:`keeps_manifold` recognises."""

  @functools.wraps(constructor)
  def build(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
    return mark(constructor(*args, **kwargs))

  return build


def _entry(name: str, constructor: Constructor, manifolds: tuple[str, ...],
           keeps_manifold: bool) -> OptimizerEntry:
  public = _marking(constructor) if keeps_manifold else constructor
  return OptimizerEntry(name, public, manifolds, keeps_manifold)


_BOTH = ("stiefel", "oblique")
_STIEFEL = ("stiefel",)

OPTIMIZER_TABLE: tuple[OptimizerEntry, ...] = (
    _entry("rsgd", _alias.rsgd, _BOTH, True),
    _entry("radam", _alias.radam, _BOTH, True),
    _entry("projected_gradient", _alias.projected_gradient, _BOTH, True),
    _entry("cayley_sgd", _cayley.cayley_sgd, _STIEFEL, True),
    _entry("cayley_adam", _cayley.cayley_adam, _STIEFEL, True),
    _entry("landing", _landing.landing, _STIEFEL, True),
    _entry("muon", _muon.muon, _STIEFEL, False),
    _entry("stiefel_muon", _muon.stiefel_muon, _STIEFEL, True),
    _entry("fused_stiefel_adam", _fused.fused_stiefel_adam, _STIEFEL, True),
    _entry("fused_stiefel_momentum", _fused_momentum.fused_stiefel_momentum, _STIEFEL, True),
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
fused_stiefel_adam = _BY_NAME["fused_stiefel_adam"].constructor
fused_stiefel_momentum = _BY_NAME["fused_stiefel_momentum"].constructor

# The building block that keeps: a chain of your own that ends in it keeps its leaves.
retract = _marking(_riemannian.retract)
