r"""E1 — ResNet-50 on ImageNet with BN, WN+MBN and GmP+IMN (GmP paper Table 1).

    python -m experiments.resnet50 --flagfile=experiments/flags/e1_resnet50_bn.flags \
        --workdir=runs/e1_bn          # likewise e1_resnet50_wn_mbn / e1_resnet50_gmp_imn
    python -m experiments.report runs/e1_bn runs/e1_wn_mbn runs/e1_gmp_imn   # one table

**One variant per invocation** (the norm, ``config.model.norm``, of the flagfile's
``--config=experiments/configs/e1_resnet50.py:NORM``): each run is days
of a pod slice, so the three are separate jobs — launched side by side on
different slices (``launch/tpu_pod.sh``, ``launch/gpu_slurm.sh``), preempted
and resumed independently (rerun the same command: the trainer resumes from
the run's last checkpoint), and merged afterwards by ``experiments.report``.
The flagfiles hold training settings only, so ``python -m experiments.train``
runs them too (as ``launch/README.md`` does); this module adds the report.

Protocol (``experiments/configs/e1_resnet50.py``; SPEC E1 and the paper's Appendix C.1,
"the same setup as He et al. 2016"): ResNet-50 v1.5 (:class:`orthojax.models.ResNet`),
SGD with momentum 0.9 at lr 0.1 for batch 256 (scale linearly with the batch),
the lr ×0.1 when top-1 has not improved for 5 epochs, stop after 10 flat
epochs or 90 epochs (``config.schedule='plateau'``, ``config.plateau_patience=5``,
``config.early_stopping_patience=10``; both count evaluations, so
``config.eval_every`` = one epoch = 1,281,167 // batch steps), the best state
restored for the final evaluation. Data: tfds ``imagenet2012`` — random
shorter side 256–480 keeping the aspect ratio, random 224² crop, horizontal
flip, colour jitter and PCA lighting; single centre-crop (256 → 224)
evaluation on the 50,000 validation images (:mod:`orthojax.train.data.imagenet`).

The report: final top-1 / top-5 (%) beside Table 1 (WN+MBN 72.58 / 90.77,
BN 73.63 / 91.11, GmP+IMN 75.57 / 92.68; the paper's ± are 0.05–0.16), and
the measured training throughput — the median over the logged intervals of
train steps/s × global batch (intervals include the input pipeline; those
with an evaluation or a checkpoint in them are outliers the median ignores).
Plots: bars of ours vs the paper, and top-1 over epochs.

How ours differs from the paper / what to expect:

* weight decay: He et al.'s L2 of 1e-4 on conv and dense kernels; GmP layers
  have no kernel — their angles are coordinates and are not decayed
  (``orthojax.train.optimizers.decay_mask``) — so the GmP+IMN variant trains
  without it (the paper does not say what it decayed);
* Flax's own ImageNet example reaches 76.1–76.7 % top-1 with BN (its own
  recipe: cosine schedule with warmup, ~100 epochs); our BN run follows the
  paper's plateau recipe instead;
* ResNet v1.5 (stride on the 3×3 conv) with zero-initialised last BN scale
  per block (BN variant); the GmP+IMN net centres only the inputs of GmP convs
  (see :mod:`orthojax.models._resnet`), the released ResNet-34 code centres
  the whole residual stream.

``resnet50_smoke.flags`` (``e1_resnet50.py:bn,smoke``) runs the same recipe end to end
on CPU in well under a minute: a BN ResNet-18 for 16 steps of batch 8 on random 32×32
``fake`` images (add ``--config.model.norm=wn_mbn`` / ``gmp_imn`` for the others; GmP compiles
and runs several times slower on CPU) — its numbers say nothing about
ImageNet (the report says so) but exercise checkpoints, preemption / resume,
evaluation, the throughput measurement and the report.
"""

from __future__ import annotations

import os
from typing import Any

import jax

from experiments import _harness

# GmP paper Table 1: single centre-crop validation accuracy (%), top-1 / top-5.
PAPER = {"wn_mbn": (72.58, 90.77), "bn": (73.63, 91.11), "gmp_imn": (75.57, 92.68)}
FLAX_BN_TOP1 = (76.1, 76.7)     # Flax examples/imagenet, ResNet-50 with BN
IMAGENET_TRAIN = 1_281_167

_harness.define_flags("e1_resnet50.py")


def plot_titles(model: str, norm: str, dataset: str) -> tuple[str, str]:
  """The titles of E1's accuracy bars and evaluation curves; both name the data, and the
  ``fake`` set (the smoke run's random images) as such: its numbers mean nothing."""
  data = _harness.data_label(dataset)
  return (f"E1 {model} {norm}: validation accuracy on {data}",
          f"E1 {model} {norm} on {data}: evaluation over training")


# -------------------------------------------------------------------- Main --

