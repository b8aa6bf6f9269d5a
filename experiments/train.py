r"""Train any orthojax model from flags: the one entry point of every experiment.

    python -m experiments.train --flagfile=experiments/flags/<experiment>.flags [--flag=value ...]

Flags are those of :mod:`orthojax.train.flags` (``--helpfull`` lists them)
plus the multi-process ones below. A bad flag stops with one line naming it.
Rerunning the same command with the same ``--workdir`` resumes from the
latest checkpoint.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging

from orthojax.train import distributed
from orthojax.train import flags as flags_lib
from orthojax.train.config import ConfigError

flags_lib.define_flags()
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Initialise jax.distributed (auto-detects TPU pods / SLURM).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0, for explicit multi-process runs.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes, with --coordinator_address.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process, with --coordinator_address.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; flags only")
  if not flags.FLAGS["verbosity"].present:   # Orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  distributed.initialize(enabled=_DISTRIBUTED.value, coordinator_address=_COORDINATOR.value,
                         num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  import jax  # after distributed start-up
  from orthojax.train import trainer
  try:
    config = flags_lib.config_from_flags(num_devices=jax.device_count(),
                                         num_processes=jax.process_count())
    result = trainer.train(config)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if jax.process_index() == 0:
    summary = ", ".join(f"{k} {v:.4g}" for k, v in result.eval_metrics.items())
    print(f"final step {result.final_step}: {summary}", flush=True)


if __name__ == "__main__":
  app.run(main)
