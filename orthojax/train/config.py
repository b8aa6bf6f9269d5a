"""One frozen, typed, nested training config, validated up front.

The sections go straight to constructors, with their keywords unchanged:

* ``model``: a :mod:`orthojax.train.registry` section — ``{"name": "ResNet", "depth": 50,
  "norm": "bn"}`` is ``oj.models.ResNet(depth=50, norm="bn", …)``; the trainer supplies the
  data's input/output sizes, ``dtype`` and ``rngs``.
* ``data``: ``{"name": "mnist", "view": "row", "data_dir": …}`` — a dataset of
  :mod:`orthojax.train.data` and its options.
* ``optimizer``: one section per parameter group, as :func:`orthojax.optim.partition`
  routes them (:data:`GROUPS`): ``{"euclidean": {"name": "adam", "learning_rate": 1e-3},
  "stiefel": {"name": "radam", "learning_rate": 1e-3, "manifold": {"name": "Stiefel",
  "retraction": "cayley"}}}``. A model uses the groups it has (``euclidean`` for every
  parameter off a manifold; ``stiefel`` / ``oblique`` for its manifold parameters).
* ``penalty``: the keywords of :func:`orthojax.optim.add_orthogonality_penalty`
  (``{"kind": "so", "strength": 1e-4}``), or None.
* ``mesh``: the keywords of ``orthojax.train.mesh.make_mesh``; ``checkpoint``: those of
  ``orthojax.train.checkpoint.Checkpointer``.

Everything else is the trainer's own (length, loss, schedule, loop). The experiments
build a Config from an ``ml_collections.ConfigDict`` (``--config=…py`` and
``--config.a.b=value`` overrides): :meth:`Config.from_dict`. Errors name the config key
(``config.mesh.data=3: …``).

Checking is done once, in two parts: :meth:`Config.validate` checks the ranges and choices
of the trainer's own keys (and, given the device and process counts, the mesh and batch);
the sections are checked by building them —
:func:`orthojax.train.program.build_program` constructs the model abstractly
(``nnx.eval_shape``) and the optimizer chain before any data is loaded or workdir touched,
so a section is accepted exactly when the run can build it. The resume check (which keys
may change when a run continues) is :mod:`orthojax.train.resume`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from orthojax.train.losses import LOSSES
from orthojax.train.schedules import SCHEDULES

DTYPES = ("float32", "bfloat16")
NAN_POLICIES = ("stop", "skip")
EVAL_SPLITS = ("eval", "train", "validation", "test")


GROUPS = ("euclidean", "stiefel", "oblique")
"""The parameter groups of ``config.optimizer``: the labels of
:func:`orthojax.nn.manifold_labels` (Euclidean parameters, and those on the Stiefel or
oblique manifold)."""

# Renamed keys and their spelling now (an error naming an old key gives the new one).
RENAMED = {
    "spectrum_every": ("config.hooks.every_steps",),
    "euclidean_optimizer": ("config.optimizer.euclidean",),
    "optimizer.manifold": ("config.optimizer.stiefel.manifold", "config.optimizer.oblique.manifold"),
}


def renamed(key: str) -> str | None:
  """``"renamed config.optimizer.euclidean.learning_rate"`` for an old dotted ``key``
  (without ``config.``), or None."""
  for old, new in RENAMED.items():
    if key == old or key.startswith(old + "."):
      return "renamed " + " or ".join(n + key[len(old):] for n in new)
  return None


class ConfigError(ValueError):
  """A bad config value; the message is one line naming the config key."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The keywords of ``orthojax.train.mesh.make_mesh`` — axis sizes (−1 fills) and
  slices — and ``shard_update``: on a mesh with more than one data-parallel device,
  each matrix's orthogonalizing update is computed once, by its owner device
  (:func:`orthojax.optim.shard_update`); false replicates the update on every device.
  ``split_above``: with ``shard_update``, a single matrix whose update costs more than this
  multiple of the mean owner load is updated by all owners together, its rows split
  over them (:func:`orthojax.optim.shard_update`'s ``split_above``); None splits nothing."""

  data: int = -1
  fsdp: int = 1
  model: int = 1
  num_slices: int = 1
  shard_update: bool = True
  split_above: float | None = None


@dataclasses.dataclass(frozen=True)
class HookConfig:
  """When the trainer calls its hooks (``hook(step, model) -> metrics``), like big_vision's
  evaluators: every ``every_steps`` steps (0: not by step count), and after the steps that
  end the given ``epochs`` (``round(epoch · steps_per_epoch)``; epoch 0 is the initial
  state, before the first update of a fresh run)."""

  every_steps: int = 0
  epochs: tuple[float, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "epochs", tuple(self.epochs))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """The keywords of ``orthojax.train.checkpoint.Checkpointer``: save every N steps
  (0: only at the end and at preemption), keep the newest ``keep``."""

  every_steps: int = 0
  keep: int = 3


def _section(value: Any, key: str) -> dict[str, Any] | None:
  if value is None:
    return None
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if not isinstance(value, Mapping):
    raise ConfigError(f"config.{key}={value!r}: a section (a dict of keywords) expected")
  return json.loads(json.dumps(dict(value), default=list))   # tuples as lists, detached


def _groups(value: Any) -> dict[str, dict[str, Any]]:
  """``config.optimizer``: one section per group of :data:`GROUPS` (None: absent)."""
  groups = _section(value, "optimizer") or {}
  if "name" in groups or "learning_rate" in groups:
    raise ConfigError("config.optimizer: one section per parameter group now, e.g. "
                      "{'euclidean': {'name': 'adam', 'learning_rate': 1e-3}}; "
                      "config.optimizer.name is config.optimizer.euclidean.name (or "
                      ".stiefel / .oblique for manifold parameters)")
  out = {}
  for group, section in groups.items():
    if group == "manifold":
      raise ConfigError(f"config.optimizer.manifold: {renamed('optimizer.manifold')}")
    if group not in GROUPS:
      raise ConfigError(f"config.optimizer.{group}: unknown parameter group; the groups are "
                        f"{', '.join(GROUPS)}")
    if section is not None:
      out[group] = _section(section, f"optimizer.{group}")
  return out


def _dataclass_section(cls, value: Any, key: str):
  if isinstance(value, cls):
    return value
  value = _section(value, key) or {}
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(value) - names)
  if unknown:
    raise ConfigError(f"config.{key}.{unknown[0]}: unknown; the keys are {', '.join(names)}")
  return cls(**value)


