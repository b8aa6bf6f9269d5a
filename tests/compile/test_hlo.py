"""The optimized-HLO reader on the CPU backend (no libtpu needed): loop trip counts,
loop-weighted matmul FLOPs against closed forms, LAPACK QR FLOPs, collectives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax import linalg
from orthojax.compile import hlo


def _module(fn, *args) -> tuple[hlo.Module, float]:
  compiled = jax.jit(fn).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return hlo.Module.from_text(compiled.as_text()), float(cost["flops"])


@pytest.mark.parametrize("layers", [3, 12])
def test_scanned_matmuls_are_weighted_by_the_trip_count(layers):
  n, batch = 64, 32

  def forward(ws, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

  module, xla = _module(forward, jnp.ones((layers, n, n)), jnp.ones((batch, n)))
  analytic = 2 * batch * n * n * layers
  assert module.unknown_loops == 0
  assert module.matmul_flops() == pytest.approx(analytic)
  assert hlo.loop_corrected_flops(xla, module) == pytest.approx(analytic, rel=0.05)


def test_dot_and_convolution_flops_without_loops():
  x, w = jnp.ones((8, 16, 16, 3)), jnp.ones((3, 3, 3, 5))
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  module, xla = _module(conv, x, w)
  # SAME padding: per axis, 16 outputs × 3 taps less the 2 that land on the padding.
  taps = (16 * 3 - 2) ** 2
  assert module.matmul_flops() == pytest.approx(2 * 8 * 5 * 3 * taps)
  assert xla == pytest.approx(2 * 8 * 5 * 3 * taps, rel=0.02)   # XLA's own rule
  module, _ = _module(lambda a, b: a @ b, jnp.ones((7, 11)), jnp.ones((11, 13)))
  assert module.matmul_flops() == 2 * 7 * 11 * 13


@pytest.mark.parametrize("shape", [(40, 20), (3, 40, 20), (20, 40)], ids=["tall", "batched", "wide"])
def test_lapack_qr_flops(shape):
  module, _ = _module(lambda x: jnp.linalg.qr(x)[0], jnp.ones(shape))
  *batch, m, n = shape
  k = min(m, n)
  householder = lambda rows, cols: 2 * rows * cols ** 2 - 2 * cols ** 3 / 3   # rows >= cols
  per_matrix = householder(max(m, n), k) + householder(m, k)   # geqrf, then Q (m × k)
  assert hlo.lapack_qr_flops(module) == pytest.approx(np.prod(batch or [1]) * per_matrix)


def test_collectives_counted_with_result_bytes():
  mesh = jax.make_mesh((4,), ("d",), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,))
  sharded = NamedSharding(mesh, P("d"))
  fn = jax.jit(lambda x: jnp.sum(x, axis=0), in_shardings=sharded,
               out_shardings=NamedSharding(mesh, P()))
  module = hlo.Module.from_text(fn.lower(jnp.ones((8, 256))).compile().as_text())
  collectives = module.collectives()
  assert collectives["all-reduce"]["count"] == 1
  assert collectives["all-reduce"]["bytes"] == 256 * 4


def test_parse_reads_computations_and_the_entry():
  text = """HloModule m, entry_computation_layout={()->f32[]}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  ROOT %t = (s32[], f32[4]) tuple(%p)
}

ENTRY %main () -> f32[] {
  %init = (s32[], f32[4]) tuple()
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[] constant(0)
}
"""
  module = hlo.Module.from_text(text)
  assert module.entry == "main"
  assert module.runs == {"main": 1, "cond": 1, "body": 7}


def test_strided_convolution_gradients_count_real_taps_only():
  """dx of a stride-2 conv is a conv over a zero-dilated input: a quarter of its taps
  are real. Both gradients then cost what the forward costs."""
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  grads = jax.grad(lambda x, w: conv(x, w).sum(), argnums=(0, 1))
  module, xla = _module(grads, jnp.ones((8, 16, 16, 3)), jnp.ones((3, 3, 3, 5)))
  forward = 2 * 8 * 5 * 3 * (8 * 3 - 1) ** 2   # SAME, stride 2: the last tap is padding
  assert module.matmul_flops() == pytest.approx(2 * forward)
  assert xla == pytest.approx(2 * forward, rel=0.15)   # XLA also skips the padding taps


# XLA:TPU's form of the batched product "btd,ide->ibte" (3 × 256 × 256 weights, batch 8):
# a convolution whose window runs over the 8-long axis of the weights, padded by 7 on each
# side, so that each output position meets exactly one real tap.
_TPU_DOT_AS_CONV = """HloModule m

