"""The GPU script: what a lent accelerator must measure, in the order it matters, within
its time (one command, ≤ 8 minutes on a warm H100 or H200).

    python -m benchmarks --only gpu            # on the device
    python -m benchmarks --only gpu --quick    # the CPU check that it runs (ResNet-18, …)

Every row prints the moment it is measured (``# gpu: …``), so a run cut short by the
device's time limit still reports what it finished; every program is compiled on its own
(``jax.jit(…).lower(…).compile()``) and its compile time is a row. In this order:

1. **The update alone** on ResNet-50's 53 conv kernels (``--quick``: ResNet-18's 20):
   radam (iterative Cayley, 2 iterations, a Newton–Schulz step after every step), Muon and
   ``stiefel_muon``, each at float32 products and at its tensor-core precision
   (``precision=None`` on a GPU: three bfloat16 passes for the manifolds, one for Muon),
   and radam at float32 with the clean-up every 100 steps in a branch: compile seconds,
   median milliseconds per update, and for those that keep the manifold the largest
   defect ``‖WᵀW − I‖_F`` after ``N`` steps of random gradients (1,000 on a GPU, one
   scanned program; target ≤ 1e-5, the constraint held at float32 rounding).
2. **ResNet-50 train steps** at batch 256 (``--quick``: ResNet-18, batch 2): SGD, and the
   conv kernels on radam or Muon (the ``resnet_optim`` suite's optimizers), each step's
   compile time over SGD's (target ≤ 2×) and its time over SGD's (targets ≤ 1.05× radam,
   ≤ 1.03× Muon: what the arithmetic allows, the update being ~1 ms at tensor-core rates
   against a 69 ms step).
3. **E8's 4 × 128 transformer steps** (nanoGPT's CPU recipe, batch 12 × 64): AdamW, Muon on
   the hidden matrices, Stiefel hidden matrices with per-output scales on
   ``stiefel_muon``: each over AdamW's (targets ≤ 1.1× Muon, ≤ 1.4× ``stiefel_muon``).

The targets are judged on a GPU and reported elsewhere.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import orthojax as oj
from benchmarks import _harness
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from benchmarks.precision_bench import defect_after
from benchmarks.precision_bench import resnet_kernels
from benchmarks.resnet_optim_bench import _train_step
from benchmarks.resnet_optim_bench import optimizers as resnet_optimizers
from orthojax import models

SUITE = "gpu"
GPU = ("gpu",)
DEFECT = Target("<=", 1e-5, backends=GPU)
COMPILE = Target("<=", 2.0, backends=GPU)
STEP = {"radam": Target("<=", 1.05, backends=GPU), "muon": Target("<=", 1.03, backends=GPU)}
E8 = {"muon": Target("<=", 1.1, backends=GPU), "stiefel_muon": Target("<=", 1.4, backends=GPU)}


def _emit(rows: list[Row], new: Row) -> None:
  """Keep ``new`` and print it now: a run cut short still says what it measured."""
  rows.append(new)
  print(f"# {SUITE}: {new.case}: {new.value:.4g} {new.unit} [{new.status}] {new.note}",
        flush=True)


def _compiled(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
  """``fn`` compiled for ``args`` on its own, and the seconds it took."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - start


def update_optimizers() -> dict[str, optax.GradientTransformation]:
  """The update-alone rows' optimizers, each at each precision it is offered at."""
  txs = {}
  for precision in ("highest", "bf16x3"):
    cayley = oj.manifolds.Stiefel("cayley", cayley_iterations=2, precision=precision)
    txs[f"radam {precision}"] = oj.optim.radam(1e-3, cayley, reorthonormalize_every=1)
  txs["radam highest, clean-up every 100 steps"] = oj.optim.radam(
      1e-3, oj.manifolds.Stiefel("cayley", cayley_iterations=2, precision="highest"),
      reorthonormalize_every=100)
  for precision in ("highest", "bf16"):
    txs[f"muon {precision}"] = oj.optim.muon(0.02, precision=precision)
  for precision in ("highest", "bf16x3"):
    txs[f"stiefel_muon {precision}"] = oj.optim.stiefel_muon(0.02, precision=precision)
  return txs


def _update_rows(rows: list[Row], quick: bool) -> None:
  depth, steps = (18, 20) if quick else (50, 1000)
  params = resnet_kernels(depth)
  grads = jax.tree.map(lambda p: 0.01 * jnp.ones_like(p), params)
  config = f"ResNet-{depth}'s {len(params)} conv kernels"
  for name, tx in update_optimizers().items():
    state = tx.init(params)
    update, seconds = _compiled(lambda g, s, p, tx=tx: tx.update(g, s, p), grads, state, params)
    _emit(rows, row(SUITE, f"{name} update compile, {config}", seconds, "s"))
    median = time_fns({name: update}, grads, state, params, jit=False, warmup=1,
                      repeats=3 if quick else 10)[name]
    _emit(rows, row(SUITE, f"{name} update, {config}", 1e3 * median, "ms"))
    if not name.startswith("muon"):
      _emit(rows, _defect_row(name, tx, params, steps, config))


