"""The training run: build → compile → loop, for the zoo's models and for yours.

:func:`train` builds the run's program (:func:`orthojax.train.program.build_program`:
mesh, model, optimizer, shardings, jitted steps), compiles its steps ahead of
time (:func:`~orthojax.train.program.compile_program` — the same two calls the
pod compile check makes on abstract TPU devices), initialises or restores the
train state, and loops: log, evaluate, reduce on plateau / stop early,
checkpoint, stop at preemption; then the final evaluation. The same code runs
on one CPU, simulated CPU devices, a GPU and a multi-host pod: everything
device-specific is the mesh.

Two entry points share everything after the model and the data:
:func:`train` takes a config that names a zoo model and a registered dataset;
:func:`fit` takes your own model, optimizer and batches::

    import optax
    import orthojax as oj
    from orthojax.train import fit, Config

    def model_fn(rngs):                 # any nnx.Module
      return MyNet(rngs=rngs)

    def optimizer(params):              # or simply an optax chain
      labels = ...                      # e.g. "stiefel" for hidden kernels, else "euclidean"
      return oj.optim.partition(labels, stiefel=oj.optim.radam(1e-3, ...),
                                euclidean=optax.adamw(1e-3))

    result = fit(model_fn, optimizer, batches, Config(batch_size=64, num_steps=1000,
                                                      workdir="runs/mine",
                                                      checkpoint={"every_steps": 100}))

both with the same mesh, sharding rules, jitted step, Orbax checkpoints with exact
resume, non-finite guard, metrics and hooks (the compile check one floor above,
:func:`orthojax.compile.aot.compile_for`, takes the same ``model_fn`` and ``optimizer``).

Exact resume: the checkpoint holds the train state *and* the loop's
bookkeeping (:class:`LoopState`, incl. the number of batches consumed); the
input pipeline is deterministic from the seed and restarts at that batch, so
a run killed at any step and restarted produces the same parameters as an
uninterrupted one.

Console: the run's lines (progress with step, loss, steps/s and ETA; resume) go
to Python :mod:`logging`, logger ``orthojax.train.trainer``, at INFO (warnings at
WARNING) — absl's ``app.run`` shows them, as does
``logging.basicConfig(level=logging.INFO)`` — unless ``print_fn`` is given: then
each line is handed to ``print_fn(line)`` instead (``print``, ``list.append``).

A run is a :class:`Loop`, built then run: building touches no file; :meth:`Loop.run`
takes the workdir, compiles, restores or initialises the state, writes ``config.json``
and trains.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from etils import epath
from flax import nnx
import jax
import optax

from orthojax.train import fingerprint
from orthojax.train import inputs
from orthojax.train import mesh as mesh_lib
from orthojax.train import metrics as metrics_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.optimizers import OptimizerArg
from orthojax.train.optimizers import user_optimizer
from orthojax.train.program import CompiledProgram
from orthojax.train.program import ModelFn
from orthojax.train.program import Program
from orthojax.train.program import build_program
from orthojax.train.program import compile_program
from orthojax.train.program import dataset_info
from orthojax.train.resume import earlier_layout
from orthojax.train.resume import resume_differences
from orthojax.train.step import TrainState
from orthojax.train.workdir_lock import WorkdirLock

if TYPE_CHECKING:   # Orbax is imported when a run opens its checkpoints (Loop._start)
  from orthojax.train import checkpoint as ckpt_lib

_LOG = logging.getLogger(__name__)

PrintFn = Callable[[str], Any]
"""``print_fn(line)``: the hook for a run's console lines, called once per line with the
line alone (no keywords). None (the default of :func:`train` and :func:`fit`): the lines
go to the ``orthojax.train.trainer`` logger at INFO, warnings at WARNING."""

Hook = Callable[[int, Any], dict[str, Any]]
"""``hook(step, model) -> metrics``: called on ``config.hooks``'s schedule with the model
(eval mode) holding the state after ``step`` updates (``Program.model``); its scalars
go to ``metrics.jsonl`` (split ``spectrum``) — big_vision's evaluators, for measurements."""

