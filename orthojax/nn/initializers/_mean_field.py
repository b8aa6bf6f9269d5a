"""Mean-field signal propagation in wide random networks: q-map, χ, criticality.

For a fully connected network ``h^{l+1} = W^{l+1} φ(h^l) + b^{l+1}`` with
``W_ij ~ N(0, σ_w²/N)`` (or ``σ_w`` times a Haar orthogonal matrix) and
``b_i ~ N(0, σ_b²)``, the pre-activations of a wide layer are Gaussian with
variance ``q^l`` following the *q-map* (Poole et al. 2016; Schoenholz et al.
2017)::

    q^{l+1} = σ_w² E_h[φ(√q^l h)²] + σ_b²,        h ~ N(0, 1),

whose stable fixed point is ``q*``. A perturbation (and a back-propagated
gradient) is multiplied per layer, in mean square, by::

    χ(q*) = σ_w² E_h[φ'(√q* h)²],

so the mean squared singular value of the input-output Jacobian of ``L``
layers is ``χ^L``: ``χ < 1`` is the ordered phase (vanishing gradients),
``χ > 1`` the chaotic phase (exploding), ``χ = 1`` the *critical* line
(Schoenholz et al. 2017). Given ``(φ, q*)`` the two conditions ``χ(q*) = 1``
and ``q* = q_map(q*)`` fix the parameters (Pennington, Schoenholz & Ganguli
2017)::

    σ_w² = 1 / E_h[φ'(√q* h)²],      σ_b² = q* − σ_w² E_h[φ(√q* h)²].

All functions here are plain numpy float64 computations meant to run once, at
initialisation time, on Python scalars: they are not traceable by jax and
must not be called under ``jax.jit``. A user-supplied activation may be a jax
function; it is evaluated (and differentiated with ``jax.grad``) eagerly in
float64 under ``jax.enable_x64``.

Gaussian expectations use adaptive composite Gauss–Legendre quadrature on
``h ∈ [−12, 12]`` (the discarded tails weigh ``2Φ(−12) ≈ 4·10⁻³³``), with
panel edges at the activation's kinks (ReLU at 0, hard-tanh at ±1), so
non-smooth activations converge as fast as smooth ones; Gauss–Hermite with a
fixed number of nodes is available as ``method="hermite"`` for smooth
integrands.

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
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orthojax.nn._activations import ACTIVATIONS
from orthojax.nn._checks import check_choice

ArrayFn = Callable[[np.ndarray], np.ndarray]

# Half-width of the integration range in units of the standard deviation.
_H_MAX = 12.0
# Gauss–Legendre rule used on every panel.
_GL_X, _GL_W = np.polynomial.legendre.leggauss(20)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ------------------------------------------------------------------------------
# Activations
# ------------------------------------------------------------------------------


class Activation(NamedTuple):
  """An activation ``φ`` prepared for the mean-field functions.

  Attributes:
    name: a label for messages.
    phi: ``φ``, vectorised, float64 numpy in and out.
    dphi: ``φ'``, vectorised, float64 numpy in and out.
    kinks: pre-activation points where ``φ`` or ``φ'`` is not smooth; the
      quadrature puts panel edges there.
  """

  name: str
  phi: ArrayFn
  dphi: ArrayFn
  kinks: tuple[float, ...] = ()


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _tanh_prime(x):
  a = np.exp(-2.0 * np.abs(x))  # sech²x = 4a/(1+a)², no overflow
  return 4.0 * a / (1.0 + a) ** 2


def _erf_prime(x):
  return (2.0 / math.sqrt(math.pi)) * np.exp(-x * x)


def _identity_form(name: str) -> Activation:
  return Activation(name, lambda x: x, np.ones_like)


# Exact float64 forms (φ, φ', kinks) of the registry names where quadrature
# should not go through jax; the other names of ACTIVATIONS are differentiated
# with jax.grad like a user's callable (every identity name, None there, is here).
_CLOSED_FORMS = {
    "tanh": Activation("tanh", np.tanh, _tanh_prime),
    "hard_tanh": Activation(
        "hard_tanh", lambda x: np.clip(x, -1.0, 1.0),
        lambda x: (np.abs(x) < 1.0).astype(np.float64), (-1.0, 1.0)),
    "erf": Activation("erf", _erf, _erf_prime),
    "relu": Activation(
        "relu", lambda x: np.maximum(x, 0.0), lambda x: (x > 0.0).astype(np.float64), (0.0,)),
    "linear": _identity_form("linear"),
    "identity": _identity_form("identity"),
}


def _eager_float64(fn: Callable[[Any], Any], what: str) -> ArrayFn:
  """``fn`` evaluated eagerly on float64 numpy input, result as float64 numpy."""

  def wrapped(x):
    x = np.asarray(x, dtype=np.float64)
    with jax.enable_x64(True):
      y = np.asarray(fn(x))
    if y.shape != x.shape:
      raise ValueError(
          f"{what} must be elementwise: input of shape {x.shape} gave output of shape {y.shape}")
    return y

  return wrapped


def _grad_float64(fn: Callable[[Any], Any]) -> ArrayFn:
  """``φ'`` of a jax-traceable scalar function ``fn``, vectorised, in float64."""
  dfn = jax.vmap(jax.grad(lambda x: jnp.asarray(fn(x), dtype=jnp.float64)))

  def wrapped(x):
    x = np.asarray(x, dtype=np.float64)
    with jax.enable_x64(True):
      try:
        y = dfn(jnp.asarray(x.reshape(-1)))
      except Exception as e:  # noqa: BLE001 - re-raised with advice
        raise ValueError(
            "could not differentiate the activation with jax.grad "
            f"({type(e).__name__}: {e}); write it with jax.numpy, or pass an "
            "explicit pair (phi, phi_prime)") from e
    return np.asarray(y, dtype=np.float64).reshape(x.shape)

  return wrapped


