"""Check every run before any trains: the experiment's own rules, then each distinct
program built abstractly; ``--config_help`` and ``--compile_for`` act here."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Mapping, NoReturn, Sequence

from absl import flags
from etils import epath
import jax

from experiments._harness import cli
from experiments._harness import fingerprints
from experiments._harness import runs as runs_lib
from experiments._harness.runs import Run
from orthojax.compile import aot
from orthojax.compile import topology
from orthojax.train import program
from orthojax.train import resume
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


def check_fixed(base: Config, fixed: Mapping[str, str], experiment: str,
                required: Mapping[str, tuple[Any, str]] = {}) -> None:  # pylint: disable=dangerous-default-value
  """The experiment's own rules on the config, declared rather than coded.

  ``fixed``: key → which flag or rule sets it per run. Setting one on the command line,
  or in the config file away from the trainer's default, would have no effect: a
  ConfigError. ``required``: key → (the value the experiment's science needs, why);
  another value is a ConfigError (e.g. E4's characteristic points are ReLU kinks).
  A key ending in ``.*`` stands for every key of that section but ``name`` and
  ``data_dir``.
  """
  tree = resume.flatten(base.to_dict())
  defaults = resume.flatten(Config().to_dict())
  for key, why in fixed.items():
    keys = ([k for k in tree if k.startswith(key[:-1])
             and not k.endswith((".name", ".data_dir"))]
            if key.endswith(".*") else [key])
    for k in keys:
      value = tree.get(k)
      if cli.overridden(k) or value != defaults.get(k):
        raise ConfigError(f"config.{k}={value!r}: {experiment} sets it per run ({why}); "
                          f"leave it out")
  for key, (want, why) in required.items():
    value = tree.get(key, want)
    if value != want:
      raise ConfigError(f"config.{key}={value!r}: {experiment} needs {want!r} ({why})")


def distinct_programs(runs: Sequence[Run]) -> list[Run]:
  """One run per distinct program: runs differing only in seed, workdir or data split
  compile to the same program."""
  seen: dict[str, Run] = {}
  for run in runs:
    data = {k: v for k, v in run.config.data.items()
            if k not in ("split_index", "data_seed", "permutation_seed")}
    key = json.dumps({**run.config.to_dict(), "seed": 0, "workdir": "", "data": data},
                     sort_keys=True)
    seen.setdefault(key, run)
  return list(seen.values())


def prepare(runs: Sequence[Run], base: Config, workdir: str) -> None:
  """Check every run the way it will run, then act on ``--config_help`` / ``--compile_for``.

  Each distinct program of ``runs`` (:func:`distinct_programs`) is built abstractly
  (:func:`orthojax.train.program.check`: the model by ``nnx.eval_shape``, the optimizer
  chain, the shardings — no data read, nothing compiled), so a bad key stops the
  experiment in one line before any run trains, naming the run it belongs to. Then
  ``--config_help`` prints the config and exits 0 — it fails exactly where the run
  would — and ``--compile_for`` compiles the programs for the topology
  (:func:`compile_runs`) and exits. Otherwise the runs that finished in ``workdir`` are
  checked to be of their configs (:func:`check_finished`).
  """
  if not cli.compile_only():   # compile_runs builds the same programs on the topology's chips
    for run in distinct_programs(runs):
      cli.fail_on_config_error(lambda run=run: _check_run(run, len(runs) > 1))
  if flags.FLAGS.config_help:
    cli.print_config_help(base)
    raise SystemExit(0)
  if cli.compile_only():
    compile_runs(runs, workdir)
  if workdir:
    cli.fail_on_config_error(lambda: check_finished(runs, workdir))


def check_finished(runs: Sequence[Run], workdir: str) -> None:
  """Before any run trains: each run of ``runs`` that finished in ``workdir`` is of its
  config (:mod:`.fingerprints`; a ConfigError naming the keys that differ). The learning
  rates are left to :func:`~experiments._harness.runs.execute`, which checks each run in
  full when it comes to it: an experiment's train stage may still set them (per cell,
  from a probe)."""
  for run in runs:
    path = epath.Path(runs_lib.result_path(run, workdir))
    if path.exists():
      fingerprints.check_finished_run(
          json.loads(path.read_text()), run.directory(workdir),
          run.config.replace(workdir=run.directory(workdir)),
          allowed=fingerprints.FINISHED_KEYS + fingerprints.RATES)


def _check_run(run: Run, name_it: bool) -> None:
  try:
    program.check(run.config, devices=run.devices or jax.devices(),
                  num_processes=jax.process_count(), published=flags.FLAGS.config_help)
  except ConfigError as e:
    if not (name_it and run.name):
      raise
    raise ConfigError(f"{e} (run {run.name})") from None


def compile_runs(runs: Sequence[Run], workdir: str, *,
                 print_fn: Callable[[str], Any] = cli.echo) -> NoReturn:
  """``--compile_for``: compile each distinct program of ``runs`` for the topology and stop.

  Prints one table per program, writes them all to ``<workdir>/compile_report.json``
  (nothing is written without ``--workdir``) and exits 0, or 1 with one line
  when the topology, the mesh or the batch is wrong or a program does not fit
  the chip's HBM. A run its experiment pins to ``n`` devices (tiny full-batch
  runs on one) compiles for the topology's first ``n`` chips.
  """
  target = flags.FLAGS.compile_for
  reports: dict[str, Any] = {}
  try:
    programs = distinct_programs(runs)
    for run in programs:
      print_fn(f"Compiling {run.name or 'the run'} for {target}"
               + (f" × {run.config.mesh.num_slices} slices" if run.config.mesh.num_slices > 1
                  else "")
               + " …")
      report = aot.compile_for(run.config, target,
                               num_chips=len(run.devices) if run.devices else None)
      reports[run.name or "run"] = report
      print_fn(report.table() + "\n")
    if workdir and cli.is_writer():
      print_fn(f"Compile report: {aot.write_reports(workdir, reports)}")
    for report, run in zip(reports.values(), programs):
      report.check_fits(run.config)
  except (ConfigError, ValueError, topology.TopologyError, aot.DoesNotFitError) as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(1) from None
  raise SystemExit(0)
