"""One frozen, typed training config, validated up front.

Every field is also an absl flag of the same name (:mod:`orthojax.train.flags`),
so a validation error names the flag to fix: ``--lr=-0.1: must be > 0``.
Validation that needs the runtime (device and process counts, data files) is
done by :func:`Config.validate` with those passed in, before anything is
built or loaded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from orthojax import penalties
from orthojax.train.losses import LOSSES

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "vgg6", "mlp", "deep_mlp",
          "deep_linear", "rnn")
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw", "rsgd", "radam", "cayley_sgd",
              "cayley_adam", "landing", "muon")
MANIFOLD_OPTIMIZERS = ("rsgd", "radam", "cayley_sgd", "cayley_adam", "landing")
EUCLIDEAN_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "warmup_cosine", "step", "plateau")
PENALTIES = ("none", *penalties.PENALTIES)   # "none", or a kind of orthojax.penalties
DTYPES = ("float32", "bfloat16")
NAN_POLICIES = ("stop", "skip")
EVAL_SPLITS = ("eval", "train", "validation", "test")


class ConfigError(ValueError):
  """A bad flag value; the message is one line naming the flag."""


# Fields a resumed run may change: where and how often it logs, evaluates and
# saves, the devices and mesh it runs on, how it guards against non-finite
# steps, micro-batching (the same update up to rounding), and how far it
# trains when the schedule does not depend on the total length. Every other
# field changes the run's mathematics and is refused on resume.
RESUMABLE_FIELDS = ("workdir", "data_dir", "log_every", "eval_every", "checkpoint_every",
                    "keep_checkpoints", "spectrum_every", "final_eval_splits", "eval_batch_size",
                    "mesh_data", "mesh_fsdp", "mesh_model", "num_slices", "nan_policy",
                    "max_skipped_fraction", "grad_accum_steps")
LENGTH_FIELDS = ("num_steps", "num_epochs")   # resumable with a constant or plateau schedule


def resume_differences(saved: dict[str, Any], config: "Config") -> list[str]:
  """``--flag=value (checkpoint: value)`` for each field that may not change on resume.

  Fields the checkpoint does not record (written by an older orthojax) are not compared.
  """
  import json  # pylint: disable=g-import-not-at-top
  now = json.loads(json.dumps(dataclasses.asdict(config)))   # tuples as the saved lists
  allowed = set(RESUMABLE_FIELDS)
  if config.schedule in ("constant", "plateau"):
    allowed |= set(LENGTH_FIELDS)
  return [f"--{k}={now[k]} (checkpoint: {saved[k]})" for k in now
          if k in saved and k not in allowed and saved[k] != now[k]]


@dataclasses.dataclass(frozen=True)
class Config:
  """All knobs of a training run. Field = flag name; see ``flags.py`` for help texts."""

  # Experiment / output.
  workdir: str = ""
  seed: int = 0
  # Model.
  model: str = "mlp"
  variant: str = "sp"
  depth: int = 0
  width: int = 0
  activation: str = ""
  init: str = ""
  q_star: float = 0.0
  weights: str = "euclidean"
  gain: float = 1.0
  # Data.
  dataset: str = "digits"
  data_dir: str = ""
  dataset_options: tuple[tuple[str, Any], ...] = ()
  batch_size: int = 128
  eval_batch_size: int = 0
  # Length.
  num_steps: int = 0
  num_epochs: float = 0.0
  # Loss.
  loss: str = "cross_entropy"
  label_smoothing: float = 0.0
  # Optimization.
  optimizer: str = "adam"
  euclidean_optimizer: str = "adam"
  lr: float = 1e-3
  euclidean_lr: float = 0.0
  momentum: float = 0.9
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
  penalty: str = "none"
  penalty_strength: float = 0.0
  penalty_gain: float = 1.0
  # Numerics.
  compute_dtype: str = "float32"
  nan_policy: str = "stop"
  max_skipped_fraction: float = 0.5
  # Mesh.
  mesh_data: int = -1
  mesh_fsdp: int = 1
  mesh_model: int = 1
  num_slices: int = 1
  # Loop.
  log_every: int = 50
  eval_every: int = 0
  checkpoint_every: int = 0
  keep_checkpoints: int = 3
  spectrum_every: int = 0
  final_eval_splits: tuple[str, ...] = ()

  def replace(self, **changes: Any) -> "Config":
    return dataclasses.replace(self, **changes)

  @property
  def options(self) -> dict[str, Any]:
    return dict(self.dataset_options)

  def validate(self, *, num_devices: int | None = None, num_processes: int = 1) -> "Config":
    """Check every field; raise :class:`ConfigError` naming the first bad flag."""
    _choice("model", self.model, MODELS)
    _choice("optimizer", self.optimizer, OPTIMIZERS)
    _choice("euclidean_optimizer", self.euclidean_optimizer, EUCLIDEAN_OPTIMIZERS)
    _choice("schedule", self.schedule, SCHEDULES)
    _choice("loss", self.loss, LOSSES)
    _choice("penalty", self.penalty, PENALTIES)
    _choice("compute_dtype", self.compute_dtype, DTYPES)
    _choice("nan_policy", self.nan_policy, NAN_POLICIES)
    _choice("weights", self.weights, ("euclidean", "stiefel", "oblique"))
    _positive("lr", self.lr)
    _nonnegative("euclidean_lr", self.euclidean_lr)
    _positive("batch_size", self.batch_size)
    _nonnegative("eval_batch_size", self.eval_batch_size)
    _positive("grad_accum_steps", self.grad_accum_steps)
    _positive("keep_checkpoints", self.keep_checkpoints)
    _positive("log_every", self.log_every)
    _positive("num_slices", self.num_slices)
    for name in ("num_steps", "warmup_steps", "eval_every", "checkpoint_every", "spectrum_every",
                 "early_stopping_patience", "depth", "width", "plateau_patience"):
      _nonnegative(name, getattr(self, name))
    for name in ("num_epochs", "weight_decay", "grad_clip_norm", "penalty_strength", "q_star"):
      _nonnegative(name, getattr(self, name))
    if not 0.0 <= self.max_skipped_fraction <= 1.0:
      raise ConfigError(f"--max_skipped_fraction={self.max_skipped_fraction}: must be in [0, 1]")
    if not 0.0 <= self.momentum < 1.0:
      raise ConfigError(f"--momentum={self.momentum}: must be in [0, 1)")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"--label_smoothing={self.label_smoothing}: must be in [0, 1)")
    if self.label_smoothing and self.loss != "cross_entropy":
      raise ConfigError(f"--label_smoothing={self.label_smoothing}: only with "
                        f"--loss=cross_entropy, not {self.loss}")
    if not 0.0 < self.decay_factor <= 1.0:
      raise ConfigError(f"--decay_factor={self.decay_factor}: must be in (0, 1]")
    if not 0.0 < self.plateau_factor <= 1.0:
      raise ConfigError(f"--plateau_factor={self.plateau_factor}: must be in (0, 1]")
    _positive("penalty_gain", self.penalty_gain)
    _positive("gain", self.gain)
    if (self.num_steps > 0) == (self.num_epochs > 0):
      raise ConfigError("--num_steps / --num_epochs: give exactly one of them (> 0)")
    if self.schedule == "step" and not self.decay_boundaries:
      raise ConfigError("--decay_boundaries: --schedule=step needs fractions of training, "
                        "e.g. --decay_boundaries=0.5,0.75")
    if any(not 0.0 < b < 1.0 for b in self.decay_boundaries):
      raise ConfigError(f"--decay_boundaries={list(self.decay_boundaries)}: fractions in (0, 1)")
    if self.schedule == "warmup_cosine" and self.warmup_steps == 0:
      raise ConfigError("--warmup_steps: --schedule=warmup_cosine needs --warmup_steps > 0")
    if self.schedule == "plateau" and self.eval_every == 0:
      raise ConfigError("--eval_every: --schedule=plateau reduces on the eval metric; "
                        "set --eval_every > 0")
    if self.early_stopping_patience and self.eval_every == 0:
      raise ConfigError("--eval_every: --early_stopping_patience needs --eval_every > 0")
    if self.restore_best and self.eval_every == 0:
      raise ConfigError("--eval_every: --restore_best keeps the best evaluated state; "
                        "set --eval_every > 0")
    for split in self.final_eval_splits:
      if split not in EVAL_SPLITS:
        raise ConfigError(f"--final_eval_splits={','.join(self.final_eval_splits)}: unknown "
                          f"split {split!r}; choose from {', '.join(EVAL_SPLITS)}")
    if self.optimizer in MANIFOLD_OPTIMIZERS and self.weights == "euclidean":
      raise ConfigError(f"--optimizer={self.optimizer}: a manifold optimizer needs manifold "
                        f"weights (--weights=stiefel or oblique)")
    if self.weights != "euclidean" and self.optimizer not in MANIFOLD_OPTIMIZERS:
      raise ConfigError(f"--weights={self.weights}: choose a manifold --optimizer from "
                        f"{MANIFOLD_OPTIMIZERS}, not {self.optimizer}")
    if self.penalty != "none" and self.penalty_strength == 0:
      raise ConfigError(f"--penalty_strength: --penalty={self.penalty} needs a strength > 0")
    if self.checkpoint_every and not self.workdir:
      raise ConfigError("--workdir: --checkpoint_every needs a --workdir to write to")
    if self.batch_size % num_processes:
      raise ConfigError(f"--batch_size={self.batch_size}: not divisible by the "
                        f"{num_processes} processes")
    if num_devices is not None:
      _check_mesh(self, num_devices)
      ways = _batch_ways(self, num_devices)
      if self.batch_size % ways:
        raise ConfigError(f"--batch_size={self.batch_size}: not divisible by the {ways} "
                          f"data-parallel devices")
      if self.batch_size % (ways * self.grad_accum_steps):
        raise ConfigError(f"--grad_accum_steps={self.grad_accum_steps}: --batch_size="
                          f"{self.batch_size} must split into that many micro-batches of "
                          f"a multiple of {ways} devices")
    return self


def _check_mesh(config: Config, num_devices: int) -> None:
  sizes = {"mesh_data": config.mesh_data, "mesh_fsdp": config.mesh_fsdp,
           "mesh_model": config.mesh_model}
  for name, size in sizes.items():
    if size == 0 or size < -1:
      raise ConfigError(f"--{name}={size}: must be a positive integer or -1 (fill)")
  flags_text = " ".join(f"--{k}={v}" for k, v in sizes.items())
  if list(sizes.values()).count(-1) > 1:
    raise ConfigError(f"{flags_text}: only one axis may be -1 (fill)")
  known = math.prod(v for v in sizes.values() if v != -1)
  fills = -1 in sizes.values()
  if (fills and num_devices % known) or (not fills and known != num_devices):
    raise ConfigError(f"{flags_text}: a mesh of {known}{' x n' if fills else ''} devices "
                      f"cannot hold the {num_devices} devices; the axis sizes must multiply to "
                      f"{num_devices} (or set one to -1 to fill)")


def _batch_ways(config: Config, num_devices: int) -> int:
  if config.mesh_data == -1 or config.mesh_fsdp == -1:
    return num_devices // max(config.mesh_model, 1)
  return config.mesh_data * config.mesh_fsdp


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise ConfigError(f"--{name}={value}: unknown; choose one of {', '.join(choices)}")


def _positive(name: str, value: float) -> None:
  if not value > 0:
    raise ConfigError(f"--{name}={value}: must be > 0")


def _nonnegative(name: str, value: float) -> None:
  if not value >= 0:
    raise ConfigError(f"--{name}={value}: must be >= 0")
