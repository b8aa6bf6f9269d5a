"""The run's optax chain, built from the config's sections.

* One optimizer per parameter group (``config.optimizer.euclidean``, ``.stiefel``,
  ``.oblique``: any name of :data:`orthojax.train.registry.OPTIMIZERS` with its
  keywords). A model without manifold parameters uses the Euclidean group's for every
  parameter; a model with :class:`~orthojax.nn.StiefelParam` /
  :class:`~orthojax.nn.ObliqueParam` leaves has them routed to their group's optimizer
  by :func:`orthojax.optim.partition`, the rest (scales, biases, classifier) to the
  Euclidean group's. A manifold group's optimizer takes its ``manifold`` section
  (``Stiefel`` / ``Oblique`` at their defaults where the section leaves it out). Groups
  the model does not have are not built.
* ``config.penalty``: a decoupled soft-orthogonality penalty on the leaves the model
  marks (:func:`orthojax.optim.add_orthogonality_penalty`), chained first so it acts
  like a loss term under SGD.
* ``config.weight_decay``: an L2 term added to the Euclidean kernels' gradient
  (``optax.add_decayed_weights``, He et al. 2016's SGD); AdamW's decoupled decay is its
  own keyword, ``config.optimizer.weight_decay``. Both skip biases, normalisation scales
  and GmP angles, stacked or not (:func:`decay_mask`, by the axes the model's Variables
  record).
* ``config.grad_clip_norm``: ``optax.clip_by_global_norm`` in front.
* ``bucket`` in a group's section (a keyword of every library optimizer,
  :data:`orthojax.linalg.BUCKETS`): how its update runs over the group's matrices on one
  device — ``"pad"`` by default (matrices that share their small side stacked into one
  batched program, zero-padded within 1.1x of their own FLOPs), ``"shape"`` (equal
  shapes only) or ``"per_leaf"`` (one program per matrix). Owner-sharded, each owner
  runs its own matrices the same way.
* ``config.mesh.shard_update``: each group's optimizer of the library's table
  (:data:`orthojax.optim.OPTIMIZER_TABLE`) wrapped explicitly in
  :func:`orthojax.optim.shard_update` (:func:`update_sharding`); the penalty, the clip
  and optax's optimizers are not per-matrix work and stay replicated.

The trainer replaces each optimizer's ``learning_rate`` (and Muon's
``adam_learning_rate``) by the schedule
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

import functools
import inspect
from typing import Any, Callable

import jax
import optax
from flax import nnx

import orthojax as oj
from orthojax.train import model_zoo
from orthojax.train import registry
from orthojax.train import schedules
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.config import GROUPS


def schedule(config: Config, base_lr: float, total_steps: int) -> optax.Schedule:
  """``config.schedule`` peaking at ``base_lr`` (:func:`orthojax.train.schedules.schedule`)."""
  return schedules.schedule(config.schedule, base_lr, total_steps,
                            warmup_steps=config.warmup_steps,
                            decay_boundaries=config.decay_boundaries,
                            decay_factor=config.decay_factor)


def decay_mask(params: Any, axes: dict[Any, Any] | None = None) -> Any:
  """Where ``config.weight_decay`` (and AdamW's own ``weight_decay``) acts: the leaves
  with two or more axes of one layer — kernels, embeddings, the head — not biases or
  normalisation scales (as Flax's ImageNet example), whether one layer's ``(d,)`` or a
  scanned stack's ``(L, d)``, and not GmP angles ``theta`` — they are coordinates, and
  shrinking them would turn every unit towards the first axis.

  Args:
    params: the parameter tree (or a part of it: the others ``optax.MaskedNode``).
    axes: ``{key path: logical axis names}`` the model's Variables record
      (:func:`orthojax.train.model_zoo.axes_by_path`): a scanned stack's layer axis does
      not count towards the two, and a leaf with an angles axis is not decayed. A leaf
      without an entry (a bare parameter dict's) is judged by its rank and its name.
  """
  axes = axes or {}

  def decayed(path, x):
    names = axes.get(path)
    if names is None:
      return x.ndim >= 2 and "'theta'" not in jax.tree_util.keystr(path)
    return (sum(n != oj.nn.sharding.LAYERS for n in names) >= 2
            and oj.nn.sharding.ANGLES not in names)

  return jax.tree_util.tree_map_with_path(decayed, params)


RATE_KEYWORDS = ("learning_rate", "adam_learning_rate")
"""The keywords that take a rate the schedule shapes: an optimizer's ``learning_rate``, and
Muon's ``adam_learning_rate`` (its AdamW group's; optax uses ``learning_rate`` when it is
left out)."""


def _scheduled(section: dict[str, Any], config: Config, total_steps: int) -> dict[str, Any]:
  return {k: (schedule(config, v, total_steps)
              if k in RATE_KEYWORDS and isinstance(v, (int, float)) and not isinstance(v, bool)
              else v) for k, v in section.items()}


Shard = Callable[..., optax.GradientTransformation]
"""``shard(tx, views=...)``: a transformation as the run applies it (:func:`update_sharding`)."""


def unsharded(tx: optax.GradientTransformation, views: Any = None
              ) -> optax.GradientTransformation:
  """The :data:`Shard` of a run that replicates the update: ``tx`` as it is; one built
  without ``views=`` (an :class:`orthojax.optim.ViewsFromInit`) built for ``views``, as
  :func:`orthojax.optim.shard_update` would run it."""
  if views is not None and isinstance(tx, oj.optim.ViewsFromInit):
    return tx.with_views(views)
  return tx


def update_sharding(config: Config, mesh: Any) -> Shard:
  """``config.mesh.shard_update`` as an explicit wrapper ``shard(tx, views=...)``.

  On (the default) and with more than one data-parallel device:
  :func:`orthojax.optim.shard_update` over ``mesh``'s ``data`` and ``fsdp`` axes with
  ``config.mesh.split_above``, the stacks striped (``stripe_stacks``) when the ``fsdp``
  axis is longer than 1, so that they reach their owners by all-to-alls instead of whole
  on every device. Off, or on one owner: :func:`unsharded`.
  """
  if not config.mesh.shard_update or oj.optim.num_owners(mesh) == 1:
    return unsharded
  return functools.partial(oj.optim.shard_update, mesh=mesh,
                           split_above=config.mesh.split_above,
                           stripe_stacks=mesh.shape["fsdp"] > 1)


OptimizerArg = optax.GradientTransformation | Callable[[Any], optax.GradientTransformation]
"""A user's optimizer: an optax chain, or a function of the abstract model
(``nnx.eval_shape`` of it: its Variable types and metadata, no arrays) that returns one —
e.g. ``oj.optim.partition(model, stiefel=..., euclidean=...)`` routing by Variable type. A
function that takes a ``shard`` keyword is given the run's wrapper
(:func:`update_sharding`) to apply to its orthogonal parts."""


def for_model(config: Config, abstract: Any, abs_params: Any, *, total_steps: int,
              mesh: Any, optimizer: OptimizerArg | None = None
              ) -> optax.GradientTransformation:
  """The run's optimizer for the abstract model: the user's ``optimizer``
  (:func:`user_optimizer`) or, when None, the chain ``config`` describes (:func:`build`)
  with the groups, views, penalty mask and decay axes the model's Variables record; the
  library's optimizers applied as ``config.mesh.shard_update`` says
  (:func:`update_sharding`).

  Args:
    config: the run's config.
    abstract: the abstract model (``nnx.eval_shape`` of its constructor).
    abs_params: its ``nnx.Param`` state.
    total_steps: for schedules.
    mesh: the run's mesh.
    optimizer: a user's optimizer, or None for the config's.

  Raises:
    ConfigError: one line naming the config key.
  """
  shard = update_sharding(config, mesh)
  if optimizer is not None:
    return user_optimizer(optimizer, abstract, shard)
  labels = nnx.to_pure_dict(oj.nn.manifold_labels(abs_params))
  if all(label == "euclidean" for label in jax.tree.leaves(labels)):
    labels = None
  return build(config, total_steps=total_steps, labels=labels,
               views=nnx.to_pure_dict(oj.nn.matrix_views(abs_params)),
               penalty_mask=model_zoo.penalty_mask(abstract, nnx.to_pure_dict(abs_params)),
               axes=model_zoo.axes_by_path(abstract), shard=shard)


def user_optimizer(optimizer: Any, abstract: Any, shard: Shard = unsharded
                   ) -> optax.GradientTransformation:
  """A user's optimizer (``fit``'s, ``compile_for``'s): a chain as given, or a function of
  the abstract model called with it — and with ``shard=shard`` where the function takes
  that keyword."""
  if isinstance(optimizer, optax.GradientTransformation):
    return optimizer
  if _takes_shard(optimizer):
    return optimizer(abstract, shard=shard)
  return optimizer(abstract)


def _takes_shard(fn: Callable[..., Any]) -> bool:
  try:
    return "shard" in inspect.signature(fn).parameters
  except (TypeError, ValueError):   # a builtin without a signature
    return False


def _optimizer(group: str, config: Config, total_steps: int,
               supplied: dict[str, Any]) -> optax.GradientTransformation:
  section = _scheduled(config.optimizer[group], config, total_steps)
  return registry.build("optimizer", section, f"config.optimizer.{group}",
                        registry.Supplied(supplied))


def _group_optimizer(group: str, config: Config, total_steps: int, views: Any,
                     shard: Shard, mask: Callable[[Any], Any]) -> optax.GradientTransformation:
  """The group's optimizer; one of the library's wrapped in ``shard`` (with the views the
  trainer gives it), Euclidean ones with the L2 term in front.

  The library's are built without ``views=`` and take them from ``shard``: under
  :func:`orthojax.optim.shard_update` the matrices it splits by rows then run with views
  that say so (``MatrixView.row_blocks``), and Muon arranges its products for that."""
  library = oj.optim.optimizer_entry(config.optimizer[group].get("name")) is not None
  given = None if library else views
  if group == "euclidean":
    supplied = {"views": given, "mask": mask}
  else:
    supplied = {"views": given, "manifold": _default_manifold(group)}
  tx = _optimizer(group, config, total_steps, supplied)
  if library:
    tx = shard(tx, views=views)
  return _with_l2(tx, config, mask) if group == "euclidean" else tx


def _with_l2(tx: optax.GradientTransformation, config: Config,
             mask: Callable[[Any], Any]) -> optax.GradientTransformation:
  if not config.weight_decay:
    return tx
  return optax.chain(optax.add_decayed_weights(config.weight_decay, mask=mask), tx)


def build(config: Config, *, total_steps: int, labels: Any = None, views: Any = None,
          penalty_mask: Any = None, axes: dict[Any, Any] | None = None,
          shard: Shard = unsharded) -> optax.GradientTransformation:
  """The full transformation for ``config``.

  Args:
    config: the run's config.
    total_steps: for schedules.
    labels: pure label tree (``"stiefel"`` / ``"oblique"`` / ``"euclidean"``,
      :func:`orthojax.nn.manifold_labels`), or None for a model without manifold params.
    views: pure ``views=`` tree for the manifold optimizers and the penalty.
    penalty_mask: which leaves the penalty sees (None: every matrix leaf).
    axes: ``{key path: logical axis names}`` the model's Variables record, for the weight
      decay's mask (:func:`decay_mask`; None: by rank and name).
    shard: how the library's optimizers are applied (:func:`update_sharding`; default
      :func:`unsharded`).

  Raises:
    ConfigError: one line naming the config key.
  """
  groups = sorted(set(jax.tree.leaves(labels)) if labels is not None else {"euclidean"},
                  key=GROUPS.index)
  for group in groups:
    _check_group(config, group, groups)
  for group in sorted(set(config.optimizer) - set(groups), key=GROUPS.index):
    # A group the model does not have is still built (and dropped): a bad key in it is an
    # error here too, not only in the runs of an experiment whose models have the group.
    _check_section(config, group, groups)
    _optimizer(group, config, total_steps, {"views": views, "manifold": _default_manifold(group)})
  links = []
  if config.grad_clip_norm:
    links.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.penalty:
    links.append(registry.build("penalty", config.penalty, "config.penalty",
                                registry.Supplied({"mask": penalty_mask, "views": views})))
  mask = functools.partial(decay_mask, axes=axes)
  txs = {group: _group_optimizer(group, config, total_steps, views, shard, mask)
         for group in groups}
  links.append(txs["euclidean"] if groups == ["euclidean"] else oj.optim.partition(labels, **txs))
  return optax.chain(*links) if len(links) > 1 else links[0]


ORTHOGONALIZED_STEPS = tuple(entry.name for entry in oj.optim.OPTIMIZER_TABLE
                             if entry.manifolds and not entry.keeps_manifold)
"""Euclidean optimizers a manifold group may name (the rows of
:data:`orthojax.optim.OPTIMIZER_TABLE` with manifolds that do not keep them: Muon): their
step is orthogonalized (Muon's Newton–Schulz polar factor), the reason to route the
group's matrices to them, but not a manifold step — the parameters start on the manifold
(the group's initialisation) and move off it, as in Muon's own use (Jordan et al. 2024).
Any other Euclidean optimizer there is refused: it would take the parameters off the
manifold without a reason."""


def _check_group(config: Config, group: str, groups: list[str]) -> None:
  """The group's section exists and suits its parameters."""
  key = f"config.optimizer.{group}"
  section = config.optimizer.get(group)
  if section is None:
    what = ("parameters off a manifold (biases, scales, the head)" if group == "euclidean"
            else f"{group} parameters")
    example = ("{'name': 'adam', 'learning_rate': 1e-3}" if group == "euclidean" else
               f"{{'name': 'radam', 'learning_rate': 1e-3, 'manifold': "
               f"{{'name': '{group.capitalize()}'}}}}")
    raise ConfigError(f"{key}: missing; the model's {what} need an optimizer, e.g. {example}")
  _check_section(config, group, groups)


def _default_manifold(group: str) -> Any:
  return oj.manifolds.Oblique() if group == "oblique" else oj.manifolds.Stiefel()


def _check_section(config: Config, group: str, groups: list[str]) -> None:
  """The group's optimizer suits its parameters (and the schedule), as
  :data:`orthojax.optim.OPTIMIZER_TABLE` says."""
  key = f"config.optimizer.{group}"
  section = config.optimizer[group]
  for rate_key in RATE_KEYWORDS:
    rate = section.get(rate_key)
    if isinstance(rate, (int, float)) and not rate > 0:
      raise ConfigError(f"{key}.{rate_key}={rate}: must be > 0")
  name = section.get("name")
  if name is None:
    return   # the registry names the missing key when it builds the section
  if group == "euclidean":
    _check_euclidean(key, name, groups)
  else:
    _check_manifold_group(config, key, group, section)


def _check_euclidean(key: str, name: str, groups: list[str]) -> None:
  """Euclidean parameters may not go to an optimizer that keeps a manifold."""
  entry = oj.optim.optimizer_entry(name)
  if entry is None or not entry.keeps_manifold:
    return
  hint = ("e.g. config.model.weights='stiefel' for DeepMLP" if groups == ["euclidean"]
          else "the model's manifold parameters are config.optimizer." +
          " / config.optimizer.".join(g for g in groups if g != "euclidean"))
  raise ConfigError(f"{key}.name={name!r}: a manifold optimizer, for manifold parameters "
                    f"({hint})")


def _check_manifold_group(config: Config, key: str, group: str, section: Any) -> None:
  """A manifold group's optimizer must serve that manifold (keeping it, or Muon's
  orthogonalized step), with a linear schedule only where it is not a manifold step."""
  name = section["name"]
  entry = oj.optim.optimizer_entry(name)
  if entry is None or not entry.manifolds:
    raise ConfigError(f"{key}.name={name!r}: not a manifold optimizer; the group's parameters "
                      f"are on the {group} manifold and would leave it: use one of "
                      f"{', '.join(registry.MANIFOLD_OPTIMIZERS)} (or "
                      f"{', '.join(ORTHOGONALIZED_STEPS)} for an orthogonalized step)")
  if config.schedule == "plateau" and entry.keeps_manifold:
    raise ConfigError(f"config.schedule='plateau': not available with the manifold optimizer "
                      f"{key}.name={name!r} (its step is not linear in the learning rate); "
                      f"use cosine, warmup_cosine or step")
  manifold = section.get("manifold")
  if isinstance(manifold, dict) and manifold.get("name", "").lower() != group:
    raise ConfigError(f"{key}.manifold.name={manifold.get('name')!r}: the group's parameters "
                      f"are {group}; use {group.capitalize()!r}")
  if group not in entry.manifolds:
    only = "/".join(m.capitalize() for m in entry.manifolds)
    serving = [e.name for e in oj.optim.OPTIMIZER_TABLE if group in e.manifolds]
    raise ConfigError(f"{key}.name={name!r}: {only}-only; the group's parameters are "
                      f"{group}: use {_one_of(serving)}")


def _one_of(names: list[str]) -> str:
  """``a, b or c``."""
  return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
