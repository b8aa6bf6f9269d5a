"""A full ResNet training step with the conv kernels on a manifold optimizer vs all-SGD.

Case: a jitted ResNet-50 (``oj.models.ResNet(50, "bn")``) training step —
forward, cross-entropy, backward, update, new BatchNorm statistics — at
batch 32 on 224×224 images. Optimizers (``oj.optim.partition`` by rank: the
53 conv kernels, each in its matrix view ``(kh·kw·cin, cout)``, vs every
other parameter):

* ``sgd``: SGD with momentum 0.9 (``optax.sgd``) on every parameter — the
  baseline;
* ``radam``: conv kernels to ``oj.optim.radam(Stiefel("cayley",
  cayley_iterations=2), reorthonormalize_every=1)`` (Riemannian Adam, iterative Cayley,
  a Newton–Schulz step after each: no branch in the step), the rest SGD momentum;
* ``muon``: conv kernels to ``oj.optim.muon`` (optax's Muon with dimension
  numbers from the matrix views), the rest SGD momentum.

Each step is compiled first (``jax.jit(step).lower(...).compile()``: tracing, lowering
and XLA's compile, reported per optimizer and printed as it finishes, so that a run cut
short by a time limit still says which compile was slow); the compiled steps are then
timed interleaved call by call (:func:`benchmarks._harness.time_fns`), so each ratio
sees one machine load.
The manifold optimizers stack same-shape kernels into one batched update
(:func:`orthojax.linalg.map_views`' buckets: 20 shapes among ResNet-50's 53
kernels); on the CPU the suite also times radam built with ``bucket="per_leaf"``, one
chain of kernels per leaf, and reports the ratio. Batch 32, or 256 (the paper's per-GPU batch) on a GPU.

Targets (GPU only): ``radam / sgd`` <= 1.15x,
``muon / sgd`` <= 1.05x. On CPU they are reported, not judged: there the
per-kernel matrix work competes with convolutions on the same two cores.
``quick`` runs ResNet-18 at batch 2 on 64×64 images (a CPU smoke run).
"""

from __future__ import annotations

import time

import jax
import optax
from flax import nnx

import orthojax as oj
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from orthojax import models

SUITE = "resnet_optim"
TARGETS = {"radam": Target("<=", 1.15, backends=("gpu",)),
           "muon": Target("<=", 1.05, backends=("gpu",))}


def conv_labels(params):
  """``"conv"`` for every rank-4 leaf (conv kernels), ``"sgd"`` for the rest."""
  return jax.tree.map(lambda p: "conv" if p.ndim == 4 else "sgd", params)


def optimizers(lr: float = 0.1, bucket: str = "pad") -> dict[str, optax.GradientTransformation]:
  sgd = lambda: optax.sgd(lr, momentum=0.9)
  cayley = oj.manifolds.Stiefel("cayley", cayley_iterations=2)
  radam = oj.optim.radam(1e-3, cayley, reorthonormalize_every=1, bucket=bucket)
  return {
      "sgd": sgd(),
      "muon": oj.optim.partition(conv_labels, sgd=sgd(),
                                 conv=oj.optim.muon(0.02, bucket=bucket)),
      "radam": oj.optim.partition(conv_labels, sgd=sgd(), conv=radam),
  }