# The exit status of a run stopped by preemption (SIGTERM) after saving its
# checkpoint: sysexits.h's EX_TEMPFAIL, "temporary failure, retry". Schedulers
# and launch/ scripts requeue on it; 0 means finished, anything else failed.
PREEMPTED_EXIT_CODE = 75
# With nan_policy="skip", the skipped fraction is judged from this many steps on.
MIN_STEPS_FOR_SKIPPED_FRACTION = 20


class NonFiniteLossError(FloatingPointError):
  """Training produced a non-finite loss or gradient (``config.nan_policy="stop"``)."""


DEFECT_TOLERANCE = 1e-2
"""The largest orthogonality defect of the manifold parameters (``‖WᵀW − I‖_F`` for a
Stiefel matrix) above which a run warns once: float32 Riemannian steps stay near 1e-5."""

@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  Attributes:
    final_step: steps taken (less than planned after early stopping or preemption).
    train_metrics: the last logged train metrics (means over its logging interval).
    eval_metrics: the final evaluation on the eval split — of the best state
      with ``config.restore_best``, else of the last one.
    best_eval: ``{metric: best value, "step": …, "stopped_early": …}`` or None.
    preempted: stopped by SIGTERM (rerun to resume).
    state: the last train state.
    best_state: the state of the best evaluation (``config.restore_best``), else None.
    split_metrics: ``{split: metrics}`` for each of ``config.final_eval_splits``,
      of the same state as ``eval_metrics``.
    model: the trained ``nnx`` model (eval mode) holding ``state``'s parameters and
      statistics (``Program.model(state)`` of ``orthojax.train.program``).
  """

  final_step: int
  train_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  best_eval: dict[str, float] | None
  preempted: bool
  state: TrainState
  best_state: TrainState | None = None
  split_metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  model: Any = None


@dataclasses.dataclass
class LoopState:
  """The loop's bookkeeping besides the train state; saved in every checkpoint.

  Attributes:
    batches_consumed: training batches stepped on (the input position to resume at).
    interval: the open logging interval's partial sums (``IntervalMean.state_dict``).
    best: the best value of the watched eval metric so far (None before the first eval).
    best_step: the step of that evaluation.
    evals_since_best: evaluations without improvement (early stopping).
    plateau_evals: evaluations without improvement since the last lr decay.
  """

  batches_consumed: int = 0
  interval: dict[str, list[float]] = dataclasses.field(default_factory=dict)
  best: float | None = None
  best_step: int | None = None
  evals_since_best: int = 0
  plateau_evals: int = 0

  @classmethod
  def from_meta(cls, meta: dict[str, Any]) -> "LoopState":
    return cls(**{f.name: meta[f.name] for f in dataclasses.fields(cls) if f.name in meta})

  def track(self, value: float, higher_is_better: bool, step: int) -> None:
    """Record an evaluation of the watched metric."""
    improved = self.best is None or (value > self.best if higher_is_better else value < self.best)
    if improved:
      self.best, self.best_step = float(value), step
      self.evals_since_best = self.plateau_evals = 0
    else:
      self.evals_since_best += 1
      self.plateau_evals += 1


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


def train(config: Config, *, hooks: tuple[Hook, ...] = (),
          devices: list[jax.Device] | None = None,
          print_fn: PrintFn | None = None) -> TrainResult:
  """Train ``config``; resumes from ``config.workdir`` when it holds a checkpoint.

  Args:
    config: the run's (validated here) config.
    hooks: ``hook(step, model) -> dict`` (:data:`orthojax.train.trainer.Hook`) on
      the schedule of ``config.hooks`` (every N steps, at given epochs); their scalars
      go to the metrics log (e.g. :func:`orthojax.analysis.spectrum_hook`).
    devices: the devices to build the mesh over (default: all).
    print_fn: called with each console line alone
      (:data:`~orthojax.train.trainer.PrintFn`); None: Python logging, logger
      ``orthojax.train.trainer``, at INFO (warnings at WARNING).

  Raises:
    NonFiniteLossError: a non-finite loss with ``config.nan_policy="stop"``; the
      message has the step, and no checkpoint is written after it.
  """
  devices = list(jax.devices() if devices is None else devices)
  info = dataset_info(config)
  # Checked by building (model and optimizer constructed, abstractly) before the workdir is
  # touched: a bad key or section leaves nothing behind.
  program = build_program(config, info, devices=devices, num_processes=jax.process_count())
  source = inputs.RegisteredInput(config.data["name"], config.options, config.data_dir)
  return Loop(program, source, hooks, print_fn, _zoo_record(config, info)).run()


def _zoo_record(config: Config, info: Any) -> dict[str, Any]:
  """What a zoo run records for its resume check: its config, and the data's checksum
  where the dataset has one (a text corpus: its sha256), so that a run does not resume on
  another corpus under the same options."""
  record = config.to_dict()
  if info.checksum:
    record["data_checksum"] = info.checksum
  return record


def fit(model_fn: ModelFn, optimizer: OptimizerArg, train_data: inputs.TrainSource,
        config: Config, *, eval_data: inputs.EvalSource | Iterable[inputs.Batch] = None,
        hooks: tuple[Hook, ...] = (), devices: Sequence[jax.Device] | None = None,
        print_fn: PrintFn | None = None) -> TrainResult:
  """Train ``model_fn(rngs)`` with ``optimizer`` on ``train_data``.

  Args:
    model_fn: ``nnx.Rngs -> nnx.Module``; called with ``nnx.Rngs(config.seed)``
      (abstractly first, to size and shard, then once to initialise).
    optimizer: an optax ``GradientTransformation`` (orthojax's or any other), or
      a function of the abstract model (``nnx.eval_shape`` of ``model_fn``:
      Variable types and metadata, no arrays) returning one — e.g.
      ``oj.optim.partition(model, stiefel=oj.optim.radam(..., views=
      oj.nn.matrix_views(model)), euclidean=optax.adamw(...))``. A function that takes
      a ``shard`` keyword gets the run's owner-sharding wrapper
      (``config.mesh.shard_update``): ``stiefel=shard(oj.optim.radam(..., views=views), views=views)``
      updates each matrix on one device (:func:`orthojax.optim.shard_update`; the
      identity where the update is replicated).
    train_data: numpy batches ``{"x": float32 (b, ...), "y": int32 labels or
      float32 targets (b,)}`` with ``b = config.batch_size / process count``: a
      function ``start_batch -> batches`` (exact resume from any batch), or a
      re-iterable (a list, a dataset object) that yields the same stream each
      time it is iterated (a resume skips the batches already stepped on).
    config: the run's config; ``num_steps`` sets the length (there is no
      epoch without a dataset size), the mesh, checkpoint, logging, loss,
      ``nan_policy`` and ``compute_dtype`` fields apply as for the zoo models;
      the model, optimizer, penalty and dataset fields are not used. In their place
      ``config.json`` and every checkpoint record what fit was given: the model's
      variables (paths, types, dtypes, shapes) and the optimizer's closure tree
      (:mod:`orthojax.train.fingerprint`: every value its ``update`` captured, a
      learning rate or a schedule's boundaries among them). Rerunning in the same
      workdir resumes only the same run: another model or optimizer is refused with
      the list of what differs.
    eval_data: batches to evaluate on (``() -> batches`` or a re-iterable; up to
      ``config.eval_batch_size or config.batch_size`` rows per process, padded
      and masked here); None: no evaluation.
    hooks: ``hook(step, model) -> dict`` (:data:`orthojax.train.trainer.Hook`)
      every ``config.hooks.every_steps`` steps.
    devices: the devices to build the mesh over (default: all).
    print_fn: called with each console line alone (``print``, ``list.append``;
      :data:`~orthojax.train.trainer.PrintFn`); None: the lines go to Python logging,
      logger ``orthojax.train.trainer``, at INFO (warnings at WARNING) —
      ``logging.basicConfig(level=logging.INFO)`` or absl's ``app.run`` shows them.

  Returns:
    The :class:`~orthojax.train.trainer.TrainResult`: ``result.model`` is the trained
    ``nnx`` model (eval mode), ``result.state`` the final train state, the metrics.

  Raises:
    ConfigError: a config, argument or data that cannot work, in one line naming it.
  """
  if isinstance(model_fn, nnx.Module) or not callable(model_fn):
    raise ConfigError(f"model_fn: got {'a model instance' if callable(model_fn) else 'a'} "
                      f"{type(model_fn).__name__}; pass a function rngs -> model (the class "
                      f"itself, or lambda rngs: Net(..., rngs=rngs)), which fit builds "
                      f"abstractly first to size and shard it")
  if not (isinstance(optimizer, optax.GradientTransformation) or callable(optimizer)):
    raise ConfigError(f"optimizer: got a {type(optimizer).__name__}; pass an optax "
                      f"GradientTransformation or a function model -> one")
  if not config.num_steps:
    raise ConfigError("num_steps: fit() trains for a number of steps; set num_steps > 0 "
                      "(num_epochs needs a registered dataset's size)")
  if config.hooks.epochs:
    raise ConfigError("config.hooks.epochs: fit() has no epochs (no dataset size); schedule "
                      "the hooks with config.hooks.every_steps")
  if eval_data is None and (config.eval_every or config.final_eval_splits
                            or config.restore_best or config.schedule == "plateau"):
    raise ConfigError("eval_data: eval_every / restore_best / plateau / final_eval_splits "
                      "need eval_data")
  if not callable(train_data) and iter(train_data) is train_data:
    raise ConfigError("train_data: a one-shot iterator cannot be resumed; pass a list, a "
                      "re-iterable, or a function start_batch -> batches")
  first = next(iter(train_data(0) if callable(train_data) else train_data), None)
  if first is None:
    raise ConfigError("train_data: yielded no batch")
  try:
    info = inputs.info_from_batch(first, num_train=config.batch_size)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  devices = list(jax.devices() if devices is None else devices)
  program = build_program(config, info, devices=devices, num_processes=jax.process_count(),
                          model_fn=model_fn, optimizer=optimizer)
  record = _fit_record(config, info, model_fn, optimizer)
  source = inputs.IterableInput(train_data, eval_data, example=first)
  return Loop(program, source, hooks, print_fn, record).run()


def _fit_record(config: Config, info: Any, model_fn: ModelFn,
                optimizer: OptimizerArg) -> dict[str, Any]:
  """What a fit run trains (:mod:`orthojax.train.fingerprint`) in place of the config's
  model, optimizer, data and penalty sections, which fit does not use. The optimizer is
  described as the user built it, unsharded (a function of the model is called once more
  with ``shard`` the identity: owner sharding depends on the devices, which a resumed
  run may change)."""
  abstract = nnx.eval_shape(lambda: model_fn(nnx.Rngs(config.seed)))
  tx = user_optimizer(optimizer, abstract)
  return {**config.to_dict(), "model": fingerprint.describe_model(abstract),
          "optimizer": {fingerprint.FIT: fingerprint.describe_transform(tx)},
          "data": {"name": fingerprint.FIT, "task": info.task,
                   "x": f"{info.input_dtype}{list(info.input_shape)}"},
          "penalty": None}



class Loop:
  """The training loop over a program and its input: built, then run (once).

  Building only records what to run: it touches no file and no checkpoint, so a
  ``Loop`` can be made, inspected or handed on freely. :meth:`run` does the rest, in
  order: take the workdir's lock (:class:`~orthojax.train.workdir_lock.WorkdirLock`),
  compile the steps, restore the newest intact checkpoint (or initialise), write
  ``config.json``, train, evaluate.

  Args:
    program: the built program (:func:`~orthojax.train.program.build_program`).
    source: where the batches come from (:mod:`orthojax.train.inputs`).
    hooks: ``hook(step, model) -> metrics`` on ``config.hooks``'s schedule.
    print_fn: called with each console line alone
      (:data:`~orthojax.train.trainer.PrintFn`); None: the ``orthojax.train.trainer``
      logger, at INFO (warnings — a damaged checkpoint passed over, parameters off their
      manifold — at WARNING).
    record: what the run trains, for ``config.json``, the checkpoints and the resume
      check: the config (default), or what :func:`fit` was given
      (:mod:`orthojax.train.fingerprint`).

  The run's console lines go through two callables named after the logging levels they
  use by default: ``_log_info`` (progress, resume, plateau, early stopping, preemption,
  the end; INFO) and ``_log_warning`` (a line that needs action; WARNING). Both are
  ``print_fn`` when it is given.
  """

  def __init__(self, program: Program, source: inputs.Input, hooks: tuple[Hook, ...] = (),
               print_fn: PrintFn | None = None, record: dict[str, Any] | None = None):
    self.program = program
    self.config = config = program.config
    self.record = record if record is not None else config.to_dict()
    self.source = source
    self.hooks = hooks
    self._log_info = _LOG.info if print_fn is None else print_fn
    self._log_warning = _LOG.warning if print_fn is None else print_fn
    self.watch, self.higher_is_better = (("top1", True) if program.classification
                                         else ("loss", False))
    # XLA:CPU runs each simulated device's part of a program on a shared thread
    # pool; with two multi-device steps in flight, each can hold threads that the
    # other's all-reduce waits for, and the rendezvous aborts the process
    # ("Termination timeout for all reduce … only 4 of 8 arrived"). On the CPU
    # the host gains nothing from running ahead (it shares the cores), so a
    # multi-device CPU mesh waits for each step before dispatching the next.
    devices = program.mesh.devices.flat
    self.one_step_in_flight = (program.mesh.size > 1
                               and all(d.platform == "cpu" for d in devices))
    self.hook_steps = {round(e * program.steps_per_epoch) for e in config.hooks.epochs}
    # Set by run(): the compiled steps, the checkpoints, the state and where it stands.
    self.compiled: CompiledProgram | None = None
    self.checkpointer: ckpt_lib.Checkpointer | None = None
    self.state: TrainState | None = None
    self.best_state: TrainState | None = None   # config.restore_best: a copy at the best eval
    self.loop = LoopState()
    self.interval = metrics_lib.IntervalMean()   # train metrics since the last log
    self.restored = False
    self.step = 0
    self.saved_step: int | None = None
    self.defect_warned = False

  def run(self) -> TrainResult:
    """Train to the end (or early stopping, or preemption) and return the result.

    Raises:
      ConfigError: the workdir is held by another run, or its checkpoint is of another
        run or damaged beyond use (one line).
      NonFiniteLossError: see :func:`train`.
      RuntimeError: the loop has run before (build another).
    """
    if self.compiled is not None:
      raise RuntimeError("a Loop runs once; build another for the next run")
    with WorkdirLock(self.config.workdir, self._log_info):   # before anything is read or written
      try:
        self._start()
        return self._loop()
      finally:
        if self.checkpointer:
          self.checkpointer.close()

  # ---------------------------------------------------------------- Start --

  def _start(self) -> None:
    """Compile, open the checkpoints, restore or initialise, write ``config.json``."""
    config = self.config
    self.compiled = compile_program(self.program)
    if config.workdir:
      from orthojax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top  (Orbax)
      self.checkpointer = ckpt_lib.Checkpointer(
          os.path.join(config.workdir, "checkpoints"), every_steps=config.checkpoint.every_steps,
          keep=config.checkpoint.keep)
    self.state = self._init_or_restore()
    self.interval.load_state_dict(self.loop.interval)
    if config.workdir and jax.process_index() == 0:   # the run's flags, beside its results
      path = epath.Path(config.workdir) / "config.json"
      path.write_text(json.dumps(self.record, indent=1))
    self.step = int(jax.device_get(self.state.step))
    self.saved_step = self.step if self.restored else None

  def _init_or_restore(self) -> TrainState:
    latest = None
    if self.checkpointer:
      try:
        latest = self.checkpointer.latest_intact_step(self._log_warning)
      except ValueError as e:
        raise ConfigError(f"config.workdir={self.config.workdir!r}: {e}") from None
    self.restored = latest is not None
    if latest is None:
      return self.program.init()
    saved = self.checkpointer.meta(latest).get("config", {})
    layout = earlier_layout(saved)
    if layout:
      self.checkpointer.close()
      raise ConfigError(f"config.workdir={self.config.workdir!r}: its checkpoint (step "
                        f"{latest}) was written by an earlier orthojax layout ({layout}) and "
                        f"cannot be resumed; start a new workdir")
    changed = resume_differences(saved, self.config, recorded=self.record)
    if changed:
      own = ("the model and optimizer it was started with"
             if self.record["model"].get("name") == fingerprint.FIT else "the run's own config")
      raise ConfigError(f"config.workdir={self.config.workdir!r}: its checkpoint (step "
                        f"{latest}) is of another run: {', '.join(changed)}; resume with "
                        f"{own} or use a new workdir")
    # Checkpoints hold the optimizer state in the replicated layout (Program.to_saved): it
    # restores onto any mesh, owner-sharded or not.
    state, meta = self.checkpointer.restore(latest, self.program.abstract_saved_state())
    state = self.program.from_saved(state)
    self.best_state = meta.pop("best_state", None)
    if self.best_state is not None:
      self.best_state = self.program.from_saved(self.best_state)
    self.loop = LoopState.from_meta(meta)
    self._log_info(f"Resumed from {self.checkpointer.directory} at step {latest}")
    return state

  # ---------------------------------------------------------------- Input --

  def _train_batches(self) -> Iterator[Any]:
    return mesh_lib.prefetch_to_mesh(self.source.train(
        batch_size=self.program.local_batch, start_batch=self.loop.batches_consumed,
        seed=self.config.seed), self.program.mesh)

  def _evaluate(self, state: TrainState, split: str = "eval") -> dict[str, float]:
    """Metrics of ``state`` on ``split``; {} when the input has no evaluation data."""
    batches = self.source.eval(batch_size=self.program.local_eval_batch, split=split)
    if batches is None:
      return {}
    return evaluate(self.compiled.eval_step, state, batches, self.program.mesh)

  # ----------------------------------------------------------------- Step --

  def _step(self, batch: Any) -> None:
    """One update. Its metrics join the logging interval on the device (no host sync);
    whether the step was finite is read back where its results reach the host
    (:meth:`_check_finite`)."""
    self.state, metrics = self.compiled.train_step(self.state, batch)
    if self.one_step_in_flight:
      jax.block_until_ready(self.state.step)
    self.interval.add(metrics)
    self.step += 1
    self.loop.batches_consumed += 1

  def _check_finite(self) -> None:
    """The guard of :meth:`_step`, run wherever its results reach the host (a log line,
    a checkpoint, the end): stop on a non-finite step (``nan_policy=stop``) or, with
    ``skip``, once more than ``max_skipped_fraction`` of the updates were dropped (judged
    from step :data:`MIN_STEPS_FOR_SKIPPED_FRACTION` on): such a run is dead, not noisy.

    Raises:
      NonFiniteLossError: one line with the step and the last checkpoint before it.
    """
    config = self.config
    if config.nan_policy == "stop":
      bad = int(jax.device_get(self.state.first_nonfinite_step))
      if bad < 0:
        return
      reason = f"non-finite loss or gradient at step {bad}"
    else:
      skipped = int(jax.device_get(self.state.skipped_steps))
      if (self.step < MIN_STEPS_FOR_SKIPPED_FRACTION
          or skipped <= config.max_skipped_fraction * self.step):
        return
      reason = (f"{skipped} of {self.step} updates were skipped as non-finite, more than "
                f"config.max_skipped_fraction={config.max_skipped_fraction:g}")
    last = None
    if self.checkpointer:
      self.checkpointer.wait()
      last = self.checkpointer.latest_step()
    raise NonFiniteLossError(
        f"{reason}; stopped. "
        + (f"The last checkpoint before it is step {last} in {self.checkpointer.directory}."
           if last is not None else "No checkpoint was written."))

  def _log_train(self, writer: metrics_lib.MetricsWriter) -> dict[str, float]:
    """Write the interval's train metrics (means since the last log) and the state's
    gauges: learning-rate scale, skipped steps, orthogonality defect."""
    values = self.interval.result()
    values["lr_scale"] = jax.device_get(self.state.lr_scale)
    if self.config.nan_policy == "skip":
      values["skipped_steps"] = jax.device_get(self.state.skipped_steps)
    if self.program.defect is not None:
      values["orthogonality_defect"] = jax.device_get(self.program.defect(self.state.params))
      self._warn_defect(values["orthogonality_defect"])
    return writer.write(self.step, values, "train")

  # ----------------------------------------------------------- Checkpoint --

  def _save(self) -> None:
    """Save the current step unless it is already saved (a periodic save at a preemption).
    The caller has passed :meth:`_check_finite` at this step: nothing non-finite is saved."""
    if self.saved_step == self.step:
      return
    self.loop.interval = self.interval.state_dict()
    meta = {**dataclasses.asdict(self.loop), "config": self.record}
    best = self.best_state if self.config.restore_best else None
    self.checkpointer.save(self.step, self.program.to_saved(self.state), meta,
                           best=None if best is None else self.program.to_saved(best))
    self.saved_step = self.step

  # ----------------------------------------------------------------- Eval --

  def _eval_and_track(self, writer: metrics_lib.MetricsWriter) -> bool:
    """A periodic evaluation; updates best / plateau / early stopping. True: stop now."""
    config, step = self.config, self.step
    metrics = writer.write(step, self._evaluate(self.state), "eval")
    self.loop.track(metrics[self.watch], self.higher_is_better, step)
    if config.restore_best and self.loop.best_step == step:
      self.best_state = jax.tree.map(lambda x: x.copy(), self.state)   # the state is donated next
    if config.schedule == "plateau" and self.loop.plateau_evals >= config.plateau_patience:
      self.loop.plateau_evals = 0
      lr_scale = jax.device_put(self.state.lr_scale * config.plateau_factor,
                                self.program.state_sharding.lr_scale)
      self.state = self.state._replace(lr_scale=lr_scale)
      self._log_info(f"Plateau: learning rate x{float(lr_scale):.3g}")
    stop = bool(config.early_stopping_patience
                and self.loop.evals_since_best >= config.early_stopping_patience)
    if stop:
      self._log_info(f"Early stopping at step {step}: no improvement in {self.watch} for "
                     f"{config.early_stopping_patience} evals (best at step "
                     f"{self.loop.best_step})")
    return stop

  # ----------------------------------------------------------------- Loop --

  def _loop(self) -> TrainResult:
    config, total = self.config, self.program.total_steps
    writer = metrics_lib.MetricsWriter(config.workdir or None, total, print_fn=self._log_info,
                                       resume_step=self.step if self.restored else None)
    train_metrics: dict[str, float] = {}
    preempted = stopped_early = False
    if self.checkpointer:
      self.checkpointer.install_sigterm_handler()
    try:
      batches = self._train_batches()
      if not self.restored and self._hook_due(0):   # epoch 0: the initial state
        self._run_hooks(writer)
      start_time = time.perf_counter()
      while self.step < total:
        batch = next(batches, None)
        if batch is None:   # only a user's finite stream ends (registered ones repeat)
          raise ConfigError(f"train_data: ended after {self.loop.batches_consumed} batches; "
                            f"num_steps={total} needs {total} (yield more, or pass a "
                            f"re-iterable, which is repeated like epochs)")
        self._step(batch)
        if self.step % config.log_every == 0 or self.step == total:
          self._check_finite()   # the step's loss reaches the host here
          train_metrics = self._log_train(writer)
        if self._hook_due(self.step):
          self._run_hooks(writer)
        if config.eval_every and self.step % config.eval_every == 0 and self.step < total:
          if self._eval_and_track(writer):
            stopped_early = True
            break
        if self.checkpointer:
          preempted = self.checkpointer.preempted(self.step)
          if preempted or self.checkpointer.should_save(self.step):
            self._check_finite()   # a non-finite step is never saved
            self._save()
          if preempted:
            self.checkpointer.wait()
            self._log_info(f"Preempted: saved step {self.step}; rerun the same command to "
                           f"resume.")
            break
      self._check_finite()
      elapsed = time.perf_counter() - start_time
      eval_metrics, split_metrics = {}, {}
      if not preempted:
        eval_metrics, split_metrics = self._final(writer, elapsed)
    finally:
      writer.close()
    best = None
    if self.loop.best is not None:
      best = {self.watch: self.loop.best, "step": self.loop.best_step,
              "stopped_early": stopped_early}
    return TrainResult(final_step=self.step, train_metrics=train_metrics,
                       eval_metrics=eval_metrics, best_eval=best, preempted=preempted,
                       state=self.state,
                       best_state=self.best_state if config.restore_best else None,
                       split_metrics=split_metrics, model=self.program.model(self.state))

  def _warn_defect(self, defect: float) -> None:
    """Say once when the manifold parameters have left their manifold."""
    if defect > DEFECT_TOLERANCE and not self.defect_warned:
      self.defect_warned = True
      self._log_warning(f"Warning: at step {self.step} the parameters on a manifold "
                        f"(StiefelParam, ObliqueParam) are {float(defect):.3g} from it "
                        f"(largest defect, tolerance {DEFECT_TOLERANCE:g}): their optimizer "
                        f"does not keep them there (Muon or a Euclidean one?); use radam, "
                        f"rsgd, cayley_adam, landing or stiefel_muon to keep them, or plain "
                        f"parameters if drifting is intended")

  def _hook_due(self, step: int) -> bool:
    """Whether ``config.hooks`` schedules the hooks after ``step`` updates."""
    every = self.config.hooks.every_steps
    by_steps = bool(every and step and step % every == 0)
    return bool(self.hooks) and (by_steps or step in self.hook_steps)

  def _run_hooks(self, writer: metrics_lib.MetricsWriter) -> None:
    model = self.program.model(self.state)
    for hook in self.hooks:
      values = hook(self.step, model)
      if values:   # a hook may measure on its own schedule and return {} between
        writer.write(self.step, values, "spectrum", console=False)

  # ---------------------------------------------------------------- Final --

  def _final(self, writer: metrics_lib.MetricsWriter, elapsed: float
             ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Save (the loop has checked the state is finite), then evaluate the final (or best)
    state on the eval and final splits."""
    config = self.config
    if self.checkpointer:
      self._save()
    final = self.state
    if config.restore_best and self.best_state is not None:
      final = self.best_state
      self._log_info(f"Restored the best state (step {self.loop.best_step}) for the final "
                     f"evaluation")
    eval_metrics = self._evaluate(final)
    if eval_metrics:
      eval_metrics = writer.write(self.step, eval_metrics, "eval")
    split_metrics = {split: writer.write(self.step, self._evaluate(final, split), split)
                     for split in config.final_eval_splits}
    skipped = int(jax.device_get(self.state.skipped_steps))
    self._log_info(f"Done: {self.step} steps in {elapsed:.1f} s"
                   + (f" ({skipped} non-finite updates skipped)" if skipped else ""))
    return eval_metrics, split_metrics
