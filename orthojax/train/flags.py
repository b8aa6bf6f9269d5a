"""absl flags for every :class:`~orthojax.train.config.Config` field.

``define_flags()`` declares one flag per field (same name, same default);
``config_from_flags()`` turns the parsed flags into a validated, frozen
``Config``. absl's ``--flagfile`` reads flags from a file, and a flagfile may
itself contain ``--flagfile=base.flags`` lines, so experiment variants share
a base (see ``experiments/*.flags``). Later flags override earlier ones.

``--dataset_options`` takes ``key=value`` pairs (``--dataset_options=view=pixel``
``--dataset_options=split_index=3``); values are parsed as int, float, bool
or kept as strings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import flags

from orthojax.train import config as config_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

HELP: dict[str, str] = {
    "workdir": "Output directory: checkpoints, metrics.jsonl, TensorBoard files. Resumes if it "
               "holds a checkpoint.",
    "seed": "Seed for init, data order and augmentation.",
    "model": f"Model: {', '.join(config_lib.MODELS)}.",
    "variant": "Parameterization / normalisation variant of the model (resnet: bn, wn_mbn, "
               "gmp_imn, none; vgg6/mlp: sp, wn, wn_mbn, bn, gmp, gmp_imn; rnn: recurrent init "
               "glorot|orthogonal).",
    "depth": "Depth (resnet: 18/34/50/101 taken from --model; deep_mlp/deep_linear: hidden "
             "layers). 0 = the model's default.",
    "width": "Hidden width (deep_mlp, deep_linear, mlp, rnn hidden size). 0 = default.",
    "activation": "Activation name (tanh, relu, hard_tanh, erf, linear, ...). '' = default.",
    "init": "Weight init (deep_mlp/deep_linear: gaussian|orthogonal). '' = default.",
    "q_star": "Mean-field fixed point q* for the critical init (deep_mlp; inputs are scaled "
              "so that h1 has variance q*); 0 = not critical.",
    "weights": "euclidean | stiefel | oblique: where the hidden weights live.",
    "gain": "Gain of the initialisation: the rnn's recurrent kernel (orthogonal x gain), "
            "deep_linear's factors (scale).",
    "dataset": "Dataset name (see orthojax.train.data.DATASETS).",
    "data_dir": "tfds data_dir / dataset files. '' = tfds default (~/tensorflow_datasets).",
    "dataset_options": "key=value dataset options, repeatable (e.g. view=pixel).",
    "batch_size": "Global batch size (all processes and devices together).",
    "eval_batch_size": "Global eval batch size; 0 = --batch_size.",
    "num_steps": "Train for this many steps (give this or --num_epochs).",
    "num_epochs": "Train for this many epochs (give this or --num_steps).",
    "loss": f"Loss: {', '.join(config_lib.LOSSES)}.",
    "label_smoothing": "Label smoothing for cross_entropy.",
    "optimizer": f"Optimizer: {', '.join(config_lib.OPTIMIZERS)}. Manifold ones apply to "
                 "Stiefel/oblique weights.",
    "euclidean_optimizer": "Optimizer of the Euclidean params when --weights is a manifold.",
    "lr": "Learning rate (peak, for schedules).",
    "euclidean_lr": "Learning rate of the Euclidean params; 0 = --lr.",
    "momentum": "Momentum of sgd-type optimizers.",
    "weight_decay": "Weight decay of the Euclidean optimizer's kernels (rank >= 2, not GmP "
                    "angles): decoupled for adamw, an L2 gradient term otherwise.",
    "grad_clip_norm": "Clip gradients to this global norm; 0 = off.",
    "grad_accum_steps": "Split each batch into this many micro-batches (same update).",
    "schedule": f"Learning-rate schedule: {', '.join(config_lib.SCHEDULES)}.",
    "warmup_steps": "Warmup steps (warmup_cosine).",
    "decay_boundaries": "Fractions of training where --schedule=step multiplies by "
                        "--decay_factor.",
    "decay_factor": "Multiplier at each step-schedule boundary.",
    "plateau_patience": "Evals without improvement before the plateau schedule decays.",
    "plateau_factor": "Plateau decay multiplier.",
    "early_stopping_patience": "Stop after this many evals without improvement; 0 = off.",
    "restore_best": "At the end, evaluate (and return) the state of the best eval, not the "
                    "last one (early stopping with restore-best).",
    "penalty": f"Soft-orthogonality penalty: {', '.join(config_lib.PENALTIES)}.",
    "penalty_strength": "Penalty strength lambda.",
    "penalty_gain": "Gain g of gain_adjusted_so.",
    "compute_dtype": "float32 | bfloat16 compute (params stay float32).",
    "nan_policy": "stop: stop at the first non-finite loss (last checkpoint intact); "
                  "skip: drop that update and go on.",
    "max_skipped_fraction": "With --nan_policy=skip: stop (as with stop) once more than this "
                            "fraction of the updates were skipped as non-finite (judged from "
                            "step 20 on); 1 never stops.",
    "mesh_data": "Mesh 'data' axis size; -1 fills.",
    "mesh_fsdp": "Mesh 'fsdp' axis size (params sharded); -1 fills.",
    "mesh_model": "Mesh 'model' axis size.",
    "num_slices": "TPU slices (multi-slice): the 'data' axis spans them over the data-centre "
                  "network, 'fsdp' and 'model' stay inside a slice.",
    "log_every": "Log train metrics every N steps (each the mean over those N steps).",
    "eval_every": "Evaluate every N steps; 0 = only at the end.",
    "checkpoint_every": "Checkpoint every N steps; 0 = only at the end / preemption.",
    "keep_checkpoints": "Checkpoints to keep.",
    "spectrum_every": "Record weight singular-value statistics every N steps; 0 = off.",
    "final_eval_splits": "Splits also evaluated once at the end (e.g. test), besides the "
                         "eval split; logged as their own split in metrics.jsonl.",
}


def _parse_value(text: str) -> Any:
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  return text


def parse_options(pairs: list[str] | tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
  out = []
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise ConfigError(f"--dataset_options={pair}: expected key=value")
    out.append((key, _parse_value(value)))
  return tuple(out)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Declare one absl flag per Config field (idempotent per FlagValues)."""
  for field in dataclasses.fields(Config):
    if field.name in flag_values:
      continue
    default = field.default
    text = HELP[field.name]
    if field.name == "dataset_options":
      flags.DEFINE_multi_string(field.name, [], text, flag_values=flag_values)
    elif field.name in ("decay_boundaries", "final_eval_splits"):
      flags.DEFINE_list(field.name, [], text, flag_values=flag_values)
    elif isinstance(default, bool):
      flags.DEFINE_bool(field.name, default, text, flag_values=flag_values)
    elif isinstance(default, int):
      flags.DEFINE_integer(field.name, default, text, flag_values=flag_values)
    elif isinstance(default, float):
      flags.DEFINE_float(field.name, default, text, flag_values=flag_values)
    else:
      flags.DEFINE_string(field.name, default, text, flag_values=flag_values)


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS, *,
                      num_devices: int | None = None, num_processes: int = 1) -> Config:
  """A validated Config from parsed flags (raises ConfigError naming the flag)."""
  values = {}
  for field in dataclasses.fields(Config):
    value = flag_values[field.name].value
    if field.name == "dataset_options":
      value = parse_options(value)
    elif field.name == "decay_boundaries":
      try:
        value = tuple(float(v) for v in value)
      except ValueError as e:
        raise ConfigError(f"--decay_boundaries={','.join(value)}: numbers expected") from e
    elif field.name == "final_eval_splits":
      value = tuple(value)
    values[field.name] = value
  return Config(**values).validate(num_devices=num_devices, num_processes=num_processes)
