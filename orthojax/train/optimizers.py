"""The run's optax chain, built from the config's sections.

* A model without manifold parameters: ``config.optimizer`` (any name of
  :data:`orthojax.train.registry.OPTIMIZERS` with its keywords) for every param.
* A model with :class:`~orthojax.nn.StiefelParam` / :class:`~orthojax.nn.ObliqueParam`
  leaves: :func:`orthojax.optim.partition` routes them to ``config.optimizer`` (its
  ``manifold`` section defaults to the model's manifold) and the rest (scales, biases,
  classifier) to ``config.euclidean_optimizer``.
* ``config.penalty``: a decoupled soft-orthogonality penalty on the leaves the model
  marks (:func:`orthojax.optim.add_orthogonality_penalty`), chained first so it acts
  like a loss term under SGD.
* ``config.weight_decay``: an L2 term added to the Euclidean kernels' gradient
  (``optax.add_decayed_weights``, He et al. 2016's SGD); AdamW's decoupled decay is its
  own keyword, ``config.optimizer.weight_decay``. Both skip biases, normalisation scales
  and GmP angles (:func:`decay_mask`).
* ``config.grad_clip_norm``: ``optax.clip_by_global_norm`` in front.

The trainer replaces each optimizer's ``learning_rate`` by the schedule
``config.schedule`` built from it (a multiplier of it, a function of the step):
``constant``, ``cosine`` (to 0 at the end), ``warmup_cosine`` (linear warmup
then cosine), ``step`` (×``decay_factor`` at each fraction in
``decay_boundaries``). ``plateau`` is not a step function: the trainer
lowers a learning-rate multiplier held in the train state when the eval
metric stalls (as ``optax.contrib.reduce_on_plateau`` does, but on the
*eval* metric at eval time, as the ResNet (He et al. 2016) and GmP (the paper's
released code) recipes do). Because that multiplier scales the update after the
optimizer, ``plateau`` is only valid for Euclidean optimizers (a manifold step is
not linear in its update).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

import orthojax as oj
from orthojax.train import registry
from orthojax.train import schedules
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


def schedule(config: Config, base_lr: float, total_steps: int) -> optax.Schedule:
  """``config.schedule`` peaking at ``base_lr`` (:func:`orthojax.train.schedules.schedule`)."""
  return schedules.schedule(config.schedule, base_lr, total_steps,
                            warmup_steps=config.warmup_steps,
                            decay_boundaries=config.decay_boundaries,
                            decay_factor=config.decay_factor)


def decay_mask(params: Any) -> Any:
  """Where ``config.weight_decay`` (and AdamW's own ``weight_decay``) acts: kernels
  (rank ≥ 2), not biases or normalisation
  scales (as Flax's ImageNet example), and not GmP angles ``theta`` — they are
  coordinates, and shrinking them would turn every unit towards the first axis."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x.ndim >= 2 and "'theta'" not in jax.tree_util.keystr(path), params)


def _scheduled(section: dict[str, Any], config: Config, total_steps: int) -> dict[str, Any]:
  if "learning_rate" not in section:
    return section
  return {**section, "learning_rate": schedule(config, section["learning_rate"], total_steps)}


def _optimizer(key: str, section: dict[str, Any], config: Config, total_steps: int,
               supplied: dict[str, Any]) -> optax.GradientTransformation:
  return registry.build("optimizer", _scheduled(section, config, total_steps), f"config.{key}",
                        registry.Supplied(supplied))


def _with_l2(tx: optax.GradientTransformation, config: Config) -> optax.GradientTransformation:
  if not config.weight_decay:
    return tx
  return optax.chain(optax.add_decayed_weights(config.weight_decay, mask=decay_mask), tx)


def build(config: Config, *, total_steps: int, labels: Any = None, views: Any = None,
          penalty_mask: Any = None) -> optax.GradientTransformation:
  """The full transformation for ``config``.

  Args:
    config: the run's config.
    total_steps: for schedules.
    labels: pure label tree (``"stiefel"`` / ``"oblique"`` / ``"euclidean"``,
      :func:`orthojax.nn.manifold_labels`), or None for a model without manifold params.
    views: pure ``views=`` tree for the manifold optimizer and the penalty.
    penalty_mask: which leaves the penalty sees (None: every matrix leaf).

  Raises:
    ConfigError: one line naming the config key.
  """
  name = config.optimizer["name"]
  manifold_kinds = sorted({l for l in jax.tree.leaves(labels) if l != "euclidean"})
  if config.schedule == "plateau" and name in registry.MANIFOLD_OPTIMIZERS:
    raise ConfigError(f"config.schedule='plateau': not available with the manifold optimizer "
                      f"{name} (its step is not linear in the learning rate); use cosine, "
                      f"warmup_cosine or step")
  links = []
  if config.grad_clip_norm:
    links.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.penalty:
    links.append(registry.build("penalty", config.penalty, "config.penalty",
                                registry.Supplied({"mask": penalty_mask, "views": views})))
  euclidean = {"views": views, "mask": decay_mask}
  if not manifold_kinds:
    if name in registry.MANIFOLD_OPTIMIZERS:
      raise ConfigError(f"config.optimizer.name={name!r}: a manifold optimizer needs manifold "
                        f"parameters (e.g. config.model.weights='stiefel' for DeepMLP)")
    if config.euclidean_optimizer is not None:
      raise ConfigError("config.euclidean_optimizer: the model has no manifold parameters, "
                        "so config.optimizer updates every parameter; remove it")
    links.append(_with_l2(_optimizer("optimizer", config.optimizer, config, total_steps,
                                     euclidean), config))
  else:
    if len(manifold_kinds) > 1:
      raise ConfigError(f"config.model: has both {' and '.join(manifold_kinds)} parameters; "
                        f"one manifold optimizer cannot update both")
    if config.euclidean_optimizer is None:
      raise ConfigError("config.euclidean_optimizer: the model has Euclidean parameters beside "
                        "its manifold ones (biases, scales, the head); name their optimizer, "
                        "e.g. {'name': 'adam', 'learning_rate': 1e-3}")
    kind = manifold_kinds[0]
    default = oj.manifolds.Oblique() if kind == "oblique" else oj.manifolds.Stiefel()
    manifold_tx = _optimizer("optimizer", config.optimizer, config, total_steps,
                             {"views": views, "manifold": default})
    _check_manifold(config, kind)
    euclid_tx = _with_l2(_optimizer("euclidean_optimizer", config.euclidean_optimizer, config,
                                    total_steps, euclidean), config)
    links.append(oj.optim.partition(labels, **{kind: manifold_tx, "euclidean": euclid_tx}))
  return optax.chain(*links) if len(links) > 1 else links[0]


def _check_manifold(config: Config, kind: str) -> None:
  """The optimizer's manifold section must match the model's manifold parameters."""
  section = config.optimizer.get("manifold")
  if isinstance(section, dict) and section.get("name", "").lower() != kind:
    raise ConfigError(f"config.optimizer.manifold.name={section.get('name')!r}: the model's "
                      f"manifold parameters are {kind}; use {kind.capitalize()!r}")
  if kind == "oblique" and config.optimizer["name"] not in ("rsgd", "radam", "projected_gradient"):
    raise ConfigError(f"config.optimizer.name={config.optimizer['name']!r}: Stiefel-only; the "
                      f"model's manifold parameters are oblique: use rsgd or radam")
