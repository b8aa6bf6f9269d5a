"""The training loop: one linear ``train(config)`` in banner-commented sections.

Mesh → input → model (abstract) → shardings → optimizer → init or restore →
jitted step → loop (log, eval, plateau / early stopping, checkpoint,
preemption) → final eval. The same code runs on one CPU, simulated CPU
devices, a GPU and a multi-host pod: everything device-specific is the mesh.

Exact resume: the checkpoint holds the train state *and* the number of
batches consumed; the input pipeline is deterministic from the seed and
restarts at that batch, so a run killed at any step and restarted produces
the same parameters as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable

import jax
from flax import nnx

import orthojax as oj
from orthojax.train import checkpoint as ckpt_lib
from orthojax.train import data as data_lib
from orthojax.train import losses as losses_lib
from orthojax.train import mesh as mesh_lib
from orthojax.train import metrics as metrics_lib
from orthojax.train import model_zoo
from orthojax.train import optimizers
from orthojax.train.config import Config
from orthojax.train.step import TrainState
from orthojax.train.step import make_eval_step
from orthojax.train.step import make_train_step


class NonFiniteLossError(FloatingPointError):
  """Training produced a non-finite loss or gradient (``--nan_policy=stop``)."""


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  Attributes:
    final_step: steps taken (less than planned after early stopping or preemption).
    train_metrics: the last logged train metrics (means over its logging interval).
    eval_metrics: the final evaluation on the eval split — of the best state
      with ``--restore_best``, else of the last one.
    best_eval: ``{metric: best value, "step": …, "stopped_early": …}`` or None.
    preempted: stopped by SIGTERM (rerun to resume).
    state: the last train state.
    best_state: the state of the best evaluation (``--restore_best``), else None.
    split_metrics: ``{split: metrics}`` for each of ``--final_eval_splits``,
      of the same state as ``eval_metrics``.
  """

  final_step: int
  train_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  best_eval: dict[str, float] | None
  preempted: bool
  state: TrainState
  best_state: TrainState | None = None
  split_metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


def _pure(state: nnx.State) -> Any:
  return nnx.to_pure_dict(state)


def _eval_metric(config: Config, classification: bool) -> tuple[str, str]:
  """The metric plateau / early stopping watch, and whether higher is better."""
  return ("top1", "max") if classification else ("loss", "min")


def evaluate(eval_step: Callable, state: TrainState, batches, mesh) -> dict[str, float]:
  """Run ``eval_step`` over the eval batches and total the masked sums."""
  totals: dict[str, float] = {}
  for local in batches:
    sums = eval_step(state, mesh_lib.global_batch(local, mesh))
    for k, v in jax.device_get(sums).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  count = totals.pop("count", 0.0)
  if count == 0:
    raise ValueError("evaluation saw no examples")
  out = {k: v / count for k, v in totals.items()}
  if "sq_error" in out:
    out["rmse"] = math.sqrt(out.pop("sq_error"))
  out["examples"] = count
  return out


