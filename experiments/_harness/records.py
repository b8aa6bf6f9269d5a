"""Records beyond a trained run's ``result.json``: measured once and cached, or brought in
from other workdirs.

* :func:`cached_record` — a stage that measures each run without training it (E5's
  ``init`` stage: the diagnostics at initialisation) keeps one JSON file per run,
  ``<workdir>/<stage>/<tags>.json``, written when it is measured and read back (not
  measured again) by every later invocation, so the stage resumes where it stopped.
* :func:`included_records` — ``--include_workdirs``: the finished runs of other workdirs
  of the same experiment (e.g. each kind of network trained by its own flagfile, at its
  own learning rates) join this workdir's report.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

from absl import flags
from etils import epath

from experiments._harness import cli
from experiments._harness import fingerprints
from experiments._harness import report
from experiments._harness import runs as runs_lib
from experiments._harness.runs import Run
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


# ------------------------------------------------------------- Record cache --

def record_path(workdir: str, stage: str, run: Run) -> str:
  """``<workdir>/<stage>/<tags>.json``: ``stage``'s record of ``run``."""
  return os.path.join(workdir, stage, run.name + ".json")


def cached_record(workdir: str, stage: str, run: Run,
                  measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
  """``stage``'s record of ``run``, measured once.

  The first call measures: the record is ``{"tags": …, **measure(), "seconds": …}`` (the
  run's tags, the experiment's numbers, the seconds ``measure`` took), written atomically
  to :func:`record_path` by process 0, and the work counts in the experiment's wall time
  (:func:`~experiments._harness.runs.count_sitting`). Later calls read the file back and
  do not call ``measure``.
  """
  path = record_path(workdir, stage, run)
  if epath.Path(path).exists():
    return json.loads(epath.Path(path).read_text())
  start = time.perf_counter()
  record = {"tags": dict(run.tags), **measure()}
  record["seconds"] = time.perf_counter() - start
  if cli.is_writer():
    runs_lib.write_json(path, record)
  runs_lib.count_sitting(workdir)
  return record


# --------------------------------------------------------- Included workdirs --

def define_include_flag() -> None:
  """``--include_workdirs`` (defined once per process; read by :func:`included_records`)."""
  if "include_workdirs" in flags.FLAGS:
    return
  flags.DEFINE_list("include_workdirs", [],
                    "Workdirs of finished runs of the same experiment (e.g. other kinds of "
                    "network, each trained by its own flagfile at its own learning rates) whose "
                    "runs join this report's rows, notes and plots.")


def included_records(workdirs: Sequence[str], own: Sequence[Run], *, config: Config,
                     experiment: str, label: str,
                     unit: str = "run") -> tuple[list[dict[str, Any]], list[str]]:
  """The finished training records of ``workdirs`` and each one's training note.

  An included workdir is of this report's config: its report's config (``results.json``)
  is ``config`` but for where it ran, how it logged and saved, and the optimizers'
  learning rates (each workdir may train its networks at its own rates; its note says
  which), and each of its runs carries its fingerprint (:mod:`.fingerprints`: a run
  recorded before the check cannot be told to be that workdir's).

  Args:
    workdirs: ``--include_workdirs``: each a finished report (``results.json``) of
      ``experiment`` whose runs lie in ``<workdir>/runs/<tags>/result.json``.
    own: this invocation's runs; the included runs have as many tags.
    config: this invocation's base config (its report's).
    experiment: the experiment's module name, ``results.json``'s ``experiment``.
    label: the experiment in messages (``"E5"``).
    unit: what a run is called in messages (``"network"``).

  Returns:
    The included runs' records (each workdir's in the order of their names) and, per
    workdir that holds any, ``"included from <workdir>: <its report's first note>"``
    (by convention the training note: data, model, optimizers and rates).

  Raises:
    ConfigError: a workdir without a finished report, a report of another experiment
      or of another config, a run without its fingerprint, or a run (its tags) in two
      workdirs, or in a workdir and this one.
  """
  flag = f"--include_workdirs={','.join(workdirs)}"
  records, notes, seen = [], [], {run.name for run in own}
  depth = len(own[0].tags) if own else 1
  for workdir in workdirs:
    results = _finished_report(workdir, flag, experiment, label)
    _check_included_config(results, workdir, flag, config)
    found = sorted(epath.Path(workdir).glob("/".join(["runs", *["*"] * depth, "result.json"])))
    for path in found:
      record = json.loads(path.read_text())
      if fingerprints.run_fingerprint(record, str(path.parent)) is None:
        raise ConfigError(f"{flag}: {path.parent}: its finished run predates the config "
                          f"check (no config recorded with it); include workdirs trained "
                          f"since, or train it again in a new workdir")
      name = Run(tuple(record["tags"].items()), None).name
      if name in seen:
        raise ConfigError(f"{flag}: {unit} {name} is in {workdir} and in another workdir of "
                          f"this report; include it once")
      seen.add(name)
      records.append(record)
    if found:
      notes.append(f"included from {workdir}: {results['notes'][0]}")
  return records, notes


INCLUDED_KEYS = fingerprints.FINISHED_KEYS + fingerprints.RATES
"""Keys an included workdir's config may differ in: a finished run's, and the learning
rates (each workdir's training note names its optimizers and rates)."""


def _check_included_config(results: Mapping[str, Any], workdir: str, flag: str,
                           config: Config) -> None:
  """Refuse (a ConfigError) an included report whose config is not ``config``
  (:data:`INCLUDED_KEYS` may differ)."""
  diff = fingerprints.differences(results.get("config"), config, against=workdir,
                                  allowed=INCLUDED_KEYS)
  if isinstance(diff, str):
    raise ConfigError(f"{flag}: the report in {workdir} {diff}; include workdirs trained "
                      f"since")
  if diff:
    raise ConfigError(f"{flag}: {workdir} was run with another config: {', '.join(diff)}; "
                      f"include workdirs of this config")


def _finished_report(workdir: str, flag: str, experiment: str, label: str) -> dict[str, Any]:
  """``results.json`` of ``workdir``, checked to be ``experiment``'s (a ConfigError)."""
  try:
    results = report.read_results(workdir)
  except FileNotFoundError:
    raise ConfigError(f"{flag}: {workdir} has no finished {label} report (results.json); run "
                      f"its flagfile to the end first") from None
  if results.get("experiment") != experiment:
    raise ConfigError(f"{flag}: {workdir} holds {results.get('experiment')!r}, not an {label} "
                      f"({experiment}) run")
  return results
