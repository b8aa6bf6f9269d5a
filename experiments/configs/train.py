r"""The default config of ``python -m experiments.train``: an MLP on scikit-learn's digits.

    python -m experiments.train --config=experiments/configs/train.py \
        --config.model.hidden=256 --config.optimizer.euclidean.learning_rate=3e-3 --workdir=runs/digits
"""

from experiments.configs._base import section
from experiments.configs._base import trainer


def get_config(arg: str = ""):
  del arg
  return trainer(
      model=section("model", "MLP", hidden=100, variant="sp", activation="relu"),
      data={"name": "digits", "data_dir": ""},   # another dataset: --config.data.name=cifar10
      batch_size=128, num_steps=500,
      optimizer={"euclidean": section("optimizer", "adam", learning_rate=1e-3)},
      log_every=50)