def train(config: Config, *, hooks: tuple[Callable[..., Any], ...] = (),
          devices: list[jax.Device] | None = None, print_fn=print) -> TrainResult:
  """Train ``config``; resumes from ``config.workdir`` when it holds a checkpoint.

  Args:
    config: the run's (validated here) config.
    hooks: callables ``hook(step, params) -> dict`` called every
      ``--spectrum_every`` steps; their scalars go to the metrics log
      (e.g. ``oj.analysis`` spectrum tracking).
    devices: the devices to build the mesh over (default: all).
    print_fn: console output.

  Raises:
    NonFiniteLossError: a non-finite loss with ``--nan_policy=stop``; the
      message has the step, and no checkpoint is written after it.
  """
  # ----------------------------------------------------------------- Mesh --
  devices = list(jax.devices() if devices is None else devices)
  config.validate(num_devices=len(devices), num_processes=jax.process_count())
  mesh = mesh_lib.make_mesh(config.mesh_data, config.mesh_fsdp, config.mesh_model, devices)
  local_batch = mesh_lib.check_global_batch(config.batch_size, mesh)

  # ---------------------------------------------------------------- Input --
  options = config.options
  data_dir = config.data_dir or None
  info = data_lib.dataset_info(config.dataset, data_dir=data_dir, **options)
  classification = info.task == "classification"
  steps_per_epoch = max(info.num_train // config.batch_size, 1)
  total_steps = config.num_steps or int(math.ceil(config.num_epochs * steps_per_epoch))
  eval_batch = config.eval_batch_size or config.batch_size
  eval_local = mesh_lib.check_global_batch(eval_batch, mesh, "--eval_batch_size")

  # ---------------------------------------------------------------- Model --
  build_model = lambda: model_zoo.build(config, info, nnx.Rngs(config.seed))
  abstract = nnx.eval_shape(build_model)
  abstract.train()
  graphdef_train, abs_params, abs_rest = nnx.split(abstract, nnx.Param, ...)
  abstract.eval()
  graphdef_eval = nnx.split(abstract, nnx.Param, ...)[0]
  labels = _pure(oj.nn.manifold_labels(abs_params)) if config.weights != "euclidean" else None
  views = _pure(oj.nn.matrix_views(abs_params))   # stacks (scanned layers) carry theirs
  penalty_mask = model_zoo.penalty_mask(config, abstract, _pure(abs_params))

  # -------------------------------------------------------------- Sharding --
  tx = optimizers.build(config, total_steps=total_steps, labels=labels, views=views,
                        penalty_mask=penalty_mask)
  params_sh = mesh_lib.param_shardings(abs_params, mesh)
  rest_sh = mesh_lib.param_shardings(abs_rest, mesh)
  rep = mesh_lib.replicated(mesh)
  opt_sh = mesh_lib.opt_state_shardings(tx, _pure(abs_params), params_sh, mesh)
  state_sh = TrainState(step=rep, params=params_sh, model_state=rest_sh, opt_state=opt_sh,
                        rng=rep, lr_scale=rep, first_nonfinite_step=rep, skipped_steps=rep)

  def init() -> TrainState:
    model = build_model()
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return TrainState.create(_pure(params), _pure(rest), tx, jax.random.key(config.seed + 1))

  # ------------------------------------------------------ Init or restore --
  checkpointer = None
  best_state: TrainState | None = None   # --restore_best: a copy at the best eval
  meta: dict[str, Any] = {"batches_consumed": 0, "best": None, "best_step": None,
                          "evals_since_best": 0, "plateau_evals": 0}
  if config.workdir:
    checkpointer = ckpt_lib.Checkpointer(os.path.join(config.workdir, "checkpoints"),
                                         every_steps=config.checkpoint_every,
                                         keep=config.keep_checkpoints)
  latest = checkpointer.latest_step() if checkpointer else None
  if latest is not None:
    abstract_state = jax.eval_shape(init)
    target = ckpt_lib.abstract_like(abstract_state, state_sh)
    state, restored_meta = checkpointer.restore(latest, target)
    best_state = restored_meta.pop("best_state", None)
    meta.update(restored_meta)
    print_fn(f"Resumed from {checkpointer.directory} at step {latest}", flush=True)
  else:
    state = jax.jit(init, out_shardings=state_sh)()

  # ----------------------------------------------------------------- Steps --
  loss_fn = losses_lib.get_loss(config.loss, config.label_smoothing)
  compute_dtype = model_zoo.compute_dtype(config)
  train_step = jax.jit(
      make_train_step(graphdef_train, tx, loss_fn, classification=classification,
                      compute_dtype=compute_dtype, grad_accum_steps=config.grad_accum_steps,
                      nan_policy=config.nan_policy, scale_updates=config.schedule == "plateau"),
      in_shardings=(state_sh, mesh_lib.batch_sharding(mesh)),
      out_shardings=(state_sh, rep), donate_argnums=0)
  eval_step = jax.jit(make_eval_step(graphdef_eval, loss_fn, classification=classification,
                                     compute_dtype=compute_dtype),
                      in_shardings=(state_sh, mesh_lib.batch_sharding(mesh)), out_shardings=rep)

  def eval_batches(split: str = "eval"):
    return data_lib.eval_batches(config.dataset, batch_size=eval_local, split=split,
                                 data_dir=data_dir, **options)

  # ------------------------------------------------------------------ Loop --
  writer = metrics_lib.MetricsWriter(config.workdir or None, total_steps, print_fn=print_fn)
  watch, mode = _eval_metric(config, classification)
  step = int(jax.device_get(state.step))
  batches = mesh_lib.prefetch_to_mesh(data_lib.train_batches(
      config.dataset, batch_size=local_batch, seed=config.seed,
      start_batch=int(meta["batches_consumed"]), data_dir=data_dir, **options), mesh)
  interval = metrics_lib.IntervalMean()
  train_metrics: dict[str, float] = {}
  eval_metrics: dict[str, float] = {}
  split_metrics: dict[str, dict[str, float]] = {}
  preempted = stopped_early = False
  if checkpointer:
    checkpointer.install_sigterm_handler()

  def check_finite():
    bad = int(jax.device_get(state.first_nonfinite_step))
    if bad >= 0 and config.nan_policy == "stop":
      if checkpointer:
        checkpointer.wait()
      last = checkpointer.latest_step() if checkpointer else None
      raise NonFiniteLossError(
          f"non-finite loss or gradient at step {bad}; stopped. "
          + (f"The last good checkpoint (step {last}) in {checkpointer.directory} is intact."
             if last is not None else "No checkpoint was written."))

  saved_step = latest

  def save():
    """Save ``step`` unless it is already saved (a periodic save at a preemption step)."""
    nonlocal saved_step
    check_finite()
    if saved_step == step:
      return
    checkpointer.save(step, state, {**meta, "config": dataclasses.asdict(config)},
                      best=best_state if config.restore_best else None)
    saved_step = step

  try:
    start_time = time.perf_counter()
    while step < total_steps:
      state, metrics = train_step(state, next(batches))
      interval.add(metrics)
      step += 1
      meta["batches_consumed"] = int(meta["batches_consumed"]) + 1

      if step % config.log_every == 0 or step == total_steps:
        check_finite()
        values = interval.result()   # means over the steps since the last log
        values["lr_scale"] = jax.device_get(state.lr_scale)
        train_metrics = writer.write(step, values, "train")
      if config.spectrum_every and step % config.spectrum_every == 0:
        for hook in hooks:
          values = hook(step, state.params)
          if values:   # a hook may measure on its own schedule and return {} between
            writer.write(step, values, "spectrum", console=False)

      if config.eval_every and step % config.eval_every == 0 and step < total_steps:
        eval_metrics = writer.write(step, evaluate(eval_step, state, eval_batches(), mesh), "eval")
        stop = _track_best(config, meta, eval_metrics[watch], mode, step)
        if config.restore_best and meta["best_step"] == step:
          best_state = jax.tree.map(lambda x: x.copy(), state)   # `state` is donated next step
        if config.schedule == "plateau" and meta["plateau_evals"] >= config.plateau_patience:
          meta["plateau_evals"] = 0
          state = state._replace(lr_scale=state.lr_scale * config.plateau_factor)
          print_fn(f"Plateau: learning rate x{float(state.lr_scale):.3g}", flush=True)
        if stop:
          stopped_early = True
          print_fn(f"Early stopping at step {step}: no improvement in {watch} for "
                   f"{config.early_stopping_patience} evals (best at step {meta['best_step']})",
                   flush=True)
          break

      if checkpointer and checkpointer.should_save(step):
        save()
      if checkpointer and checkpointer.preempted(step):
        save()
        checkpointer.wait()
        preempted = True
        print_fn(f"Preempted: saved step {step}; rerun the same command to resume.", flush=True)
        break
    check_finite()
    elapsed = time.perf_counter() - start_time

    # ------------------------------------------------------------ Final --
    if not preempted:
      if checkpointer:
        save()
      final = best_state if config.restore_best and best_state is not None else state
      if final is best_state:
        print_fn(f"Restored the best state (step {meta['best_step']}) for the final "
                 f"evaluation", flush=True)
      eval_metrics = writer.write(step, evaluate(eval_step, final, eval_batches(), mesh), "eval")
      for split in config.final_eval_splits:
        split_metrics[split] = writer.write(
            step, evaluate(eval_step, final, eval_batches(split), mesh), split)
      print_fn(f"Done: {step} steps in {elapsed:.1f} s", flush=True)
  finally:
    writer.close()
    if checkpointer:
      checkpointer.close()

  best = None
  if meta.get("best") is not None:
    best = {watch: meta["best"], "step": meta["best_step"], "stopped_early": stopped_early}
  return TrainResult(final_step=step, train_metrics=train_metrics, eval_metrics=eval_metrics,
                     best_eval=best, preempted=preempted, state=state,
                     best_state=best_state if config.restore_best else None,
                     split_metrics=split_metrics)


def _track_best(config: Config, meta: dict[str, Any], value: float, mode: str,
                step: int) -> bool:
  """Update the best value and patience counters; returns whether to stop now."""
  best = meta.get("best")
  improved = best is None or (value > best if mode == "max" else value < best)
  if improved:
    meta.update(best=float(value), best_step=step, evals_since_best=0, plateau_evals=0)
  else:
    meta["evals_since_best"] = int(meta["evals_since_best"]) + 1
    meta["plateau_evals"] = int(meta["plateau_evals"]) + 1
  return bool(config.early_stopping_patience
              and meta["evals_since_best"] >= config.early_stopping_patience)
