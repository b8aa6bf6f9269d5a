"""The manifold optimizers on tensor-core products: the constraint held at float32
rounding over 1,000 steps, emulated exactly on the CPU (``orthojax.linalg.at_precision``),
and Muon's bfloat16 orthogonalization within bfloat16's own distance of optax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib._muon import orthogonalize_via_newton_schulz

import orthojax as oj
from orthojax.linalg import MatrixView
from orthojax.manifolds import Stiefel

# One of each kind, at an eighth of the width so that 1,000 emulated steps fit in CI
# (the full shapes are the precision benchmark's): ResNet-50's 3 × 3 and 1 × 1 kernels
# (72 × 8 and 32 × 8 tall views), E5's square stack (2 × 50 × 50) beside its wide input
# kernel (384 × 50), E8's hidden matrices (16 × 48 QKV, 64 × 16 MLP).
PARAMS_AND_VIEWS = {
    "conv3x3": ((3, 3, 8, 8), MatrixView.conv()),
    "conv1x1": ((1, 1, 32, 8), MatrixView.conv()),
    "stack": ((2, 50, 50), MatrixView.stacked()),
    "input": ((384, 50), MatrixView.dense()),
    "qkv": ((16, 48), MatrixView.dense()),
    "mlp_out": ((64, 16), MatrixView.dense()),
}
VIEWS = {k: v for k, (_, v) in PARAMS_AND_VIEWS.items()}
STEPS = 1000


def _params():
  keys = jax.random.split(jax.random.key(0), len(PARAMS_AND_VIEWS))
  return {name: Stiefel().random(k, shape, view=view)
          for k, (name, (shape, view)) in zip(keys, PARAMS_AND_VIEWS.items())}


def _optimizer(name, precision):
  if name == "radam":   # the ResNet recipe: iterative Cayley, a clean-up step each step
    cayley = Stiefel("cayley", cayley_iterations=2, precision=precision)
    return oj.optim.radam(1e-3, cayley, reorthonormalize_every=1, views=VIEWS)
  if name == "rsgd":
    return oj.optim.rsgd(1e-2, Stiefel(precision=precision), momentum=0.9, views=VIEWS)
  return oj.optim.stiefel_muon(0.02, precision=precision, views=VIEWS)


def _run(tx, params, steps):
  def body(carry, key):
    p, s = carry
    g = jax.tree.map(lambda x, k: 0.01 * jax.random.normal(k, x.shape),
                     p, dict(zip(p, jax.random.split(key, len(p)))))
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), None

  keys = jax.random.split(jax.random.key(1), steps)
  (p, _), _ = jax.lax.scan(body, (params, tx.init(params)), keys)
  return p


def _defects(params):
  return {k: float(jnp.max(Stiefel().defect(v, view=VIEWS[k]))) for k, v in params.items()}


@pytest.mark.parametrize("name", ["radam", "rsgd", "stiefel_muon"])
def test_three_bfloat16_passes_hold_the_constraint_over_1000_steps(name):
  """What a GPU or TPU runs by default (``precision=None`` there), emulated: every
  matrix within 1e-5 of the manifold after 1,000 noisy steps — the float32 correction of
  each point is what holds it — and the iterates follow float32's closely."""
  params = _params()
  reduced = jax.jit(lambda p: _run(_optimizer(name, "bf16x3"), p, STEPS))(params)
  defects = _defects(reduced)
  assert max(defects.values()) <= 1e-5, defects
  short = jax.jit(lambda p, prec: _run(_optimizer(name, prec), p, 20), static_argnums=1)
  a, b = short(params, "bf16x3"), short(params, "highest")
  for k in params:
    assert float(jnp.abs(a[k] - b[k]).max()) < 2e-3, k   # products at 2^-17, not 2^-9
    assert float(jnp.abs(a[k] - b[k]).max()) > 0, k      # really reduced


def test_one_bfloat16_pass_does_not_hold_it():
  """Why the default is three passes: with one, the same correction leaves the iterate
  well above float32 rounding (its product's 2^-9 error times the defect it corrects)."""
  p = jax.jit(lambda p: _run(_optimizer("rsgd", "bf16"), p, 50))(_params())
  assert max(_defects(p).values()) > 2e-5


def test_the_fused_and_chained_radam_agree_at_reduced_precision():
  params = _params()
  cayley = Stiefel("cayley", cayley_iterations=2, precision="bf16x3")
  fused = oj.optim.radam(1e-3, cayley, reorthonormalize_every=1, views=VIEWS)
  chain = optax.chain(oj.optim.project_to_tangent(cayley, VIEWS),
                      oj.optim.scale_by_riemannian_adam(cayley, views=VIEWS),
                      optax.scale_by_learning_rate(1e-3),
                      oj.optim.retract(cayley, VIEWS, reorthonormalize_every=1))
  a = jax.jit(lambda p: _run(fused, p, 5))(params)
  b = jax.jit(lambda p: _run(chain, p, 5))(params)
  for k in params:
    np.testing.assert_allclose(a[k], b[k], atol=2e-4)


