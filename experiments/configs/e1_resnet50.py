r"""E1 — ResNet-50 on ImageNet (GmP paper Table 1), the paper's recipe; one norm per job.

    python -m experiments.resnet50 --config=experiments/configs/e1_resnet50.py:gmp_imn --workdir=...

The argument is ``NORM[,smoke]``: ``bn``, ``wn_mbn``, ``gmp_imn`` (Table 1) or ``none``;
``smoke`` trains a BN ResNet-18 for 16 steps on random 32×32 ``fake`` images (CI, about a
minute on CPU) with a checkpoint every 2 steps and an evaluation every epoch (4 steps).
Changing the batch size? Scale the learning rate linearly (0.1 per 256) and set
``eval_every`` and ``checkpoint.every_steps`` to one epoch, 1281167 // batch steps
(launch/README.md has a table). On TPUs add ``--config.compute_dtype=bfloat16``.
"""

from experiments.configs._base import section
from experiments.configs._base import trainer

IMAGENET_TRAIN = 1_281_167


def get_config(arg: str = "bn"):
  norm, *flags = arg.split(",")
  epoch = IMAGENET_TRAIN // 256        # 5004 steps at batch 256
  config = trainer(
      model=section("model", "ResNet", depth=50, norm=norm),
      data={"name": "imagenet2012", "data_dir": ""},
      batch_size=256, num_epochs=90.0,
      # SGD with momentum 0.9 and He et al.'s L2 of 1e-4 on the kernels (not on GmP scales
      # or angles; orthojax.train.optimizers.decay_mask).
      optimizer=section("optimizer", "sgd", learning_rate=0.1, momentum=0.9),
      weight_decay=1e-4,
      # lr x0.1 after 5 epochs without a better top-1; stop after 10 such epochs or 90 epochs.
      schedule="plateau", plateau_patience=5, plateau_factor=0.1,
      early_stopping_patience=10, restore_best=True,
      eval_every=epoch, checkpoint={"every_steps": epoch, "keep": 3}, log_every=100, seed=0)
  if "smoke" in flags:
    config.model.depth = 18
    config.data = {"name": "fake", "height": 32, "width": 32, "num_train": 32, "num_eval": 16}
    config.batch_size = 8
    config.optimizer.learning_rate = 0.1 * 8 / 256
    config.num_epochs, config.num_steps = 0.0, 16
    config.eval_every, config.checkpoint.every_steps, config.log_every = 4, 2, 1
  return config