@dataclasses.dataclass(frozen=True)
class Config:
  """All knobs of a training run (module docstring). Build with keywords, nested sections
  as dicts: ``Config(model={"name": "MLP", "hidden": 32}, batch_size=64, num_steps=100)``."""

  # Experiment / output.
  workdir: str = ""
  seed: int = 0
  # Model and data (registry sections).
  model: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"name": "MLP"})
  data: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"name": "digits"})
  batch_size: int = 128
  eval_batch_size: int = 0
  # Length.
  num_steps: int = 0
  num_epochs: float = 0.0
  # Loss.
  loss: str = "cross_entropy"
  label_smoothing: float = 0.0
  # Optimization.
  optimizer: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=lambda: {"euclidean": {"name": "adam", "learning_rate": 1e-3}})
  weight_decay: float = 0.0
  grad_clip_norm: float = 0.0
  grad_accum_steps: int = 1
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_boundaries: tuple[float, ...] = ()
  decay_factor: float = 0.1
  plateau_patience: int = 5
  plateau_factor: float = 0.1
  early_stopping_patience: int = 0
  restore_best: bool = False
  penalty: Mapping[str, Any] | None = None
  # Numerics.
  compute_dtype: str = "float32"
  nan_policy: str = "stop"
  max_skipped_fraction: float = 0.5
  # Devices and checkpoints.
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  # Loop.
  log_every: int = 50
  eval_every: int = 0
  hooks: HookConfig = dataclasses.field(default_factory=HookConfig)
  final_eval_splits: tuple[str, ...] = ()

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    for key in ("model", "data"):
      set_(key, _section(getattr(self, key), key))
    set_("optimizer", _groups(self.optimizer))
    set_("penalty", _section(self.penalty, "penalty"))
    set_("mesh", _dataclass_section(MeshConfig, self.mesh, "mesh"))
    set_("checkpoint", _dataclass_section(CheckpointConfig, self.checkpoint, "checkpoint"))
    set_("hooks", _dataclass_section(HookConfig, self.hooks, "hooks"))
    set_("decay_boundaries", tuple(self.decay_boundaries))
    set_("final_eval_splits", tuple(self.final_eval_splits))

  @classmethod
  def from_dict(cls, tree: Any) -> "Config":
    """A Config from a (nested) dict or ``ml_collections.ConfigDict``; unknown keys are a
    ConfigError naming them."""
    tree = dict(tree.to_dict() if hasattr(tree, "to_dict") else tree)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(tree) - names)
    if unknown and renamed(unknown[0]):
      raise ConfigError(f"config.{unknown[0]}: {renamed(unknown[0])}")
    if unknown:
      raise ConfigError(f"config.{unknown[0]}: unknown key; the trainer's keys are "
                        f"{', '.join(sorted(names))}")
    try:
      return cls(**tree)
    except TypeError as e:
      raise ConfigError(f"config: {e}") from None

  def to_dict(self) -> dict[str, Any]:
    """Plain JSON-able dict (tuples as lists) — the form ``config.json`` records."""
    return json.loads(json.dumps(dataclasses.asdict(self), default=list))

  def replace(self, **changes: Any) -> "Config":
    """A copy with ``changes``; a dict given for a section is merged into it
    (``replace(model={"depth": 18})`` keeps the model's other keywords; ``None`` clears an
    optional section). ``optimizer`` merges group by group:
    ``replace(optimizer={"euclidean": {"learning_rate": 0.1}})`` changes one rate; a group
    given as None is removed."""
    merged = {}
    for key, value in changes.items():
      old = getattr(self, key)
      if key == "optimizer" and isinstance(value, Mapping):
        value = {**old, **{g: ({**old.get(g, {}), **v} if isinstance(v, Mapping) else v)
                           for g, v in value.items()}}
        value = {g: v for g, v in value.items() if v is not None}
      elif isinstance(value, Mapping) and key in ("model", "data") or (
          isinstance(value, Mapping) and key == "penalty" and old):
        value = {**old, **value}
      elif isinstance(value, Mapping) and key in ("mesh", "checkpoint", "hooks"):
        value = {**dataclasses.asdict(old), **value}
      merged[key] = value
    return dataclasses.replace(self, **merged)

  @property
  def data_dir(self) -> str | None:
    """``data.data_dir`` (None: tfds's default)."""
    return self.data.get("data_dir") or None

  @property
  def options(self) -> dict[str, Any]:
    """``data`` without ``name`` and ``data_dir``, i.e. the dataset's options."""
    return {k: v for k, v in self.data.items() if k not in ("name", "data_dir")}

  @property
  def learning_rate(self) -> float:
    """``optimizer.euclidean.learning_rate`` (the peak of the schedule; 0 without a
    Euclidean group). A manifold group's is ``optimizer[group]["learning_rate"]``."""
    return self.optimizer.get("euclidean", {}).get("learning_rate", 0.0)

  def validate(self, *, num_devices: int | None = None, num_processes: int = 1,
               dataset: Any = None) -> "Config":
    """Check the ranges and choices of the trainer's keys (with ``num_devices``: the mesh
    and the batch split too; with ``dataset``, the data's description — its ``task`` and
    ``name``, ``orthojax.train.data.DatasetInfo`` — that the loss fits its task); raise
    :class:`ConfigError` naming the first bad one.

    The registry sections (model, optimizer groups, penalty) and the data are checked by
    building them (``orthojax.train.program.check``), not here.
    """
    _choice("schedule", self.schedule, SCHEDULES)
    _choice("loss", self.loss, LOSSES)
    _choice("compute_dtype", self.compute_dtype, DTYPES)
    _choice("nan_policy", self.nan_policy, NAN_POLICIES)
    _positive("batch_size", self.batch_size)
    _nonnegative("eval_batch_size", self.eval_batch_size)
    _positive("grad_accum_steps", self.grad_accum_steps)
    _positive("checkpoint.keep", self.checkpoint.keep)
    _nonnegative("checkpoint.every_steps", self.checkpoint.every_steps)
    _positive("log_every", self.log_every)
    _positive("mesh.num_slices", self.mesh.num_slices)
    if not isinstance(self.mesh.shard_update, bool):
      raise ConfigError(f"config.mesh.shard_update={self.mesh.shard_update!r}: must be true or "
                        f"false")
    split_above = self.mesh.split_above
    if split_above is not None and (isinstance(split_above, bool) or
                                    not isinstance(split_above, (int, float)) or
                                    not split_above > 0):
      raise ConfigError(f"config.mesh.split_above={split_above!r}: must be a number > 0 (a "
                        f"multiple of the mean owner load, e.g. 1.0) or None")
    _nonnegative("hooks.every_steps", self.hooks.every_steps)
    if any(not e >= 0 for e in self.hooks.epochs):
      raise ConfigError(f"config.hooks.epochs={list(self.hooks.epochs)}: epochs must be >= 0")
    for name in ("num_steps", "warmup_steps", "eval_every",
                 "early_stopping_patience", "plateau_patience", "num_epochs", "weight_decay",
                 "grad_clip_norm"):
      _nonnegative(name, getattr(self, name))
    if not 0.0 <= self.max_skipped_fraction <= 1.0:
      raise ConfigError(f"config.max_skipped_fraction={self.max_skipped_fraction}: must be in "
                        f"[0, 1]")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"config.label_smoothing={self.label_smoothing}: must be in [0, 1)")
    if self.label_smoothing and self.loss != "cross_entropy":
      raise ConfigError(f"config.label_smoothing={self.label_smoothing}: only with "
                        f"config.loss='cross_entropy', not {self.loss!r}")
    if not 0.0 < self.decay_factor <= 1.0:
      raise ConfigError(f"config.decay_factor={self.decay_factor}: must be in (0, 1]")
    if not 0.0 < self.plateau_factor <= 1.0:
      raise ConfigError(f"config.plateau_factor={self.plateau_factor}: must be in (0, 1]")
    if (self.num_steps > 0) == (self.num_epochs > 0):
      raise ConfigError("config.num_steps / config.num_epochs: give exactly one of them (> 0)")
    if self.schedule == "step" and not self.decay_boundaries:
      raise ConfigError("config.decay_boundaries: config.schedule='step' needs fractions of "
                        "training, e.g. (0.5, 0.75)")
    if any(not 0.0 < b < 1.0 for b in self.decay_boundaries):
      raise ConfigError(f"config.decay_boundaries={list(self.decay_boundaries)}: fractions in "
                        f"(0, 1)")
    if self.schedule == "warmup_cosine" and self.warmup_steps == 0:
      raise ConfigError("config.warmup_steps: config.schedule='warmup_cosine' needs "
                        "warmup_steps > 0")
    if self.schedule == "plateau" and self.eval_every == 0:
      raise ConfigError("config.eval_every: config.schedule='plateau' reduces on the eval "
                        "metric; set eval_every > 0")
    if self.early_stopping_patience and self.eval_every == 0:
      raise ConfigError("config.eval_every: early_stopping_patience needs eval_every > 0")
    if self.restore_best and self.eval_every == 0:
      raise ConfigError("config.eval_every: restore_best keeps the best evaluated state; "
                        "set eval_every > 0")
    for split in self.final_eval_splits:
      if split not in EVAL_SPLITS:
        raise ConfigError(f"config.final_eval_splits={list(self.final_eval_splits)}: unknown "
                          f"split {split!r}; choose from {', '.join(EVAL_SPLITS)}")
    if self.checkpoint.every_steps and not self.workdir:
      raise ConfigError("config.workdir: checkpoint.every_steps needs a workdir to write to")
    if self.batch_size % num_processes:
      raise ConfigError(f"config.batch_size={self.batch_size}: not divisible by the "
                        f"{num_processes} processes")
    if num_devices is not None:
      _check_mesh(self, num_devices)
      ways = _batch_ways(self, num_devices)
      if self.batch_size % ways:
        raise ConfigError(f"config.batch_size={self.batch_size}: not divisible by the {ways} "
                          f"data-parallel devices")
      if (self.eval_batch_size or self.batch_size) % ways:
        raise ConfigError(f"config.eval_batch_size={self.eval_batch_size}: not divisible by "
                          f"the {ways} data-parallel devices")
      if self.batch_size % (ways * self.grad_accum_steps):
        raise ConfigError(f"config.grad_accum_steps={self.grad_accum_steps}: batch_size="
                          f"{self.batch_size} must split into that many micro-batches of "
                          f"a multiple of {ways} devices")
    if dataset is not None:
      _check_loss(self, dataset)
    return self


