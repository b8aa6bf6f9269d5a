"""spectrum_stats / spectrum_hook on matrices with known singular values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax import analysis as oa
from orthojax.linalg import MatrixView


def _orthonormal(seed, n, p):
  q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, p)))
  return q * np.sign(np.diag(r))


def _expected(s):
  """The statistics of one tall matrix with singular values ``s`` (numpy)."""
  s = np.sort(np.asarray(s, np.float64))[::-1]
  g2 = np.mean(s**2)
  return {"sv_mean": s.mean(), "sv_std": s.std(), "sv_min": s.min(), "sv_max": s.max(),
          "cond": s.max() / s.min(), "gain": np.sqrt(g2)}


def _check(stats, name, want, rtol=1e-5, atol=1e-6):
  for k, v in want.items():
    np.testing.assert_allclose(stats[f"{name}/{k}"], v, rtol=rtol, atol=atol, err_msg=k)


def test_gain_times_orthogonal_and_diagonal():
  g = 1.7
  diag = np.zeros((6, 4))
  diag[np.arange(4), np.arange(4)] = [3.0, 2.0, 1.0, 0.5]
  params = {"tall": {"kernel": g * _orthonormal(0, 20, 8)},
            "wide": {"kernel": g * _orthonormal(1, 20, 8).T},   # rows orthonormal
            "diag": {"kernel": diag, "bias": np.ones(4)}}
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  stats = oa.spectrum_stats(params)
  assert set(stats) == {f"{leaf}/kernel/{s}" for leaf in ("tall", "wide", "diag")
                        for s in oa.STATS}   # biases (1-D) are skipped
  for leaf in ("tall", "wide"):
    _check(stats, f"{leaf}/kernel", {"sv_mean": g, "sv_min": g, "sv_max": g, "gain": g,
                                     "cond": 1.0, "defect_normalized": 0.0,
                                     "defect": abs(g * g - 1) * np.sqrt(8)}, atol=2e-5)
    np.testing.assert_allclose(stats[f"{leaf}/kernel/sv_std"], 0.0, atol=2e-6)
  s = np.array([3.0, 2.0, 1.0, 0.5])
  g2 = np.mean(s**2)
  _check(stats, "diag/kernel", {**_expected(s),
                                "defect": np.sqrt(np.sum((s**2 - 1) ** 2)),
                                "defect_normalized": np.sqrt(np.sum((s**2 / g2 - 1) ** 2))})
  # Under jit: the same dict.
  jitted = jax.jit(oa.spectrum_stats)(params)
  assert set(jitted) == set(stats)
  for k in stats:
    np.testing.assert_allclose(jitted[k], stats[k], rtol=1e-6, atol=1e-6)


def test_conv_kernel_and_scanned_stack():
  rng = np.random.default_rng(2)
  conv = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
  stack = rng.standard_normal((5, 6, 6)).astype(np.float32)
  stack[2] = 2.0 * _orthonormal(3, 6, 6)   # one gain-adjusted orthogonal layer
  params = {"conv": {"kernel": jnp.asarray(conv)}, "cell": {"kernels": jnp.asarray(stack)}}
  stats = oa.spectrum_stats(params, views={"cell": MatrixView.stacked()}, per_matrix=True)

  s_conv = np.linalg.svd(conv.reshape(36, 8).astype(np.float64), compute_uv=False)
  _check(stats, "conv/kernel", _expected(s_conv), rtol=1e-4)
  assert "conv/kernel/per_matrix/sv_mean" not in stats   # no stack axis

  s_stack = np.linalg.svd(stack.astype(np.float64), compute_uv=False)     # (5, 6)
  per = [_expected(s) for s in s_stack]
  pooled = _expected(s_stack.reshape(-1))
  del pooled["cond"]
  _check(stats, "cell/kernels", pooled, rtol=1e-4)     # pooled over the stack
  np.testing.assert_allclose(stats["cell/kernels/cond"], max(p["cond"] for p in per), rtol=1e-3)
  for stat in ("sv_mean", "sv_max", "gain", "cond"):
    np.testing.assert_allclose(stats[f"cell/kernels/per_matrix/{stat}"], [p[stat] for p in per],
                               rtol=1e-3)
  defects = stats["cell/kernels/per_matrix/defect_normalized"]
  assert defects.shape == (5,) and float(defects[2]) < 1e-5 and float(defects.min()) < 1e-5
  np.testing.assert_allclose(stats["cell/kernels/defect_normalized"], defects.max(), rtol=1e-6)
  gram = np.einsum("lni,lnj->lij", stack, stack) - np.eye(6)
  np.testing.assert_allclose(stats["cell/kernels/defect"],
                             np.linalg.norm(gram, axis=(1, 2)).max(), rtol=1e-4)
  # The same through matrix_stats, one leaf.
  one = oa.matrix_stats(jnp.asarray(stack), MatrixView.stacked())
  np.testing.assert_allclose(one["singular_values"], s_stack, rtol=1e-4, atol=1e-5)


class _Stack(nnx.Module):
  """A scanned stack of square kernels and a readout, built from numpy (no init cost)."""

  def __init__(self, constrained: bool):
    stack = np.stack([_orthonormal(i, 8, 8) for i in range(3)]).astype(np.float32)
    if constrained:   # the Variable carries its matrix view, as orthojax.models do
      self.kernels = oj.nn.StiefelParam(jnp.asarray(stack), matrix_view=MatrixView.stacked())
    else:
      self.kernels = nnx.Param(jnp.asarray(stack))
    self.readout = nnx.Param(jnp.asarray(_orthonormal(9, 8, 2), jnp.float32))
    self.scale = nnx.Param(jnp.ones(()))


def test_modules_read_the_views_from_metadata():
  stats = oa.spectrum_stats(_Stack(constrained=True))
  np.testing.assert_allclose(stats["kernels/defect"], 0.0, atol=1e-5)
  np.testing.assert_allclose(stats["kernels/sv_mean"], 1.0, atol=1e-5)
  assert sorted({k.rsplit("/", 1)[0] for k in stats}) == ["kernels", "readout"]
  plain = _Stack(constrained=False)
  with pytest.raises(ValueError, match="kernels.*ambiguous"):
    oa.spectrum_stats(plain)
  stats = oa.spectrum_stats(nnx.state(plain, nnx.Param), views={"kernels": MatrixView.stacked()},
                            mask={"kernels": True})
  assert sorted({k.split("/")[0] for k in stats}) == ["kernels"]


@pytest.mark.parametrize("as_state", [False, True])
def test_model_zoo_stacks_carry_their_view(as_state):
  """Euclidean scanned stacks (DeepMLP, DeepLinear) need no views= argument."""
  for model in (oj.models.DeepMLP(16, 3, 8, 4, q_star=0.5, init="orthogonal",
                                  rngs=nnx.Rngs(0)),
                oj.models.DeepLinear(4, 8, init="orthogonal", scale=1.5, rngs=nnx.Rngs(0))):
    stats = oa.spectrum_stats(nnx.state(model, nnx.Param) if as_state else model)
    gain = model.sigma_w if isinstance(model, oj.models.DeepMLP) else 1.5
    np.testing.assert_allclose(stats["kernels/sv_min"], gain, rtol=1e-5)
    np.testing.assert_allclose(stats["kernels/sv_max"], gain, rtol=1e-5)


def test_hook():
  params = {"dense": {"kernel": jnp.asarray(0.5 * _orthonormal(4, 6, 3), jnp.float32),
                      "bias": jnp.zeros(3)},
            "stack": jnp.asarray(np.random.default_rng(5).standard_normal((2, 4, 4)), jnp.float32)}
  hook = oa.spectrum_hook(every_n=2, views={"stack": MatrixView.stacked()}, per_matrix=True,
                          prefix="spectrum/")
  assert hook(3, params) == {}
  out = hook(4, params)
  assert all(isinstance(v, float) for v in out.values())
  assert out["spectrum/dense/kernel/gain"] == pytest.approx(0.5, rel=1e-5)
  assert "spectrum/stack/per_matrix/cond/1" in out and "spectrum/stack/cond" in out
  assert out["spectrum/stack/cond"] == pytest.approx(
      max(out["spectrum/stack/per_matrix/cond/0"], out["spectrum/stack/per_matrix/cond/1"]))
  # every step when every_n is None; the same compiled function for new values
  plain = oa.spectrum_hook(views={"stack": MatrixView.stacked()})
  assert plain(1, params)["dense/kernel/sv_max"] == pytest.approx(0.5, rel=1e-5)
  doubled = jax.tree.map(lambda a: 2 * a, params)
  assert plain(2, doubled)["dense/kernel/sv_max"] == pytest.approx(1.0, rel=1e-5)
  with pytest.raises(ValueError, match="every_n"):
    oa.spectrum_hook(every_n=0)


def test_bad_input():
  with pytest.raises(ValueError, match=r"stack has shape \(2, 3, 3\).*ambiguous"):
    oa.spectrum_stats({"stack": jnp.ones((2, 3, 3))})
  with pytest.raises(TypeError, match="floating"):
    oa.spectrum_stats({"w": jnp.ones((3, 3), jnp.int32)})
  with pytest.raises(ValueError, match="at least 2 axes"):
    oa.spectrum_stats({"b": jnp.ones(3)}, mask={"b": True})
  with pytest.raises(TypeError, match="views entry"):
    oa.spectrum_stats({"w": jnp.ones((3, 3))}, views={"w": "dense"})
  with pytest.raises(ValueError, match="at least 2 axes"):
    oa.matrix_stats(jnp.ones(4))
