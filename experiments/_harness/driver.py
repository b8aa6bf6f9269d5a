"""One driver for every experiment: the shared skeleton, the science supplied by an
:class:`Experiment`."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from absl import flags
from absl import logging
import jax

from experiments._harness import checks
from experiments._harness import cli
from experiments._harness import report
from experiments._harness import runs as runs_lib
from experiments._harness.runs import Run
from orthojax.train import distributed
from orthojax.train import program
from orthojax.train.config import Config


class Experiment:
  """What an experiment supplies; :func:`main` runs everything else.

  The skeleton, the same for E1–E7: flags → the base config (one line and exit 2 on a
  bad flag or key) → the experiment's rules (:attr:`per_run_keys`, :attr:`required`,
  :meth:`check`) → the dataset's info (:attr:`reads_base_data`) → its runs
  (:meth:`plan`) → every distinct program built abstractly, where ``--config_help`` and
  ``--compile_for`` stop (:func:`checks.prepare`) → one line (:meth:`describe`) → each run
  trained or read back (:meth:`train`, :meth:`execute`, :meth:`extra`) → rows, notes and
  plots (:meth:`summarize`) → ``results.json`` and ``report.md``.

  Attributes:
    name: the module's name, ``results.json``'s ``experiment``.
    label: the experiment in messages (``"E3"``).
    title: the report's title.
    per_run_keys: config key → the flag or rule that sets it per run; setting it is an
      error (:func:`checks.check_fixed`).
    required: config key → (the value the science needs, why).
    reads_base_data: whether the runs train on the base config's dataset (its info is
      read once, ``info`` below); else ``info`` is None (E3, E4: one per set).

  One instance serves one invocation: :meth:`check` and :meth:`plan` may keep what they
  parse (the flags' values, the steps per epoch) on ``self`` for the later steps.
  """

  name = ""
  label = ""
  title = ""
  per_run_keys: Mapping[str, str] = {}
  required: Mapping[str, tuple[Any, str]] = {}
  reads_base_data = True

  def check(self, base: Config) -> None:
    """The experiment's own rules on its flags and the base config (a ConfigError)."""

  def plan(self, base: Config, info: Any) -> list[Run]:
    """The runs of the grid the flags choose."""
    raise NotImplementedError

  def describe(self, base: Config, runs: Sequence[Run], info: Any) -> str:
    """The line printed before the first run trains."""
    return f"{self.label}: {len(runs)} runs"

  def train(self, base: Config, runs: Sequence[Run], info: Any) -> list[dict[str, Any]]:
    """Each run's record, trained or read back (:meth:`execute`), in order."""
    return [self.execute(run, base.workdir) for run in runs]

  def execute(self, run: Run, workdir: str) -> dict[str, Any]:
    """:func:`runs.execute` with :meth:`extra`."""
    return runs_lib.execute(run, workdir, verbose=flags.FLAGS.verbose,
                            extra=lambda result: self.extra(run, result))

  def extra(self, run: Run, result: Any) -> dict[str, Any]:
    """The experiment's own numbers of a finished run (into its ``result.json``)."""
    del run, result
    return {}

  def summarize(self, base: Config, runs: Sequence[Run], records: Sequence[dict[str, Any]],
                info: Any) -> tuple[list[report.Row], list[str], list[str]]:
    """The report's rows, notes and plots (plots written by process 0 only)."""
    raise NotImplementedError


def main(experiment: Experiment) -> None:
  """``python -m experiments.<name>``: :func:`cli.run` of :func:`run_experiment`."""
  cli.run(lambda argv: run_experiment(experiment, argv))


def start(argv: Sequence[str]) -> Config:
  """Common start of ``main``: check argv, quiet Orbax, show the runs' progress lines
  (:func:`cli.show_progress`), start jax.distributed, read flags.

  Returns the base config, its ranges and choices checked (:meth:`Config.validate`; a bad
  flag exits with one line naming it, status 2). Its sections are checked by building the
  runs' programs (:func:`checks.prepare`).
  """
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {list(argv[1:])}; flags only")
  runs_lib.SITTING.reset()
  if not flags.FLAGS["verbosity"].present:   # Orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  cli.show_progress()   # the runs' progress lines (orthojax's logger) on stdout
  fv = flags.FLAGS
  cli.check_workdir(fv.workdir)
  if fv.compile_for:   # abstract TPU devices only; this machine's backend is the CPU
    jax.config.update("jax_platforms", "cpu")
  if not fv.config_help:
    distributed.initialize(enabled=fv.distributed, coordinator_address=fv.coordinator_address,
                           num_processes=fv.num_processes, process_id=fv.process_id)
  config = cli.fail_on_config_error(lambda: cli.config_from_flags(fv))
  if fv.config_help and not config.workdir:
    # --config_help exits in prepare(), before any run writes; os.devnull (not a directory)
    # makes an accidental write fail loudly rather than leave a directory behind.
    config = config.replace(workdir=os.devnull)
  return cli.fail_on_config_error(config.validate)


def run_experiment(experiment: Experiment, argv: Sequence[str]) -> None:
  """The skeleton of :class:`Experiment`'s docstring."""
  base = start(argv)
  if not base.workdir and not cli.compile_only():
    cli.fail("--workdir: the experiment writes its runs and report there")
  cli.fail_on_config_error(lambda: checks.check_fixed(
      base, experiment.per_run_keys, experiment.label, experiment.required))
  cli.fail_on_config_error(lambda: experiment.check(base))
  info = None
  if experiment.reads_base_data:
    info = cli.fail_on_config_error(
        lambda: program.dataset_info(base, published=cli.compile_only()))
  runs = cli.fail_on_config_error(lambda: experiment.plan(base, info))
  checks.prepare(runs, base, base.workdir)
  print(experiment.describe(base, runs, info), flush=True)
  started = time.perf_counter()
  records = experiment.train(base, runs, info)
  rows, notes, plots = cli.fail_on_config_error(
      lambda: experiment.summarize(base, runs, records, info))
  report.write_report(base.workdir, experiment=experiment.name, title=experiment.title,
                      rows=rows, config=base, notes=notes, plots=plots,
                      seconds=time.perf_counter() - started)
