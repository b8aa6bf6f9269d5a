"""Flax NNX layers, initializers and constrained Variable types."""

from orthojax.nn import initializers
from orthojax.nn import sharding
from orthojax.nn._activations import ACTIVATIONS
from orthojax.nn._activations import activation_fn
from orthojax.nn._checks import check_choice
from orthojax.nn._checks import check_positive_int
from orthojax.nn._constrained import ManifoldLinear
from orthojax.nn._constrained import ManifoldParam
from orthojax.nn._constrained import ObliqueParam
from orthojax.nn._constrained import StiefelParam
from orthojax.nn._constrained import manifold_labels
from orthojax.nn._constrained import matrix_views
from orthojax.nn._gmp import GmPConv
from orthojax.nn._gmp import GmPDense
from orthojax.nn._hyperspherical import angles_to_direction
from orthojax.nn._hyperspherical import direction_to_angles
from orthojax.nn._norm import InputMeanNorm
from orthojax.nn._norm import MeanOnlyBatchNorm
from orthojax.nn._norm import WeightNormConv
from orthojax.nn._norm import WeightNormDense
from orthojax.nn._orthogonal import OrthogonalConv
from orthojax.nn._orthogonal import OrthogonalDense

__all__ = [
    "ACTIVATIONS",
    "GmPConv",
    "GmPDense",
    "InputMeanNorm",
    "ManifoldLinear",
    "ManifoldParam",
    "ObliqueParam",
    "OrthogonalConv",
    "OrthogonalDense",
    "StiefelParam",
    "MeanOnlyBatchNorm",
    "WeightNormConv",
    "WeightNormDense",
    "activation_fn",
    "angles_to_direction",
    "check_choice",
    "check_positive_int",
    "direction_to_angles",
    "initializers",
    "manifold_labels",
    "matrix_views",
    "sharding",
]