def resolve_activation(activation: str | Callable | Sequence[Callable] | Activation) -> Activation:
  """Turn an activation specification into an :class:`Activation`.

  Args:
    activation: a name in :data:`orthojax.nn.ACTIVATIONS` (``"tanh"``,
      ``"hard_tanh"``, ``"erf"``, ``"relu"`` and ``"linear"``/``"identity"``
      use exact float64 forms, the others their jax function); a callable
      ``φ`` (elementwise, jax-traceable: ``φ'`` is taken with ``jax.grad``);
      a pair ``(φ, φ')`` of elementwise callables (any numpy or jax code); or
      an :class:`Activation`.

  Raises:
    ValueError: for an unknown name, listing the known ones.
    TypeError: for anything else.
  """
  if isinstance(activation, Activation):
    return activation
  if isinstance(activation, str):
    if activation in _CLOSED_FORMS:
      return _CLOSED_FORMS[activation]
    fn = ACTIVATIONS[check_choice(activation, tuple(ACTIVATIONS), "activation",
                                  also="a callable phi or a pair (phi, phi_prime)")]
    return Activation(activation, _eager_float64(fn, "phi"), _grad_float64(fn))
  is_pair = isinstance(activation, (tuple, list)) and len(activation) == 2
  if is_pair and all(map(callable, activation)):
    phi, dphi = activation
    name = getattr(phi, "__name__", "activation")
    return Activation(name, _eager_float64(phi, "phi"), _eager_float64(dphi, "phi_prime"))
  if callable(activation):
    name = getattr(activation, "__name__", "activation")
    return Activation(name, _eager_float64(activation, "phi"), _grad_float64(activation))
  raise TypeError(
      f"activation must be a name ({', '.join(ACTIVATIONS)}), a callable or a pair "
      f"(phi, phi_prime); got {activation!r}")


# ------------------------------------------------------------------------------
# Gaussian expectations
# ------------------------------------------------------------------------------


def _panel_nodes(lo: np.ndarray, hi: np.ndarray):
  mid = 0.5 * (lo + hi)
  half = 0.5 * (hi - lo)
  return mid[:, None] + half[:, None] * _GL_X, half[:, None] * _GL_W


