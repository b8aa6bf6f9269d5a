r"""E2 — VGG-6 on ImageNet32 across parameterizations and batch sizes (GmP paper Table 2).

    python -m experiments.vgg6_imagenet32 --flagfile=experiments/flags/e2_vgg6.flags \
        --workdir=runs/e2

One invocation runs the ablation grid ``--vgg_variants`` × ``--vgg_batch_sizes``
(6 × 3 = 18 runs by default) one after the other, each in
``<workdir>/runs/variant=…/batch=…``. Why a list and not one job per
flagfile (as E1): Table 2 is one ablation whose runs are an order of
magnitude cheaper than E1's and only meaningful side by side; a single job
keeps one workdir and one report, and it is preemption-safe — rerunning the
same command reads finished runs back and resumes the interrupted one from
its checkpoint. To spread the grid over several machines, give each job a
slice (``--vgg_variants=gmp,gmp_imn --vgg_batch_sizes=1024``) and its own
``--workdir``, then merge with ``python -m experiments.report DIR…``.

Protocol (paper Appendix C.2; SPEC E2): VGG-6 (:class:`orthojax.models.VGG6`:
six 3×3 convs 128-128-256-256-512-512 with 2×2 max-pools, global average
pooling, a dense classifier) under SP, WN, WN+MBN, BN, GmP and GmP+IMN; SGD
with momentum 0.9; lr 0.1 for GmP and GmP+IMN (``--vgg_gmp_lr``), 0.01 for
the others (``config.optimizer.euclidean.learning_rate``), the same at every batch size
(the paper does not scale it); lr ×0.1 after 5 epochs without a better top-1,
stop after 10 or at 90 epochs (``experiments/configs/e2_vgg6.py``).
``config.model.variant`` and ``config.batch_size`` are replaced per run by the
grid's, and ``config.eval_every`` and ``config.checkpoint.every_steps`` by
one epoch at the run's batch size (``num_train // batch`` steps), so the
patiences count epochs. Data: tfds ``imagenet_resized/32x32`` (ImageNet32,
Chrabaszcz et al. 2017: 1,281,167 train / 50,000 validation images, 1000
classes) with random horizontal flips, per-channel normalisation, evaluated
on the validation split; the best state is restored for the final evaluation.

Paper, Table 2 — top-1 (%) at batch 256 / 512 / 1024 (top-5 in :data:`PAPER`):
SP 38.31/36.99/35.02, WN 39.13/37.92/36.17, WN+MBN 42.22/40.96/39.33,
BN 42.79/41.90/41.39, GmP 40.76/41.65/41.29, GmP+IMN 43.14/43.62/42.70
(± 0.01–0.19 over their runs). A row carries the paper's number when its
batch size is one of Table 2's; other batch sizes (smoke runs) get none, and
the notes list the variant's Table 2 row.

How ours differs: no weight decay by default (``config.weight_decay``; Chrabaszcz
et al. use 5e-4 for their WRNs — the paper does not say for VGG-6); Glorot-uniform kernels and BN/MBN/IMN momentum 0.99,
ε = 1e-3 as the released Keras code (:mod:`orthojax.models._vgg`); the released
GmP+IMN code also centres the last conv's output before the classifier, which
only shifts the classifier's bias.

``vgg6_smoke.flags`` (``e2_vgg6.py:smoke``) runs two variants for a few steps at batch 8 on random
32×32 ``fake`` images (CPU, well under a minute; numbers meaningless).
"""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from experiments import _harness
from orthojax import models
from orthojax.train.config import ConfigError

VARIANTS = models.VGG6.VARIANTS   # GmP Table 2 rows, in its order
GMP_VARIANTS = ("gmp", "gmp_imn")
BATCH_SIZES = (256, 512, 1024)
# GmP paper Table 2: variant -> {batch: (top-1, top-5)} validation accuracy (%).
_TOP1 = {"sp": (38.31, 36.99, 35.02), "wn": (39.13, 37.92, 36.17),
         "wn_mbn": (42.22, 40.96, 39.33), "bn": (42.79, 41.90, 41.39),
         "gmp": (40.76, 41.65, 41.29), "gmp_imn": (43.14, 43.62, 42.70)}
_TOP5 = {"sp": (62.48, 60.71, 58.14), "wn": (63.28, 61.93, 60.16),
         "wn_mbn": (66.04, 65.08, 63.32), "bn": (67.17, 66.50, 65.89),
         "gmp": (65.08, 65.76, 65.49), "gmp_imn": (67.36, 67.76, 66.98)}
PAPER: dict[str, dict[int, tuple[float, float]]] = {
    v: {b: (_TOP1[v][i], _TOP5[v][i]) for i, b in enumerate(BATCH_SIZES)} for v in VARIANTS}

_harness.define_flags("e2_vgg6.py")
_VARIANTS = _harness.define_list("vgg_variants", VARIANTS,
                                 f"VGG-6 variants: {', '.join(VARIANTS)}.", choices=VARIANTS)
_BATCHES = _harness.define_list("vgg_batch_sizes", BATCH_SIZES,
                                "Global batch sizes (Table 2: 256, 512, 1024).", kind=int,
                                check=lambda b: b > 0, requirement="must be > 0")
