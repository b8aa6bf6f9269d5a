r"""E1 — ResNet-50 on ImageNet (GmP paper Table 1), the paper's recipe; one norm per job.

    python -m experiments.resnet50 --config=experiments/configs/e1_resnet50.py:gmp_imn --workdir=...

(``experiments/flags/e1_resnet50_{bn,wn_mbn,gmp_imn}.flags`` are that line for each norm;
they hold training settings only, so ``python -m experiments.train`` runs them too.)

The argument is ``NORM[,smoke]``: ``bn``, ``wn_mbn``, ``gmp_imn`` (Table 1) or ``none``
(:attr:`orthojax.models.ResNet.NORMS`); ``smoke`` trains a ResNet-18 with that norm for 16
steps on random 32×32 ``fake`` images (CI, about a minute on CPU for ``bn``) with a
checkpoint every 2 steps and an evaluation every epoch (4 steps): plateau / early-stopping /
restore-best bookkeeping and the report, end to end; its numbers are meaningless.
Changing the batch size? Scale the learning rate linearly (0.1 per 256) and set
``eval_every`` and ``checkpoint.every_steps`` to one epoch, 1281167 // batch steps
(launch/README.md has a table). On TPUs add ``--config.compute_dtype=bfloat16``.
"""

from experiments.configs._base import data as data_section
from experiments.configs._base import section
from experiments.configs._base import trainer

IMAGENET_TRAIN = 1_281_167


def get_config(arg: str = "bn"):
  norm, *flags = arg.split(",")
  epoch = IMAGENET_TRAIN // 256        # one epoch at batch 256: 5004 steps
  config = trainer(
      # ResNet-50 v1.5 (He et al. 2016, "the same setup" as the paper's Appendix C.1).
      model=section("model", "ResNet", depth=50, norm=norm),
      data=data_section("imagenet2012"),
      batch_size=256, num_epochs=90.0,
      # SGD with momentum 0.9, lr 0.1 at batch 256, and He et al.'s L2 of 1e-4 on the
      # kernels (GmP layers: their scales are not decayed, nor their angles;
      # orthojax.train.optimizers.decay_mask).
      optimizer={"euclidean": section("optimizer", "sgd", learning_rate=0.1, momentum=0.9)},
      weight_decay=1e-4,
      loss="cross_entropy",
      # lr x0.1 after 5 epochs without a better top-1; stop after 10 such epochs or 90 epochs
      # (both patiences count evaluations: evaluate once per epoch), the best state restored
      # for the final evaluation.
      schedule="plateau", plateau_patience=5, plateau_factor=0.1,
      early_stopping_patience=10, restore_best=True,
      eval_every=epoch, checkpoint={"every_steps": epoch, "keep": 3}, log_every=100, seed=0)
  unknown = [f for f in flags if f != "smoke"]
  if unknown:
    raise ValueError(f"e1_resnet50.py:{arg}: unknown {unknown[0]!r}; the argument is "
                     f"NORM[,smoke]")
  if "smoke" in flags:
    config.model.depth = 18
    config.data = data_section("fake", height=32, width=32, num_train=32, num_eval=16)
    config.batch_size = 8
    config.optimizer.euclidean.learning_rate = 0.1 * 8 / 256   # linear scaling: 0.003125
    config.num_epochs, config.num_steps = 0.0, 16
    config.eval_every, config.checkpoint.every_steps, config.log_every = 4, 2, 1
  return config