def _adaptive_gauss_legendre(g: ArrayFn, edges: np.ndarray, rtol: float, max_levels: int) -> float:
  """∫ g over [edges[0], edges[-1]] by adaptive composite Gauss–Legendre.

  Every active panel is integrated whole and as two halves; a panel is
  accepted when the two estimates agree to its share of the error budget
  ``rtol · ∫|g|`` (or to the floating-point noise of ``g``), otherwise it is
  split. All panels of one level are evaluated in one vectorised call.
  """
  lo, hi = edges[:-1], edges[1:]
  span = edges[-1] - edges[0]
  total, total_err, scale = 0.0, 0.0, None
  for level in range(max_levels):
    mid = 0.5 * (lo + hi)
    x_whole, w_whole = _panel_nodes(lo, hi)
    x_left, w_left = _panel_nodes(lo, mid)
    x_right, w_right = _panel_nodes(mid, hi)
    x = np.concatenate([x_whole, x_left, x_right])
    raw = np.asarray(g(x))
    floating = np.issubdtype(raw.dtype, np.floating)
    eps = np.finfo(raw.dtype if floating else np.float64).eps
    v = raw.astype(np.float64)
    if not np.all(np.isfinite(v)):
      raise FloatingPointError("the integrand is not finite on the integration range")
    p = lo.shape[0]
    whole = np.sum(w_whole * v[:p], axis=1)
    left, right = v[p:2 * p], v[2 * p:]
    fine = np.sum(w_left * left, axis=1) + np.sum(w_right * right, axis=1)
    fine_abs = np.sum(w_left * np.abs(left), axis=1) + np.sum(w_right * np.abs(right), axis=1)
    err = np.abs(whole - fine)
    if scale is None:
      scale = max(float(np.sum(fine_abs)), np.finfo(np.float64).tiny)
    budget = rtol * scale
    noise = 64.0 * eps * fine_abs
    width = hi - lo
    too_narrow = width <= 64.0 * np.finfo(np.float64).eps * np.maximum(np.abs(lo), np.abs(hi))
    done = (err <= np.maximum(budget * width / span, noise)) | too_narrow
    if total_err + float(np.sum(err)) <= budget or level == max_levels - 1:
      done[:] = True
    total += float(np.sum(fine[done]))
    total_err += float(np.sum(err[done]))
    if np.all(done):
      break
    keep = ~done
    lo, mid, hi = lo[keep], mid[keep], hi[keep]
    lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
  return total


def gaussian_expectation(
    f: ArrayFn,
    q: float,
    *,
    breakpoints: Sequence[float] = (),
    method: str = "adaptive",
    rtol: float = 1e-12,
    order: int = 200,
    max_levels: int = 60,
) -> float:
  r"""``E_{h~N(0,1)}[f(√q h)] = ∫ f(x) exp(−x²/2q) dx / √(2πq)`` by quadrature.

  Not traceable: a numpy float64 computation for initialisation time.

  Args:
    f: an elementwise, vectorised function of a float64 numpy array.
    q: the variance of the Gaussian, ``q ≥ 0`` (``q = 0`` gives ``f(0)``).
    breakpoints: points ``x`` where ``f`` is not smooth (kinks, jumps); the
      adaptive rule puts panel edges at ``x/√q``.
    method: ``"adaptive"`` (default): composite Gauss–Legendre on
      ``h ∈ [−12, 12]``, panels split until the error estimate is below
      ``rtol · E|f|``; ``"hermite"``: Gauss–Hermite with ``order`` nodes
      (``numpy.polynomial.hermite_e.hermegauss``), spectrally accurate for
      entire ``f`` but slow to converge at kinks or near complex poles (e.g.
      ``tanh`` at large ``q``).
    rtol: target error relative to ``E|f(√q h)|`` (adaptive method).
    order: number of Gauss–Hermite nodes (hermite method).
    max_levels: cap on the number of bisection levels (adaptive method).

  Returns:
    The expectation as a Python float.
  """
  q = float(q)
  if not math.isfinite(q) or q < 0.0:
    raise ValueError(f"the variance q must be finite and >= 0, got {q}")
  if q == 0.0:
    return float(np.asarray(f(np.zeros(1)), dtype=np.float64)[0])
  sq = math.sqrt(q)
  if method == "hermite":
    x, w = np.polynomial.hermite_e.hermegauss(order)
    return float(np.sum(w * np.asarray(f(sq * x), dtype=np.float64)) * _INV_SQRT_2PI)
  if method != "adaptive":
    raise ValueError(f"method must be 'adaptive' or 'hermite', got {method!r}")
  cuts = [float(b) / sq for b in breakpoints]
  cuts = [c for c in cuts if -_H_MAX < c < _H_MAX]
  edges = np.unique(np.concatenate([np.linspace(-_H_MAX, _H_MAX, 13), cuts]))

  def integrand(h):
    y = np.asarray(f(sq * h))
    weight = _INV_SQRT_2PI * np.exp(-0.5 * h * h)
    if np.issubdtype(y.dtype, np.floating) and y.dtype != np.float64:
      # keep f's own precision visible to the noise floor
      return (y.astype(np.float64) * weight).astype(y.dtype)
    return y * weight

  return _adaptive_gauss_legendre(integrand, edges, rtol, max_levels)


