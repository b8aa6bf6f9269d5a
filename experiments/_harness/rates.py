"""Learning rates per cell: the ``probe`` stage picks them, ``rates.json`` hands them to the
``train`` stage.

A *cell* is a setting whose runs share their rates (E5: a ``(q*, kind of network)``;
E8: an optimizer arm), named like a run by its tags (:func:`cell_name`). The probe stage
(:func:`probe_cells`) runs the experiment's probe of each cell — short trials
(:func:`probe_trial`) scored on a validation split, a grid per parameter group
(:func:`~experiments._harness.probe.probe_groups`) — and writes
``<workdir>/probe/rates.json``::

    {**rule, "fingerprint": {...}, "cells": {cell: {"rates": {group: rate},
                                                    "probes": {group: {...}}}}}

where ``rule`` holds the probe's parameters (E5: its epochs and ``--probe_widen``) and
``fingerprint`` the config the trials are made from (:mod:`.fingerprints`). The
train stage trains each run at its cell's rates (:func:`with_rates`), from that file or
from ``--rates_from=<a probe's workdir or its rates.json>`` (:func:`given_rates`).
Per-cell rates replace the config's learning rates, so setting one of those too is an
error (:func:`check_rates_flags`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import flags
from etils import epath

from experiments._harness import cli
from experiments._harness import fingerprints
from experiments._harness import runs as runs_lib
from experiments._harness.runs import Run
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

RATES_FILE = os.path.join("probe", "rates.json")
PROBE_DIR = "probe"


def define_rates_flags() -> None:
  """``--rates_from`` and ``--probe_widen`` (defined once per process)."""
  if "rates_from" in flags.FLAGS:
    return
  flags.DEFINE_string("rates_from", None,
                      "The train stage's learning rates per cell: a probe's workdir or its "
                      "rates.json (--stages=probe writes <workdir>/probe/rates.json).")
  flags.DEFINE_integer("probe_widen", 3, "Rates the probe may add past a grid's edge.",
                       lower_bound=0)


def cell_name(tags: Iterable[tuple[str, Any]]) -> str:
  """A cell's key in ``rates.json``, as a run's name: ``q_star=0.5/weights=stiefel``."""
  return "/".join(f"{k}={v}" for k, v in tags)


def with_rates(config: Config, rates: Mapping[str, float]) -> Config:
  """``config`` with ``config.optimizer.<group>.learning_rate`` of each group of ``rates``."""
  return config.replace(optimizer={g: {"learning_rate": r} for g, r in rates.items()})


# --------------------------------------------------------------- The probe --

def probe_trial(run: Run, workdir: str, metric: str, *, verbose: bool = False) -> float:
  """Train a probe trial in ``<workdir>/probe/runs/<tags>`` and return its final eval
  ``metric`` (NaN if absent). A finished trial is read back; it keeps its record and
  metrics, not its weights (its checkpoints are removed once it is done). ``verbose``:
  print the trial's own train / eval lines."""
  where = os.path.join(workdir, PROBE_DIR)
  record = runs_lib.execute(run, where, verbose=verbose)
  epath.Path(run.file(where, "checkpoints")).rmtree(missing_ok=True)
  return record["eval"].get(metric, float("nan"))


def probe_cells(workdir: str, cells: Sequence[str], probe_cell: Callable[[str], dict[str, Any]],
                *, rule: Mapping[str, Any], config: Config) -> tuple[dict[str, Any], str]:
  """The probe stage: ``probe_cell(cell)`` of each cell, into ``<workdir>/probe/rates.json``.

  The file is written after each cell, so an interrupted probe keeps what it found (and
  ``probe_cell``'s trials, read back, make the rerun cheap; each trial is a run, reused
  only for its own config). Cells already in the file that are not probed now are kept
  when the file's ``rule`` is this one and its fingerprint is ``config``'s; a kept cell of
  another config (or of a file from before the check) is refused in one line before any
  trial (:mod:`.fingerprints`).

  Args:
    workdir: the experiment's workdir.
    cells: the cells to probe, in order.
    probe_cell: a cell's entry, ``{"rates": {group: rate}, "probes": {...}}``
      (:func:`~experiments._harness.probe.probe_groups`).
    rule: the probe's parameters, written beside the cells.
    config: the config the probe's trials are made from (the experiment's base); its
      fingerprint is written beside the cells.

  Returns:
    The file's contents and its path.
  """
  path = os.path.join(workdir, RATES_FILE)
  rates = {**rule, fingerprints.KEY: fingerprints.fingerprint(config), "cells": {}}
  if epath.Path(path).exists():
    earlier = json.loads(epath.Path(path).read_text())
    if all(earlier.get(key) == value for key, value in rule.items()):
      kept = [c for c in earlier.get("cells", {}) if c not in cells]
      if kept:
        cli.fail_on_config_error(lambda: _check_kept(path, kept, earlier, config))
      rates["cells"] = earlier.get("cells", {})
  for i, cell in enumerate(cells):
    entry = probe_cell(cell)
    rates["cells"][cell] = entry
    print(f"  probe {i + 1}/{len(cells)} {cell}: "
          + ", ".join(f"{g} lr {r:g}" for g, r in entry["rates"].items()), flush=True)
    if cli.is_writer():
      runs_lib.write_json(path, rates)
  return rates, path