def test_the_gpu_program_runs_the_maths_on_tensor_cores_and_the_correction_at_float32():
  """radam's update exported for a GPU (no device needed): most products carry the
  three-pass bfloat16 algorithm; the float32 ones are the corrections' Gram matrices."""
  params = _params()
  tx = _optimizer("radam", None)
  grads = jax.tree.map(jnp.ones_like, params)
  update = jax.jit(lambda g, s, p: tx.update(g, s, p)[0])
  text = jax.export.export(update, platforms=["cuda"])(grads, tx.init(params),
                                                        params).mlir_module()
  dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
  reduced = [d for d in dots if "num_primitive_operations = 3" in d]
  full = [d for d in dots if "HIGHEST" in d]
  assert len(reduced) + len(full) == len(dots)
  assert 0 < len(full) < len(reduced), (len(full), len(reduced))


def _dots(tx, params, platform):
  """``(three-pass, float32)`` product counts of ``tx``'s update exported for ``platform``."""
  grads = jax.tree.map(jnp.ones_like, params)
  update = jax.jit(lambda g, s, p: tx.update(g, s, p)[0])
  text = jax.export.export(update, platforms=[platform])(grads, tx.init(params),
                                                          params).mlir_module()
  dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
  passes = {n: sum(f"num_primitive_operations = {n}" in d for d in dots) for n in (1, 3)}
  full = sum("HIGHEST" in d for d in dots)
  assert passes[1] + passes[3] + full == len(dots)
  return passes[3], full


@pytest.mark.parametrize("name", ["radam", "rsgd"])
def test_on_a_tpu_the_qr_retraction_runs_at_float32_without_a_correction(name):
  """One CholeskyQR pass on a TPU: its Gram matrix and its product with ``R⁻¹`` at
  float32 (six passes there) and no correction — two products where a GPU runs four
  (both at three passes, then the correction's float32 Gram and three-pass product)."""
  params = {"stack": _params()["stack"], "input": _params()["input"]}
  tx = (oj.optim.radam if name == "radam" else oj.optim.rsgd)(1e-3, Stiefel("qr"),
                                                            views=VIEWS)
  gpu, tpu = _dots(tx, params, "cuda"), _dots(tx, params, "tpu")
  buckets = 2   # the stack's 50 x 50 matrices and the 384 x 50 input kernel
  assert tpu[1] == 2 * buckets and gpu[1] == buckets   # float32: the QR's, the corrections'
  assert tpu[0] == gpu[0] - 3 * buckets                # the QR's and the correction's three-pass
  assert _dots(oj.optim.radam(1e-3, Stiefel("qr", precision="bf16"), views=VIEWS), params,
               "tpu")[1] == buckets   # one pass: the correction stays, the cheaper there
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  assert _dots(tx, bf16, "tpu") == _dots(tx, bf16, "cuda")   # a bfloat16 point: as a GPU


@pytest.mark.parametrize("shape", [(256, 64), (128, 128), (64, 512), (3, 96, 32)])
def test_muon_in_bfloat16_is_within_bfloat16s_own_distance_of_optax(shape):
  """Muon's orthogonalization with one bfloat16 pass per product (its GPU default) is no
  farther from optax's float32 ``orthogonalize_via_newton_schulz`` than optax's own
  iteration on bfloat16 inputs is."""
  g = jax.random.normal(jax.random.key(0), shape)
  coeffs = jnp.asarray((3.4445, -4.7750, 2.0315))
  reference = jax.vmap(orthogonalize_via_newton_schulz, (0, None, None))(
      g.reshape(-1, *shape[-2:]), coeffs, 5)
  in_bf16 = jax.vmap(orthogonalize_via_newton_schulz, (0, None, None))(
      g.reshape(-1, *shape[-2:]).astype(jnp.bfloat16), coeffs, 5).astype(jnp.float32)
  ours = jax.jit(lambda g: oj.linalg.newton_schulz(g, precision="bf16"))(g)
  distance = lambda x: float(jnp.linalg.norm(x.reshape(reference.shape) - reference)
                             / jnp.linalg.norm(reference))
  assert 1e-3 < distance(ours) <= distance(in_bf16), (distance(ours), distance(in_bf16))


def test_muon_takes_the_precision_and_reads_it_per_backend():
  params = {"w": jax.random.normal(jax.random.key(0), (64, 32))}
  grads = {"w": jax.random.normal(jax.random.key(1), (64, 32))}
  out = {}
  for precision in ("highest", None, "bf16"):
    tx = oj.optim.muon(0.1, precision=precision)
    out[precision] = jax.jit(tx.update)(grads, tx.init(params), params)[0]["w"]
  np.testing.assert_array_equal(out["highest"], out[None])        # a CPU: float32
  assert float(jnp.abs(out["bf16"] - out["highest"]).max()) > 1e-4
  with pytest.raises(ValueError, match="^muon: precision='fp8' is not a precision"):
    oj.optim.muon(0.1, precision="fp8")
