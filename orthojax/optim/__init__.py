"""Optax gradient transformations for manifold-constrained and orthogonality-regularised training.

Building blocks (compose with ``optax.chain``): :func:`project_to_tangent`,
:func:`riemannian_momentum`, :func:`scale_by_riemannian_adam`, :func:`retract`.
Optimizers: :func:`rsgd`, :func:`radam`, :func:`projected_gradient`,
:func:`cayley_sgd`, :func:`cayley_adam`, :func:`landing`, :func:`muon`,
:func:`stiefel_muon`; :func:`fused_stiefel_adam` and :func:`fused_stiefel_momentum` are
``radam``'s and ``rsgd``'s fused Stiefel paths. Regularisation: :func:`add_orthogonality_penalty`.
Routing: :func:`partition` (:func:`keeps_manifold` tells which transformations keep
a manifold leaf on its manifold: a :class:`ManifoldTransformation`, what the optimizers
that retract return). :data:`OPTIMIZER_TABLE` lists the optimizers (name, constructor,
manifolds, keeps-the-manifold) for the trainer's config and its checks. Views: every
transformation that takes ``views=`` and is built without it is a :class:`ViewsFromInit`:
it reads the views the parameters' Flax Variables record where ``init`` gets them
(``nnx.Optimizer``) and keeps them in a :class:`RecordedViewsState`; bare arrays are
inferred. Bucketing: every optimizer's ``bucket`` keyword (:data:`orthojax.linalg.BUCKETS`;
same-shape or zero-padded matrices in one batched program, or one per leaf). Execution
(``orthojax.optim.execution``, above the algorithms): :func:`shard_update` (pod scale:
each matrix's update computed once, by its owner device), :func:`replicated_state` /
:func:`sharded_state`.
"""

from orthojax.optim._cayley import CayleyState
from orthojax.optim._keeps import ManifoldTransformation
from orthojax.optim._keeps import keeps_manifold
from orthojax.optim._landing import LandingState
from orthojax.optim._muon import MUON_PRECISION
from orthojax.optim._muon import muon_dimension_numbers
from orthojax.optim._muon import scale_by_muon
from orthojax.optim._muon import to_muon
from orthojax.optim._partition import partition
from orthojax.optim._penalty import AddOrthogonalityPenaltyState
from orthojax.optim._penalty import add_orthogonality_penalty
from orthojax.optim._recorded import RecordedViewsState
from orthojax.optim._recorded import ViewsFromInit
from orthojax.optim._riemannian import RetractState
from orthojax.optim._riemannian import RiemannianMomentumState
from orthojax.optim._riemannian import ScaleByRiemannianAdamState
from orthojax.optim._riemannian import project_to_tangent
from orthojax.optim._riemannian import retract
from orthojax.optim._riemannian import riemannian_momentum
from orthojax.optim._riemannian import scale_by_riemannian_adam
from orthojax.optim._table import OPTIMIZER_TABLE
from orthojax.optim._table import OptimizerEntry
from orthojax.optim._table import cayley_adam
from orthojax.optim._table import cayley_sgd
from orthojax.optim._table import fused_stiefel_adam
from orthojax.optim._table import fused_stiefel_momentum
from orthojax.optim._table import landing
from orthojax.optim._table import muon
from orthojax.optim._table import optimizer_entry
from orthojax.optim._table import projected_gradient
from orthojax.optim._table import radam
from orthojax.optim._table import rsgd
from orthojax.optim._table import stiefel_muon
from orthojax.optim._table import manifold_muon
from orthojax.optim._manifold_muon import manifold_muon_direction
from orthojax.optim._manifold_muon import msign
from orthojax.optim._manifold_muon import clip_spectral
from orthojax.optim._manifold_muon import scale_by_manifold_muon
from orthojax.optim.execution import MatrixLeaf
from orthojax.optim.execution import Piece
from orthojax.optim.execution import ShardedUpdateState
from orthojax.optim.execution import SplitMatrix
from orthojax.optim.execution import UpdateLayout
from orthojax.optim.execution import assign_owners
from orthojax.optim.execution import num_owners
from orthojax.optim.execution import plan
from orthojax.optim.execution import replicated_state
from orthojax.optim.execution import shard_update
from orthojax.optim.execution import sharded_state
from orthojax.optim.execution import split_cost
from orthojax.optim.execution import split_matrices