def rows_from(record: dict[str, Any], model: str, variant: str, batch: int,
              speed: dict[str, float], comparable: bool) -> list[_harness.Row]:
  """Top-1 / top-5 (%) beside Table 1, and the throughput, of one run."""
  setting = {"model": model, "variant": variant, "batch": batch}
  paper = PAPER.get(variant, (None, None))
  note = "" if comparable else "not comparable: paper is ResNet-50 on ImageNet"
  if variant == "bn" and comparable:
    note = f"Flax example (BN): {FLAX_BN_TOP1[0]}–{FLAX_BN_TOP1[1]}"
  rows = [_harness.Row(setting, "top-1 (%)", [100 * record["eval"]["top1"]], paper[0], note),
          _harness.Row(setting, "top-5 (%)", [100 * record["eval"]["top5"]], paper[1],
                       "" if comparable else note)]
  rows.append(_harness.Row(setting, "throughput (images/s)", [speed["images_per_sec"]], None,
                           f"median of {speed['intervals']} logged intervals"))
  return rows


class ResNet50(_harness.Experiment):
  """E1: one norm per job, one run in the workdir itself."""

  name, label = "resnet50", "E1"
  title = "E1 — ResNet-50 on ImageNet (GmP Table 1)"
  required = {"model.name": ("ResNet", "a ResNet of config.model.depth 18, 34, 50 or 101")}

  def plan(self, base, info):
    self.per_epoch = max(info.num_train // base.batch_size, 1)
    model = f"resnet{base.model['depth']}"
    return [_harness.Run(tags=(("model", model), ("variant", base.model["norm"])), config=base,
                         single=True)]

  def describe(self, base, runs, info):
    note = ""
    if base.schedule == "plateau" and base.eval_every != self.per_epoch:
      note = (f"Note: config.eval_every={base.eval_every} but one epoch is {self.per_epoch} "
              f"steps; the plateau / early-stopping patience counts evaluations, not epochs\n")
    return (f"{note}E1 {runs[0].tags[0][1]} {base.model['norm']} on {base.data['name']}: batch "
            f"{base.batch_size}, lr {base.learning_rate:g}, {self.per_epoch} steps/epoch, "
            f"workdir {runs[0].directory(base.workdir)}")

  def extra(self, run, result):
    return {"throughput": _harness.throughput(run.directory(run.config.workdir), run.config.batch_size)}

  def summarize(self, base, runs, records, info):
    (record,), per_epoch = records, self.per_epoch
    model, norm, dataset = runs[0].tags[0][1], base.model["norm"], base.data["name"]
    comparable = (model == "resnet50" and dataset == "imagenet2012")
    speed = record.get("throughput") or _harness.throughput(base.workdir, base.batch_size)
    rows = rows_from(record, model, norm, base.batch_size, speed, comparable)
    best = record.get("best") or {}
    optimizer = base.optimizer["euclidean"]["name"]
    if base.optimizer["euclidean"].get("momentum") is not None:
      optimizer += f" (momentum {base.optimizer['euclidean']['momentum']:g}"
      optimizer += ", nesterov)" if base.optimizer["euclidean"].get("nesterov") else ")"
    notes = [
        f"{model} {norm}, {dataset}, batch {base.batch_size}, {optimizer} "
        f"lr {base.learning_rate:g}, schedule {base.schedule} (patience "
        f"{base.plateau_patience} evals, ×{base.plateau_factor}), early stopping after "
        f"{base.early_stopping_patience} evals, eval every {base.eval_every} steps "
        f"({base.eval_every / per_epoch:.3g} epochs), restore best: {base.restore_best}",
        f"trained {record['final_step']} steps ({record['final_step'] / per_epoch:.3g} epochs)"
        + (f"; best top-1 {100 * best['top1']:.2f}% at step {best['step']}"
           + (", stopped early" if best.get("stopped_early") else "") if "top1" in best else ""),
        f"throughput: {speed['images_per_sec']:.4g} images/s = median "
        f"{speed['steps_per_sec']:.4g} steps/s × batch {base.batch_size} on "
        f"{jax.device_count()} × {jax.devices()[0].device_kind} ({jax.process_count()} "
        f"process(es))",
        f"weight decay {base.weight_decay:g} (L2 on kernels; GmP angles are not decayed)",
        f"Flax's ImageNet example reaches {FLAX_BN_TOP1[0]}–{FLAX_BN_TOP1[1]}% top-1 with BN "
        f"(its own cosine recipe)",
    ]
    if not comparable:
      notes.insert(0, f"{model} on {dataset}: a smoke/scaled run; Table 1 is ResNet-50 "
                      f"on ImageNet — the paper column is the target, not a comparison")
    plots = []
    accuracy_title, curves_title = plot_titles(model, norm, dataset)
    if _harness.is_writer():
      plots.append(_harness.plot_rows([r for r in rows if r.metric != "throughput (images/s)"],
                                      os.path.join(base.workdir, "e1_accuracy.png"),
                                      group="model", series="variant", title=accuracy_title,
                                      ylabel="validation accuracy (%)",
                                      paper_label="paper" if comparable else
                                      "paper, ResNet-50 on ImageNet (a target only)"))
      plots.append(_harness.plot_curves(base.workdir, runs, os.path.join(base.workdir, "e1_curves.png"),
                               curves_title))
    return rows, notes, plots


if __name__ == "__main__":
  _harness.main(ResNet50())
