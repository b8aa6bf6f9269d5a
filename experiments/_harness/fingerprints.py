"""Which config a finished record belongs to: a record is reused only for the config that
produced it.

Three kinds of record are read back instead of being made again: a run's ``result.json``
(:func:`~experiments._harness.runs.execute`; a probe's trials are runs too), the probe's
cells in ``rates.json`` (:func:`~experiments._harness.rates.probe_cells`) and the runs of
``--include_workdirs`` (:func:`~experiments._harness.records.included_records`). Each is
checked against today's config before it is used, and another config is refused in one
line naming the keys that differ, as the trainer refuses a checkpoint of another run.

The fingerprint is the trainer's record of a zoo run — what it writes to ``config.json``
and into every checkpoint for its resume check (:mod:`orthojax.train.fingerprint` builds
the same record for a :func:`~orthojax.train.fit` run from its objects): the run's config,
``config.to_dict()``, which names the model, the optimizer groups, the penalty and the
data. Computing it builds nothing and reads no data. It is compared by the trainer's own
diff (:func:`orthojax.train.resume.resume_differences`: sections with their constructors'
defaults filled in), with fewer keys allowed to differ (:data:`FINISHED_KEYS`): a resumed
run goes on training, so its checkpoint may change how far it trains, how often it
evaluates, its hooks and its final splits; a finished run is read back as it is, and each
of those would have made another record (its length, its eval curve, its hook
measurements, its splits). Where it ran (workdir, mesh, data directory) and how it logged
and saved may differ.

Not compared: the data's checksum that the trainer's record adds for a text corpus (its
sha256: computing it reads the corpus). The config names the data — the set and its
options; the trainer's resume check compares the checksum.

A record written before this check has no fingerprint. A run's ``config.json`` — the
trainer writes it beside the run's files when the run starts, and a finished run is never
started again — stands in for it; a run without one (or one in an earlier layout) cannot
be told to be this config's and is refused: a new workdir trains it afresh, and the old
one stays as it is. Refusing rather than trusting it is the point of the check: a
report built on another config's numbers is wrong without any sign of it.

Not checked: the records a stage measures without training
(:func:`~experiments._harness.records.cached_record`, E5's diagnostics at initialisation),
which depend on the network and the data alone and are meant to be copied between
workdirs of different training flags (``critical_tanh_init.flags``' workdir into the
training flagfiles').
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from etils import epath

from orthojax.train import resume
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

KEY = "fingerprint"   # the key of a record's fingerprint (result.json, rates.json)
# Resumable keys that change a finished run's record: a checkpoint may change them.
SHAPES_RECORD = ("eval_every", "hooks.every_steps", "hooks.epochs", "final_eval_splits")
FINISHED_KEYS = tuple(k for k in resume.RESUMABLE_KEYS if k not in SHAPES_RECORD)
"""Keys a finished run's config may differ in and still be reused: where it ran, how it
logged and saved (the trainer's :data:`~orthojax.train.resume.RESUMABLE_KEYS` but
:data:`SHAPES_RECORD`)."""
RATES = ("optimizer.*learning_rate",)
"""The learning rates: a planned run's may still change (a train stage sets them per cell
from a probe), and each included workdir may train at its own."""


def fingerprint(config: Config) -> dict[str, Any]:
  """What ``config`` trains, as the trainer records it for its resume check: the config
  as JSON (no data read)."""
  return config.to_dict()


def run_fingerprint(record: Mapping[str, Any], run_dir: str) -> dict[str, Any] | None:
  """The fingerprint of a finished run in ``run_dir`` whose ``result.json`` is ``record``:
  the record's own, else the ``config.json`` the trainer wrote when the run started (a
  record from before the check), else None."""
  if isinstance(record.get(KEY), Mapping):
    return dict(record[KEY])
  path = epath.Path(run_dir) / "config.json"
  try:
    saved = json.loads(path.read_text()) if path.exists() else None
  except json.JSONDecodeError:
    return None
  return saved if isinstance(saved, dict) else None


def differences(saved: Mapping[str, Any] | None, config: Config, *, against: str,
                allowed: Sequence[str] = FINISHED_KEYS) -> list[str] | str:
  """``config.key=now (<against>: then)`` for each key of ``config`` that differs from the
  fingerprint ``saved`` (``allowed``: ``fnmatch`` patterns of keys that may differ); or, as
  a string, why ``saved`` cannot be compared: it is None (recorded before the check) or of
  an earlier layout."""
  if saved is None:
    return "predates the config check (no config recorded with it)"
  saved = {k: v for k, v in saved.items() if k != "data_checksum"}   # not compared
  layout = resume.earlier_layout(saved)
  if layout:
    return f"was recorded by an earlier orthojax layout ({layout})"
  return resume.resume_differences(saved, config, allowed=allowed, against=against)


def check_finished_run(record: Mapping[str, Any], run_dir: str, config: Config, *,
                       allowed: Sequence[str] = FINISHED_KEYS) -> None:
  """Refuse (a ConfigError) the finished run in ``run_dir`` (its ``result.json``:
  ``record``) unless it was trained with ``config`` (``allowed``: keys that may differ)."""
  step = f" (step {record['final_step']})" if "final_step" in record else ""
  saved = run_fingerprint(record, run_dir)
  diff = differences(saved, config, against="finished run", allowed=allowed)
  if isinstance(diff, str):
    raise ConfigError(f"{run_dir}: its finished run{step} {diff}; use a new --workdir")
  if diff:
    raise ConfigError(f"{run_dir}: its finished run{step} is of another config: "
                      f"{', '.join(diff)}; rerun with that config or use a new --workdir")
