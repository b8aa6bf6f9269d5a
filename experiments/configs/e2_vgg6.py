r"""E2 — VGG-6 on ImageNet32 (GmP paper Table 2), the paper's recipe (Appendix C.2).

    python -m experiments.vgg6_imagenet32 --config=experiments/configs/e2_vgg6.py \
        --vgg_variants=sp,wn,wn_mbn,bn,gmp,gmp_imn --vgg_batch_sizes=256,512,1024 --workdir=...

(``experiments/flags/e2_vgg6.flags`` is that line.) The experiment trains every variant
of ``--vgg_variants`` at every batch size of ``--vgg_batch_sizes``: per run it replaces
``model.variant``, ``batch_size``, ``eval_every`` and ``checkpoint.every_steps`` (one
epoch at the run's batch size, ``num_train // batch`` steps, so the patiences count
epochs), and the learning rate of ``gmp`` / ``gmp_imn`` by ``--vgg_gmp_lr``.

The argument: ``""`` (the paper's setting) or ``smoke``: batch 8 for 6 steps on random
32×32 ``fake`` images, 4 steps per epoch — an evaluation, a checkpoint, the report
(CI, well under a minute on CPU; numbers meaningless). On TPUs add
``--config.compute_dtype=bfloat16``.
"""

from experiments.configs._base import data as data_section
from experiments.configs._base import section
from experiments.configs._base import trainer

IMAGENET32 = "imagenet_resized/32x32"


def get_config(arg: str = ""):
  config = trainer(
      # VGG-6 (six 3x3 convs 128-128-256-256-512-512); model.variant is set per run from
      # --vgg_variants (sp, Table 2's first row, for a run of this config alone, e.g. by
      # experiments.train or benchmarks/scale_bench.py).
      model=section("model", "VGG6", variant="sp"),
      data=data_section(IMAGENET32),
      # Replaced per run by each of --vgg_batch_sizes (Table 2: 256, 512, 1024).
      batch_size=256, eval_batch_size=1000, num_epochs=90.0,
      # SGD with momentum 0.9; lr 0.01 for sp/wn/wn_mbn/bn, 0.1 for gmp/gmp_imn
      # (--vgg_gmp_lr), at every batch size (as the paper). No weight decay (the paper
      # gives none for VGG-6).
      optimizer={"euclidean": section("optimizer", "sgd", learning_rate=0.01, momentum=0.9)},
      loss="cross_entropy",
      # lr x0.1 after 5 epochs without a better top-1; stop after 10 such epochs or 90
      # epochs; the best state restored for the final evaluation.
      schedule="plateau", plateau_patience=5, plateau_factor=0.1,
      early_stopping_patience=10, restore_best=True,
      # Replaced per run by one epoch at the run's batch size (1281167 // batch steps).
      eval_every=5004, checkpoint={"every_steps": 5004, "keep": 3},
      log_every=100, seed=0)
  if arg not in ("", "smoke"):
    raise ValueError(f"e2_vgg6.py:{arg}: unknown argument; use e2_vgg6.py (the paper) or "
                     f"e2_vgg6.py:smoke")
  if arg == "smoke":
    config.data = data_section("fake", height=32, width=32, num_train=32, num_eval=16)
    config.batch_size, config.eval_batch_size = 8, 16
    config.num_epochs, config.num_steps = 0.0, 6
    config.log_every = 1
  return config
