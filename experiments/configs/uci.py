r"""E3 — UCI regression, GmP paper Table 3, the released code's recipe.

    python -m experiments.uci --flagfile=experiments/flags/uci_boston.flags --workdir=...

One hidden layer of 100 ReLU units (:class:`~orthojax.models.MLP`; the experiment sets
``model.variant`` per run from ``--variants``), MAE loss on standardised targets,
full-batch Adam at lr 0.01 (the GmP variant at ``--gmp_lr``, 0.1), at most 5000 epochs
(= steps), the learning rate ×0.1 after 50 epochs without a better eval loss, early
stopping after 100 (restoring the best weights), an evaluation every epoch.

The experiment also sets, per run, the data (``data.name`` is replaced by each set of
``--uci_datasets``; ``split_index`` and ``validation_fraction`` come from the split and
``--protocol``; the other data keys apply to every set), the batch (the whole training
split), one device (``mesh`` 1 × 1 × 1) and the final test evaluation.

The argument is ``""`` or ``smoke`` (CI: 30 epochs, plateau after 5, early stopping after
10).
"""

from experiments.configs._base import section
from experiments.configs._base import trainer


def get_config(arg: str = ""):
  if arg not in ("", "smoke"):
    raise ValueError(f"uci.py:{arg}: the argument is '' or 'smoke'")
  model = section("model", "MLP", hidden=100, activation="relu")
  del model["variant"]   # per run: --variants
  config = trainer(
      model=model,
      data={"name": "uci/boston", "csv_path": "", "download": True, "data_dir": ""},
      loss="mae",
      optimizer={"euclidean": section("optimizer", "adam", learning_rate=0.01)},
      num_steps=5000,
      schedule="plateau", plateau_factor=0.1, plateau_patience=50,
      early_stopping_patience=100, restore_best=True,
      eval_every=1, log_every=500, seed=0)
  if arg == "smoke":
    config.num_steps = 30
    config.plateau_patience = 5
    config.early_stopping_patience = 10
  return config
