"""characteristic_points and CharacteristicPointTracker: closed forms, the real layers' boundaries.

Independent checks: φ zeroes the pre-activation that the orthojax module's own
forward pass computes (BN with the batch statistics of training mode), φ is
parallel to the direction, and the direction is the normalized gradient of that
pre-activation (so it points into the active side). The float64 GmP direction
comes from ``orthojax.nn.angles_to_direction``; it is compared with a numpy
``cumprod`` reference (the formula E4 used to copy) bit for bit where that holds.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import orthojax.analysis as oa
from orthojax.models import MLP
from orthojax.nn import activation_fn
from orthojax.nn import angles_to_direction

VARIANTS = ("sp", "wn", "bn", "gmp")
DIMS = (1, 2, 5)


def _close(actual, expected):
  np.testing.assert_allclose(actual, np.asarray(expected, np.float64), rtol=1e-12, atol=1e-12)


def _numpy_direction(theta):
  """``u(θ)`` (GmP eq. 10) by a float64 cumulative product of sines."""
  theta = np.asarray(theta, np.float64)
  s, c = np.sin(theta), np.cos(theta)
  units, k = theta.shape
  prefix = np.ones((units, k + 1))
  prefix[:, 1:] = np.cumprod(s, axis=1)           # ∏_{j<i} sin θ_j
  own = np.concatenate([c, np.ones((units, 1))], axis=1)
  return prefix * own


# ------------------------------------------------------------ Closed forms --

def test_sp_wn_points_by_hand():
  # SP, 1-D: the kink of ReLU(w x + b) is x = −b/w.
  phi, d = oa.characteristic_points("sp", {"layer": {"kernel": [[2.0, -1.0]],
                                                     "bias": [1.0, 3.0]}})
  _close(phi, [[-0.5], [3.0]])
  _close(d, [[1.0], [-1.0]])
  # SP, 2-D: w = (3, 4), b = 10 → φ = −b w/‖w‖² = −0.4·(3, 4).
  phi, d = oa.characteristic_points("sp", {"layer": {"kernel": [[3.0], [4.0]], "bias": [10.0]}})
  _close(phi, [[-1.2, -1.6]])
  _close(d, [[0.6, 0.8]])
  # WN: w = g v/‖v‖. v = 3, g = 2 → w = 2, φ = −4/2; v = (0, 5), g = −1 → w = (0, −1).
  phi, _ = oa.characteristic_points("wn", {"layer": {"kernel": [[3.0]], "scale": [2.0],
                                                     "bias": [4.0]}}, wn_epsilon=0.0)
  _close(phi, [[-2.0]])
  phi, d = oa.characteristic_points("wn", {"layer": {"kernel": [[0.0], [5.0]], "scale": [-1.0],
                                                     "bias": [3.0]}})
  _close(phi, [[0.0, 3.0]])
  _close(d, [[0.0, -1.0]])
  # WN's ε enters ‖v‖: g v/sqrt(v² + ε) with v = 3, ε = 7 → w = 2·3/4.
  phi, _ = oa.characteristic_points("wn", {"layer": {"kernel": [[3.0]], "scale": [2.0],
                                                     "bias": [3.0]}}, wn_epsilon=7.0)
  _close(phi, [[-2.0]])


def test_bn_point_by_hand():
  # z = γ (x w − μ)/s + β with μ = m w = 2, s = sqrt(w² v) = 4 (ε = 0):
  # 0.5 (2x − 2)/4 + 1 = 0  ⇔  x = −3.
  hidden = {"layer": {"kernel": [[2.0]]}, "norm": {"scale": [0.5], "bias": [1.0]}}
  phi, d = oa.characteristic_points("bn", hidden, x_mean=[1.0], x_cov=[[4.0]], bn_epsilon=0.0)
  _close(phi, [[-3.0]])
  _close(d, [[1.0]])
  # ε: s = sqrt(16 + 9) = 5 → 0.5 (2x − 2)/5 + 1 = 0 ⇔ x = −4; scalar statistics accepted.
  phi, _ = oa.characteristic_points("bn", hidden, x_mean=1.0, x_cov=4.0, bn_epsilon=9.0)
  _close(phi, [[-4.0]])
  # A negative γ flips the unit's direction (the active side).
  hidden["norm"]["scale"] = [-0.5]
  phi, d = oa.characteristic_points("bn", hidden, x_mean=[1.0], x_cov=[[4.0]], bn_epsilon=0.0)
  _close(phi, [[5.0]])     # −0.5 (2x − 2)/4 + 1 = 0 ⇔ x = 5
  _close(d, [[-1.0]])


def test_gmp_points_by_hand():
  # 1-D: fixed sign u ∈ {±1}, φ = −λ u.
  phi, d = oa.characteristic_points("gmp", {"layer": {"lam": [0.5, 2.0], "r": [3.0, -1.0]}},
                                    sign=[1.0, -1.0])
  _close(phi, [[-0.5], [2.0]])
  _close(d, [[1.0], [-1.0]])
  # 2-D: u(θ) = (cos θ, sin θ).
  phi, d = oa.characteristic_points(
      "gmp", {"layer": {"theta": [[math.pi / 2], [0.0]], "lam": [2.0, -1.0], "r": [1.0, 1.0]}})
  _close(phi, [[0.0, -2.0], [1.0, 0.0]])
  np.testing.assert_allclose(d, [[0.0, 1.0], [1.0, 0.0]], atol=1e-15)
  # 3-D: θ = (π/2, π/2) → u = (0, 0, 1).
  phi, d = oa.characteristic_points(
      "gmp", {"layer": {"theta": [[math.pi / 2, math.pi / 2]], "lam": [3.0], "r": [1.0]}})
  np.testing.assert_allclose(phi, [[0.0, 0.0, -3.0]], atol=1e-15)


def test_errors():
  with pytest.raises(ValueError, match="sign"):
    oa.characteristic_points("gmp", {"layer": {"lam": [1.0], "r": [1.0]}})
  with pytest.raises(ValueError, match="mean and covariance"):
    oa.characteristic_points("bn", {"layer": {"kernel": [[1.0]]},
                                    "norm": {"scale": [1.0], "bias": [0.0]}})
  with pytest.raises(ValueError, match="unknown variant 'wn_mbn'"):
    oa.characteristic_points("wn_mbn", {"layer": {"kernel": [[1.0]]}})


def test_zero_weight_gives_nan_not_an_error():
  phi, d = oa.characteristic_points("sp", {"layer": {"kernel": [[0.0, 1.0]], "bias": [1.0, 1.0]}})
  assert np.isnan(d[0]).all() and not np.isfinite(phi[0]).all()
  _close(phi[1], [-1.0])


# --------------------------------------------------- Float64 GmP direction --

@pytest.mark.parametrize("shape", [(10, 1), (100, 1), (7, 2), (7, 4), (50, 16), (20, 17),
                                   (5, 100), (3, 1000)])
@pytest.mark.parametrize("low, high", [(0.0, math.pi), (-4.0, 4.0)])
def test_float64_direction_vs_numpy_reference(shape, low, high):
  """angles_to_direction in float64 equals the cumprod formula bit for bit for one angle
  (2-D inputs, E4's banana) and to within one unit of float64 round-off (≤ 2.3e-16
  absolutely, on unit vectors) for more: it accumulates log|sin| in a sum, not a product."""
  seed = shape[0] * 1000 + shape[1] + (7 if low < 0 else 0)
  theta = np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)
  ref = _numpy_direction(theta)
  _, got = oa.characteristic_points("gmp", {"layer": {"theta": theta,
                                                      "lam": np.zeros(shape[0])}})
  assert got.dtype == np.float64
  if shape[1] == 1:
    np.testing.assert_array_equal(got, ref)
  else:
    assert np.max(np.abs(got - ref)) <= 2.3e-16
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-15)


def test_float64_direction_leaves_x64_as_it_was():
  before = jax.config.jax_enable_x64
  oa.characteristic_points("gmp", {"layer": {"theta": [[0.3, 0.4]], "lam": [1.0]}})
  assert jax.config.jax_enable_x64 == before
  assert jnp.zeros(1).dtype == (jnp.float64 if before else jnp.float32)


# ------------------------------------------------------ The real layers --

def _perturbed_mlp(dim, variant, seed=3, hidden=6):
  """An MLP whose hidden unit is moved off its init (λ = b = β = 0 there), BN momentum 0
  so that one training-mode call leaves exactly the batch statistics in the running ones."""
  rng = np.random.default_rng(seed + dim)
  model = MLP(dim, hidden=hidden, variant=variant, momentum=0.0, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param)
  pure = nnx.to_pure_dict(state)
  pure["hidden"] = {k: {n: (np.asarray(v) + 0.3 * rng.normal(size=np.shape(v))).astype(np.float32)
                        for n, v in d.items()}
                    for k, d in pure["hidden"].items()}
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model, pure["hidden"], rng


def _pre_activation_fn(model, variant, x):
  """``x -> (batch, units)`` pre-activations, by the unit's own modules.

  BN: the unit runs once in training mode on the batch ``x`` (momentum 0: the running
  statistics become the batch's own), then in eval mode, which applies exactly the
  training-mode normalization of that batch to any input."""
  unit = model.hidden
  if variant == "bn":
    train_out = unit.norm(unit.layer(x))
    unit.norm.eval()
    np.testing.assert_allclose(unit.norm(unit.layer(x)), train_out, rtol=1e-6, atol=1e-6)
    return lambda p: unit.norm(unit.layer(p))
  if variant == "gmp":
    layer = nnx.clone(unit.layer)
    layer.activation = activation_fn("identity")       # r·(uᵀx + λ)
    r = layer.r[...]
    return lambda p: layer(p) / r
  return unit.layer


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_points_are_on_the_real_layers_boundaries(variant, dim):
  model, hidden, rng = _perturbed_mlp(dim, variant)
  x = jnp.asarray(rng.normal(size=(64, dim)) + 0.5, jnp.float32)
  xs = np.asarray(x, np.float64)
  static = {}
  if variant == "bn":
    static = dict(x_mean=xs.mean(0), x_cov=np.cov(xs, rowvar=False, bias=True))
  if variant == "gmp" and dim == 1:
    static = dict(sign=np.asarray(model.hidden.layer.sign[...]))
  phi, direction = oa.characteristic_points(variant, hidden, **static)
  units = phi.shape[0]
  assert phi.shape == direction.shape == (units, dim) and phi.dtype == np.float64
  np.testing.assert_allclose(np.linalg.norm(direction, axis=1), 1.0, atol=1e-14)
  # φ is parallel to u: the foot of the perpendicular from 0 (φ = (φ·u) u).
  along = np.sum(phi * direction, axis=1)
  np.testing.assert_allclose(phi, along[:, None] * direction, atol=1e-12)

  pre = _pre_activation_fn(model, variant, x)
  at = np.asarray(pre(jnp.asarray(phi, jnp.float32)), np.float64)      # (units, units)
  grad = np.asarray(jax.jacobian(lambda p: pre(p[None])[0])(jnp.zeros((dim,), jnp.float32)),
                    np.float64)                                        # (units, dim)
  gnorm = np.linalg.norm(grad, axis=1)
  # Zero at φ, to float32 round-off of s(φ) = ‖w‖(u·φ + λ): scale ‖w‖·(1 + ‖φ‖).
  scale = gnorm * (1.0 + np.linalg.norm(phi, axis=1))
  assert np.all(np.abs(np.diag(at)) <= 2e-6 * scale), (np.diag(at), scale)
  # The direction is the boundary's unit normal towards the active side.
  np.testing.assert_allclose(grad / gnorm[:, None], direction, atol=2e-6)
  # One unit of distance along u raises the pre-activation by ‖∇s‖.
  beyond = np.asarray(pre(jnp.asarray(phi + direction, jnp.float32)), np.float64)
  assert np.all(np.abs(np.diag(beyond) - gnorm) <= 2e-5 * gnorm + 2e-6 * scale)
  if variant == "gmp":
    # GmP's direction is u(θ) of eq. 10: the library map in float64, and the layer's own
    # (float32) direction.
    if dim > 1:
      with jax.enable_x64(True):
        ref = np.asarray(angles_to_direction(jnp.asarray(hidden["layer"]["theta"], jnp.float64)))
      np.testing.assert_array_equal(direction, ref)
    np.testing.assert_allclose(direction, np.asarray(model.hidden.layer.direction()).T,
                               atol=1e-6)


def test_gmp_2d_points_equal_the_numpy_formula_bitwise():
  """E4's banana runs (GmP, 2 inputs): φ and u are bit-identical to the numpy copy."""
  model, hidden, _ = _perturbed_mlp(2, "gmp", hidden=50)
  phi, direction = oa.characteristic_points("gmp", hidden)
  u = _numpy_direction(hidden["layer"]["theta"])
  np.testing.assert_array_equal(direction, u)
  np.testing.assert_array_equal(phi, -np.asarray(hidden["layer"]["lam"], np.float64)[:, None] * u)


# --------------------------------------------------------------- Tracker --

class _Wrapper(nnx.Module):
  """The trainer's layout: the MLP under ``.model``."""

  def __init__(self, model):
    self.model = model

  def __call__(self, x):
    return self.model(x)


def _nudge(model, rng, size=0.05):
  state = nnx.state(model, nnx.Param)
  pure = nnx.to_pure_dict(state)
  pure = jax.tree.map(lambda v: (np.asarray(v) + size * rng.normal(size=np.shape(v))
                                 ).astype(np.float32), pure)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_tracker_records_points_and_per_step_changes(variant, dim):
  mlp, _, rng = _perturbed_mlp(dim, variant, seed=11)
  model = _Wrapper(mlp)
  xs = rng.normal(size=(40, dim))
  stats = dict(x_mean=xs.mean(0), x_cov=np.cov(xs, rowvar=False, bias=True)) \
      if variant == "bn" else {}
  tracker = oa.CharacteristicPointTracker(model, "model.hidden", step=0, **stats)
  assert tracker.variant == variant

  def by_hand():   # the old E4 path: the hidden unit's entry of the whole model's params
    hidden = nnx.to_pure_dict(nnx.state(model, nnx.Param))["model"]["hidden"]
    static = dict(stats)
    if variant == "bn":
      static["bn_epsilon"] = 1e-3
    if variant == "gmp" and dim == 1:
      static["sign"] = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))
                                        )["model"]["hidden"]["layer"]["sign"]
    return oa.characteristic_points(variant, hidden, **static)

  phi0, dir0 = by_hand()
  np.testing.assert_array_equal(tracker.phi[0], phi0)
  np.testing.assert_array_equal(tracker.direction[0], dir0)
  previous = (phi0, dir0)
  for step in (1, 2, 3):
    _nudge(model, rng)
    out = tracker(step, model)
    phi, direction = by_hand()
    assert set(out) == {"max_dphi", "max_dangle_deg"}
    assert out["max_dphi"] == np.max(np.linalg.norm(phi - previous[0], axis=1))
    cos = np.clip(np.sum(direction * previous[1], axis=1), -1.0, 1.0)
    assert out["max_dangle_deg"] == np.max(np.degrees(np.arccos(cos)))
    if dim == 1 and variant == "gmp":
      assert out["max_dangle_deg"] == 0.0          # a fixed sign never turns
    np.testing.assert_array_equal(tracker.phi[-1], phi)
    previous = (phi, direction)
  arrays = tracker.arrays()
  np.testing.assert_array_equal(arrays["steps"], [0, 1, 2, 3])
  units = phi0.shape[0]
  assert arrays["phi"].shape == arrays["direction"].shape == (4, units, dim)
  assert arrays["phi"].dtype == np.float32 and arrays["max_dphi"].dtype == np.float64
  assert arrays["max_dphi"].shape == arrays["max_dangle_deg"].shape == (3,)
  np.testing.assert_array_equal(arrays["max_dphi"], tracker.max_dphi)