ENTRY %main (w: bf16[3,256,256,1], x: f32[8,256,256,1]) -> f32[3,256,8,256] {
  %w = bf16[3,256,256,1]{1,2,3,0} parameter(0)
  %x = f32[8,256,256,1]{1,2,0,3} parameter(1)
  ROOT %convolution.72 = f32[3,256,8,256]{3,1,2,0} convolution(%w, %x), window={size=1x8 pad=0_0x7_7 rhs_reversal=0x1}, dim_labels=0fb1_1oi0->0b1f
}
"""


def test_a_batched_dot_lowered_to_a_padded_convolution_counts_its_real_taps():
  module = hlo.Module.from_text(_TPU_DOT_AS_CONV)
  assert module.matmul_flops() == 2 * 8 * 256 * 256 * 3 * 256   # not 8× that


_CUDNN = """HloModule m

ENTRY %main (p0: bf16[8,32,32,3], p1: bf16[64,7,7,3], g: bf16[8,16,16,64]) -> bf16[8,16,16,64] {
  %p0 = bf16[8,32,32,3]{3,2,1,0} parameter(0)
  %p1 = bf16[64,7,7,3]{3,2,1,0} parameter(1)
  %g = bf16[8,16,16,64]{3,2,1,0} parameter(2)
  %fwd = (bf16[8,16,16,64]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %p1), window={size=7x7 stride=2x2 pad=3_3x3_3}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward"
  %din = (bf16[8,32,32,3]{3,2,1,0}, u8[0]{0}) custom-call(%g, %p1), window={size=7x7 stride=2x2 pad=3_3x3_3}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardInput"
  %dw = (bf16[64,7,7,3]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %g), window={size=7x7 stride=2x2 pad=3_3x3_3}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter"
  ROOT %out = bf16[8,16,16,64]{3,2,1,0} get-tuple-element(%fwd), index=0
}
"""


def test_cudnn_convolutions_count_as_their_forward_convolution():
  """XLA:GPU's cuDNN custom calls (not in its cost analysis): forward, input gradient
  and filter gradient of one 7×7 stride-2 convolution each cost the forward's
  2 × output elements × kernel elements per output feature."""
  module = hlo.Module.from_text(_CUDNN)
  forward = 2 * (8 * 16 * 16 * 64) * (7 * 7 * 3)
  assert hlo.cudnn_conv_flops(module) == 3 * forward
  assert module.matmul_flops() == 0          # not dot / convolution instructions


def test_a_conditional_counts_its_costliest_branch_as_xla_does():
  """Each device runs one branch of a lax.switch (the owner-sharded update's form):
  per chip, the costliest branch counts, once; XLA's cost analysis takes the maximum."""
  a = jnp.ones((64, 64))
  small = lambda x: x[:8, :8] @ x[:8, :8]
  big = lambda x: (x @ x)[:8, :8]
  fn = lambda i, x: jax.lax.switch(i, [small, big, small], x)
  module, xla = _module(fn, jnp.int32(0), a)
  assert module.matmul_flops() == 2 * 64 ** 3
  assert xla == pytest.approx(2 * 64 ** 3, rel=0.05)
  (branches,) = [ins for body in module.computations.values() for ins in body
                 if ins.op == "conditional"]
  assert sum(module.runs.get(c, 0) for c in module.computations if c in branches.rest) == 1


def test_collectives_split_by_the_scope_that_runs_them():
  """The all-gather an ``optimizer`` scope runs is its; the all-reduce outside is not."""
  if jax.device_count() < 4:
    pytest.skip("needs 4 (simulated) devices")
  mesh = jax.make_mesh((4,), ("d",), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,))

  def body(x):
    total = jax.lax.psum(x, "d")
    with jax.named_scope("optimizer"), jax.named_scope("owner_sharded"):
      gathered = jax.lax.all_gather(x * 2, "d", tiled=True)
    return total, gathered

  fn = jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=(P("d"), P()),
                     check_vma=False)
  module, _ = _module(fn, jnp.ones((8, 16)))
  assert set(module.collectives()) == {"all-reduce", "all-gather"}
  assert module.collectives(scope="optimizer") == {"all-gather": {"count": 1, "bytes": 8 * 16 * 4}}
  assert module.collectives(scope="optim") == {}


