r"""E7 — deep linear networks: epochs to a training-loss threshold vs depth (Saxe et al. 2014).

    python -m experiments.deep_linear --flagfile=experiments/flags/deep_linear.flags \
        --workdir=runs/deep_linear

Protocol (the training settings: ``experiments/configs/deep_linear.py``, whose
argument picks digits, ``mnist`` or ``smoke``; the flagfiles name it and set this
module's own flags). ``y = softmax(x W_1 ⋯ W_D)``: a :class:`~orthojax.models.DeepLinear`
network (``config.model``: ``D`` bias-free linear factors, no nonlinearity; square
``width × width`` factors plus a ``width × 10`` output factor) on scikit-learn's
bundled 8×8 digits (``config.data.name='digits'``: 1,438 training images, 64
standardised pixels, 10 classes; offline). For each depth ``D`` in ``--depths``, each
initialisation in ``--inits`` and ``--num_seeds`` seeds, it trains with full-batch
gradient descent (``config.optimizer.euclidean``: ``sgd``; the batch is the whole training set,
so one step is one epoch and the logged training loss is the exact training loss) for
``config.num_epochs`` epochs, and reads from the run's ``metrics.jsonl`` the number of
epochs after which the training cross-entropy first falls to each threshold in
``--loss_thresholds``. Initialisations, with gain 1 (``config.model.scale``):

* ``orthogonal``: every factor a Haar-random orthonormal matrix (every
  singular value of the product is 1 for the square factors);
* ``gaussian``: "scaled Gaussian", ``W_ij ~ N(0, 1/fan_in)`` — the product's
  mean squared singular value is 1 but its spectrum spreads with depth.

Learning rate: with ``--lr_scaling=inverse_depth`` (default) a depth-``D``
network trains at ``config.optimizer.euclidean.learning_rate / D``. In a deep linear network every factor
receives a gradient of the same size, so the end-to-end map moves ``D``
times faster than one factor: a fixed learning rate makes deeper
orthogonal nets *faster* (and makes deep Gaussian nets diverge), while
``lr ∝ 1/D`` is the depth scaling of Saxe et al.'s analysis under which
learning time from balanced (orthogonal) initial conditions is depth
independent. ``--lr_scaling=constant`` uses the config's learning rate at every depth.

A run that never reaches a threshold within ``config.num_epochs`` (or diverges
first — ``config.nan_policy='skip'`` keeps such a run going with its non-finite
updates dropped, and marks it ``diverged``) is counted as ``config.num_epochs``,
a lower bound; the row's note says how many runs were censored.

The experiment sets per run ``config.model.depth``, ``config.model.init``,
``config.seed`` (``seed + i``), ``config.optimizer.euclidean.learning_rate`` (scaled),
``config.batch_size`` (the training set), ``config.eval_batch_size`` (0),
``config.log_every`` (1) and the mesh (one device); overriding one of those is an error.

The paper's claim (Saxe, McClelland & Ganguli, ICLR 2014, their MNIST
depth experiment; reproduced as Figure 2 of the dynamical-isometry seed):
with random orthogonal initialisation the training time to a fixed error
criterion is (nearly) independent of depth, with scaled random Gaussian
initialisation it grows with depth (the seed says: linearly). The paper
reports this as a plot only, so every row's paper value is None (—).

How ours differs: digits instead of MNIST (the offline, seconds-per-run
stand-in; the config argument ``mnist`` runs the 5,000-image MNIST subset, see
``deep_linear_mnist.flags``, whose 784 → 128 input factor and 128 → 10 output factor
make depth 2 the shallowest), softmax cross-entropy on the linear network's
output rather than a squared error, full-batch gradient descent, and a
training-*loss* criterion rather than a training-error one. orthojax's
trainer has no synthetic linear-teacher dataset and its ``mse`` loss takes
regression targets, not class labels, so the squared-error MNIST setup is
not available without touching the data layer.

Outputs in ``--workdir``: ``runs/depth=D/init=I/seed=S/`` (each run's
``metrics.jsonl`` and ``result.json`` with its ``epochs_to_threshold``),
``results.json`` / ``report.md`` (epochs to each threshold, depth × init,
mean ± std over seeds), ``deep_linear_epochs.png`` (epochs vs depth, one
line per init, error bars: std over seeds) and ``deep_linear_loss.png``
(mean training-loss curves).
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence

from absl import flags
import jax
import numpy as np

from experiments import _harness
from orthojax import models
from orthojax.train import metrics as metrics_lib
from orthojax.train.config import ConfigError

INITS = models.DeepLinear.INITS
LR_SCALINGS = ("inverse_depth", "constant")
# The paper reports its depth sweep as a figure only (Saxe et al. 2014, MNIST;
# seed Figure 2): no number to print beside ours.
PAPER: dict[tuple[int, str], float | None] = {}
PAPER_CLAIM = ("paper (Saxe et al. 2014, plot only — no numbers): epochs to criterion "
               "~constant in depth for orthogonal init, growing with depth for scaled "
               "Gaussian init")


_harness.define_flags("deep_linear.py")
_DEPTHS = _harness.define_list("depths", (2, 4, 8, 16, 32),
                               "Depths D (number of linear factors).", kind=int,
                               check=lambda d: d >= 2, unique=True,
                               requirement="< 2 (a deep linear net here has at least one "
                                           "hidden factor and the output factor)")
_INITS = _harness.define_list("inits", INITS, f"Initialisations: {', '.join(INITS)}.",
                              choices=INITS)
_THRESHOLDS = _harness.define_list(
    "loss_thresholds", (0.5, 0.2),
    "Training-loss thresholds; epochs until the loss first falls to each.", kind=float,
    check=lambda t: t > 0 and math.isfinite(t), requirement="must be > 0")
_LR_SCALING = flags.DEFINE_enum("lr_scaling", "inverse_depth", LR_SCALINGS,
                                "Depth-D nets train at "
                                "config.optimizer.euclidean.learning_rate / D, or at it.")


# ------------------------------------------------------------ Measurement --

def epochs_to_threshold(records: Iterable[dict[str, Any]], threshold: float,
                        steps_per_epoch: int = 1) -> float | None:
  """Epochs completed when the logged training loss first is ``<= threshold``.

  Args:
    records: a run's ``metrics.jsonl`` records (:func:`orthojax.train.metrics.read_jsonl`);
      only ``split == "train"`` records with a ``loss`` are read. The loss
      logged at step ``s`` is computed on the parameters *before* update
      ``s`` (after ``s − 1`` updates), so a loss first at or below the
      threshold at step ``s`` means ``(s − 1) / steps_per_epoch`` epochs.
      Non-finite losses never count; repeated steps (a resumed run appends
      to its log) do not matter — the earliest step wins.
    threshold: the loss criterion.
    steps_per_epoch: updates per epoch (1 for full-batch training).

  Returns:
    The number of epochs, or None if the loss never reached the threshold.
  """
  if steps_per_epoch < 1:
    raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
  first = None
  for r in records:
    if r.get("split") != "train" or "loss" not in r:
      continue
    loss = float(r["loss"])
    if math.isfinite(loss) and loss <= threshold and (first is None or r["step"] < first):
      first = int(r["step"])
  return None if first is None else (first - 1) / steps_per_epoch


def run_summary(records: list[dict[str, Any]], thresholds: Sequence[float],
                steps_per_epoch: int = 1) -> dict[str, Any]:
  """A run's E7 numbers from its metrics log: epochs to each threshold, divergence, losses."""
  train = sorted((r for r in records if r.get("split") == "train" and "loss" in r),
                 key=lambda r: r["step"])
  losses = [float(r["loss"]) for r in train]
  return {
      "epochs_to_threshold": {_key(t): epochs_to_threshold(train, t, steps_per_epoch)
                              for t in thresholds},
      "diverged": any(not math.isfinite(v) for v in losses),
      "initial_loss": losses[0] if losses else None,
      "final_loss": losses[-1] if losses else None,
  }