def _squared(fn: ArrayFn) -> ArrayFn:
  return lambda x: np.square(fn(x))


def _expect_phi2(act: Activation, q: float, **quad) -> float:
  return gaussian_expectation(_squared(act.phi), q, breakpoints=act.kinks, **quad)


def _expect_dphi2(act: Activation, q: float, **quad) -> float:
  return gaussian_expectation(_squared(act.dphi), q, breakpoints=act.kinks, **quad)


def _vectorize_q(fn: Callable[[float], float], q):
  if np.ndim(q) == 0:
    return fn(float(q))
  q = np.asarray(q, dtype=np.float64)
  return np.reshape(np.array([fn(float(v)) for v in q.reshape(-1)]), q.shape)


# ------------------------------------------------------------------------------
# q-map, χ, fixed point
# ------------------------------------------------------------------------------


def q_map(q, sigma_w: float, sigma_b: float, activation, **quad):
  r"""The length map ``q ↦ σ_w² E_h[φ(√q h)²] + σ_b²`` (Poole et al. 2016).

  Args:
    q: pre-activation variance(s), scalar or array.
    sigma_w: weight scale (weights ``N(0, σ_w²/fan_in)``).
    sigma_b: bias standard deviation.
    activation: see :func:`resolve_activation`.
    **quad: options of :func:`gaussian_expectation`.

  Returns:
    A float, or a float64 array shaped like ``q``.
  """
  act = resolve_activation(activation)
  sw2, sb2 = float(sigma_w) ** 2, float(sigma_b) ** 2
  return _vectorize_q(lambda v: sw2 * _expect_phi2(act, v, **quad) + sb2, q)


def chi(q, sigma_w: float, activation, **quad):
  r"""``χ(q) = σ_w² E_h[φ'(√q h)²]``, the per-layer mean squared Jacobian gain.

  ``χ(q*) = 1`` is criticality (Schoenholz et al. 2017); for a linear network
  ``χ = σ_w²`` for every ``q``.

  Args:
    q: pre-activation variance(s), scalar or array (normally ``q*``).
    sigma_w: weight scale.
    activation: see :func:`resolve_activation`.
    **quad: options of :func:`gaussian_expectation`.
  """
  act = resolve_activation(activation)
  sw2 = float(sigma_w) ** 2
  return _vectorize_q(lambda v: sw2 * _expect_dphi2(act, v, **quad), q)