def _check_kept(path: str, kept: Sequence[str], earlier: Mapping[str, Any],
                config: Config) -> None:
  """Refuse (a ConfigError) the cells ``kept`` from ``earlier`` (the file at ``path``)
  unless its fingerprint is ``config``'s."""
  diff = fingerprints.differences(earlier.get(fingerprints.KEY), config, against="probe")
  cell = f"{path}: its probe of {', '.join(kept)}"
  if isinstance(diff, str):
    raise ConfigError(f"{cell} {diff}; use a new --workdir")
  if diff:
    raise ConfigError(f"{cell} is of another config: {', '.join(diff)}; probe with that "
                      f"config or use a new --workdir")


# --------------------------------------------------------------- The file --

def rates_path(source: str) -> str:
  """``rates.json`` of ``--rates_from``: the file, or a probe workdir's."""
  path = epath.Path(source)
  return str(path / RATES_FILE) if path.is_dir() else str(path)


def read_rates(source: str, cells: Sequence[str], *,
               hint: str = "--stages=probe with those cells") -> dict[str, Any]:
  """The rates file of ``--rates_from=source``, checked to hold every cell of ``cells``.

  Raises:
    ConfigError: no such file, not JSON, or a cell missing (``hint`` says how to probe
      it: ``probe those cells (<hint>)``).
  """
  path = rates_path(source)
  try:
    rates = json.loads(epath.Path(path).read_text())
  except FileNotFoundError:
    raise ConfigError(f"--rates_from={source}: no {path}; run --stages=probe there first, or "
                      f"name a rates.json") from None
  except json.JSONDecodeError as err:
    raise ConfigError(f"--rates_from={source}: {path} is not JSON ({err})") from None
  missing = [c for c in cells if c not in rates.get("cells", {})]
  if missing:
    raise ConfigError(f"--rates_from={source}: {path} has no rates for {', '.join(missing)}; "
                      f"probe those cells ({hint})")
  return rates


def given_rates(source: str | None, stages: Sequence[str], cells: Sequence[str], *,
                hint: str = "--stages=probe with those cells"
                ) -> tuple[dict[str, Any] | None, str | None]:
  """The rates of ``--rates_from=source`` and their file when the train stage runs, else
  ``(None, None)`` (:func:`read_rates`: every cell of ``cells`` must be there)."""
  if not source or "train" not in stages:
    return None, None
  return read_rates(source, cells, hint=hint), rates_path(source)


def cell_rates(rates: Mapping[str, Any], cell: str) -> dict[str, float]:
  """The rates of ``cell`` (group → rate) in a rates file's contents."""
  return rates["cells"][cell]["rates"]


def check_rates_flags(source: str | None, stages: Sequence[str], groups: Sequence[str], *,
                      unit: str = "run") -> None:
  """Per-cell rates replace the config's: ``--rates_from=source`` with ``--stages=probe``,
  or either with ``--config.optimizer.<group>.learning_rate`` for a group of ``groups``, is
  a ConfigError (``unit``: what a run is called, ``each <unit> trains at its probed
  rates``)."""
  if "probe" in stages and source:
    raise ConfigError(f"--rates_from={source}: --stages=probe picks this workdir's "
                      f"rates; drop one")
  if "probe" in stages or source:
    for group in groups:
      key = f"optimizer.{group}.learning_rate"
      if cli.overridden(key):
        raise ConfigError(f"config.{key}: each {unit} trains at its probed rates "
                          f"({'--stages=probe' if 'probe' in stages else '--rates_from'}); "
                          f"leave it out")


def rates_notes(rates: Mapping[str, Any], source: str, *, rule: str, unit: str = "run",
                score: str = "validation score") -> list[str]:
  """The report's lines on the rates: where from, the ``rule`` (text), each cell's probes
  (``score``: what the probe's numbers are, e.g. ``validation top-1``)."""
  lines = [f"learning rates per {unit} from {source}: {rule}"]
  for name, entry in rates["cells"].items():
    for group, probe in entry["probes"].items():
      lines.append(f"probe {name}, config.optimizer.{group}.learning_rate ({score}): "
                   f"{probe['row']}")
  return lines
