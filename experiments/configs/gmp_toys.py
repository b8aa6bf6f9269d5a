r"""E4 — GmP characteristic points on 1-D Levy regression and 2-D banana classification
(GmP paper §3.5, Fig. 2 and 3).

    python -m experiments.gmp_toys --flagfile=experiments/flags/gmp_toys.flags --workdir=...

Adam at a constant learning rate, the characteristic points tracked after every step
(``hooks.every_steps=1``, a trainer hook). The experiment sets, per run, what its own flags
choose: the toy's data (``--toys``, ``--levy_options``, ``--banana_options``), the model's
``hidden`` width (100 on Levy, 10 on banana) and ``variant`` (``--toy_variants``), the
learning rate (each of ``--toy_lrs`` replaces ``optimizer.euclidean.learning_rate``), the seed
(``--toy_seeds``), the loss (``--levy_loss``; banana: cross-entropy), one device, and the
steps and batch of each toy (``--levy_steps`` / ``--banana_steps``,
``--levy_batch_size`` / ``--banana_batch_size``; 0 falls back to ``num_steps`` /
``batch_size`` here). ``model.activation`` must stay ReLU: a characteristic point is a
ReLU unit's kink.

The argument is ``""`` or ``smoke`` (CI: a log line every 20 steps).
"""

from experiments.configs._base import section
from experiments.configs._base import trainer


def get_config(arg: str = ""):
  if arg not in ("", "smoke"):
    raise ValueError(f"gmp_toys.py:{arg}: the argument is '' or 'smoke'")
  model = section("model", "MLP", activation="relu")
  del model["hidden"], model["variant"]   # per toy and per run
  config = trainer(
      model=model,
      data={"name": "levy"},   # per toy: --toys, --levy_options, --banana_options
      optimizer={"euclidean": section("optimizer", "adam", learning_rate=0.01)},   # lr: --toy_lrs
      schedule="constant", hooks={"every_steps": 1}, log_every=1000, seed=0,
      # Fallbacks of --{levy,banana}_steps / _batch_size (gmp_toys.flags sets both toys').
      num_steps=3000, batch_size=128)
  if arg == "smoke":
    config.log_every = 20
  return config
