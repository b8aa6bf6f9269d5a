r"""Characteristic points of ReLU units, and a training hook that tracks them.

A ReLU unit with pre-activation ``s(x) = w_effᵀx + b_eff`` is inactive on one
side of its *characteristic activation boundary* ``B = {x : s(x) = 0}`` (a
hyperplane of ``R^n``; a point on the real line). Its *characteristic point*
is the point of ``B`` nearest the origin, the foot of the perpendicular
(GmP paper, Definition 2, eq. 8)::

    φ = −b_eff · w_eff / ‖w_eff‖²  = −λ u,   λ = b_eff / ‖w_eff‖,  u = w_eff / ‖w_eff‖

with ``u`` the unit normal of ``B`` pointing into the active side
(eq. 9). Per parameterization (:class:`orthojax.models.MLP`'s variants):

* GmP ``z = r·ReLU(u(θ)ᵀx + λ)``: ``φ = −λ·u(θ)`` directly (eq. 9), with
  ``u(θ)`` the hyperspherical direction of eq. 10
  (:func:`orthojax.nn.angles_to_direction`); ``r`` only scales the output.
  With one input (``S⁰ = {±1}``) the direction is the layer's fixed sign.
* SP: ``w_eff = w``, ``b_eff = b``; in 1-D the kink ``x = −b/w``.
* WN: ``w_eff = g·v/sqrt(‖v‖² + ε)`` (:class:`orthojax.nn.WeightNormDense`),
  ``b_eff = b``.
* BN in training mode, ``γ(xᵀw − μ)/s + β`` with the batch mean
  ``μ = mᵀw`` and standard deviation ``s = sqrt(wᵀΣw + ε)`` of ``xᵀw``
  (``m``, ``Σ`` the mean and biased covariance of the inputs):
  ``w_eff = γw/s``, ``b_eff = β − γμ/s``, i.e.
  ``φ = (mᵀw − β·s/γ)·w/‖w‖²``. The running averages of eval mode are not
  what a gradient step acts on and are not used.

Everything is computed in float64 on the host: in numpy, and the directions
of GmP by :func:`~orthojax.nn.angles_to_direction` under ``jax.enable_x64``
on the CPU device. For one angle (2-D inputs) that direction is bit-identical
to a numpy ``cos``/``sin``; for more it differs from a numpy cumulative
product of sines by at most one float64 rounding unit of 1 (≤ 2.3e-16
absolutely), since it accumulates ``log|sin θ|`` in a sum.

:class:`CharacteristicPointTracker` is a training hook
``hook(step, model) -> {"max_dphi", "max_dangle_deg"}`` that keeps the whole
trajectory and logs, per step, ``max_i ‖φ_{i,t} − φ_{i,t−1}‖`` (GmP Fig. 2c)
and the largest change of a unit's direction in degrees,
``max_i arccos(u_{i,t}ᵀu_{i,t−1})`` (Fig. 3i).

References:
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP): §3.3, Definition 2,
  eq. 8–10; §3.5 and Figures 2 and 3 (the per-step changes).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orthojax.nn import angles_to_direction

VARIANTS = ("sp", "wn", "bn", "gmp")


def _host_device() -> Any:
  """The first CPU device, or None where the CPU backend is not loaded."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:
    return None


def _direction_float64(theta: np.ndarray) -> np.ndarray:
  """``u(θ)`` of eq. 10 in float64: :func:`angles_to_direction` under ``jax.enable_x64``,
  on the CPU (the same numbers whatever accelerator trains the model; float64 is not
  native everywhere)."""
  with jax.enable_x64(True), jax.default_device(_host_device()):
    u = angles_to_direction(jnp.asarray(theta, jnp.float64), axis=-1)
    return np.asarray(u, np.float64)


