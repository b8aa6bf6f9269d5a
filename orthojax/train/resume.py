"""Which config keys a resumed run may change, and the comparison that refuses the others.

A run that resumes from a checkpoint compares the config it was started with (recorded in
the checkpoint's metadata) with today's: :func:`resume_differences` lists every key that
changed and is not in :data:`RESUMABLE_KEYS`. Sections are compared with their
constructors' defaults filled in (:func:`orthojax.train.registry.with_defaults`), so a
section that spells out a default equals one that leaves it out; a config recorded by an
earlier orthojax is brought to today's form first (:func:`migrate`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from orthojax.train import data as data_lib
from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import flatten
from orthojax.train.fingerprint import FIT

# Keys a resumed run may change: where and how often it logs, evaluates and saves, the
# devices and mesh it runs on (and whether its update is owner-sharded: checkpoints hold
# the replicated layout), how it guards against non-finite steps, micro-batching
# (the same update up to rounding), and how far it trains when the schedule does not
# depend on the total length. Every other key changes the run's mathematics and is
# refused on resume.
RESUMABLE_KEYS = ("workdir", "data.data_dir", "log_every", "eval_every", "checkpoint.every_steps",
                  "checkpoint.keep", "hooks.every_steps", "hooks.epochs", "final_eval_splits",
                  "eval_batch_size", "mesh.data", "mesh.fsdp", "mesh.model", "mesh.num_slices",
                  "mesh.shard_update", "mesh.split_above", "nan_policy", "max_skipped_fraction",
                  "grad_accum_steps")
LENGTH_KEYS = ("num_steps", "num_epochs")   # resumable with a constant or plateau schedule


def resume_differences(saved: dict[str, Any], config: Config,
                       recorded: Mapping[str, Any] | None = None) -> list[str]:
  """``config.key=value (checkpoint: value)`` for each key that may not change on resume.

  ``recorded``: what the run trains when it is not all in ``config`` (a
  :func:`orthojax.train.fit` run: its model and optimizer objects, described by
  :mod:`orthojax.train.fingerprint`); default ``config.to_dict()``. Keys the checkpoint
  does not record (written by an older orthojax) are not compared.
  """
  recorded = config.to_dict() if recorded is None else dict(recorded)
  now, then = flatten(_with_defaults(recorded)), flatten(_with_defaults(migrate(saved)))
  allowed = set(RESUMABLE_KEYS)
  if config.schedule in ("constant", "plateau"):
    allowed |= set(LENGTH_KEYS)
  if not isinstance(saved.get("model"), Mapping):
    return []   # a flat config of orthojax < 0.2: not comparable, not compared
  fit = lambda tree: isinstance(tree.get("model"), Mapping) and tree["model"].get("name") == FIT
  unrecorded = ()
  if fit(recorded) != fit(saved):   # a fit run saved before its objects were recorded
    unrecorded = ("model.", "optimizer.", "data.", "penalty")
  keys = sorted(set(now) | set(then))
  return [f"config.{k}={now.get(k)!r} (checkpoint: {then.get(k)!r})" for k in keys
          if k not in allowed and now.get(k) != then.get(k) and not k.startswith(unrecorded)]


def migrate(saved: Mapping[str, Any]) -> dict[str, Any]:
  """A recorded config of an earlier orthojax in today's form: its ``optimizer`` (and
  ``euclidean_optimizer``) as parameter groups, the manifold its trainer supplied written
  out, so that a run started before the groups resumes (its mathematics is the same)."""
  saved = dict(saved)
  if "spectrum_every" in saved:   # the hook schedule's key before config.hooks
    saved["hooks"] = {"every_steps": saved.pop("spectrum_every"), "epochs": []}
  optimizer = saved.get("optimizer")
  if not isinstance(optimizer, Mapping) or "name" not in optimizer:
    return saved
  euclidean = saved.pop("euclidean_optimizer", None)
  if euclidean is None:
    saved["optimizer"] = {"euclidean": dict(optimizer)}
    return saved
  model = saved.get("model")
  group = "oblique" if isinstance(model, Mapping) and model.get("weights") == "oblique" \
      else "stiefel"
  manifold_tx = dict(optimizer)
  fn = registry.OPTIMIZERS.get(manifold_tx["name"])
  if fn is not None and "manifold" in registry.keywords(fn) and "manifold" not in manifold_tx:
    manifold_tx["manifold"] = {"name": group.capitalize()}
  saved["optimizer"] = {"euclidean": dict(euclidean), group: manifold_tx}
  return saved


def _with_defaults(tree: dict[str, Any]) -> dict[str, Any]:
  """The registry sections with their constructors' defaults filled in, JSON-normalised."""
  tree = dict(tree)
  for key, kind in (("model", "model"), ("penalty", "penalty")):
    if isinstance(tree.get(key), Mapping):
      tree[key] = registry.with_defaults(kind, tree[key])
  if isinstance(tree.get("optimizer"), Mapping):
    tree["optimizer"] = {g: registry.with_defaults("optimizer", v) if isinstance(v, Mapping)
                         else v for g, v in tree["optimizer"].items()}
  data = tree.get("data")
  if isinstance(data, Mapping) and data.get("name") in data_lib.DATASETS:
    tree["data"] = {"data_dir": "", **data_lib.default_options(data["name"]), **data}
  return json.loads(json.dumps(tree, default=list))