def _illinois(fn: Callable[[float], float], a: float, b: float, fa: float, fb: float,
              xtol: float, rtol: float, max_iter: int = 200) -> float:
  """A root of ``fn`` in the bracket ``[a, b]`` (``fa·fb ≤ 0``): Illinois regula falsi.

  Superlinear, never leaves the bracket; a bisection step is forced when the
  bracket stops shrinking by half every few steps.
  """
  if fa == 0.0:
    return a
  if fb == 0.0:
    return b
  side = 0
  width = abs(b - a)
  for it in range(max_iter):
    c = (a * fb - b * fa) / (fb - fa)
    if it % 4 == 3 and abs(b - a) > 0.5 * width:
      c = 0.5 * (a + b)
    if it % 4 == 3:
      width = abs(b - a)
    if not (min(a, b) < c < max(a, b)):
      c = 0.5 * (a + b)
    fc = fn(c)
    if fc == 0.0:
      return c
    if (fc > 0) == (fb > 0):
      b, fb = c, fc
      if side == -1:
        fa *= 0.5
      side = -1
    else:
      a, fa = c, fc
      if side == 1:
        fb *= 0.5
      side = 1
    if abs(b - a) <= xtol + rtol * abs(c):
      return c
  return c


def q_star(
    sigma_w: float,
    sigma_b: float,
    activation,
    *,
    q0: float = 1.0,
    rtol: float = 1e-12,
    max_iter: int = 100,
    q_max: float = 1e12,
    **quad,
) -> float:
  r"""The fixed point ``q* = q_map(q*)`` reached by iterating the q-map from ``q0``.

  Iterates ``q ← σ_w² E[φ(√q h)²] + σ_b²`` (the depth recursion itself, so
  the stable fixed point is found); when that has not converged after
  ``max_iter`` steps (near criticality the map's slope tends to 1), the root
  of ``q_map(q) − q`` is bracketed in the direction the iteration moves and
  polished with regula falsi.

  Args:
    sigma_w: weight scale.
    sigma_b: bias standard deviation.
    activation: see :func:`resolve_activation`.
    q0: starting variance (matters only where every ``q`` is fixed, e.g. a
      linear network with ``σ_w = 1, σ_b = 0`` or ReLU with ``σ_w² = 2``).
    rtol: relative tolerance on ``q*``.
    max_iter: fixed-point iterations before switching to root finding.
    q_max: a fixed point beyond this counts as none.
    **quad: options of :func:`gaussian_expectation`.

  Raises:
    ValueError: when ``q`` grows without bound (no finite fixed point, e.g.
      ``σ_w ≥ 1`` with ``σ_b > 0`` for a linear network, ``σ_w² ≥ 2`` with
      ``σ_b > 0`` for ReLU).
  """
  act = resolve_activation(activation)
  sw2, sb2 = float(sigma_w) ** 2, float(sigma_b) ** 2

  def qmap(v):
    return sw2 * _expect_phi2(act, v, **quad) + sb2

  def residual(v):
    return qmap(v) - v

  q = float(q0)
  if not math.isfinite(q) or q < 0.0:
    raise ValueError(f"q0 must be finite and >= 0, got {q0}")
  for _ in range(max_iter):
    q_next = qmap(q)
    if not math.isfinite(q_next) or q_next > q_max:
      break
    if abs(q_next - q) <= rtol * max(q_next, np.finfo(np.float64).tiny):
      return q_next
    q = q_next

  no_fixed_point = ValueError(
      f"the q-map of {act.name} with sigma_w={sigma_w}, sigma_b={sigma_b} has no finite fixed "
      f"point (q grows past {q_max:g}); e.g. a linear network needs sigma_w < 1 and ReLU "
      "sigma_w**2 < 2 when sigma_b > 0")
  if not math.isfinite(q) or q > q_max:
    raise no_fixed_point
  fq = residual(q)
  if fq == 0.0:
    return q
  if fq > 0.0:  # q increases: look upwards for residual <= 0
    lo, flo = q, fq
    hi = max(2.0 * q, np.finfo(np.float64).tiny)
    fhi = residual(hi)
    while fhi > 0.0:
      lo, flo = hi, fhi
      hi *= 2.0
      if hi > q_max:
        raise no_fixed_point
      fhi = residual(hi)
  else:  # q decreases: look downwards for residual >= 0 (residual(0) = q_map(0) >= 0)
    hi, fhi = q, fq
    lo = 0.5 * q
    flo = residual(lo)
    for _ in range(200):
      if flo >= 0.0:
        break
      hi, fhi = lo, flo
      lo *= 0.5
      flo = residual(lo)
    else:
      lo, flo = 0.0, residual(0.0)
  return _illinois(residual, lo, hi, flo, fhi, xtol=0.0, rtol=rtol)