def _check_mesh(config: Config, num_devices: int) -> None:
  sizes = {"mesh.data": config.mesh.data, "mesh.fsdp": config.mesh.fsdp,
           "mesh.model": config.mesh.model}
  for name, size in sizes.items():
    if size == 0 or size < -1:
      raise ConfigError(f"config.{name}={size}: must be a positive integer or -1 (fill)")
  text = " ".join(f"config.{k}={v}" for k, v in sizes.items())
  if list(sizes.values()).count(-1) > 1:
    raise ConfigError(f"{text}: only one axis may be -1 (fill)")
  known = math.prod(v for v in sizes.values() if v != -1)
  fills = -1 in sizes.values()
  if (fills and num_devices % known) or (not fills and known != num_devices):
    raise ConfigError(f"{text}: a mesh of {known}{' x n' if fills else ''} devices "
                      f"cannot hold the {num_devices} devices; the axis sizes must multiply to "
                      f"{num_devices} (or set one to -1 to fill)")


def _check_loss(config: Config, dataset: Any) -> None:
  """The loss must fit the task: cross-entropy for classes, mse / mae for regression."""
  classification = dataset.task == "classification"
  if classification != (config.loss == "cross_entropy"):
    want = "cross_entropy" if classification else "mse or mae"
    if dataset.name == "user":   # fit's own batches: their y says which task it is
      labels = ("int32 class labels" if classification else "float32 regression targets")
      other = ("float32 targets" if classification else "int32 class labels")
      loss = "'cross_entropy'" if classification else "'mse' or 'mae'"
      raise ConfigError(f"config.loss={config.loss!r}: train_data's y are {labels}; set "
                        f"loss={loss}, or give {other}")
    raise ConfigError(f"config.loss={config.loss!r}: {dataset.name} is a {dataset.task} "
                      f"task; use {want}")


def _batch_ways(config: Config, num_devices: int) -> int:
  if config.mesh.data == -1 or config.mesh.fsdp == -1:
    return num_devices // max(config.mesh.model, 1)
  return config.mesh.data * config.mesh.fsdp


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise ConfigError(f"config.{name}={value!r}: unknown; choose one of {', '.join(choices)}")


def _positive(name: str, value: float) -> None:
  if not value > 0:
    raise ConfigError(f"config.{name}={value}: must be > 0")


def _nonnegative(name: str, value: float) -> None:
  if not value >= 0:
    raise ConfigError(f"config.{name}={value}: must be >= 0")