_GMP_LR = flags.DEFINE_float("vgg_gmp_lr", 0.1,
                             "Learning rate of gmp and gmp_imn (the others: "
                             "config.optimizer.euclidean.learning_rate).")


def plan_runs(base, variants, batch_sizes, gmp_lr, num_train):
  """variants × batch sizes; eval and checkpoint once per epoch of each batch size."""
  runs = []
  for batch in batch_sizes:
    for variant in variants:
      per_epoch = max(num_train // batch, 1)
      lr = gmp_lr if variant in GMP_VARIANTS else base.learning_rate
      config = base.replace(model={"variant": variant}, batch_size=batch,
                            optimizer={"euclidean": {"learning_rate": lr}}, eval_every=per_epoch,
                            checkpoint={"every_steps": per_epoch})
      runs.append(_harness.Run(tags=(("variant", variant), ("batch", batch)), config=config))
  return runs


def rows_from(records: list[dict[str, Any]]) -> list[_harness.Row]:
  """Top-1 and top-5 (%) per (variant, batch), beside Table 2 where it has the batch."""
  rows = []
  for metric, key, index in (("top-1 (%)", "top1", 0), ("top-5 (%)", "top5", 1)):
    for record in records:
      variant, batch = record["tags"]["variant"], int(record["tags"]["batch"])
      paper = PAPER.get(variant, {}).get(batch)
      note = "" if paper else "Table 2 has batch 256/512/1024 only"
      rows.append(_harness.Row({"variant": variant, "batch": batch}, metric,
                               [100 * record["eval"][key]],
                               paper[index] if paper else None, note))
  return rows


def plot_titles(dataset: str) -> tuple[str, str]:
  """The titles of E2's accuracy bars and evaluation curves, naming the data (the smoke
  run's ``fake`` images as such)."""
  data = _harness.data_label(dataset)
  return (f"E2 VGG-6: validation accuracy on {data}",
          f"E2 VGG-6 on {data}: evaluation over training (cf. paper Fig. 4)")


class VGG6(_harness.Experiment):
  """E2: variants × batch sizes, top-1 / top-5 beside Table 2."""

  name, label = "vgg6_imagenet32", "E2"
  title = "E2 — VGG-6 on ImageNet32 (GmP Table 2)"
  # model.variant: the file's is for experiments.train; each of --vgg_variants replaces it.
  required = {"model.name": ("VGG6", "the VGG-6 of Table 2")}

  def check(self, base):
    if not _GMP_LR.value > 0:
      raise ConfigError(f"--vgg_gmp_lr={_GMP_LR.value}: must be > 0")

  def plan(self, base, info):
    return plan_runs(base, _VARIANTS.value, _BATCHES.value, _GMP_LR.value, info.num_train)

  def describe(self, base, runs, info):
    return (f"E2 VGG-6 on {base.data['name']}: {len(runs)} runs ({', '.join(_VARIANTS.value)} "
            f"× batch {', '.join(map(str, _BATCHES.value))}), lr {base.learning_rate:g} (GmP "
            f"{_GMP_LR.value:g})")

  def extra(self, run, result):
    return {"throughput": _harness.throughput(run.directory(run.config.workdir),
                                        run.config.batch_size)}

  def summarize(self, base, runs, records, info):
    rows = rows_from(records)
    euclidean = base.optimizer["euclidean"]
    notes = [
        f"{base.data['name']}: {info.num_train} train / {info.num_eval} eval images; "
        f"{euclidean['name']} (momentum {euclidean.get('momentum')}), lr "
        f"{base.learning_rate:g} (GmP, GmP+IMN {_GMP_LR.value:g}), schedule {base.schedule} "
        f"(patience {base.plateau_patience} epochs, ×{base.plateau_factor}), early stopping "
        f"after {base.early_stopping_patience} epochs, at most "
        f"{base.num_epochs or base.num_steps} {'epochs' if base.num_epochs else 'steps'}, "
        f"restore best: {base.restore_best}",
        f"weight decay {base.weight_decay:g} (the paper gives none for VGG-6)",
    ]
    for record in records:
      speed = record.get("throughput") or {}
      notes.append(f"{record['tags']['variant']} batch {record['tags']['batch']}: "
                   f"{record['final_step']} steps, "
                   f"{speed.get('images_per_sec', float('nan')):.4g} images/s (median steps/s "
                   f"× batch)")
    for variant in _VARIANTS.value:
      if any(b not in BATCH_SIZES for b in _BATCHES.value):
        top1 = "/".join(f"{PAPER[variant][b][0]:.2f}" for b in BATCH_SIZES)
        notes.append(f"Table 2, {variant}: top-1 {top1} at batch 256/512/1024")
    plots = []
    if _harness.is_writer():
      bars, curves = plot_titles(base.data["name"])
      plots.append(_harness.plot_rows(rows, os.path.join(base.workdir, "e2_accuracy.png"),
                                      group="batch", series="variant", title=bars,
                                      ylabel="validation accuracy (%)"))
      plots.append(_harness.plot_curves(base.workdir, runs,
                                  os.path.join(base.workdir, "e2_curves.png"), curves))
    return rows, notes, plots


if __name__ == "__main__":
  _harness.main(VGG6())