# ------------------------------------------------------------------------------
# Criticality
# ------------------------------------------------------------------------------

# |σ_b²| below this fraction of q* is quadrature round-off, taken as 0.
_SB2_RTOL = 1e-10


def critical_point(activation, q_star: float, **quad) -> tuple[float, float]:
  r"""``(σ_w, σ_b)`` with fixed point ``q*`` *and* ``χ(q*) = 1``.

  Solves ``χ(q*) = 1`` and ``q* = q_map(q*)`` simultaneously (Pennington,
  Schoenholz & Ganguli 2017, §4)::

      σ_w² = 1 / E_h[φ'(√q* h)²],
      σ_b² = q* − σ_w² E_h[φ(√q* h)²].

  For tanh every ``q* > 0`` has a critical point, with ``σ_w → 1`` and
  ``σ_b² = O(q*³)`` as ``q* → 0`` (the near-linear, near-isometric regime).
  For positively homogeneous activations (ReLU, linear) ``σ_w² E[φ²] = q*``
  exactly, so ``σ_b = 0`` for every ``q*`` (ReLU: ``σ_w = √2``; linear:
  ``σ_w = 1``): their critical points all have zero bias, and every ``q`` is
  then a fixed point. ``|σ_b²| ≤ 1e-10 q*`` is taken as 0.

  Not traceable: a numpy float64 computation for initialisation time.

  Args:
    activation: see :func:`resolve_activation`.
    q_star: the desired fixed-point pre-activation variance, ``> 0``.
    **quad: options of :func:`gaussian_expectation`.

  Returns:
    ``(sigma_w, sigma_b)`` as Python floats.

  Raises:
    ValueError: when ``σ_b² < 0`` beyond round-off, i.e. no critical point
      has this ``q*`` (activations with ``φ(0) ≠ 0`` at small ``q*``, e.g.
      sigmoid or softplus), or when ``E[φ'²] = 0``.
  """
  act = resolve_activation(activation)
  q = float(q_star)
  if not math.isfinite(q) or q <= 0.0:
    raise ValueError(f"q_star must be finite and > 0, got {q_star}")
  e_dphi2 = _expect_dphi2(act, q, **quad)
  if not e_dphi2 > 0.0:
    raise ValueError(
        f"E[phi'(sqrt(q*) h)^2] = {e_dphi2} for {act.name} at q*={q}: no sigma_w makes chi = 1")
  sw2 = 1.0 / e_dphi2
  mapped = sw2 * _expect_phi2(act, q, **quad)
  sb2 = q - mapped
  if abs(sb2) <= _SB2_RTOL * q:
    sb2 = 0.0
  if sb2 < 0.0:
    raise ValueError(
        f"{act.name} has no critical point with q*={q}: chi = 1 needs sigma_w^2 = {sw2:.6g}, "
        f"which alone maps q* to sigma_w^2 E[phi^2] = {mapped:.6g} > q*, so sigma_b^2 would be "
        f"{sb2:.3g} < 0. (Positively homogeneous activations such as ReLU and linear give "
        "sigma_b^2 = q* - q* = 0 exactly: their only critical points have sigma_b = 0.) "
        "Try another q*.")
  return math.sqrt(sw2), math.sqrt(sb2)