def _key(threshold: float) -> str:
  return f"{threshold:g}"


# ------------------------------------------------------------------- Runs --

# Keys the experiment sets per run (why), so an override of one would have no effect.
PER_RUN_KEYS = {
    "model.depth": "each depth of --depths",
    "model.init": "each init of --inits",
    "batch_size": "the whole training set: full batch",
    "eval_batch_size": "0: the batch",
    "log_every": "1: every epoch's loss",
    "mesh.data": "1: one device",
    "mesh.fsdp": "1: one device",
    "mesh.model": "1: one device",
}


def runs(base, depths: Sequence[int], inits: Sequence[str], num_seeds: int, lr_scaling: str,
         num_train: int) -> list[_harness.Run]:
  """depths × inits × seeds, full-batch on one device (the batch is the training set)."""
  out = []
  for depth in depths:
    for init in inits:
      for s in range(num_seeds):
        lr = base.learning_rate
        config = base.replace(
            model={"depth": depth, "init": init}, seed=base.seed + s,
            batch_size=num_train, eval_batch_size=0,
            optimizer={"euclidean": {"learning_rate": lr / depth if lr_scaling == "inverse_depth" else lr}},
            log_every=1, mesh={"data": 1, "fsdp": 1, "model": 1})
        out.append(_harness.Run(tags=(("depth", depth), ("init", init), ("seed", s)),
                                config=config, devices=jax.devices()[:1]))
  return out