def characteristic_points(variant: str, hidden: dict[str, Any], *, sign: Any = None,
                          x_mean: Any = None, x_cov: Any = None, bn_epsilon: float = 1e-3,
                          wn_epsilon: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
  r"""Characteristic points ``φ`` and unit directions ``u`` of a hidden ReLU layer.

  ``φ_i = −b_i·w_i/‖w_i‖² = −λ_i u_i`` (GmP paper, eq. 8–9) for each unit's
  effective pre-activation ``w_iᵀx + b_i`` (SP, WN, BN in training mode;
  the module docstring gives each), and ``φ_i = −λ_i u(θ_i)`` with the
  hyperspherical direction of eq. 10 for GmP. ``φ_i`` lies on the unit's
  activation boundary and is parallel to ``u_i``, which points into the
  active side.

  Args:
    variant: ``"sp"``, ``"wn"``, ``"bn"`` or ``"gmp"`` (the variants of
      :class:`orthojax.models.MLP`).
    hidden: the hidden unit's parameters as a pure dict (the
      ``nnx.to_pure_dict`` of its ``nnx.Param`` state, e.g.
      ``params["hidden"]`` of an MLP): ``{"layer": {...}}`` with
      ``kernel``/``bias`` (SP), ``kernel``/``scale``/``bias`` (WN), ``kernel``
      (BN), ``theta``/``lam`` (GmP; no ``theta`` with one input), plus
      ``{"norm": {"scale", "bias"}}`` (γ, β) for BN.
    sign: GmP with one input: the fixed direction ``(units,)`` of ±1 (the
      layer's non-trainable ``sign`` variable).
    x_mean, x_cov: BN: mean ``(dim,)`` and biased covariance ``(dim, dim)``
      of the inputs (the batch statistics BN normalizes with).
    bn_epsilon: BN's ε (:class:`orthojax.models.MLP`'s default 1e-3).
    wn_epsilon: WN's ε, added to ``‖v‖²`` (:class:`orthojax.nn.WeightNormDense`'s 1e-12).

  Returns:
    ``(phi, direction)``, both float64 ``(units, dim)``; ``direction`` has
    unit rows (NaN for a unit whose effective weight is zero).

  Raises:
    ValueError: unknown ``variant``; BN without ``x_mean``/``x_cov``; GmP
      with one input without ``sign``.

  References:
    Chen & Ge (GmP), Definition 2 and eq. 8–10.
  """
  layer = {k: np.asarray(v, np.float64) for k, v in hidden["layer"].items()}
  if variant == "gmp":
    lam = layer["lam"]
    if "theta" in layer:
      u = _direction_float64(layer["theta"])
    else:
      if sign is None:
        raise ValueError("characteristic_points: GmP with one input needs its fixed sign")
      u = np.asarray(sign, np.float64).reshape(-1, 1)
    return -lam[:, None] * u, u
  if variant not in VARIANTS:
    raise ValueError(f"characteristic_points: unknown variant {variant!r}; valid: "
                     f"{list(VARIANTS)}")
  kernel = layer["kernel"]                          # (dim, units)
  if variant == "sp":
    w, b = kernel, layer["bias"]
  elif variant == "wn":
    norm = np.sqrt(np.sum(kernel ** 2, axis=0) + wn_epsilon)
    w, b = kernel * (layer["scale"] / norm), layer["bias"]
  else:   # bn
    if x_mean is None or x_cov is None:
      raise ValueError("characteristic_points: BN needs the input mean and covariance "
                       "(x_mean, x_cov)")
    gamma = np.asarray(hidden["norm"]["scale"], np.float64)
    beta = np.asarray(hidden["norm"]["bias"], np.float64)
    x_mean = np.atleast_1d(np.asarray(x_mean, np.float64))
    x_cov = np.atleast_2d(np.asarray(x_cov, np.float64))
    mu = x_mean @ kernel
    s = np.sqrt(np.einsum("iu,ij,ju->u", kernel, x_cov, kernel) + bn_epsilon)
    w, b = kernel * (gamma / s), beta - gamma * mu / s
  w = w.T                                            # (units, dim)
  sq = np.sum(w ** 2, axis=1)
  with np.errstate(divide="ignore", invalid="ignore"):
    phi = -(b / sq)[:, None] * w
    direction = w / np.sqrt(sq)[:, None]
  return phi, direction


def _angle_deg(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Angle between corresponding unit rows of ``a`` and ``b``, in degrees (0..180)."""
  return np.degrees(np.arccos(np.clip(np.sum(a * b, axis=1), -1.0, 1.0)))


def _selector(hidden: str | Sequence[str | int] | Callable[[Any], Any]
              ) -> Callable[[Any], Any]:
  """``model -> hidden unit`` from a callable, a path ``"model.hidden"`` or its parts."""
  if callable(hidden):
    return hidden
  parts = [p for p in re.split(r"[./]", hidden) if p] if isinstance(hidden, str) else list(hidden)
  if not parts:
    raise ValueError(f"CharacteristicPointTracker: empty hidden path {hidden!r}")

  def select(model):
    node = model
    for part in parts:
      if isinstance(part, int) or (isinstance(part, str) and part.isdigit()
                                   and not hasattr(node, part)):
        node = node[int(part)]
      else:
        node = getattr(node, part)
    return node

  return select


class CharacteristicPointTracker:
  r"""Training hook: a hidden layer's characteristic points after every call, and their changes.

  ``tracker(step, model) -> {"max_dphi", "max_dangle_deg"}`` reads the hidden
  unit out of the (NNX) model, computes :func:`characteristic_points` and
  returns the largest per-unit change since the previous call,
  ``max_i ‖φ_{i,t} − φ_{i,t−1}‖`` (GmP Fig. 2c), and the largest change of
  a unit's direction in degrees, ``max_i arccos(u_{i,t}ᵀu_{i,t−1})``
  (0..180, Fig. 3i). The whole trajectory stays in memory (``steps``,
  ``phi``, ``direction``, ``max_dphi``, ``max_dangle``; :meth:`arrays`); the
  first point is the constructor's model (``steps[0] = step``).

  The hidden unit is a sub-module of the model, an
  :class:`orthojax.models.Unit` (``MLP.hidden``) or anything with the same
  layout (``layer`` with its parameters, ``norm`` for BN, ``variant``):
  ``hidden`` is its attribute path from the model, ``"hidden"`` for an
  :class:`orthojax.models.MLP` and ``"model.hidden"`` for the MLP inside the
  orthojax trainer's ``Flatten`` wrapper, or a function ``model -> unit``.
  Its ``nnx.Param`` values (``nnx.to_pure_dict(nnx.state(unit, nnx.Param))``,
  fetched to the host) are what :func:`characteristic_points` receives; the
  constants are read from the unit once, here, unless given: ``variant``
  (``unit.variant``), GmP's fixed ``sign`` with one input
  (``unit.layer.sign``), BN's ε (``unit.norm.epsilon``) and WN's ε
  (``unit.layer.epsilon``). BN needs the input statistics ``x_mean`` and
  ``x_cov`` (the training set's, for instance).

  Args:
    model: the model at the start (before the first step).
    hidden: the unit's path in the model (dotted or ``/``-separated string,
      or a sequence of attribute names / integer indices) or a function
      ``model -> unit``.
    variant, sign, x_mean, x_cov, bn_epsilon, wn_epsilon: as in
      :func:`characteristic_points`; None reads them from the unit as above.
    step: the step of the first point.

  Attributes:
    variant: the parameterization.
    steps: the steps of the points (the first is ``step``).
    phi: a float64 ``(units, dim)`` array per point.
    direction: a float64 ``(units, dim)`` array per point.
    max_dphi: ``max_i ‖Δφ_i‖`` per call (one fewer than ``steps``).
    max_dangle: the largest direction change in degrees per call.
    static: the keyword arguments (constants) passed to :func:`characteristic_points`.

  Raises:
    ValueError: an unsupported variant, or what :func:`characteristic_points` raises.
    AttributeError: ``hidden`` does not lead to a sub-module.

  References:
    Chen & Ge (GmP), §3.5, Figures 2c and 3i.
  """

  def __init__(self, model: nnx.Module, hidden: str | Sequence[str | int] | Callable[[Any], Any],
               *, variant: str | None = None, sign: Any = None, x_mean: Any = None,
               x_cov: Any = None, bn_epsilon: float | None = None,
               wn_epsilon: float | None = None, step: int = 0):
    self._select = _selector(hidden)
    unit = self._select(model)
    self.variant = str(getattr(unit, "variant", "")) if variant is None else variant
    if self.variant not in VARIANTS:
      raise ValueError(f"CharacteristicPointTracker: variant {self.variant!r} (pass variant= "
                       f"for a unit without one); valid: {list(VARIANTS)}")
    layer = getattr(unit, "layer", None)
    static: dict[str, Any] = {}
    if self.variant == "gmp" and sign is None and getattr(layer, "theta", None) is None:
      if getattr(layer, "sign", None) is not None:
        sign = np.asarray(jax.device_get(layer.sign[...]))
    if self.variant == "gmp":
      static["sign"] = sign
    if self.variant == "bn":
      if bn_epsilon is None:
        bn_epsilon = float(unit.norm.epsilon)
      static.update(x_mean=x_mean, x_cov=x_cov, bn_epsilon=bn_epsilon)
    if self.variant == "wn":
      static["wn_epsilon"] = float(getattr(layer, "epsilon", 1e-12)) if wn_epsilon is None \
          else wn_epsilon
    self.static = static
    phi, direction = characteristic_points(self.variant, self._params(model), **static)
    self.steps, self.phi, self.direction = [int(step)], [phi], [direction]
    self.max_dphi: list[float] = []
    self.max_dangle: list[float] = []

  def _params(self, model: nnx.Module) -> dict[str, Any]:
    unit = self._select(model)
    return jax.device_get(nnx.to_pure_dict(nnx.state(unit, nnx.Param)))

  def __call__(self, step: int, model: nnx.Module) -> dict[str, float]:
    phi, direction = characteristic_points(self.variant, self._params(model), **self.static)
    with np.errstate(invalid="ignore"):
      dphi = float(np.max(np.linalg.norm(phi - self.phi[-1], axis=1)))
      dangle = float(np.max(_angle_deg(direction, self.direction[-1])))
    self.steps.append(int(step))
    self.phi.append(phi)
    self.direction.append(direction)
    self.max_dphi.append(dphi)
    self.max_dangle.append(dangle)
    return {"max_dphi": dphi, "max_dangle_deg": dangle}

  def arrays(self) -> dict[str, np.ndarray]:
    """The trajectory: ``steps`` (int64), ``phi`` and ``direction`` (float32,
    ``(points, units, dim)``), ``max_dphi`` and ``max_dangle_deg`` (float64, per call)."""
    return {"steps": np.asarray(self.steps, np.int64),
            "phi": np.asarray(self.phi, np.float32),
            "direction": np.asarray(self.direction, np.float32),
            "max_dphi": np.asarray(self.max_dphi, np.float64),
            "max_dangle_deg": np.asarray(self.max_dangle, np.float64)}