def critical_line(
    activation,
    sigma_b_values,
    *,
    return_q_star: bool = False,
    q_range: tuple[float, float] = (1e-10, 1e6),
    rtol: float = 1e-11,
    **quad,
):
  r"""``σ_w`` on the critical line ``χ(q*(σ_w, σ_b)) = 1`` at each given ``σ_b``.

  The critical line is traced through its parametrisation by ``q*``
  (Schoenholz et al. 2017; Pennington et al. 2017): ``q ↦ (σ_w(q), σ_b(q))``
  of :func:`critical_point`. For each ``σ_b`` the ``q*`` with
  ``σ_b(q*)² = σ_b²`` is bracketed on a log grid over ``q_range`` and
  polished with regula falsi. ``σ_b = 0`` for activations whose critical
  ``σ_b(q)`` only reaches 0 as ``q → 0`` (tanh, erf, hard-tanh) gives the
  limit ``σ_w = 1/|φ'(0)|`` with ``q* = 0``.

  Args:
    activation: see :func:`resolve_activation`.
    sigma_b_values: scalar or array of bias scales ``σ_b ≥ 0``.
    return_q_star: also return the ``q*`` of each point.
    q_range: the ``q*`` interval searched.
    rtol: relative tolerance on ``q*``.
    **quad: options of :func:`gaussian_expectation`.

  Returns:
    ``sigma_w`` (float or array shaped like ``sigma_b_values``), and ``q*``
    of the same shape if ``return_q_star``.

  Raises:
    ValueError: when no ``q*`` in ``q_range`` has that ``σ_b``. ReLU and
      linear networks are critical only at ``σ_b = 0`` (``σ_w = √2``, resp.
      ``1``): with ``σ_b > 0`` and that ``σ_w``, q grows without bound.
  """
  act = resolve_activation(activation)
  cache: dict[float, tuple[float, float]] = {}

  def point(q: float) -> tuple[float, float]:
    """(σ_w², σ_b²) of the critical point with fixed point q (memoised)."""
    if q not in cache:
      sw2 = 1.0 / _expect_dphi2(act, q, **quad)
      cache[q] = (sw2, q - sw2 * _expect_phi2(act, q, **quad))
    return cache[q]

  grid = np.geomspace(q_range[0], q_range[1], 33)
  sb2_grid = np.array([point(float(q))[1] for q in grid])
  zero_bias = np.abs(sb2_grid) <= _SB2_RTOL * grid
  sw_small_q = math.sqrt(point(float(grid[0]))[0])

  def solve(s: float) -> tuple[float, float]:
    if not math.isfinite(s) or s < 0:
      raise ValueError(f"sigma_b must be finite and >= 0, got {s}")
    s2 = s * s
    if s2 == 0.0 and zero_bias[0]:
      return sw_small_q, 0.0  # the q* -> 0 end of the line
    if np.all(zero_bias):
      raise ValueError(
          f"{act.name} is critical only at sigma_b = 0 (sigma_w = {sw_small_q:.6g}, every q "
          "then a fixed point), like ReLU and linear networks: sigma_b^2(q*) = 0 for all q*, "
          f"so there is no critical point with sigma_b = {s}")
    vals = sb2_grid - s2
    sign_change = np.nonzero(np.sign(vals[:-1]) * np.sign(vals[1:]) <= 0)[0]
    if sign_change.size == 0:
      raise ValueError(
          f"{act.name} has no critical point with sigma_b = {s} for q* in {q_range}: "
          f"critical sigma_b^2 ranges over [{sb2_grid.min():.3g}, {sb2_grid.max():.3g}] there")
    i = int(sign_change[0])
    residual = lambda logq: point(math.exp(logq))[1] - s2
    logq = _illinois(residual, math.log(grid[i]), math.log(grid[i + 1]), vals[i], vals[i + 1],
                     xtol=rtol, rtol=0.0)
    q = math.exp(logq)
    return math.sqrt(point(q)[0]), q

  if np.ndim(sigma_b_values) == 0:
    sw, qs = solve(float(sigma_b_values))
    return (sw, qs) if return_q_star else sw
  sb = np.asarray(sigma_b_values, dtype=np.float64)
  out = [solve(float(s)) for s in sb.reshape(-1)]
  sw = np.array([o[0] for o in out]).reshape(sb.shape)
  qs = np.array([o[1] for o in out]).reshape(sb.shape)
  return (sw, qs) if return_q_star else sw
