r"""E8 — Muon vs AdamW on a transformer language model: does Muon need a third less training?

    python -m experiments.lm --flagfile=experiments/flags/lm.flags --workdir=runs/e8
    python -m experiments.lm --flagfile=experiments/flags/lm_smoke.flags --workdir=runs/e8_smoke
    python -m experiments.lm --flagfile=experiments/flags/lm.flags --preset=gpt2_small \
        --compile_for=v5e:8x8 --workdir=runs/e8_pod

The orthogonality notes ("Orthogonality in gradient") say Muon "has outperformed AdamW in a
lot of benchmark tasks, reducing the training cost by 1/3 on average". The tuned
comparisons disagree on the size: Moonlight (arXiv 2502.16982) ≈ 2× compute efficiency;
Essential AI (arXiv 2505.02222) 10–15 % fewer tokens; "Fantastic pretraining optimizers"
(arXiv 2509.02046), every optimizer tuned: 1.4× at 0.1 B parameters, 1.1× at 1.2 B. This
experiment measures it the way they do: the tokens each optimizer needs to reach AdamW's
final held-out loss, each at its own probed learning rates, over seeds.

The model is a :class:`~orthojax.models.TransformerLM` (``experiments/configs/lm.py``: by
default nanoGPT's CPU recipe, 4 × 128 on characters of Shakespeare's complete works). The
arms (``--arms``), each on the same model, data order and token budget:

* ``adamw`` — AdamW on every parameter;
* ``muon`` — :func:`orthojax.optim.muon` (optax's, with the matrix views): the hidden
  matrices (Q, K, V, attention output, MLP) orthogonalized by 5 quintic Newton–Schulz
  steps, momentum 0.95 with Nesterov; the embedding, the head and the norm gains on its
  AdamW group at the ``adamw`` arm's rate — Keller Jordan's and optax's split, which the
  model's metadata gives without a label tree;
* ``muon_polar_express`` — the same with the Polar Express coefficients (Amsel et al.
  2025);
* ``stiefel_muon`` — the hidden matrices constrained to the Stiefel manifold with a learned
  scale per output (``W = V diag(s)``), ``V`` trained by
  :func:`orthojax.optim.stiefel_muon` (Muon's step, then a Newton–Schulz retraction), the
  rest by AdamW at the ``adamw`` arm's rate;
* ``adamw_so`` — AdamW with a soft-orthogonality penalty ``λ‖WᵀW − I‖²_F`` on the hidden
  matrices (``--so_strength``; Bansal et al. 2018);
* ``manifold_muon`` — every hidden matrix on the Stiefel manifold with a learned scale per
  output, ``V`` trained by :func:`orthojax.optim.manifold_muon` (steepest descent under the
  spectral norm *within* the tangent space, Bernstein 2025), the rest by AdamW;
* ``stiefel_attention`` — Q, K, V and the attention output on the Stiefel manifold
  (:func:`~orthojax.optim.manifold_muon`), the MLP's matrices on Muon: the assignment
  Yoshihara (arXiv 2606.13276) found best on GPT-2 small;
* ``stiefel_mlp`` — the reverse, the MLP constrained and attention on Muon: an assignment
  that leaves attention unconstrained, which Yoshihara found unstable.

Every orthogonal arm's AdamW group (the embedding, the head, the gains, and a
constrained arm's scales, the matrices' magnitudes) is probed as well, after the arm's own
group; the ``stiefel_attention`` / ``stiefel_mlp`` arms' Muon group takes the ``muon``
arm's rate.

Every run records, at every evaluation, the largest pre-softmax attention logit of each
layer (:meth:`~orthojax.models.TransformerLM.attention_logit_max`, on a fixed batch of
validation windows) and, at the end, each layer's ``‖W_q W_kᵀ‖₂``
(:meth:`~orthojax.models.TransformerLM.query_key_norms`): the growth Kimi K2's QK-clip
caps and Yoshihara saw in unconstrained attention.

Stages (``--stages``, default ``train``):

* ``probe`` — each arm's learning rate: short trials (``--probe_steps``, the run's own
  schedule compressed) at every rate of the arm's grid (``--probe_rates_adamw``,
  ``--probe_rates_muon``, ``--probe_rates_stiefel``, widened past an edge), scored by the
  loss on the validation split; the ``adamw`` arm first, since the other arms' AdamW
  groups take its rate. Writes ``<workdir>/probe/rates.json``
  (:mod:`experiments._harness.rates`);
* ``train`` — every arm × ``--num_seeds`` seeds at the probed rates (or ``--rates_from``,
  or untuned defaults: the config's AdamW rate, :data:`DEFAULT_RATES`), evaluated every
  ``config.eval_every`` steps on the **test** split, which the probe never sees.

The claim, measured (``report.md``): for each seed ``s`` the target is AdamW's final test
loss ``L_s``; an arm's run of the same seed needs ``T_s`` tokens to reach it (linear
interpolation between evaluations; not reached: beyond the budget), and the row is the
ratio ``T_s / T`` to AdamW's budget ``T`` over seeds, mean ± 2 standard errors, beside the
notes' 2/3 and the published ratios; the same in seconds of training on this machine
(median step time × steps). Plots: test loss against tokens and against seconds per arm,
the Stiefel arm's orthogonality defect, and the singular values of the last block's
``W_q`` after training under each arm.

``--preset`` (:data:`experiments.configs.lm.PRESETS`) switches to a production size for
``--compile_for`` rows: GPT-2 small or a 1.3 B model at about 0.5 M tokens a step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any, Sequence

from absl import flags
import jax
import numpy as np

from experiments import _harness
from experiments.configs.lm import PRESETS
from orthojax import analysis
from orthojax.train import data as data_lib
from orthojax.train import metrics as metrics_lib
from orthojax.train.config import ConfigError

ARMS = ("adamw", "muon", "stiefel_muon", "muon_polar_express", "adamw_so", "manifold_muon",
        "stiefel_attention", "stiefel_mlp")
CONSTRAINED = {"stiefel_muon": ("all",), "manifold_muon": ("all",),
               "stiefel_attention": ("attention",), "stiefel_mlp": ("mlp",)}
"""The arms with Stiefel-constrained matrices, and which (``TransformerLM(stiefel=...)``)."""
STAGES = ("probe", "train")
DEFAULT_STAGES = ("train",)
DEFAULT_RATES = {"muon": 0.02, "stiefel": 0.02, "manifold": 0.02}
"""Untuned rates of the Muon and Stiefel groups without a probe (Keller Jordan's 0.02)."""
CLAIM = 2 / 3
"""The notes' "a third less training": an arm's tokens over AdamW's."""
PUBLISHED = (
    ("Moonlight (arXiv 2502.16982): ≈ 2× compute efficiency", 0.5),
    ("Essential AI (arXiv 2505.02222): 10–15 % fewer tokens", 0.875),
    ("Fantastic pretraining optimizers (arXiv 2509.02046): 1.4× at 0.1 B", 1 / 1.4),
    ("Fantastic pretraining optimizers (arXiv 2509.02046): 1.1× at 1.2 B", 1 / 1.1),
)
"""The published tuned comparisons as ratios of tokens (arm / AdamW)."""
ADAMW = {"name": "adamw", "b1": 0.9, "b2": 0.95, "weight_decay": 0.0}
MUON = {"name": "muon", "beta": 0.95, "nesterov": True, "ns_steps": 5, "adam_b2": 0.95}
MANIFOLD_MUON = {"name": "manifold_muon", "beta": 0.95, "nesterov": True, "steps": 5,
                 "msign_steps": 8, "retraction": "newton_schulz"}
"""manifold_muon as the constrained arms run it, chosen by the update's time on the 2-core
CPU (the 4 × 128 model, every hidden matrix constrained; Muon's update 21 ms): the default
(10 reweighted iterations on the 512 × 128 MLP matrices, SVD msigns for the square ones,
polar retraction) 204 ms; 5 iterations (objective within 6.4e-5 of the solution on 512 ×
128), 8 Polar Express steps per msign and a retraction from products (QR or Newton–Schulz
polar, the same time) 96–111 ms."""
LOGIT_WINDOWS = 32
"""Validation windows of the fixed batch the attention logits are measured on."""

_harness.define_flags("lm.py")
_ARMS = _harness.define_list("arms", ARMS, f"Optimizer arms: {', '.join(ARMS)}.",
                             choices=ARMS)
_PRESET = flags.DEFINE_string("preset", "", "A production size for --compile_for: "
                              + ", ".join(PRESETS) + " (experiments/configs/lm.py).")
_PROBE_STEPS = flags.DEFINE_integer("probe_steps", 500, "Steps of a probe trial (its "
                                    "schedule compressed to them).", lower_bound=1)
_GRIDS = {
    "adamw": _harness.define_list("probe_rates_adamw", (3e-4, 1e-3, 3e-3, 1e-2),
                                  "AdamW rates the probe tries.", kind=float,
                                  check=lambda r: r > 0, requirement="must be > 0"),
    "muon": _harness.define_list("probe_rates_muon", (5e-3, 1e-2, 2e-2, 4e-2, 8e-2),
                                 "Muon rates the probe tries (the hidden matrices).",
                                 kind=float, check=lambda r: r > 0, requirement="must be > 0"),
    "stiefel": _harness.define_list("probe_rates_stiefel", (5e-3, 1e-2, 2e-2, 4e-2, 8e-2),
                                    "stiefel_muon rates the probe tries.", kind=float,
                                    check=lambda r: r > 0, requirement="must be > 0"),
    "manifold": _harness.define_list("probe_rates_manifold_muon",
                                     (5e-3, 1e-2, 2e-2, 4e-2, 8e-2),
                                     "manifold_muon rates the probe tries (the constrained "
                                     "matrices of the manifold_muon, stiefel_attention and "
                                     "stiefel_mlp arms).", kind=float,
                                     check=lambda r: r > 0, requirement="must be > 0"),
}
_SO = flags.DEFINE_float("so_strength", 1e-3, "λ of the adamw_so arm's penalty.",
                         lower_bound=0.0)
_harness.define_stages_flag()    # --stages
_harness.define_rates_flags()    # --rates_from, --probe_widen
_harness.define_include_flag()   # --include_workdirs

# Keys the experiment sets per run (why), so an override of one would have no effect.
PER_RUN_KEYS = {
    "model.stiefel": "the constrained arms (--arms)",
    "hooks.every_steps": "the attention-logit record, at every evaluation",
    "penalty": "the adamw_so arm (--arms, --so_strength)",
    "final_eval_splits": "validation and test",
    "data.eval_split": "test in the train stage, validation in the probe",
  "model.oblique": "no arm constrains to the oblique manifold",
}


# --------------------------------------------------------------------- Arms --

RATE_GROUPS = {"adamw": "AdamW's learning_rate", "muon": "Muon's learning_rate",
               "stiefel": "stiefel_muon's learning_rate",
               "manifold": "manifold_muon's learning_rate"}
"""The rates a cell holds: AdamW's (every AdamW group), Muon's, stiefel_muon's,
manifold_muon's."""


def probed_groups(arm: str) -> tuple[str, ...]:
  """The rate groups the probe tunes for ``arm``, in order (the others take the ``adamw``
  cell's rate, and the ``muon`` cell's for a Muon group): an orthogonal arm's own group,
  then its AdamW group — the scales of a constrained arm, the embedding, head and gains
  of every arm but ``adamw`` — which the probe found to want other rates than the AdamW
  arm's once the hidden matrices are orthogonalized."""
  return {"muon": ("muon", "adamw"), "muon_polar_express": ("muon", "adamw"),
          "stiefel_muon": ("stiefel", "adamw"), "manifold_muon": ("manifold", "adamw"),
          "stiefel_attention": ("manifold", "adamw"),
          "stiefel_mlp": ("manifold", "adamw")}.get(arm, ("adamw",))


def depends_on(arm: str) -> tuple[str, ...]:
  """The arms whose probed rates ``arm``'s probe starts from."""
  return {"adamw": (), "stiefel_attention": ("adamw", "muon"),
          "stiefel_mlp": ("adamw", "muon")}.get(arm, ("adamw",))


def arm_config(base, arm: str, rates: dict[str, float], so_strength: float = 1e-3):
  """The config of ``arm`` at ``rates`` (``adamw``, and ``muon`` / ``stiefel`` where the arm
  has the group): its model, optimizer groups and penalty (``adamw_so``: λ =
  ``so_strength``)."""
  adamw = {**ADAMW, "learning_rate": rates["adamw"]}
  muon = {**MUON, "learning_rate": rates["muon"], "adam_learning_rate": rates["adamw"]}
  manifold_muon = {**MANIFOLD_MUON, "learning_rate": rates["manifold"]}
  model = {**base.model, "stiefel": CONSTRAINED.get(arm, ())}
  if arm in ("muon", "muon_polar_express"):
    groups = {"euclidean": {**muon, **({"ns_coeffs": "polar_express"}
                                      if arm == "muon_polar_express" else {})}}
  elif arm == "stiefel_muon":
    groups = {"euclidean": adamw, "stiefel": {"name": "stiefel_muon",
                                              "learning_rate": rates["stiefel"]}}
  elif arm == "manifold_muon":
    groups = {"euclidean": adamw, "stiefel": manifold_muon}
  elif arm in ("stiefel_attention", "stiefel_mlp"):
    groups = {"euclidean": muon, "stiefel": manifold_muon}
  else:
    groups = {"euclidean": adamw}
  penalty = ({"name": "add_orthogonality_penalty", "kind": "so", "strength": so_strength}
             if arm == "adamw_so" else None)
  return dataclasses.replace(base, model=model, optimizer=groups, penalty=penalty)


def apply_preset(base, name: str):
  """``base`` at the production size ``name`` (:data:`PRESETS`)."""
  p = PRESETS[name]
  return base.replace(model={"depth": p["depth"], "width": p["width"], "heads": p["heads"],
                             "vocab_size": p["vocab_size"], "remat": True},
                      data={"context": p["context"]}, batch_size=p["batch_size"],
                      eval_batch_size=p["batch_size"],
                      compute_dtype="bfloat16", mesh={"data": 1, "fsdp": -1})


def cell(arm: str) -> str:
  return _harness.cell_name((("arm", arm),))


# ---------------------------------------------------------------- Measures --

def eval_curve(run_dir: str) -> list[tuple[int, float]]:
  """``(step, loss)`` of every evaluation in the run's ``metrics.jsonl`` (last per step)."""
  by_step = {r["step"]: r["loss"] for r in metrics_lib.read_jsonl(
      os.path.join(run_dir, "metrics.jsonl")) if r.get("split") == "eval"}
  return sorted(by_step.items())


def steps_to_reach(curve: Sequence[tuple[int, float]], target: float,
                   start_loss: float) -> float | None:
  """The first step at which the loss reaches ``target``, interpolated linearly between
  evaluations (from ``(0, start_loss)``, the loss at initialisation); None if never."""
  previous = (0, start_loss)
  for step, loss in curve:
    if loss <= target:
      (s0, l0), (s1, l1) = previous, (step, loss)
      return float(s1) if l0 <= target or l0 == l1 else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    previous = (step, loss)
  return None


def median_step_seconds(run_dir: str) -> float:
  """The median seconds per step over the logged intervals (compile and evaluation
  excluded: the trainer times the steps alone)."""
  rates = [r["steps_per_sec"] for r in metrics_lib.read_jsonl(
      os.path.join(run_dir, "metrics.jsonl")) if r.get("split") == "train"
           and r.get("steps_per_sec")]
  return 1.0 / statistics.median(rates) if rates else math.nan


def query_singular_values(model) -> list[float]:
  """Singular values of the last block's query matrix ``W_q`` as the layer applies it
  (``V diag(s)`` for a constrained model), largest first."""
  w = np.asarray(model.qkv[...][-1, 0], np.float64)
  if "qkv" in model.scales:
    w = w * np.asarray(model.scales["qkv"][...][-1, 0], np.float64)
  return np.linalg.svd(w, compute_uv=False).tolist()


def logit_batch(config) -> np.ndarray:
  """The fixed tokens the attention logits are measured on: the first
  :data:`LOGIT_WINDOWS` evaluation windows of the validation split."""
  options = {**config.options, "eval_split": "validation"}
  batch = next(data_lib.eval_batches(config.data["name"], batch_size=LOGIT_WINDOWS,
                                     split="validation", data_dir=config.data_dir or None,
                                     **options))
  return np.asarray(batch["x"])


def logit_hook(tokens: np.ndarray):
  """``hook(step, model)`` for the trainer: each layer's largest attention logit on
  ``tokens`` (:meth:`orthojax.models.TransformerLM.attention_logit_max`)."""
  measure = jax.jit(lambda model, tokens: model.attention_logit_max(tokens))

  def hook(step, model):
    del step
    return {f"max_logit_{i}": float(v) for i, v in enumerate(np.asarray(measure(model, tokens)))}

  return hook


def logit_curve(run_dir: str) -> list[tuple[int, list[float]]]:
  """``(step, [largest logit of each layer])`` of every hook record of the run."""
  curve = {}
  for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
    keys = sorted((k for k in r if k.startswith("max_logit_")), key=lambda k: int(k[10:]))
    if r.get("split") == "spectrum" and keys:
      curve[r["step"]] = [r[k] for k in keys]
  return sorted(curve.items())


def ratio_verdict(ratios: Sequence[float | None]) -> tuple[str, float, float]:
  """``(verdict, mean, 2 SE)`` of the token ratios against :data:`CLAIM` (None: an arm
  that did not reach the target in the budget, counted as the budget's end, 1.0, which
  makes the mean a lower bound)."""
  values = [1.0 if r is None else r for r in ratios]
  if len(values) < 2:
    return "not resolved (fewer than 2 seeds)", values[0] if values else math.nan, math.nan
  mean = float(np.mean(values))
  half = 2 * analysis.standard_error(values)
  if any(r is None for r in ratios):
    prefix = "a lower bound (a seed did not reach AdamW's loss): "
  else:
    prefix = ""
  if mean - half > CLAIM:
    verdict = ("no faster than AdamW" if mean - half >= 1.0 else
               "faster than AdamW but by less than a third")
  elif mean + half < CLAIM:
    verdict = "more than a third fewer tokens"
  else:
    verdict = "consistent with a third fewer tokens"
  return prefix + verdict, mean, half


class LanguageModel(_harness.Experiment):
  """E8: arm × seed on one transformer; probe, then train, then the claim."""

  name, label = "lm", "E8"
  title = "E8 — Muon vs AdamW on a transformer language model (the notes' \"a third less\")"
  per_run_keys = PER_RUN_KEYS

  def check(self, base):
    if _PRESET.value and _PRESET.value not in PRESETS:
      raise ConfigError(f"--preset={_PRESET.value}: choose one of {', '.join(PRESETS)}")
    self.stages = _harness.chosen_stages(flags.FLAGS.stages, STAGES, DEFAULT_STAGES)
    _harness.check_rates_flags(flags.FLAGS.rates_from, self.stages, ("euclidean", "stiefel"),
                               unit="arm")
    if base.model.get("name") != "TransformerLM":
      raise ConfigError(f"config.model.name={base.model.get('name')!r}: E8 trains a "
                        f"TransformerLM")

  def plan(self, base, info):
    reported = base   # the report's config (results.json), which included workdirs match
    if _PRESET.value:
      base = apply_preset(base, _PRESET.value)
    self.base, self.info = base, info
    self.arms = list(_ARMS.value)
    # An arm's cell after those of the arms whose rates its probe starts from.
    ordered = [dep for arm in self.arms for dep in depends_on(arm)] + self.arms
    self.cells = [cell(arm) for arm in dict.fromkeys(["adamw", *ordered])]
    self.rates, self.rates_source = _harness.given_rates(
        flags.FLAGS.rates_from, self.stages, self.cells, hint="--stages=probe --arms=...")
    runs = []
    for arm in self.arms:
      for seed in range(_harness.num_seeds(3)):
        config = arm_config(base, arm, self.default_rates(base), _SO.value)
        config = config.replace(seed=base.seed + seed, data={"eval_split": "test"},
                                final_eval_splits=("validation", "test"),
                                hooks={"every_steps": base.eval_every})
        runs.append(_harness.Run(tags=(("arm", arm), ("seed", seed)), config=config))
    self.included, self.included_notes = _harness.included_records(
        flags.FLAGS.include_workdirs, runs, config=reported, experiment=self.name,
        label=self.label, unit="run")
    self.probed: dict[str, Any] = {}
    return runs

  @staticmethod
  def default_rates(base) -> dict[str, float]:
    return {"adamw": base.optimizer["euclidean"]["learning_rate"], **DEFAULT_RATES}

  def describe(self, base, runs, info):
    m, b = self.base.model, self.base
    tokens = b.num_steps * b.batch_size * b.data["context"]
    return (f"E8 transformer LM: {len(runs)} runs ({', '.join(self.arms)} × "
            f"{_harness.num_seeds(3)} seeds), {m['depth']} × {m['width']}, {m['heads']} heads, "
            f"context {b.data['context']}, batch {b.batch_size}, {b.num_steps} steps "
            f"({tokens / 1e6:.2f} M tokens) on {b.data['name']}; stages: "
            f"{', '.join(self.stages)}"
            + (f"; rates from {self.rates_source}" if self.rates else ""))

  # --------------------------------------------------------------- Stages --

  def train(self, base, runs, info):
    if "probe" in self.stages:
      self.rates, self.rates_source = _harness.probe_cells(
          base.workdir, self.cells, self.probe_cell, rule=self.probe_rule(), config=self.base)
    if "train" not in self.stages:
      return []
    hooks = (logit_hook(logit_batch(self.base)),)
    return [self.execute(dataclasses.replace(run, config=self.at_rates(run), hooks=hooks),
                         base.workdir) for run in runs]

  def probe_rule(self) -> dict[str, Any]:
    return {"probe_steps": _PROBE_STEPS.value, "probe_widen": flags.FLAGS.probe_widen,
            "score": "validation loss"}

  def probe_cell(self, name: str) -> dict[str, Any]:
    """One arm's probe: its groups' grids, the others at the ``adamw`` cell's rate."""
    arm = name.split("=", 1)[1]
    # The other arms' AdamW groups take the adamw cell's rate (probed first: self.cells
    # starts with it); a cell records the rates its arm uses, no others.
    start = {group: self.probed[cell(dep)]["rates"][group]
             for dep, group in ((dep, "adamw" if dep == "adamw" else "muon")
                                for dep in depends_on(arm))}
    grids = [(group, _GRIDS[group].value) for group in probed_groups(arm)]
    steps = _PROBE_STEPS.value
    base = self.base.replace(num_steps=steps, eval_every=0, log_every=max(steps // 10, 1),
                             warmup_steps=max(self.base.warmup_steps * steps
                                              // max(self.base.num_steps, 1), 1),
                             checkpoint={"every_steps": 0})

    def score(rates):
      tags = (("arm", arm),) + tuple((g, f"{rates[g]:g}") for g in probed_groups(arm))
      run = _harness.Run(tags=tags, config=arm_config(
          base, arm, {**self.default_rates(self.base), **start, **rates}, _SO.value))
      return _harness.probe_trial(run, base.workdir, "loss", verbose=flags.FLAGS.verbose)

    self.probed[name] = _harness.probe_groups(grids, score, start=start,
                                              widen=flags.FLAGS.probe_widen, maximize=False)
    return self.probed[name]

  def at_rates(self, run):
    if not self.rates:
      return run.config
    arm = dict(run.tags)["arm"]
    rates = {**self.default_rates(self.base),
             **_harness.cell_rates(self.rates, cell("adamw")),
             **_harness.cell_rates(self.rates, cell(arm))}
    return arm_config(run.config, arm, rates, _SO.value)

  def extra(self, run, result):
    run_dir = run.directory(run.config.workdir)
    log = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    defect = [(r["step"], r["orthogonality_defect"]) for r in log
              if r.get("split") == "train" and "orthogonality_defect" in r]
    test = result.split_metrics.get("test", {}).get("loss", math.nan)
    return {"eval_curve": eval_curve(run_dir), "defect_curve": defect,
            "step_seconds": median_step_seconds(run_dir),
            "device": jax.devices()[0].device_kind,
            "query_singular_values": query_singular_values(result.model),
            "logit_curve": logit_curve(run_dir),
            "query_key_norms": np.asarray(result.model.query_key_norms()).tolist(),
            "headline": f"test loss {test:.4f}, validation "
                        f"{result.split_metrics.get('validation', {}).get('loss', math.nan):.4f}"}

  # -------------------------------------------------------------- Summary --

  def summarize(self, base, runs, records, info):
    records = [*records, *self.included]
    rows, notes, plots = summarize(records, self.base, info)
    if self.rates:
      notes.append(f"learning rates per arm from {self.rates_source}: the lowest validation "
                   f"loss after {_PROBE_STEPS.value} steps (the run's schedule compressed); "
                   f"every orthogonal arm's AdamW group (with a constrained arm's scales) "
                   f"probed after its own group")
      for name, entry in self.rates["cells"].items():
        for group, probe in entry["probes"].items():
          notes.append(f"probe {name}, {RATE_GROUPS[group]} (validation loss): {probe['row']}")
    notes += self.included_notes
    return rows, notes, plots


def summarize(records, base, info):
  """Rows (final losses, token and time ratios), notes (the verdicts) and plots."""
  by_arm: dict[str, dict[int, dict]] = {}
  for r in records:
    by_arm.setdefault(r["tags"]["arm"], {})[r["tags"]["seed"]] = r
  tokens_per_step = base.batch_size * base.data["context"]
  budget = base.num_steps
  start_loss = math.log(info.num_classes)
  rows, notes = [], []
  for arm, seeds in by_arm.items():
    for split in ("validation", "test"):
      rows.append(_harness.Row({"arm": arm}, f"final {split} loss",
                               [seeds[s][split]["loss"] for s in sorted(seeds)]))
  for arm, seeds in by_arm.items():
    logged = [seeds[s] for s in sorted(seeds) if seeds[s].get("logit_curve")]
    if logged:
      rows.append(_harness.Row({"arm": arm}, "largest attention logit, any layer, end",
                               [max(r["logit_curve"][-1][1]) for r in logged]))
      rows.append(_harness.Row({"arm": arm}, "largest attention logit, any layer or step",
                               [max(max(v) for _, v in r["logit_curve"]) for r in logged]))
    normed = [seeds[s]["query_key_norms"] for s in sorted(seeds)
              if seeds[s].get("query_key_norms")]
    if normed:
      rows.append(_harness.Row({"arm": arm}, "‖W_q W_kᵀ‖₂, largest layer, end",
                               [max(n) for n in normed]))
  adamw = by_arm.get("adamw", {})
  for arm, seeds in by_arm.items():
    if arm == "adamw" or not adamw:
      continue
    paired = sorted(set(seeds) & set(adamw))
    token_ratios, time_ratios = [], []
    for s in paired:
      target = adamw[s]["test"]["loss"]
      steps = steps_to_reach(seeds[s]["eval_curve"], target, start_loss)
      token_ratios.append(None if steps is None else steps / budget)
      # A seed that never reaches the target ran the whole budget: its ratios are lower
      # bounds, 1 in tokens and the step-time ratio in seconds.
      time_ratios.append((budget if steps is None else steps) * seeds[s]["step_seconds"]
                         / (budget * adamw[s]["step_seconds"]))
    short = " (≥: a seed did not reach it)" if None in token_ratios else ""
    rows.append(_harness.Row({"arm": arm}, "tokens to AdamW's final test loss / AdamW's",
                             [1.0 if r is None else r for r in token_ratios], paper=CLAIM,
                             note="notes' claim: 2/3" + short))
    rows.append(_harness.Row({"arm": arm}, "seconds to AdamW's final test loss / AdamW's",
                             time_ratios, note=short.strip()))
    verdict, mean, half = ratio_verdict(token_ratios)
    notes.append(f"{arm}: {mean:.3f} ± {half:.3f} of AdamW's tokens ({len(paired)} seeds, "
                 f"mean ± 2 SE) — {verdict}; "
                 + "; ".join(f"{name} → {ratio:.2f}"
                             + (" (inside)" if abs(mean - ratio) <= half else "")
                             for name, ratio in PUBLISHED))
  rows_, notes_ = moonshot(by_arm, budget, start_loss)
  rows += rows_
  notes += notes_
  notes.append(f"{tokens_per_step * budget / 1e6:.2f} M tokens per run "
               f"({budget} steps × {base.batch_size} × {base.data['context']}); nanoGPT's CPU "
               f"recipe reaches ≈ 1.88 validation loss on tiny Shakespeare (a different, five "
               f"times smaller text: a scale, not a target)")
  plots = [] if not _harness.is_writer() else plot(records, base, by_arm, tokens_per_step)
  return rows, notes, plots


MOONSHOT_GAP = 0.01
"""A constrained arm matches Muon when its final test loss is within this (nats) of the
same seed's Muon run."""
MOONSHOT_TIME = 1.5
"""... at no more than this multiple of Muon's step time."""


def moonshot(by_arm, budget: int, start_loss: float) -> tuple[list[Any], list[str]]:
  """Each constrained arm against the ``muon`` arm, seed by seed: its final test loss minus
  Muon's, the tokens it needs to reach Muon's final test loss over Muon's budget, and its
  step time over Muon's; a note per arm says whether it matches Muon (within
  :data:`MOONSHOT_GAP` at equal tokens, at most :data:`MOONSHOT_TIME` × Muon's step) or by
  how much it misses."""
  muon = by_arm.get("muon", {})
  rows, notes = [], []
  for arm in (a for a in by_arm if a in CONSTRAINED and muon):
    seeds = sorted(set(by_arm[arm]) & set(muon))
    if not seeds:
      continue
    runs = [(by_arm[arm][s], muon[s]) for s in seeds]
    gaps = [r["test"]["loss"] - m["test"]["loss"] for r, m in runs]
    reached = [steps_to_reach(r["eval_curve"], m["test"]["loss"], start_loss) for r, m in runs]
    times = [r["step_seconds"] / m["step_seconds"] for r, m in runs]
    rows.append(_harness.Row({"arm": arm}, "final test loss − Muon's (same seed)", gaps,
                             note=f"matches within {MOONSHOT_GAP}"))
    short = " (≥: a seed did not reach it)" if None in reached else ""
    rows.append(_harness.Row({"arm": arm}, "tokens to Muon's final test loss / Muon's",
                             [1.0 if t is None else t / budget for t in reached],
                             note=short.strip()))
    rows.append(_harness.Row({"arm": arm}, "step time / Muon's", times,
                             note=f"at most {MOONSHOT_TIME}"))
    gap, time = float(np.mean(gaps)), float(np.median(times))
    half = 2 * analysis.standard_error(gaps) if len(gaps) > 1 else math.nan
    misses = []
    if gap > MOONSHOT_GAP:
      misses.append(f"{gap - MOONSHOT_GAP:.4f} nats over the {MOONSHOT_GAP} allowance")
    if time > MOONSHOT_TIME:
      misses.append(f"{time:.2f}× Muon's step against {MOONSHOT_TIME}×")
    notes.append(f"{arm} against Muon: final test loss {gap:+.4f} ± {half:.4f} nats "
                 f"({len(seeds)} paired seeds, mean ± 2 SE), step time {time:.2f}× — "
                 + ("misses: " + ", ".join(misses) if misses else "matches Muon"))
  return rows, notes


def plot(records, base, by_arm, tokens_per_step) -> list[str]:
  """Test loss against tokens and seconds, the largest attention logit against steps, the
  constrained arms' defect, W_q's spectrum."""
  plt = _harness.pyplot()
  workdir = base.workdir
  fig, axes = plt.subplots(1, 5, figsize=(21, 3.8))
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  colors = {arm: cycle[i % len(cycle)] for i, arm in enumerate(ARMS)}
  for arm, seeds in by_arm.items():
    for i, s in enumerate(sorted(seeds)):
      r = seeds[s]
      steps = [p[0] for p in r["eval_curve"]]
      losses = [p[1] for p in r["eval_curve"]]
      label = arm if i == 0 else None
      axes[0].plot([t * tokens_per_step / 1e6 for t in steps], losses, color=colors.get(arm),
                   lw=1, label=label)
      axes[1].plot([t * r["step_seconds"] for t in steps], losses, color=colors.get(arm), lw=1,
                   label=label)
      if r.get("logit_curve"):
        axes[2].semilogy([p[0] for p in r["logit_curve"]],
                         [max(p[1]) for p in r["logit_curve"]], color=colors.get(arm), lw=1,
                         label=label)
      if r.get("defect_curve"):
        axes[3].semilogy([p[0] for p in r["defect_curve"]], [p[1] for p in r["defect_curve"]],
                         color=colors.get(arm), lw=1, label=label)
      if arm in ("adamw", "muon") and i == 0:
        sv = r["query_singular_values"]
        axes[4].plot(range(1, len(sv) + 1), sv, "o-", ms=2, color=colors.get(arm), label=arm)
  axes[0].set(xlabel="tokens (M)", ylabel="test loss (nats/char)")
  devices = sorted({r.get("device", "?") for r in records})
  axes[1].set(xlabel=f"seconds of training ({', '.join(devices)})", ylabel="test loss")
  axes[2].set(xlabel="step", ylabel="max |q·k| / √d (largest layer)",
              title="largest attention logit")
  axes[3].set(xlabel="step", ylabel="‖VᵀV − I‖ (largest)", title="constrained arms' defect")
  axes[4].set(xlabel="index", ylabel="singular value", title="last block's W_q, end")
  for ax in axes:
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  low = min((p[1] for r in records for p in r["eval_curve"]), default=1.0)
  for ax in axes[:2]:
    ax.set_ylim(low - 0.05, low + 1.5)
  _harness.suptitle(fig, f"E8: {base.model['depth']} × {base.model['width']} transformer, "
                         f"{base.data['name']} (seeds in thin lines)")
  fig.tight_layout()
  return [_harness.save_figure(fig, os.path.join(workdir, "lm_curves.png"))]


if __name__ == "__main__":
  _harness.main(LanguageModel())
