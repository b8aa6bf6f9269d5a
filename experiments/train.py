r"""Train any orthojax model from flags: the one entry point of every experiment.

    python -m experiments.train --flagfile=experiments/flags/<experiment>.flags [--flag=value ...]

Flags are those of :mod:`orthojax.train.flags` (``--helpfull`` lists them)
plus the multi-process ones below. A bad flag stops with one line naming it.
Rerunning the same command with the same ``--workdir`` resumes from the
latest checkpoint.
"""

from __future__ import annotations

from absl import app

from experiments import _harness

_harness.define_flags()


def main(argv: list[str]) -> None:
  config = _harness.start(argv)
  if _harness.compile_only():
    _harness.compile_runs([_harness.Run(tags=(), config=config)], config.workdir)
  import jax  # pylint: disable=g-import-not-at-top  (after distributed start-up)
  from orthojax.train import trainer  # pylint: disable=g-import-not-at-top
  result = _harness.fail_on_config_error(lambda: trainer.train(config))
  if result.preempted:   # checkpoint saved: a scheduler requeues on this status
    raise SystemExit(trainer.PREEMPTED_EXIT_CODE)
  if jax.process_index() == 0:
    summary = ", ".join(f"{k} {v:.4g}" for k, v in result.eval_metrics.items())
    print(f"final step {result.final_step}: {summary}", flush=True)


if __name__ == "__main__":
  app.run(main)
