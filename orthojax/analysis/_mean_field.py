r"""Mean-field predictions for deep random networks: q^l, χ, Jacobian spectrum moments.

The q-map, its fixed point, ``χ`` and the critical points live in
:mod:`orthojax.nn.initializers` (they set initial scales) and are re-exported
from :mod:`orthojax.analysis`; this module adds the depth recursion and the
free-probability moments of the input-output Jacobian spectrum.

Jacobian spectrum (Pennington, Schoenholz & Ganguli 2017, §2–3). For
``J = ∏_{l=1}^{L} W_l D_l`` with ``N × N`` weights of variance ``σ_w²/N``
(Gaussian) or ``σ_w`` times Haar orthogonal, and ``D_l = diag φ'(h^l)``
with the pre-activations at the fixed point ``q*``, the spectrum of ``JJᵀ``
is, for ``N → ∞``, the free multiplicative convolution of those of
``W_l W_lᵀ`` and ``D_l²``: S-transforms multiply,
``S_{JJᵀ}(z) = ∏_l S_{W_lW_lᵀ}(z) S_{D_l²}(z)``. With ``S(z) = s_0 + s_1 z + …``
a spectrum has mean ``m_1 = 1/s_0`` and variance ``−s_1/s_0³``, and for a
product ``log S`` adds, so the moments follow from each factor's first two
coefficients. Write ``μ_k = E_h[φ'(√q* h)^{2k}]`` (``h ~ N(0, 1)``):

* ``D²``: ``s_0 = 1/μ_1``, ``−s_1/s_0 = μ_2/μ_1² − 1``;
* ``W Wᵀ`` orthogonal (``= σ_w² I``): ``s_0 = σ_w^{−2}``, ``s_1 = 0``;
* ``W Wᵀ`` Gaussian (Marchenko–Pastur, ratio 1):
  ``S(z) = σ_w^{−2}/(1 + z)``, ``−s_1/s_0 = 1``.

Hence, with ``χ = σ_w² μ_1``::

    m_1      = χ^L,
    σ²_{JJᵀ} = m_1² · L · (μ_2/μ_1² − 1 + [1 if Gaussian else 0]).

At criticality (``χ = 1``, so ``m_1 = 1``) and for piecewise-linear ``φ``
(ReLU, hard-tanh, linear: ``φ' ∈ {0, 1}``, so ``μ_1 = μ_2 = p(q*)``, the
fraction of units in the linear regime) this is Pennington et al.'s
result::

    orthogonal:  σ²_{JJᵀ} = L (1/p(q*) − 1),     Gaussian:  σ²_{JJᵀ} = L / p(q*).

A linear network (``p = 1``) with orthogonal weights is an exact isometry
(``σ² = 0``); with Gaussian weights the variance is ``L`` — it grows
linearly with depth, the loss of dynamical isometry.

References:
  Poole, Lahiri, Raghu, Sohl-Dickstein & Ganguli, "Exponential expressivity in
  deep neural networks through transient chaos", NeurIPS 2016.
  Schoenholz, Gilmer, Ganguli & Sohl-Dickstein, "Deep information
  propagation", ICLR 2017.
  Pennington, Schoenholz & Ganguli, "Resurrecting the sigmoid in deep
  learning through dynamical isometry: theory and practice", NeurIPS 2017.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from orthojax.nn import check_choice
from orthojax.nn.initializers import CRITICAL_INITS
from orthojax.nn.initializers import critical_point
from orthojax.nn.initializers import gaussian_expectation
from orthojax.nn.initializers import q_map
from orthojax.nn.initializers import q_star as fixed_point
from orthojax.nn.initializers import resolve_activation


def q_recursion(q0: float, sigma_w: float, sigma_b: float, activation, depth: int,
                **quad) -> np.ndarray:
  r"""The pre-activation variances ``q^0 … q^L`` of a deep random network.

  ``q^0 = q0`` and ``q^l = σ_w² E_h[φ(√q^{l−1} h)²] + σ_b²`` (the q-map of
  :func:`~orthojax.nn.initializers.q_map`), so ``q^l → q*`` with depth.
  For :class:`~orthojax.models.DeepMLP` the first hidden pre-activation has
  ``q¹ = σ_w² mean(x²) + σ_b²``; start there.

  Not traceable: numpy float64, for analysis and tests.

  Args:
    q0: the starting variance, ``≥ 0``.
    sigma_w: weight scale (weights ``N(0, σ_w²/fan_in)``).
    sigma_b: bias standard deviation.
    activation: a name (``"tanh"``, ``"hard_tanh"``, ``"erf"``, ``"relu"``,
      ``"linear"``), a callable, or a pair ``(φ, φ')``.
    depth: number of q-map applications ``L ≥ 0``.
    **quad: options of :func:`~orthojax.nn.initializers.gaussian_expectation`.

  Returns:
    ``(depth + 1,)`` float64 array.

  Raises:
    ValueError: ``q0 < 0`` or ``depth < 0``.

  References:
    Poole et al. 2016; Schoenholz et al. 2017.
  """
  if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
    raise ValueError(f"q_recursion: depth must be an int >= 0, got {depth!r}")
  q0 = float(q0)
  if not math.isfinite(q0) or q0 < 0:
    raise ValueError(f"q_recursion: q0 must be finite and >= 0, got {q0}")
  act = resolve_activation(activation)
  out = [q0]
  for _ in range(int(depth)):
    out.append(float(q_map(out[-1], sigma_w, sigma_b, act, **quad)))
  return np.asarray(out)


class JacobianMoments(NamedTuple):
  """Predicted moments of the spectrum of ``JJᵀ`` (see :func:`jacobian_spectrum_moments`).

  Attributes:
    m1: mean eigenvalue of ``JJᵀ`` (mean squared singular value of ``J``), ``χ^L``.
    m2: second moment, ``variance + m1²``.
    variance: ``σ²_{JJᵀ}``, the variance of the eigenvalues of ``JJᵀ``.
    chi: the per-layer ``χ = σ_w² μ_1``.
    mu1: ``E[φ'(√q* h)²]`` (``p(q*)`` for piecewise-linear ``φ``).
    mu2: ``E[φ'(√q* h)⁴]``.
    q_star: the pre-activation variance used.
    sigma_w: weight scale.
    sigma_b: bias scale.
    depth: ``L``.
    weights: ``"orthogonal"`` or ``"gaussian"``.
  """

  m1: float
  m2: float
  variance: float
  chi: float
  mu1: float
  mu2: float
  q_star: float
  sigma_w: float
  sigma_b: float
  depth: int
  weights: str


def jacobian_spectrum_moments(activation, depth: int, *, weights: str = "orthogonal",
                              q_star: float | None = None, sigma_w: float | None = None,
                              sigma_b: float | None = None, **quad) -> JacobianMoments:
  r"""Mean and variance of the spectrum of ``JJᵀ`` for ``L`` random layers (free probability).

  With ``μ_k = E_h[φ'(√q* h)^{2k}]`` and ``χ = σ_w² μ_1`` (module
  docstring, Pennington, Schoenholz & Ganguli 2017)::

      m_1      = χ^L,
      σ²_{JJᵀ} = m_1² · L · (μ_2/μ_1² − 1 + [1 if Gaussian else 0]),

  i.e. at criticality, for piecewise-linear ``φ`` with ``p = p(q*)``:
  ``σ² = L(1/p − 1)`` (orthogonal) and ``σ² = L/p`` (Gaussian). Valid for
  wide (``N ≫ L``) square layers with pre-activations at ``q*``.

  Which scales are used:

  * ``q_star`` alone: the critical point with that fixed point
    (:func:`~orthojax.nn.initializers.critical_point`, ``χ = 1``);
  * ``sigma_w`` (and ``sigma_b``, default 0): those scales, with ``q*`` their
    fixed point (:func:`~orthojax.nn.initializers.q_star`) unless ``q_star``
    is also given (then ``D`` is evaluated at that variance, e.g. for
    ReLU/linear networks where every ``q`` is a fixed point).

  Not traceable: numpy float64.

  Args:
    activation: a name, a callable, or a pair ``(φ, φ')``.
    depth: ``L ≥ 1``.
    weights: ``"orthogonal"`` or ``"gaussian"``.
    q_star, sigma_w, sigma_b: see above.
    **quad: options of :func:`~orthojax.nn.initializers.gaussian_expectation`.

  Returns:
    A :class:`JacobianMoments`.

  Raises:
    ValueError: unknown ``weights``, ``depth < 1``, neither ``q_star`` nor
      ``sigma_w``, ``sigma_b`` without ``sigma_w``, or ``μ_1 = 0``.

  References:
    Pennington, Schoenholz & Ganguli, NeurIPS 2017, eq. (13)–(17) and Table 1.
  """
  who = "jacobian_spectrum_moments"
  check_choice(weights, CRITICAL_INITS, "weights", where=who)
  if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
    raise ValueError(f"{who}: depth must be an int >= 1, got {depth!r}")
  act = resolve_activation(activation)
  if sigma_w is None:
    if sigma_b is not None:
      raise ValueError(f"{who}: sigma_b needs sigma_w (or give q_star alone for the critical "
                       "point)")
    if q_star is None:
      raise ValueError(f"{who}: give q_star (critical point) or sigma_w (and sigma_b)")
    sigma_w, sigma_b = critical_point(act, q_star, **quad)
  else:
    sigma_b = 0.0 if sigma_b is None else float(sigma_b)
    if q_star is None:
      q_star = fixed_point(sigma_w, sigma_b, act, **quad)
  q = float(q_star)
  if not math.isfinite(q) or q < 0:
    raise ValueError(f"{who}: q_star must be finite and >= 0, got {q_star}")
  mu1 = gaussian_expectation(lambda v: act.dphi(v) ** 2, q, breakpoints=act.kinks, **quad)
  mu2 = gaussian_expectation(lambda v: act.dphi(v) ** 4, q, breakpoints=act.kinks, **quad)
  if not mu1 > 0:
    raise ValueError(f"{who}: E[phi'(sqrt(q*) h)^2] = {mu1}: the Jacobian vanishes")
  chi = float(sigma_w) ** 2 * mu1
  depth = int(depth)
  m1 = chi ** depth
  per_layer = mu2 / mu1 ** 2 - 1.0 + (1.0 if weights == "gaussian" else 0.0)
  variance = m1 * m1 * depth * per_layer
  return JacobianMoments(m1=m1, m2=variance + m1 * m1, variance=variance, chi=chi, mu1=mu1,
                         mu2=mu2, q_star=q, sigma_w=float(sigma_w), sigma_b=float(sigma_b),
                         depth=depth, weights=weights)
