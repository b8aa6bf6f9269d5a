"""Optax transformations and schedules built from a :class:`Config`.

* ``--weights=euclidean``: one optimizer (``--optimizer``) for every param.
* ``--weights=stiefel|oblique``: :func:`orthojax.optim.partition` routes the
  model's :class:`~orthojax.nn.StiefelParam` / :class:`~orthojax.nn.ObliqueParam`
  leaves to the manifold optimizer (``--optimizer``, ``--lr``) and the rest
  (scales, biases, classifier) to ``--euclidean_optimizer`` at
  ``--euclidean_lr`` (default ``--lr``).
* ``--penalty``: a decoupled soft-orthogonality penalty on the leaves the
  model marks (:func:`orthojax.optim.add_orthogonality_penalty`), chained
  first so it acts like a loss term under SGD.
* ``--grad_clip_norm``: ``optax.clip_by_global_norm`` in front.

Schedules (multiplying the learning rate; a function of the step):
``constant``, ``cosine`` (to 0 at the end), ``warmup_cosine`` (linear warmup
then cosine), ``step`` (×``decay_factor`` at each fraction in
``decay_boundaries``). ``plateau`` is not a step function: the trainer
lowers a learning-rate multiplier held in the train state when the eval
metric stalls (as ``optax.contrib.reduce_on_plateau`` does, but on the
*eval* metric at eval time, as the E1 (He et al. 2016) and E3 (the GmP paper's
released code) recipes do). Because that
multiplier scales the update after the optimizer, ``plateau`` is only valid
for Euclidean optimizers (a manifold step is not linear in its update).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

import orthojax as oj
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.config import MANIFOLD_OPTIMIZERS


def schedule(config: Config, base_lr: float, total_steps: int) -> optax.Schedule:
  """The learning-rate schedule of ``config`` (``plateau`` → constant here)."""
  name = config.schedule
  if name in ("constant", "plateau"):
    return optax.constant_schedule(base_lr)
  if name == "cosine":
    return optax.cosine_decay_schedule(base_lr, max(total_steps, 1))
  if name == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, base_lr, config.warmup_steps,
                                              max(total_steps, config.warmup_steps + 1))
  if name == "step":
    boundaries = {int(round(b * total_steps)): config.decay_factor
                  for b in config.decay_boundaries}
    return optax.piecewise_constant_schedule(base_lr, boundaries)
  raise ConfigError(f"--schedule={name}: unknown")


def decay_mask(params: Any) -> Any:
  """Where ``--weight_decay`` acts: kernels (rank ≥ 2), not biases or normalisation
  scales (as Flax's ImageNet example), and not GmP angles ``theta`` — they are
  coordinates, and shrinking them would turn every unit towards the first axis."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x.ndim >= 2 and "'theta'" not in jax.tree_util.keystr(path), params)


def _euclidean(name: str, lr: optax.ScalarOrSchedule, config: Config) -> optax.GradientTransformation:
  """A Euclidean optimizer; ``--weight_decay`` is decoupled for ``adamw`` (Loshchilov &
  Hutter) and an L2 term added to the gradient for the others (He et al.'s SGD)."""
  if name == "adamw":
    return optax.adamw(lr, weight_decay=config.weight_decay, mask=decay_mask)
  if name == "sgd":
    tx = optax.sgd(lr)
  elif name == "momentum":
    tx = optax.sgd(lr, momentum=config.momentum)
  elif name == "nesterov":
    tx = optax.sgd(lr, momentum=config.momentum, nesterov=True)
  elif name == "adam":
    tx = optax.adam(lr)
  else:
    raise ConfigError(f"--euclidean_optimizer={name}: unknown")
  if config.weight_decay:
    return optax.chain(optax.add_decayed_weights(config.weight_decay, mask=decay_mask), tx)
  return tx


def _manifold(name: str, lr: optax.ScalarOrSchedule, config: Config,
              views: Any) -> optax.GradientTransformation:
  manifold = oj.manifolds.Oblique() if config.weights == "oblique" else oj.manifolds.Stiefel()
  if name == "rsgd":
    return oj.optim.rsgd(lr, manifold=manifold, momentum=config.momentum, views=views)
  if name == "radam":
    return oj.optim.radam(lr, manifold=manifold, views=views)
  if config.weights == "oblique":
    raise ConfigError(f"--optimizer={name}: Stiefel-only; with --weights=oblique use rsgd or radam")
  if name == "cayley_sgd":
    return oj.optim.cayley_sgd(lr, momentum=config.momentum, views=views)
  if name == "cayley_adam":
    return oj.optim.cayley_adam(lr, views=views)
  if name == "landing":
    return oj.optim.landing(lr, views=views)
  raise ConfigError(f"--optimizer={name}: unknown")


def build(config: Config, *, total_steps: int, labels: Any = None, views: Any = None,
          penalty_mask: Any = None) -> optax.GradientTransformation:
  """The full transformation for ``config``.

  Args:
    config: the run's config.
    total_steps: for schedules.
    labels: pure label tree (``"stiefel"`` / ``"oblique"`` / ``"euclidean"``)
      when the model has manifold weights.
    views: pure ``views=`` tree for the manifold optimizer and the penalty.
    penalty_mask: which leaves the penalty sees (None: every matrix leaf).
  """
  if config.schedule == "plateau" and config.optimizer in MANIFOLD_OPTIMIZERS:
    raise ConfigError(f"--schedule=plateau: not available with the manifold optimizer "
                      f"{config.optimizer} (its step is not linear in the learning rate); "
                      f"use cosine, warmup_cosine or step")
  lr = schedule(config, config.lr, total_steps)
  links = []
  if config.grad_clip_norm:
    links.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.penalty != "none":
    links.append(oj.optim.add_orthogonality_penalty(
        config.penalty, config.penalty_strength, config.penalty_gain,
        mask=penalty_mask, views=views))
  if config.weights == "euclidean":
    if config.optimizer == "muon":
      links.append(oj.optim.muon(lr, views=views))
    elif config.optimizer in MANIFOLD_OPTIMIZERS:
      raise ConfigError(f"--optimizer={config.optimizer}: needs --weights=stiefel or oblique")
    else:
      links.append(_euclidean(config.optimizer, lr, config))
  else:
    if labels is None:
      raise ValueError("build: a model with manifold weights must provide labels")
    euclid_lr = schedule(config, config.euclidean_lr or config.lr, total_steps)
    manifold_label = "oblique" if config.weights == "oblique" else "stiefel"
    links.append(oj.optim.partition(
        labels, **{manifold_label: _manifold(config.optimizer, lr, config, views),
                   "euclidean": _euclidean(config.euclidean_optimizer, euclid_lr, config)}))
  return optax.chain(*links) if len(links) > 1 else links[0]
