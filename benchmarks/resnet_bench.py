"""Benchmarks for the ResNet variants: one full training step, GmP+IMN and WN+MBN vs BN.

Case: a jitted ResNet-50 training step — forward, cross-entropy loss,
backward, SGD with momentum 0.9 (``optax.sgd``), new BatchNorm / mean-norm
running statistics — at batch 32 on 224×224 images, for ``norm`` in
``bn``, ``gmp_imn`` and ``wn_mbn``. The three steps are timed interleaved
call by call (:func:`benchmarks._harness.time_fns`), so each ratio sees one
machine load.

* ``gmp_imn / bn``: target ≤ 1.3× on CPU. Per conv the GmP step adds the
  direction map ``U(θ)`` (O(fan_in·fan_out), forward and backward) and an
  IMN (one batch mean, one subtraction) in front of 52 of the 53 convs;
  against the O(batch·H·W·fan_in·fan_out) convolutions at batch 32 that is
  small, and GmP drops the BN variance pass and scale.
* ``wn_mbn / bn``: report only (WN's per-conv norm plus a mean-only BN).

``quick`` runs ResNet-18 at batch 2 on 64×64 images with fewer repeats (a
CPU smoke run of about a minute); its ratios are report-only.
"""

from __future__ import annotations

import jax
import optax
from flax import nnx

from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from orthojax import models

SUITE = "resnet"
TARGET = Target("<=", 1.3, backends=("cpu",))
NORMS = tuple(n for n in models.ResNet.NORMS if n != "none")


def _train_step(model: nnx.Module, tx: optax.GradientTransformation):
  """``(params, rest, opt_state, x, y) -> (params, rest, opt_state, loss)`` and its inputs."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = tx.init(params)

  def step(params, rest, opt_state, x, y):
    def loss_fn(params, rest):
      model = nnx.merge(graphdef, params, rest, copy=True)
      logits = model(x)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
      return loss, nnx.split(model, nnx.Param, ...)[2]  # updated running statistics

    (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, new_rest, opt_state, loss

  return step, (params, rest, opt_state)


def run(quick: bool = False) -> list[Row]:
  """Run the ResNet suite; ``quick`` uses ResNet-18, batch 2, 64×64 (report-only)."""
  depth, batch, size = (18, 2, 64) if quick else (50, 32, 224)
  reps = dict(warmup=1, repeats=2) if quick else dict(warmup=1, repeats=3)
  x = jax.random.normal(jax.random.key(0), (batch, size, size, 3))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 1000)
  tx = optax.sgd(0.1, momentum=0.9)
  fns, args = {}, []
  for i, norm in enumerate(NORMS):
    model = models.ResNet(depth, norm, num_classes=1000, rngs=nnx.Rngs(0))
    step, state = _train_step(model, tx)
    fns[norm] = (lambda step, i: lambda *a: step(*a[3 * i:3 * i + 3], a[-2], a[-1]))(step, i)
    args += list(state)
  t = time_fns(fns, *args, x, y, **reps)
  config = f"ResNet-{depth}, batch {batch}, {size}x{size}"
  rows = [row(SUITE, f"{norm} train step, {config}", 1e3 * t[norm], "ms",
              note="fwd + bwd + SGD momentum, jitted") for norm in NORMS]
  rows.append(row(SUITE, f"gmp_imn / bn train step, {config}", ratio(t["gmp_imn"], t["bn"]), "x",
                  None if quick else TARGET, "GmP convs + IMN vs conv + BatchNorm"))
  rows.append(row(SUITE, f"wn_mbn / bn train step, {config}", ratio(t["wn_mbn"], t["bn"]), "x",
                  note="WN convs + mean-only BN vs conv + BatchNorm (report only)"))
  return rows
