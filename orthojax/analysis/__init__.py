r"""Dynamical-isometry diagnostics: Jacobian spectra, Fisher/NTK eigenvalues,
mean-field theory, spectrum tracking during training, and their plots.

* Eigensolvers (matrix-free, jit-able): :func:`lanczos` (full
  reorthogonalisation), :func:`top_eigenvalues`, :func:`power_iteration`,
  :func:`spectral_density` (stochastic Lanczos quadrature).
* Input-output Jacobians: :func:`jacobian_singular_values` (exact SVD or
  Lanczos on ``JᵀJ``/``JJᵀ`` via jvp/vjp), :func:`gram_operator`,
  :func:`deep_mlp_hidden_map` (``h^a ↦ h^b`` of a
  :class:`~orthojax.models.DeepMLP`), :func:`model_function` /
  :func:`model_apply` (pure eval-mode functions of NNX models).
* Curvature: :func:`fisher_max_eigenvalue` (Gauss–Newton = Fisher, or the
  empirical Fisher; Lanczos or power), :func:`fisher_matvec`,
  :func:`empirical_ntk`, :func:`ntk_eigenvalues` (under MSE the non-zero
  Fisher eigenvalues are the NTK's divided by the batch size).
* Fisher vs. Jacobian: :func:`isometry_diagnostics` (``λ_max`` of the
  empirical Fisher and ``σ_max`` of ``J_{x⁰}^{h^g}`` of a
  :class:`~orthojax.models.DeepMLP` on one batch; Sokol & Park 2020).
* Characteristic points of ReLU units (GmP paper §3.3–3.5):
  :func:`characteristic_points` (``φ = −λu`` of SP / WN / BN / GmP hidden
  layers), :class:`CharacteristicPointTracker` (a ``hook(step, model)``
  recording them and their per-step changes).
* Mean field (also grouped as :mod:`orthojax.analysis.mean_field`):
  ``q_map``, ``q_star``, ``chi``, ``critical_point``, ``critical_line``
  (from :mod:`orthojax.nn.initializers`), :func:`q_recursion`,
  :func:`jacobian_spectrum_moments`.
* Tracking: :func:`spectrum_stats` (per-leaf singular-value statistics
  through the matrix view), :func:`spectrum_hook` (for
  ``orthojax.train.train(hooks=...)``).
* Plots: :func:`plot_singular_value_bands`, :func:`plot_jacobian_spectrum`,
  :func:`plot_fisher_vs_jacobian`.
* Seed statistics: :func:`paired_difference` (mean of paired differences, its
  standard error and the 2-SE verdict), :func:`standard_error`.

Nothing here imports ``orthojax.train``, the experiments or tensorflow;
matplotlib is imported only inside the plotting functions.
"""

from orthojax.analysis import mean_field
from orthojax.analysis._characteristic import CharacteristicPointTracker
from orthojax.analysis._characteristic import characteristic_points
from orthojax.analysis._fisher import FisherEigen
from orthojax.analysis._fisher import fisher_matvec
from orthojax.analysis._fisher import fisher_max_eigenvalue
from orthojax.analysis._fisher import per_example_loss
from orthojax.analysis._jacobian import JacobianSpectrum
from orthojax.analysis._jacobian import deep_mlp_hidden_map
from orthojax.analysis._jacobian import gram_operator
from orthojax.analysis._jacobian import jacobian_singular_values
from orthojax.analysis._isometry import isometry_diagnostics
from orthojax.analysis._lanczos import EigenResult
from orthojax.analysis._lanczos import LanczosResult
from orthojax.analysis._lanczos import PowerResult
from orthojax.analysis._lanczos import SpectralDensity
from orthojax.analysis._lanczos import lanczos
from orthojax.analysis._lanczos import power_iteration
from orthojax.analysis._lanczos import spectral_density
from orthojax.analysis._lanczos import top_eigenvalues
from orthojax.analysis._lanczos import tridiagonal
from orthojax.analysis._mean_field import JacobianMoments
from orthojax.analysis._mean_field import jacobian_spectrum_moments
from orthojax.analysis._mean_field import q_recursion
from orthojax.analysis._model import model_apply
from orthojax.analysis._model import model_function
from orthojax.analysis._ntk import empirical_ntk
from orthojax.analysis._ntk import ntk_eigenvalues
from orthojax.analysis._plots import pearson
from orthojax.analysis._plots import pearson_interval
from orthojax.analysis._plots import plot_fisher_vs_jacobian
from orthojax.analysis._plots import plot_jacobian_spectrum
from orthojax.analysis._plots import plot_singular_value_bands
from orthojax.analysis._spectrum import STATS
from orthojax.analysis._spectrum import SV_STATS
from orthojax.analysis._spectrum import matrix_stats
from orthojax.analysis._spectrum import spectrum_hook
from orthojax.analysis._spectrum import spectrum_stats
from orthojax.analysis._stats import PairedDifference
from orthojax.analysis._stats import paired_difference
from orthojax.analysis._stats import standard_error
from orthojax.nn.initializers import chi
from orthojax.nn.initializers import critical_line
from orthojax.nn.initializers import critical_point
from orthojax.nn.initializers import gaussian_expectation
from orthojax.nn.initializers import q_map
from orthojax.nn.initializers import q_star

__all__ = [
    "CharacteristicPointTracker",
    "EigenResult",
    "FisherEigen",
    "JacobianMoments",
    "JacobianSpectrum",
    "LanczosResult",
    "PairedDifference",
    "PowerResult",
    "STATS",
    "SV_STATS",
    "SpectralDensity",
    "characteristic_points",
    "chi",
    "critical_line",
    "critical_point",
    "deep_mlp_hidden_map",
    "empirical_ntk",
    "fisher_matvec",
    "fisher_max_eigenvalue",
    "gaussian_expectation",
    "gram_operator",
    "isometry_diagnostics",
    "jacobian_singular_values",
    "jacobian_spectrum_moments",
    "lanczos",
    "matrix_stats",
    "mean_field",
    "model_apply",
    "model_function",
    "ntk_eigenvalues",
    "paired_difference",
    "pearson",
    "pearson_interval",
    "per_example_loss",
    "plot_fisher_vs_jacobian",
    "plot_jacobian_spectrum",
    "plot_singular_value_bands",
    "power_iteration",
    "q_map",
    "q_recursion",
    "q_star",
    "spectral_density",
    "spectrum_hook",
    "spectrum_stats",
    "standard_error",
    "top_eigenvalues",
    "tridiagonal",
]
