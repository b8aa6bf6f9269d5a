"""E5's learning rates per network: the probe that picks them, the file that keeps them.

The paper tuned every network's rates by Bayesian optimisation on validation accuracy
after 50 epochs (Sokol & Park 2020, §4) and does not publish them. The stand-in here
is a probe per (q*, kind of network), seed 0, each trial ``--probe_epochs`` epochs and
judged by its final validation top-1 (:func:`experiments._harness.probe.best_rate`; a
best rate at a grid's edge widens the grid):

* a Euclidean network: Adam's rate over ``--probe_rates_euclidean``;
* a Stiefel / oblique network: first the rate of its manifold weights'
  ``config.optimizer.<kind>`` over ``--probe_rates_manifold`` with Adam at
  ``--probe_rest_rate`` on the scales, biases and classifier; then Adam's rate of those
  over ``--probe_rates_rest`` at the manifold rate just chosen.

``--stages=probe`` writes ``<workdir>/probe/rates.json``; the train stage trains each
network at its cell's rates, from that file or from ``--rates_from``. A trial keeps its
record and metrics, not its weights (its checkpoints are removed once it is done).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from absl import flags
from etils import epath

from experiments import _harness
from experiments._harness import cli
from experiments._harness import probe as probe_lib
from orthojax.train.config import ConfigError

RATES_FILE = os.path.join("probe", "rates.json")
RULE = ("the best final validation top-1 after {epochs:g} epoch(s) of seed 0 (one grid per "
        "parameter group, widened past an edge by up to {widen} rates)")

_positive = {"kind": float, "check": lambda r: r > 0, "requirement": "must be > 0"}
PROBE_EPOCHS = flags.DEFINE_float("probe_epochs", 5, "Epochs of each probe trial.",
                                  lower_bound=0.1)
EUCLIDEAN = _harness.define_list("probe_rates_euclidean", (1e-5, 3e-5, 1e-4, 3e-4, 1e-3),
                                 "The probe's Adam rates of a Euclidean network.", **_positive)
MANIFOLD = _harness.define_list("probe_rates_manifold", (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
                                "The probe's rates of a Stiefel / oblique network's manifold "
                                "weights (config.optimizer.<kind>).", **_positive)
REST = _harness.define_list("probe_rates_rest", (1e-4, 1e-3, 3e-3),
                            "The probe's Adam rates of a manifold network's scales, biases and "
                            "classifier, at its chosen manifold rate.", **_positive)
REST_RATE = flags.DEFINE_float("probe_rest_rate", 1e-4,
                               "Adam's rate on a manifold network's scales, biases and "
                               "classifier while its manifold rate is probed.", lower_bound=0)
WIDEN = flags.DEFINE_integer("probe_widen", 3, "Rates the probe may add past a grid's edge.",
                             lower_bound=0)
RATES_FROM = flags.DEFINE_string("rates_from", None,
                                 "The train stage's rates per network: a probe's workdir or its "
                                 "rates.json (--stages=probe writes <workdir>/probe/rates.json).")


def cell(q_label: str, kind: str) -> str:
  """A cell's key in ``rates.json``: ``q_star=0.5/weights=stiefel``."""
  return f"q_star={q_label}/weights={kind}"


def groups(kind: str) -> list[str]:
  """The optimizer sections a network of ``kind`` trains with."""
  return ["euclidean"] if kind == "euclidean" else [kind, "euclidean"]


def probe_cell(base, q_star: float, q_label: str, kind: str, workdir: str,
               run_config: Callable[..., Any]) -> dict[str, Any]:
  """Probe one cell (module docstring); returns its entry of ``rates.json``:
  ``{"rates": {group: rate}, "probes": {group: {"scores": {rate: top-1}, "at_edge": …}}}``."""
  steps = ([("euclidean", EUCLIDEAN.value)] if kind == "euclidean" else
           [(kind, MANIFOLD.value), ("euclidean", REST.value)])
  chosen = {} if kind == "euclidean" else {"euclidean": REST_RATE.value}
  entry: dict[str, Any] = {"rates": {}, "probes": {}}
  for group, grid in steps:

    def score(rate, group=group):
      rates = {**chosen, group: rate}
      tags = (("q_star", q_label), ("weights", kind),
              *((f"{g}_lr", f"{rates[g]:g}") for g in groups(kind)))
      config = run_config(base, q_star, kind, 0).replace(
          num_epochs=PROBE_EPOCHS.value, final_eval_splits=(), hooks={"epochs": ()},
          optimizer={g: {"learning_rate": r} for g, r in rates.items()})
      run = _harness.Run(tags=tags, config=config)
      record = _harness.execute(run, os.path.join(workdir, "probe"),
                                verbose=flags.FLAGS.verbose)
      epath.Path(run.file(os.path.join(workdir, "probe"), "checkpoints")).rmtree(missing_ok=True)
      return record["eval"].get("top1", float("nan"))

    probe = probe_lib.best_rate(grid, score, widen=WIDEN.value)
    chosen[group] = probe.best
    entry["probes"][group] = {"scores": {f"{r:g}": s for r, s in sorted(probe.scores.items())},
                              "best": probe.best, "at_edge": probe.at_edge,
                              "row": probe.row()}
  entry["rates"] = {g: chosen[g] for g in groups(kind)}
  return entry


def rates_path(source: str) -> str:
  """``rates.json`` of ``--rates_from``: the file, or a probe workdir's."""
  path = epath.Path(source)
  return str(path / RATES_FILE) if path.is_dir() else str(path)


def read_rates(source: str, cells: list[str]) -> dict[str, Any]:
  """The rates file of ``--rates_from``, checked to hold every cell of ``cells``."""
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
                      f"probe those cells (--stages=probe with their --q_stars and "
                      f"--weight_kinds)")
  return rates


def check_flags(stages) -> None:
  """Per-network rates replace the config's learning rates: naming both is an error."""
  if "probe" in stages and RATES_FROM.value:
    raise ConfigError(f"--rates_from={RATES_FROM.value}: --stages=probe picks this workdir's "
                      f"rates; drop one")
  if "probe" in stages or RATES_FROM.value:
    for group in ("euclidean", "stiefel", "oblique"):
      key = f"optimizer.{group}.learning_rate"
      if cli.overridden(key):
        raise ConfigError(f"config.{key}: each network trains at its probed rates "
                          f"({'--stages=probe' if 'probe' in stages else '--rates_from'}); "
                          f"leave it out")


def notes(rates: dict[str, Any], source: str) -> list[str]:
  """The report's lines on the rates: where from, the rule, each cell's probes."""
  lines = [f"learning rates per network from {source}: "
           + RULE.format(epochs=rates["epochs"], widen=rates["widen"])]
  for name, entry in rates["cells"].items():
    for group, probe in entry["probes"].items():
      lines.append(f"probe {name}, config.optimizer.{group}.learning_rate (validation "
                   f"top-1): {probe['row']}")
  return lines