def test_a_guarded_conditional_counts_its_cheapest_branch_when_asked():
  """``guarded_cond`` (a guard's rare fall-back) counts its cheapest branch with
  ``branches="cheapest"`` and its costliest, as XLA does, by default; an unguarded
  ``lax.switch`` (each device's own branch) counts its costliest either way."""
  a = jnp.ones((64, 64))
  small = lambda x: x[:8, :8] @ x[:8, :8]
  big = lambda x: (x @ x)[:8, :8]
  guarded = lambda x: linalg.guarded_cond(jnp.sum(x) > 0, small, big, x)
  fn = lambda i, x: jax.lax.switch(i, [small, guarded], x) + guarded(x)
  module, _ = _module(fn, jnp.int32(0), a)
  cheapest = hlo.Module.from_text(jax.jit(fn).lower(jnp.int32(0), a).compile().as_text(),
                                  branches="cheapest")
  assert module.matmul_flops() == 2 * (2 * 64 ** 3)
  # the switch's costliest branch is the guarded one, itself at its cheapest: two 8³ products
  assert cheapest.matmul_flops() == 2 * (2 * 8 ** 3)
  assert module.with_branches("cheapest").runs == cheapest.runs   # no second parse needed
  with pytest.raises(ValueError, match="branches must be"):
    hlo.Module.from_text("", branches="taken")


@pytest.mark.parametrize("shape", [(40, 20), (3, 40, 20)], ids=["tall", "batched"])
def test_lapack_flops_count_cholesky_qr2s_factor_and_solve(shape):
  """CholeskyQR2 on CPU: with its guards at their cheapest branch, the one pass's
  Cholesky factor (p³/3) and triangular solve (n p²) — no Householder QR; at the
  costliest, the second pass's and Householder's too."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)
  text = jax.jit(linalg.cholesky_qr2).lower(x).compile().as_text()
  *batch, n, p = shape
  matrices = np.prod(batch or [1])
  one_pass = matrices * (p ** 3 / 3 + n * p * p)
  cheapest = hlo.Module.from_text(text, branches="cheapest")
  assert hlo.lapack_qr_flops(cheapest) == 0
  assert hlo.lapack_flops(cheapest) == pytest.approx(one_pass)
  householder = lambda rows, cols: 2 * rows * cols ** 2 - 2 * cols ** 3 / 3
  costliest = hlo.Module.from_text(text)
  assert hlo.lapack_flops(costliest) == pytest.approx(
      2 * one_pass + matrices * 2 * householder(n, p))


def test_kernels_count_a_scopes_launches_per_step():
  """A scanned loop's body launches once per trip (the count is linear in the trips); a
  Cholesky is one library call; what runs outside the ``optimizer`` scope is not its."""
  def fn(ws, x, spd):
    h = jnp.tanh(x @ x.T)                       # outside the scope
    with jax.named_scope("optimizer"):
      y = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w) * 2 + 1, None), x, ws)[0]
      factor = jnp.linalg.cholesky(spd)
    return h, y, factor

  def kernels(layers, scope="optimizer"):
    module, _ = _module(fn, jnp.ones((layers, 16, 16)), jnp.ones((8, 16)),
                        4 * jnp.eye(6) + jnp.ones((6, 6)))
    return module.kernels(scope)

  three, four, six = (sum(kernels(n).values()) for n in (3, 4, 6))
  body = four - three
  assert body >= 1 and six == three + 3 * body
  ours = kernels(3)
  assert [v for k, v in ours.items() if k.startswith("custom-call:") and "potrf" in k] == [1]
  assert sum(kernels(3, None).values()) > three   # the product outside counts there only


def test_matrix_unit_flops_weight_each_product_by_its_bfloat16_passes():
  """A TPU's float32 products: HIGHEST six passes, HIGH / BF16_BF16_F32_X3 three,
  DEFAULT one; bfloat16 operands one; nominal FLOPs count each once."""
  one = 2 * 8 * 16 * 4
  cases = [(lambda a, b: jnp.matmul(a, b, precision="highest"), 6),
           (lambda a, b: jnp.matmul(a, b, precision="high"), 3),
           (lambda a, b: jax.lax.dot(a, b, precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3), 3),
           (lambda a, b: a @ b, 1)]
  for fn, passes in cases:
    module, _ = _module(fn, jnp.ones((8, 16)), jnp.ones((16, 4)))
    assert module.matmul_flops() == one
    assert module.matrix_unit_flops() == passes * one
  text = "\n".join([
      "ENTRY %main (a: bf16[8,16], b: bf16[16,4]) -> f32[8,4] {",
      "  %a = bf16[8,16]{1,0} parameter(0)", "  %b = bf16[16,4]{1,0} parameter(1)",
      "  ROOT %d = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, "
      "rhs_contracting_dims={0}, operand_precision={highest,highest}", "}"])
  assert hlo.Module.from_text(text).matrix_unit_flops() == one   # bfloat16: one pass