# ----------------------------------------------------------------- Report --

def rows_from(records: Sequence[dict[str, Any]], depths: Sequence[int], inits: Sequence[str],
              thresholds: Sequence[float], num_epochs: float) -> list[_harness.Row]:
  """Epochs to each threshold per (depth, init) over seeds; censored runs count as the cap."""
  rows = []
  for t in thresholds:
    for init in inits:
      for depth in depths:
        mine = [r for r in records
                if r["tags"]["depth"] == depth and r["tags"]["init"] == init]
        if not mine:
          continue
        values, censored, diverged = [], 0, 0
        for r in mine:
          epochs = r["epochs_to_threshold"].get(_key(t))
          if epochs is None:
            censored += 1
            epochs = float(num_epochs)
          values.append(float(epochs))
          diverged += bool(r.get("diverged"))
        notes = []
        if censored:
          notes.append(f"{censored}/{len(mine)} not reached in {num_epochs:g} epochs "
                       f"(counted as {num_epochs:g}: a lower bound)")
        if diverged:
          notes.append(f"{diverged}/{len(mine)} diverged later")
        rows.append(_harness.Row({"depth": depth, "init": init},
                                 f"epochs to train loss ≤ {t:g}", values,
                                 PAPER.get((depth, init)), "; ".join(notes)))
  return rows


