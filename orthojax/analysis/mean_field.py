"""Mean-field theory in one namespace: ``oj.analysis.mean_field.q_star`` etc.

The q-map, fixed point, ``χ`` and critical points are those of
:mod:`orthojax.nn.initializers` (reused, not duplicated); the depth recursion
and the Jacobian spectrum moments come from :mod:`orthojax.analysis`. Every
name here is also available directly as ``oj.analysis.<name>``.
"""

from orthojax.analysis._mean_field import JacobianMoments
from orthojax.analysis._mean_field import jacobian_spectrum_moments
from orthojax.analysis._mean_field import q_recursion
from orthojax.nn.initializers import ACTIVATIONS
from orthojax.nn.initializers import chi
from orthojax.nn.initializers import critical_line
from orthojax.nn.initializers import critical_point
from orthojax.nn.initializers import gaussian_expectation
from orthojax.nn.initializers import q_map
from orthojax.nn.initializers import q_star
from orthojax.nn.initializers import resolve_activation

__all__ = [
    "ACTIVATIONS",
    "JacobianMoments",
    "chi",
    "critical_line",
    "critical_point",
    "gaussian_expectation",
    "jacobian_spectrum_moments",
    "q_map",
    "q_recursion",
    "q_star",
    "resolve_activation",
]
