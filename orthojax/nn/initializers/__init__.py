"""Initializers (``jax.nn.initializers`` signature) and mean-field criticality.

Kernel initializers read shapes through the matrix view of
:mod:`orthojax.linalg`. The mean-field functions (``gaussian_expectation``,
``q_map``, ``q_star``, ``chi``, ``critical_point``, ``critical_line``) are
numpy float64 computations for initialisation time, not traceable by jax.
"""

from orthojax.nn._activations import ACTIVATIONS
from orthojax.nn.initializers._mean_field import Activation
from orthojax.nn.initializers._mean_field import chi
from orthojax.nn.initializers._mean_field import critical_line
from orthojax.nn.initializers._mean_field import critical_point
from orthojax.nn.initializers._mean_field import gaussian_expectation
from orthojax.nn.initializers._mean_field import q_map
from orthojax.nn.initializers._mean_field import q_star
from orthojax.nn.initializers._mean_field import resolve_activation
from orthojax.nn.initializers._orthogonal import CRITICAL_INITS
from orthojax.nn.initializers._orthogonal import critical
from orthojax.nn.initializers._orthogonal import critical_gaussian
from orthojax.nn.initializers._orthogonal import critical_orthogonal
from orthojax.nn.initializers._orthogonal import delta_orthogonal
from orthojax.nn.initializers._orthogonal import gaussian
from orthojax.nn.initializers._orthogonal import orthogonal
from orthojax.nn.initializers._orthogonal import variance_scaling

__all__ = [
    "ACTIVATIONS",
    "CRITICAL_INITS",
    "Activation",
    "chi",
    "critical",
    "critical_gaussian",
    "critical_line",
    "critical_orthogonal",
    "critical_point",
    "delta_orthogonal",
    "gaussian",
    "gaussian_expectation",
    "orthogonal",
    "q_map",
    "q_star",
    "resolve_activation",
    "variance_scaling",
]