def _train_step(graphdef, tx):
  """``(params, rest, opt_state, x, y) -> (params, rest, opt_state, loss)`` on pure dicts."""

  def step(params, rest, opt_state, x, y):
    def loss_fn(params):
      model = nnx.merge(graphdef, params, rest, copy=True)
      loss = optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
      return loss, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))

    (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_rest, opt_state, loss

  return step


def muon_update_rows(params, config: str, reps: dict) -> list[Row]:
  """orthojax's Muon update against ``optax.contrib.muon``'s on the same conv kernels (the
  same dimension numbers, jitted, timed interleaved): the update alone, target below
  optax's (buckets, and Newton–Schulz on the Gram matrix of each rectangular kernel)."""
  kernels = {jax.tree_util.keystr(p): x for p, x in
             jax.tree_util.tree_flatten_with_path(params)[0] if x.ndim == 4}
  grads = jax.tree.map(lambda x: 0.01 * jax.numpy.ones_like(x), kernels)
  dims = oj.optim.muon_dimension_numbers(kernels)
  txs = {"orthojax": oj.optim.muon(0.02),
         "optax": optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims)}
  states = {name: tx.init(kernels) for name, tx in txs.items()}
  fns = {name: (lambda tx, s: lambda g, p: tx.update(g, s, p)[0])(tx, states[name])
         for name, tx in txs.items()}
  t = time_fns(fns, grads, kernels, **reps)
  return [row(SUITE, f"orthojax muon / optax.contrib.muon update, {config}",
              ratio(t["orthojax"], t["optax"]), "x", Target("<=", 1.0),
              f"{1e3 * t['orthojax']:.0f} vs {1e3 * t['optax']:.0f} ms; "
              f"{len(kernels)} conv kernels, the update alone")]


def run(quick: bool = False) -> list[Row]:
  gpu = jax.default_backend() == "gpu"
  depth, batch, size = (18, 2, 64) if quick else (50, 256 if gpu else 32, 224)
  reps = dict(warmup=1, repeats=2) if quick else dict(warmup=1, repeats=3)
  model = models.ResNet(depth, "bn", num_classes=1000, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  x = jax.random.normal(jax.random.key(0), (batch, size, size, 3))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 1000)
  txs = optimizers()
  if not gpu:   # per leaf: minutes of compile on a GPU (183 s on an H200 at batch 256)
    txs["radam_per_leaf"] = optimizers(bucket="per_leaf")["radam"]
  states = [tx.init(params) for tx in txs.values()]
  compiled, compile_s = {}, {}
  for (name, tx), state in zip(txs.items(), states):
    start = time.perf_counter()
    compiled[name] = jax.jit(_train_step(graphdef, tx)).lower(
        params, rest, state, x, y).compile()
    compile_s[name] = time.perf_counter() - start
    print(f"# {SUITE}: {name} step compiled in {compile_s[name]:.1f} s", flush=True)
  fns = {name: (lambda f, i: lambda p, r, *a: f(p, r, a[i], a[-2], a[-1]))(f, i)
         for i, (name, f) in enumerate(compiled.items())}
  t = time_fns(fns, params, rest, *states, x, y, jit=False, **reps)
  n_conv = sum(p.ndim == 4 for p in jax.tree.leaves(params))
  config = f"ResNet-{depth}, batch {batch}, {size}x{size}"
  rows = [row(SUITE, f"sgd train step, {config}", 1e3 * t["sgd"], "ms",
              note="fwd + bwd + SGD momentum 0.9 on every param, jitted")]
  notes = {"radam": f"{n_conv} conv kernels: radam(Stiefel cayley, 2 iterations); rest SGD-m",
           "muon": f"{n_conv} conv kernels: oj.optim.muon; rest SGD-m"}
  for name in ("radam", "muon"):
    rows.append(row(SUITE, f"{name} / sgd train step, {config}", ratio(t[name], t["sgd"]), "x",
                    TARGETS[name], f"{1e3 * t[name]:.0f} ms; {notes[name]}"))
  rows += [row(SUITE, f"{name} / sgd compile time, {config}",
                ratio(compile_s[name], compile_s["sgd"]), "x",
                note=f"{compile_s[name]:.1f} s vs {compile_s['sgd']:.1f} s (lower + compile)")
           for name in txs if name != "sgd"]
  rows += muon_update_rows(params, config, reps)
  if "radam_per_leaf" in t:
    rows.append(row(SUITE, f"radam bucketed / per leaf train step, {config}",
                    ratio(t["radam"], t["radam_per_leaf"]), "x",
                    note=f"{1e3 * t['radam_per_leaf']:.0f} ms per leaf"))
  return rows