def _defect_row(name: str, tx: optax.GradientTransformation, params: dict[str, jax.Array],
                steps: int, config: str) -> Row:
  """The largest ``‖WᵀW − I‖_F`` after ``steps`` updates on random gradients (one scan)."""
  start = time.perf_counter()
  defect = defect_after(tx, params, steps)
  return row(SUITE, f"{name} defect after {steps} steps, {config}", defect(), "", DEFECT,
             f"float32; compiled and run in {time.perf_counter() - start:.1f} s")


def _step_rows(rows: list[Row], quick: bool) -> None:
  gpu = jax.default_backend() == "gpu"
  depth, batch, size = (18, 2, 64) if quick else (50, 256 if gpu else 32, 224)
  graphdef, params, rest = _split(models.ResNet(depth, "bn", num_classes=1000,
                                                 rngs=nnx.Rngs(0)))
  x = jax.random.normal(jax.random.key(0), (batch, size, size, 3))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 1000)
  config = f"ResNet-{depth}, batch {batch}"
  _timed_steps(rows, config, graphdef, params, rest, x, y, resnet_optimizers(), "sgd",
               STEP, quick)


def _e8_rows(rows: list[Row], quick: bool) -> None:
  depth = 2 if quick else 4
  build = lambda **kw: models.TransformerLM(65, depth=depth, width=128, heads=4,
                                            rngs=nnx.Rngs(0), **kw)
  tokens = jax.random.randint(jax.random.key(0), (12, 65), 0, 65)
  config = f"E8 {depth} × 128, batch 12 × 64"
  plain, stiefel = build(), build(stiefel=models.TransformerLM.MATRICES, scale="output")
  views = nnx.to_pure_dict(oj.nn.matrix_views(plain))
  stiefel_tx = oj.optim.partition(
      stiefel, stiefel=oj.optim.stiefel_muon(0.02, views=oj.nn.matrix_views(stiefel)),
      euclidean=optax.adamw(1e-3))
  x, y = tokens[:, :-1], tokens[:, 1:]
  _timed_steps(rows, config, *_split(plain), x, y,
               {"adamw": optax.adamw(1e-3), "muon": oj.optim.muon(0.02, views=views)},
               "adamw", E8, quick)
  _timed_steps(rows, config, *_split(stiefel), x, y, {"stiefel_muon": stiefel_tx}, None, {},
               quick)
  step_ms = {r.case: r.value for r in rows}
  _emit(rows, row(SUITE, f"stiefel_muon / adamw step, {config}",
                  step_ms[f"stiefel_muon step, {config}"] / step_ms[f"adamw step, {config}"],
                  "x", E8["stiefel_muon"], "timed apart (another model's step)"))


def _split(model: nnx.Module) -> tuple[Any, Any, Any]:
  """``(graphdef, params, rest)`` with the states as plain dicts."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rest)


def _timed_steps(rows, config, graphdef, params, rest, x, y, txs, baseline, targets, quick):
  """Each train step compiled on its own (a row), then all timed interleaved: a row each
  in milliseconds, and over ``baseline``'s where one is named."""
  compiled, states, seconds = {}, {}, {}
  for name, tx in txs.items():
    states[name] = tx.init(params)
    compiled[name], seconds[name] = _compiled(_train_step(graphdef, tx), params, rest,
                                              states[name], x, y)
    _emit(rows, row(SUITE, f"{name} step compile, {config}", seconds[name], "s"))
  fns = {name: (lambda f, s: lambda p, r: f(p, r, s, x, y))(compiled[name], states[name])
         for name in txs}
  t = time_fns(fns, params, rest, jit=False, warmup=1, repeats=2 if quick else 10)
  for name in txs:
    _emit(rows, row(SUITE, f"{name} step, {config}", 1e3 * t[name], "ms"))
    if baseline is not None and name != baseline:
      _emit(rows, row(SUITE, f"{name} / {baseline} step, {config}",
                      ratio(t[name], t[baseline]), "x", targets.get(name)))
      _emit(rows, row(SUITE, f"{name} / {baseline} compile, {config}",
                      ratio(seconds[name], seconds[baseline]), "x", COMPILE))


def run(quick: bool = False) -> list[Row]:
  rows: list[Row] = []
  print(f"# {SUITE}: {_harness.format_device(_harness.device_description())}", flush=True)
  for section in (_update_rows, _step_rows, _e8_rows):
    section(rows, quick)
  return rows