def plot_epochs(rows: Sequence[_harness.Row], path: str, cap: float, setting: str) -> str:
  """Epochs to threshold vs depth: one line per init (mean ± std), one panel per threshold;
  a dotted line at ``cap``, the epochs a run that never reached the threshold counts as.
  The inits are nudged apart sideways so that equal values stay visible; ``setting``
  (data, seeds) goes in the title."""
  plt = _harness.pyplot()

  metrics = list(dict.fromkeys(r.metric for r in rows))
  fig, axes = plt.subplots(1, len(metrics), squeeze=False, figsize=(4.2 * len(metrics), 3.4))
  for ax, metric in zip(axes[0], metrics):
    mine = [r for r in rows if r.metric == metric]
    inits = list(dict.fromkeys(r.setting["init"] for r in mine))
    for k, init in enumerate(inits):
      series = sorted((r for r in mine if r.setting["init"] == init),
                      key=lambda r: r.setting["depth"])
      stats = [r.stats() for r in series]
      nudge = 2 ** (0.04 * (k - (len(inits) - 1) / 2))   # a few % of an octave
      ax.errorbar([r.setting["depth"] * nudge for r in series], [s[0] for s in stats],
                  yerr=[s[1] for s in stats], marker="o", capsize=3, label=init)
    if any("not reached" in r.note for r in mine):
      ax.axhline(cap, color="0.4", ls=":", lw=1,
                 label=f"{cap:g} epochs: not reached (censored, a lower bound)")
    depths = sorted({r.setting["depth"] for r in mine})
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel("depth D (log scale)")
    ax.set_ylabel("epochs")
    ax.set_title(metric, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
  fig.suptitle(f"E7 deep linear, {setting}: epochs to threshold (mean ± std over seeds; "
               "the paper has a plot only, no numbers)", fontsize=9)
  fig.tight_layout()
  return _harness.save_figure(fig, path)


def plot_losses(curves: dict[tuple[int, str], list[list[float]]], thresholds: Sequence[float],
                path: str, setting: str) -> str:
  """Mean training-loss curves: one panel per init, one line per depth; the thresholds
  dashed; ``setting`` (data, seeds) in the title."""
  plt = _harness.pyplot()

  inits = list(dict.fromkeys(init for _, init in curves))
  fig, axes = plt.subplots(1, len(inits), squeeze=False, figsize=(4.2 * len(inits), 3.4),
                           sharey=True)
  for ax, init in zip(axes[0], inits):
    for depth in sorted(d for d, i in curves if i == init):
      runs_ = curves[(depth, init)]
      n = min(len(c) for c in runs_)
      if not n:
        continue
      mean = np.nanmean(np.array([c[:n] for c in runs_], dtype=float), axis=0)
      ax.plot(np.arange(n), mean, label=f"D={depth}")
    for i, t in enumerate(thresholds):
      ax.axhline(t, color="k", lw=0.6, ls="--",
                 label=f"thresholds ({', '.join(f'{x:g}' for x in thresholds)})" if not i
                 else None)
    _harness.log_axis(ax)
    ax.set_xlabel("epoch")
    ax.set_title(f"{init} init", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")   # the curves start high and end right
  axes[0, 0].set_ylabel("training loss (mean over seeds)")
  fig.suptitle(f"E7 deep linear, {setting}: training loss by depth", fontsize=9)
  fig.tight_layout()
  return _harness.save_figure(fig, path)


# ------------------------------------------------------------------- Main --

class DeepLinear(_harness.Experiment):
  """E7: depths × inits × seeds; epochs to each loss threshold."""

  name, label = "deep_linear", "E7"
  title = "E7 — deep linear networks: epochs to a loss threshold vs depth (Saxe et al. 2014)"
  per_run_keys = PER_RUN_KEYS
  required = {"model.name": ("DeepLinear", "E7 trains DeepLinear networks")}

  def check(self, base):
    if not base.model.get("width"):
      raise ConfigError("config.model.width: the deep linear network's hidden width is needed "
                        "(e.g. 64)")
    if not base.num_epochs:
      raise ConfigError("config.num_epochs: E7 trains full batch for a number of epochs "
                        "(config.num_steps is not used)")

  def plan(self, base, info):
    if info.task == "classification" and base.loss != "cross_entropy":
      raise ConfigError(f"config.loss={base.loss!r}: {base.data['name']} is a classification "
                        f"set; E7 trains with config.loss='cross_entropy'")
    return runs(base, _DEPTHS.value, _INITS.value, _harness.num_seeds(5), _LR_SCALING.value,
                info.num_train)

  def describe(self, base, runs, info):
    return (f"E7 deep linear: {len(runs)} runs (depths {', '.join(map(str, _DEPTHS.value))} × "
            f"{', '.join(_INITS.value)} × {_harness.num_seeds(5)} seeds), {base.data['name']} "
            f"full batch ({info.num_train}), {base.optimizer['euclidean']['name']} lr "
            f"{base.learning_rate:g}{'/D' if _LR_SCALING.value == 'inverse_depth' else ''}, "
            f"{base.num_epochs:g} epochs")

  def extra(self, run, result):
    return run_summary(_log(run), _THRESHOLDS.value)

  def summarize(self, base, runs, records, info):
    thresholds, curves = _THRESHOLDS.value, {}
    # Recomputed from the logs, so a rerun with other thresholds needs no retraining.
    logs = [_log(run) for run in runs]
    records = [{**record, **run_summary(log, thresholds)} for log, record in zip(logs, records)]
    for run, log in zip(runs, logs):
      steps = {}
      for r in log:
        if r.get("split") == "train" and "loss" in r:
          steps.setdefault(int(r["step"]), float(r["loss"]))
      curves.setdefault((run.tags[0][1], run.tags[1][1]), []).append(
          [steps[s] for s in sorted(steps)])
    rows = rows_from(records, _DEPTHS.value, _INITS.value, thresholds, base.num_epochs)
    seeds = _harness.num_seeds(5)
    notes = [
        PAPER_CLAIM,
        f"{base.data['name']} ({info.num_train} training examples), full-batch "
        f"{base.optimizer['euclidean']['name']}, lr {base.learning_rate:g}"
        + (" / D" if _LR_SCALING.value == "inverse_depth" else " at every depth")
        + f", {base.loss} loss, width {base.model['width']}, {base.num_epochs:g} epochs max; "
        f"seeds {base.seed}..{base.seed + seeds - 1}",
        "epochs = full passes completed when the logged training loss first reached the "
        "threshold (the loss logged at step s is that of the parameters after s − 1 updates)",
        "ours differs from the paper: digits/MNIST-subset softmax cross-entropy instead of "
        "MNIST squared error, a loss (not error) criterion",
    ]
    diverged = sum(bool(r.get("diverged")) for r in records)
    if diverged:
      notes.append(f"{diverged}/{len(records)} runs produced a non-finite loss at some point "
                   f"(updates dropped from there; config.nan_policy={base.nan_policy!r})")
    plots = []
    if rows and _harness.is_writer():
      setting = f"{base.data['name']}, {_harness.plural(seeds, 'seed')}"
      plots.append(plot_epochs(rows, os.path.join(base.workdir, "deep_linear_epochs.png"),
                               base.num_epochs, setting))
      plots.append(plot_losses(curves, thresholds,
                               os.path.join(base.workdir, "deep_linear_loss.png"), setting))
    return rows, notes, plots


def _log(run: _harness.Run) -> list[dict[str, Any]]:
  """The run's ``metrics.jsonl`` records."""
  return metrics_lib.read_jsonl(run.file(run.config.workdir, "metrics.jsonl"))


if __name__ == "__main__":
  _harness.main(DeepLinear())