def test_tracker_paths_and_selectors_agree():
  mlp, _, rng = _perturbed_mlp(2, "wn", seed=5)
  wrapped = _Wrapper(mlp)
  a = oa.CharacteristicPointTracker(mlp, "hidden")
  b = oa.CharacteristicPointTracker(wrapped, "model/hidden")
  c = oa.CharacteristicPointTracker(wrapped, ("model", "hidden"))
  d = oa.CharacteristicPointTracker(wrapped, lambda m: m.model.hidden, variant="wn",
                                    wn_epsilon=1e-12)
  for t in (b, c, d):
    np.testing.assert_array_equal(t.phi[0], a.phi[0])
  _nudge(mlp, rng)
  outs = [a(1, mlp)] + [t(1, wrapped) for t in (b, c, d)]
  assert all(o == outs[0] for o in outs)


def test_tracker_reads_the_units_constants():
  """sign (GmP, one input), BN's ε and WN's ε come from the unit unless given."""
  mlp = MLP(1, hidden=4, variant="gmp", rngs=nnx.Rngs(0))
  t = oa.CharacteristicPointTracker(mlp, "hidden")
  np.testing.assert_array_equal(t.static["sign"], np.asarray(mlp.hidden.layer.sign[...]))
  mlp = MLP(2, hidden=4, variant="bn", epsilon=0.25, rngs=nnx.Rngs(0))
  t = oa.CharacteristicPointTracker(mlp, "hidden", x_mean=[0.0, 0.0], x_cov=np.eye(2))
  assert t.static["bn_epsilon"] == 0.25
  t = oa.CharacteristicPointTracker(mlp, "hidden", x_mean=[0.0, 0.0], x_cov=np.eye(2),
                                    bn_epsilon=0.5)
  assert t.static["bn_epsilon"] == 0.5
  mlp = MLP(2, hidden=4, variant="wn", rngs=nnx.Rngs(0))
  assert oa.CharacteristicPointTracker(mlp, "hidden").static["wn_epsilon"] == \
      mlp.hidden.layer.epsilon


def test_tracker_sees_a_flipped_unit_turn_180_degrees():
  mlp = MLP(2, hidden=3, variant="sp", rngs=nnx.Rngs(0))
  t = oa.CharacteristicPointTracker(mlp, "hidden", step=10)
  mlp.hidden.layer.kernel[...] = -mlp.hidden.layer.kernel[...]
  out = t(11, mlp)
  assert out["max_dangle_deg"] == pytest.approx(180.0)
  assert t.steps == [10, 11]


def test_tracker_errors():
  mlp = MLP(2, hidden=3, variant="bn", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="mean and covariance"):
    oa.CharacteristicPointTracker(mlp, "hidden")
  with pytest.raises(AttributeError):
    oa.CharacteristicPointTracker(mlp, "model.hidden", x_mean=[0, 0], x_cov=np.eye(2))
  with pytest.raises(ValueError, match="variant"):
    oa.CharacteristicPointTracker(mlp, "hidden.layer")      # a Linear has no variant
  with pytest.raises(ValueError, match="empty"):
    oa.CharacteristicPointTracker(mlp, "")
