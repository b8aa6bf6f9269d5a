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
record and metrics, not its weights (its checkpoints are removed once it is done). That
machinery — the probe stage, the groups probed in turn, the file, ``--rates_from``,
``--probe_widen`` — is the harness's (:mod:`experiments._harness.rates`,
:mod:`experiments._harness.probe`); this module holds E5's grids, cells and rule.
"""

from __future__ import annotations

from typing import Any, Callable

from absl import flags

from experiments import _harness

RULE = ("the best final validation top-1 after {epochs:g} epoch(s) of seed 0 (one grid per "
        "parameter group, widened past an edge by up to {widen} rates)")

_harness.define_rates_flags()   # --rates_from, --probe_widen
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
GROUPS = ("euclidean", "stiefel", "oblique")   # the optimizer sections a rate may be probed for
HINT = "--stages=probe with their --q_stars and --weight_kinds"


def rule() -> dict[str, Any]:
  """The probe's parameters, kept in ``rates.json`` beside the cells."""
  return {"epochs": PROBE_EPOCHS.value, "widen": flags.FLAGS.probe_widen}


def cell(q_label: str, kind: str) -> str:
  """A cell's key in ``rates.json``: ``q_star=0.5/weights=stiefel``."""
  return _harness.cell_name((("q_star", q_label), ("weights", kind)))


def groups(kind: str) -> list[str]:
  """The optimizer sections a network of ``kind`` trains with."""
  return ["euclidean"] if kind == "euclidean" else [kind, "euclidean"]


def probe_cell(base, q_star: float, q_label: str, kind: str, workdir: str,
               run_config: Callable[..., Any]) -> dict[str, Any]:
  """Probe one cell (module docstring); returns its entry of ``rates.json``:
  ``{"rates": {group: rate}, "probes": {group: {"scores": {rate: top-1}, "at_edge": …}}}``."""
  grids = ([("euclidean", EUCLIDEAN.value)] if kind == "euclidean" else
           [(kind, MANIFOLD.value), ("euclidean", REST.value)])
  start = {} if kind == "euclidean" else {"euclidean": REST_RATE.value}

  def score(rates):
    tags = (("q_star", q_label), ("weights", kind),
            *((f"{g}_lr", f"{rates[g]:g}") for g in groups(kind)))
    config = _harness.with_rates(run_config(base, q_star, kind, 0).replace(
        num_epochs=PROBE_EPOCHS.value, final_eval_splits=(), hooks={"epochs": ()}), rates)
    return _harness.probe_trial(_harness.Run(tags=tags, config=config), workdir, "top1",
                                verbose=flags.FLAGS.verbose)

  return _harness.probe_groups(grids, score, start=start, widen=flags.FLAGS.probe_widen)


def notes(rates: dict[str, Any], source: str) -> list[str]:
  """The report's lines on the rates: where from, the rule, each cell's probes."""
  return _harness.rates_notes(rates, source, unit="network", score="validation top-1",
                              rule=RULE.format(epochs=rates["epochs"], widen=rates["widen"]))
