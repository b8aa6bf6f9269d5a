r"""Train any orthojax model from a config: the one entry point of every experiment.

    python -m experiments.train --config=experiments/configs/<file>.py[:arg] \
        [--config.key=value ...] --workdir=DIR

The config's keys are those of :class:`orthojax.train.Config`; ``--config_help`` prints
them and every model, optimizer and manifold a section may name. A bad flag or key stops
with one line naming it. Rerunning the same command with the same ``--workdir`` resumes
from the latest checkpoint.
"""

from __future__ import annotations

from experiments import _harness
from orthojax.train import trainer

_harness.define_flags("train.py")


def main(argv: list[str]) -> None:
  config = _harness.start(argv)
  _harness.prepare([_harness.Run(tags=(), config=config)], config, config.workdir)
  result = _harness.fail_on_config_error(lambda: trainer.train(config))
  if result.preempted:   # checkpoint saved: a scheduler requeues on this status
    raise SystemExit(trainer.PREEMPTED_EXIT_CODE)
  if _harness.is_writer():
    summary = ", ".join(f"{k} {v:.4g}" for k, v in result.eval_metrics.items())
    print(f"final step {result.final_step}: {summary}", flush=True)


if __name__ == "__main__":
  _harness.run(main)
