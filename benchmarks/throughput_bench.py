"""ResNet-50 training throughput in bfloat16: orthojax's trainer step vs the Flax recipe.

Cases (all four steps timed interleaved, call by call, so every ratio sees
one machine load; images/s = batch / median step time):

* ``flax recipe, BN``: the Flax ImageNet example's recipe
  (:mod:`benchmarks._flax_recipe`: Linen ResNet-50 v1.5 computing in
  bfloat16, L2 in the loss, Nesterov SGD with warmup + cosine).
* ``orthojax, bn`` / ``gmp_imn`` / ``wn_mbn``: the step the trainer runs for
  E1 — :func:`orthojax.train.step.make_train_step` on the model
  ``model_zoo.build`` makes from E1's config (``e1_resnet50_<norm>.flags`` with
  ``--config.compute_dtype=bfloat16``,
  SGD momentum 0.9, L2 1e-4 on the kernels, plateau learning-rate scale,
  the non-finite guard, loss / accuracy / gradient-norm metrics).

Targets: ``orthojax bn / flax recipe`` ≥ 1 (at least
the recipe's throughput), ``gmp_imn / bn`` ≥ 0.9 and ``wn_mbn / bn`` ≥ 0.9,
all as throughput ratios, on every backend. Batch: 32 at 224² on CPU, 256 on
an accelerator (the recipe's per-device batch with mixed precision).
Neither step donates its inputs here (each is called repeatedly on the same
state); the trainer donates, which saves a copy of the state per step.

``quick`` runs ResNet-18 at batch 2 on 64×64 images (a CPU smoke run); its
ratios are report-only.
"""

from __future__ import annotations

import jax
from flax import nnx

from benchmarks import _flax_recipe
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from benchmarks.scale_bench import flagfile_config
from orthojax import models
from orthojax.train import losses
from orthojax.train import model_zoo
from orthojax.train import optimizers
from orthojax.train.data._info import DatasetInfo
from orthojax.train.step import TrainState
from orthojax.train.step import make_train_step

SUITE = "throughput"
AT_LEAST_RECIPE = Target(">=", 1.0)
AT_LEAST_90 = Target(">=", 0.9)
NORMS = tuple(n for n in models.ResNet.NORMS if n != "none")


def _orthojax_step(norm: str, depth: int, image_size: int, batch: int):
  """E1's trainer step for ``norm`` (from its flagfile, in bfloat16) and its initial state."""
  config = flagfile_config(  # no workdir: the step only (checkpoint.every_steps=0)
      f"e1_resnet50_{norm}.flags", f"--config.model.depth={depth}",
      f"--config.batch_size={batch}", f"--config.optimizer.euclidean.learning_rate={0.1 * batch / 256}",
      "--config.compute_dtype=bfloat16")
  info = DatasetInfo(name="imagenet2012", task="classification",
                     input_shape=(image_size, image_size, 3), num_classes=1000,
                     num_train=1281167, num_eval=50000, eval_split="validation")
  model = model_zoo.build(config, info, nnx.Rngs(0))
  model.train()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  tx = optimizers.build(config, total_steps=config.num_epochs * 5004)
  state = TrainState.create(params, nnx.to_pure_dict(rest), tx)
  step = make_train_step(graphdef, tx, losses.get_loss(config.loss), classification=True,
                         compute_dtype=model_zoo.compute_dtype(config),
                         nan_policy=config.nan_policy,
                         scale_updates=config.schedule == "plateau")
  return step, state


def run(quick: bool = False) -> list[Row]:
  """Run the throughput suite; ``quick`` uses ResNet-18, batch 2, 64×64 (report-only)."""
  on_cpu = jax.default_backend() == "cpu"
  depth, batch, size = (18, 2, 64) if quick else (50, 32 if on_cpu else 256, 224)
  reps = dict(warmup=1, repeats=2) if quick else dict(warmup=1, repeats=5)
  x = jax.random.normal(jax.random.key(0), (batch, size, size, 3))
  y = jax.random.randint(jax.random.key(1), (batch,), 0, 1000)

  recipe = _flax_recipe.resnet(depth)
  recipe_tx = _flax_recipe.optimizer(batch)
  recipe_step = _flax_recipe.make_train_step(recipe, recipe_tx)
  recipe_state = _flax_recipe.init(recipe, recipe_tx, size)
  fns = {"recipe": lambda states, x, y: recipe_step(*states["recipe"], x, y)}
  states = {"recipe": recipe_state}
  for norm in NORMS:
    step, states[norm] = _orthojax_step(norm, depth, size, batch)
    fns[norm] = (lambda step, norm: lambda states, x, y: step(states[norm], {"x": x, "y": y}))(
        step, norm)
  t = time_fns(fns, states, x, y, **reps)

  config = f"ResNet-{depth}, batch {batch}, {size}x{size}, bfloat16"
  per_s = {k: batch / v for k, v in t.items()}
  rows = [row(SUITE, f"flax recipe BN, {config}", per_s["recipe"], "img/s",
              note=f"step {1e3 * t['recipe']:.0f} ms")]
  rows += [row(SUITE, f"orthojax {norm}, {config}", per_s[norm], "img/s",
               note=f"step {1e3 * t[norm]:.0f} ms") for norm in NORMS]
  rows.append(row(SUITE, "orthojax bn / flax recipe throughput", ratio(t["recipe"], t["bn"]), "x",
                  None if quick else AT_LEAST_RECIPE, "same device, batch and dtype"))
  for norm in ("gmp_imn", "wn_mbn"):
    rows.append(row(SUITE, f"{norm} / bn throughput", ratio(t["bn"], t[norm]), "x",
                    None if quick else AT_LEAST_90, "orthojax trainer step, both"))
  return rows
