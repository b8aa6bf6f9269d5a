"""Build and compile a run's program: the first two of build → compile → loop.

:func:`build_program` turns a config, a dataset description and a set of
devices into everything the training loop needs that is not data or
arrays: the mesh, the model's graph, the optimizer chain, the shardings of
the train state and of the batches, the jitted ``init`` and the jitted train
and eval steps. :func:`compile_program` lowers and compiles those steps
ahead of time for the abstract state and batches (``jax.jit(...).lower(
ShapeDtypeStructs).compile()``).

The run (:func:`orthojax.train.trainer.train`) calls both on its real devices
and then loops over the *compiled* executables; the pod compile check
(:mod:`orthojax.compile.aot`, one floor above) calls the same two on abstract
TPU devices from ``jax.experimental.topologies`` and reports on the
executables instead of running them — one construction of the step for
both, so what is checked is what would run (MaxText's ``train_compile``
does the same for its LLM steps).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import NamedSharding

import orthojax as oj
from orthojax.train import data as data_lib
from orthojax.train import losses as losses_lib
from orthojax.train import mesh as mesh_lib
from orthojax.train import model_zoo
from orthojax.train import optimizers
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.data import DatasetInfo
from orthojax.train.optimizers import OptimizerArg
from orthojax.train.step import TrainState
from orthojax.train.step import make_eval_step
from orthojax.train.step import make_train_step

ModelFn = Callable[[nnx.Rngs], nnx.Module]


def _pure(state: nnx.State) -> Any:
  return nnx.to_pure_dict(state)


@dataclasses.dataclass(frozen=True)
class Program:
  """A run's model, optimizer, shardings and jitted steps, for one mesh.

  Attributes:
    config: the run's config (validated for this mesh).
    info: the dataset as the model sees it.
    mesh: the device mesh (real or abstract devices).
    num_processes: host processes that feed the mesh (per-process batches
      are the global ones divided by this).
    total_steps: optimizer updates the run makes.
    steps_per_epoch: updates per pass over the training split.
    tx: the optimizer chain.
    state_sharding: a :class:`TrainState` of ``NamedSharding`` s.
    init: jitted ``() -> TrainState`` placing every leaf on its sharding.
    train_step: jitted ``(state, batch) -> (state, metrics)``; the state is donated.
    eval_step: jitted ``(state, batch) -> masked sums``.
    step_fn: the train step before ``jax.jit`` (its jaxpr is the program's).
    saved_sharding: the shardings of the state as checkpoints hold it: the optimizer
      state in the replicated layout (:func:`orthojax.optim.replicated_state`), so a
      checkpoint restores on any device count, with or without ``mesh.shard_update``.
    to_saved: jitted ``state -> state`` in that layout (identity when nothing is sharded).
    from_saved: its inverse, onto ``state_sharding``.
    graphdef: the model's GraphDef in eval mode (:meth:`model`).
    defect: jitted ``params -> the largest orthogonality defect`` of the parameters on a
      manifold (``StiefelParam``, ``ObliqueParam``: :meth:`Manifold.defect`, e.g.
      ``‖WᵀW − I‖_F``), None when the model has none. The trainer logs it with the
      train metrics.
  """

  config: Config
  info: DatasetInfo
  mesh: Mesh
  num_processes: int
  total_steps: int
  steps_per_epoch: int
  tx: optax.GradientTransformation
  state_sharding: TrainState
  init: Callable[[], TrainState]
  train_step: Any
  eval_step: Any
  step_fn: Callable[..., Any]
  saved_sharding: TrainState
  to_saved: Callable[[TrainState], TrainState]
  from_saved: Callable[[TrainState], TrainState]
  graphdef: Any = None
  defect: Callable[[Any], Any] | None = None

  def model(self, state: TrainState) -> nnx.Module:
    """The model, in eval mode, holding ``state``'s parameters and statistics — what a hook
    sees. Its arrays are the state's own: valid until the next train step (which donates
    them); copy what you keep (``jax.device_get``)."""
    return nnx.merge(self.graphdef, state.params, state.model_state)

  @property
  def classification(self) -> bool:
    return self.info.task == "classification"

  @property
  def batch_sharding(self) -> NamedSharding:
    return mesh_lib.batch_sharding(self.mesh)

  @property
  def eval_batch_size(self) -> int:
    """The global evaluation batch."""
    return self.config.eval_batch_size or self.config.batch_size

  @property
  def local_batch(self) -> int:
    """The per-process training batch the input pipeline yields."""
    return self.config.batch_size // self.num_processes

  @property
  def local_eval_batch(self) -> int:
    return self.eval_batch_size // self.num_processes

  def abstract_state(self) -> TrainState:
    """The train state as ``ShapeDtypeStruct`` s carrying their shardings."""
    shapes = jax.eval_shape(self.init)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, self.state_sharding)

  def abstract_saved_state(self) -> TrainState:
    """The train state as checkpoints hold it (a restore target)."""
    shapes = jax.eval_shape(self.to_saved, jax.eval_shape(self.init))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, self.saved_sharding)

  def abstract_batch(self, *, eval: bool = False) -> dict[str, jax.ShapeDtypeStruct]:  # pylint: disable=redefined-builtin
    """One global batch as ``ShapeDtypeStruct`` s split over the batch axes."""
    size = self.eval_batch_size if eval else self.config.batch_size
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch_sharding)
            for k, (shape, dtype) in self.info.batch_spec(size, eval=eval).items()}


def dataset_info(config: Config, *, published: bool = False) -> DatasetInfo:
  """The dataset ``config.data`` names, as the model sees it (no examples are read).

  ``published``: the catalogue's sizes instead of the prepared files (the pod compile
  check, :func:`orthojax.train.data.dataset_info`).

  Raises:
    ConfigError: an unknown dataset, option or ``final_eval_splits`` entry, naming the key.
    orthojax.train.data.DatasetNotFoundError: the data is not prepared (what to do).
  """
  name = config.data.get("name")
  if name is None:
    raise ConfigError("config.data.name: missing; a dataset of orthojax.train.data")
  if name not in data_lib.DATASETS:
    raise ConfigError(f"config.data.name={name!r}: unknown; choose one of "
                      f"{', '.join(data_lib.DATASETS)}")
  try:
    data_lib.check_options(name, config.options)
  except ValueError as e:
    raise ConfigError(f"config.data: {e}") from None
  try:
    data_lib.check_splits(name, config.final_eval_splits)
  except ValueError as e:
    raise ConfigError(f"config.final_eval_splits={list(config.final_eval_splits)}: "
                      f"{e}") from None
  try:
    return data_lib.dataset_info(name, data_dir=config.data_dir, published=published,
                                 **config.options)
  except ValueError as e:   # an option's value the set rejects (e.g. mnist's view)
    raise ConfigError(f"config.data: {str(e).splitlines()[0]}") from None


def check(config: Config, *, devices: Sequence[jax.Device] | None = None,
          num_processes: int | None = None, published: bool = False) -> Program:
  """Check every key of ``config`` the way the run will: build its program abstractly.

  :func:`dataset_info` (no examples read) and :func:`build_program` (the model by
  ``nnx.eval_shape``, the optimizer chain, the shardings; nothing compiled, no arrays):
  a config passes exactly when the run can build it.

  Raises:
    ConfigError: the first bad key, in one line naming it.
  """
  return build_program(config, dataset_info(config, published=published), devices=devices,
                       num_processes=num_processes)


def build_program(config: Config, info: DatasetInfo, *,
                  devices: Sequence[jax.Device] | None = None, num_processes: int | None = None,
                  model_fn: ModelFn | None = None,
                  optimizer: OptimizerArg | None = None) -> Program:
  """Build the program of ``config`` over ``devices``.

  Args:
    config: the run's config; validated here against the devices and processes.
    info: the dataset (:func:`orthojax.train.data.dataset_info`).
    devices: real devices (default: all) or abstract ones
      (``jax.experimental.topologies``); TPU devices carry their slice.
    num_processes: processes feeding the mesh (default: those the devices
      belong to).
    model_fn: ``rngs -> nnx.Module``; default: the model zoo's model of ``config``.
    optimizer: an optax chain or a function of the abstract model returning
      one; default: the chain ``config`` describes
      (:func:`orthojax.train.optimizers.build`). With ``config.mesh.shard_update``
      on a multi-device mesh, the config's optimizers of the library's table are
      owner-sharded (:func:`orthojax.optim.shard_update`); a function that takes a
      ``shard`` keyword is called with the run's wrapper, ``shard(tx, views=...)``
      (:func:`orthojax.train.optimizers.update_sharding`), to apply to its orthogonal
      transformations; a chain given ready-made, or a function without ``shard``, is
      used as it is.

  Raises:
    ConfigError: a config that does not fit the devices (one line naming the flag).
  """
  # ----------------------------------------------------------------- Mesh --
  devices = list(jax.devices() if devices is None else devices)
  if num_processes is None:
    num_processes = len({d.process_index for d in devices})
  config.validate(num_devices=len(devices), num_processes=num_processes, dataset=info)
  mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.model, devices,
                            num_slices=config.mesh.num_slices)
  eval_batch = config.eval_batch_size or config.batch_size
  try:
    mesh_lib.check_global_batch(config.batch_size, mesh, num_processes=num_processes)
    mesh_lib.check_global_batch(eval_batch, mesh, "config.eval_batch_size",
                                num_processes=num_processes)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  steps_per_epoch = max(info.num_train // config.batch_size, 1)
  total_steps = config.num_steps or int(math.ceil(config.num_epochs * steps_per_epoch))

  # ---------------------------------------------------------------- Model --
  if model_fn is None:
    model_fn = lambda rngs: model_zoo.build(config, info, rngs)
  build_model = lambda: model_fn(nnx.Rngs(config.seed))
  abstract = nnx.eval_shape(build_model)
  abstract.train()
  graphdef_train, abs_params, abs_rest = nnx.split(abstract, nnx.Param, ...)
  abstract.eval()
  graphdef_eval = nnx.split(abstract, nnx.Param, ...)[0]
  pure_params = _pure(abs_params)

  # ------------------------------------------------------------ Optimizer --
  # Owner-sharded updates (config.mesh.shard_update): the library's optimizers update
  # each matrix on one device, wrapped explicitly in oj.optim.shard_update.
  tx = optimizers.for_model(config, abstract, abs_params, total_steps=total_steps, mesh=mesh,
                            optimizer=optimizer)

  # ---------------------------------------------------------------- Steps --
  # Pure functions of arrays: the state before the first step, one update, one evaluation.
  loss_fn = losses_lib.get_loss(config.loss, config.label_smoothing)
  classification = info.task == "classification"
  dtype = model_zoo.compute_dtype(config)

  def init() -> TrainState:
    _, params, rest = nnx.split(build_model(), nnx.Param, ...)
    return TrainState.create(_pure(params), _pure(rest), tx)

  params_sh = mesh_lib.param_shardings(abs_params, mesh)
  # Under FSDP the gradients enter the optimizer pinned to the parameters' sharding, so
  # that the owners' blocks of layers do not propagate into the backward pass (the 1.3 B
  # transformer on v5e:8x8: 668 -> 640 GiB per chip and step). With replicated
  # parameters the pin only constrains the partitioner (E5: +0.1 GiB), so it is left out.
  step_fn = make_train_step(graphdef_train, tx, loss_fn, classification=classification,
                            compute_dtype=dtype, grad_accum_steps=config.grad_accum_steps,
                            nan_policy=config.nan_policy,
                            scale_updates=config.schedule == "plateau",
                            param_sharding=params_sh if mesh.shape["fsdp"] > 1 else None)
  eval_fn = make_eval_step(graphdef_eval, loss_fn, classification=classification,
                           compute_dtype=dtype)

  # ------------------------------------------------------------- Sharding --
  # Where every array lives on the mesh, and the steps jitted for it.
  rep = mesh_lib.replicated(mesh)
  abs_opt = jax.eval_shape(tx.init, pure_params)
  state_sh = TrainState(step=rep, params=params_sh,
                        model_state=mesh_lib.param_shardings(abs_rest, mesh),
                        opt_state=mesh_lib.state_shardings(abs_opt, pure_params, params_sh, mesh),
                        lr_scale=rep, first_nonfinite_step=rep, skipped_steps=rep)
  saved_sh, to_saved, from_saved = mesh_lib.saved_form(abs_opt, pure_params, params_sh,
                                                        state_sh, mesh)
  # The models' activations keep the batch's sharding (orthojax.nn.sharding.constrain).
  step_fn = mesh_lib.with_activation_sharding(step_fn, mesh)
  eval_fn = mesh_lib.with_activation_sharding(eval_fn, mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  train_step = jax.jit(step_fn, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, rep),
                       donate_argnums=0)
  eval_step = jax.jit(eval_fn, in_shardings=(state_sh, batch_sh), out_shardings=rep)
  return Program(config=config, info=info, mesh=mesh, num_processes=num_processes,
                 total_steps=total_steps, steps_per_epoch=steps_per_epoch, tx=tx,
                 state_sharding=state_sh, init=jax.jit(init, out_shardings=state_sh),
                 train_step=train_step, eval_step=eval_step, step_fn=step_fn,
                 saved_sharding=saved_sh, to_saved=to_saved, from_saved=from_saved,
                 graphdef=graphdef_eval, defect=_defect_fn(abs_params, rep))


def _defect_fn(abs_params: Any, out_sharding: Any) -> Callable[[Any], Any] | None:
  """The jitted largest defect of the manifold parameters (:attr:`Program.defect`)."""
  manifolds = {"stiefel": oj.manifolds.Stiefel(), "oblique": oj.manifolds.Oblique()}
  labels = dict(jax.tree_util.tree_flatten_with_path(
      _pure(oj.nn.manifold_labels(abs_params)))[0])
  views = model_zoo.views_by_path(abs_params)
  constrained = {path: manifolds[label] for path, label in labels.items() if label in manifolds}
  if not constrained:
    return None

  def defect(params):
    values = [jnp.max(constrained[path].defect(w, view=views.get(path)))
              for path, w in jax.tree_util.tree_flatten_with_path(params)[0]
              if path in constrained]
    return jnp.max(jnp.stack([v.astype(jnp.float32) for v in values]))

  return jax.jit(defect, out_shardings=out_sharding)


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
  """The ahead-of-time compiled steps of a :class:`Program`.

  Attributes:
    program: what was compiled.
    train_step, eval_step: ``jax.stages.Compiled`` executables; they accept
      exactly the abstract state and batches they were compiled for.
    seconds: wall time of lowering and compiling both.
  """

  program: Program
  train_step: Any
  eval_step: Any
  seconds: float


def compile_program(program: Program) -> CompiledProgram:
  """Lower and compile the train and eval steps for the program's abstract inputs."""
  start = time.perf_counter()
  state = program.abstract_state()
  train = program.train_step.lower(state, program.abstract_batch()).compile()
  evaluate = program.eval_step.lower(state, program.abstract_batch(eval=True)).compile()
  return CompiledProgram(program=program, train_step=train, eval_step=evaluate,
                         seconds=time.perf_counter() - start)
