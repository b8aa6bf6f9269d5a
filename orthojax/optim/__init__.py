"""Optax gradient transformations for manifold-constrained and orthogonality-regularised training.

Building blocks (compose with ``optax.chain``): :func:`project_to_tangent`,
:func:`riemannian_momentum`, :func:`scale_by_riemannian_adam`, :func:`retract`.
Optimizers: :func:`rsgd`, :func:`radam`, :func:`projected_gradient`,
:func:`cayley_sgd`, :func:`cayley_adam`, :func:`landing`, :func:`muon`,
:func:`stiefel_muon`; :func:`fused_stiefel_adam` and :func:`fused_stiefel_momentum` are
``radam``'s and ``rsgd``'s fused Stiefel paths. Regularisation: :func:`add_orthogonality_penalty`.
Routing: :func:`partition` (:func:`keeps_manifold` tells which transformations keep
a manifold leaf on its manifold). Views: every transformation that takes ``views=``
defaults to the views the parameters' Flax Variables record where ``init`` gets them
(``nnx.Optimizer``), kept in a :class:`RecordedViewsState`; bare arrays are inferred. Pod scale: :func:`shard_update` (each matrix's update
computed once, by its owner device), :func:`sharded_updates`,
:func:`replicated_state` / :func:`sharded_state`.
"""

from orthojax.optim._alias import projected_gradient
from orthojax.optim._alias import radam
from orthojax.optim._alias import rsgd
from orthojax.optim._cayley import CayleyState
from orthojax.optim._cayley import cayley_adam
from orthojax.optim._cayley import cayley_sgd
from orthojax.optim._fused import fused_stiefel_adam
from orthojax.optim._fused_momentum import fused_stiefel_momentum
from orthojax.optim._keeps import keeps_manifold
from orthojax.optim._landing import LandingState
from orthojax.optim._landing import landing
from orthojax.optim._muon import muon
from orthojax.optim._muon import muon_dimension_numbers
from orthojax.optim._muon import scale_by_muon
from orthojax.optim._muon import stiefel_muon
from orthojax.optim._muon import to_muon
from orthojax.optim._partition import partition
from orthojax.optim._penalty import AddOrthogonalityPenaltyState
from orthojax.optim._penalty import add_orthogonality_penalty
from orthojax.optim._recorded import RecordedViewsState
from orthojax.optim._riemannian import RetractState
from orthojax.optim._riemannian import RiemannianMomentumState
from orthojax.optim._riemannian import ScaleByRiemannianAdamState
from orthojax.optim._riemannian import project_to_tangent
from orthojax.optim._riemannian import retract
from orthojax.optim._riemannian import riemannian_momentum
from orthojax.optim._riemannian import scale_by_riemannian_adam
from orthojax.optim._owners import MatrixLeaf
from orthojax.optim._owners import Piece
from orthojax.optim._owners import assign_owners
from orthojax.optim._owners import split_cost
from orthojax.optim._owners import split_matrices
from orthojax.optim._sharded import ShardedUpdateState
from orthojax.optim._sharded import SplitMatrix
from orthojax.optim._sharded import UpdateLayout
from orthojax.optim._sharded import num_owners
from orthojax.optim._sharded import replicated_state
from orthojax.optim._sharded import shard_update
from orthojax.optim._sharded import sharded_state
from orthojax.optim._sharded import sharded_updates
