"""Which config keys a resumed run may change, and the comparison that refuses the others.

A run that resumes from a checkpoint compares the config it was started with (recorded in
the checkpoint's metadata) with today's: :func:`resume_differences` lists every key that
changed and is not in :data:`RESUMABLE_KEYS`. Sections are compared with their
constructors' defaults filled in (:func:`orthojax.train.registry.with_defaults`), so a
section that spells out a default equals one that leaves it out. A recorded config in
another layout than today's cannot be compared key by key: :func:`earlier_layout` names
what gives it away, and the trainer refuses to resume it (a new workdir starts afresh).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from typing import Any, Iterable, Mapping

from orthojax.train import data as data_lib
from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import GROUPS
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
LENGTH_KEYS = ("num_steps", "num_epochs")
"""Keys a resumed run may also change under a constant or plateau schedule (one that does
not depend on the run's total length)."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A config as the comparison reads it, by dotted key: ``{"a": {"b": 1}}`` →
  ``{"a.b": 1}`` (sections of sections too)."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def earlier_layout(saved: Mapping[str, Any]) -> str | None:
  """What marks ``saved`` (a checkpoint's recorded config) as another layout than today's,
  or None when it is today's.

  Today's layout has exactly :class:`~orthojax.train.Config`'s keys (a zoo run may add
  its data's ``data_checksum``), every section a dict, and the optimizer split into
  parameter groups (``euclidean``, ``stiefel``, ``oblique``; a :func:`~orthojax.train.fit`
  run's description). Returns e.g. ``"config.spectrum_every is not a key"``,
  ``"no config.hooks"`` or ``"config.model is not a section"``.
  """
  keys = {f.name for f in dataclasses.fields(Config)}
  extra = sorted(set(saved) - keys - {"data_checksum"})
  if extra:
    return f"config.{extra[0]} is not a key"
  missing = sorted(keys - set(saved))
  if missing:
    return f"no config.{missing[0]}"
  for section in ("model", "data", "optimizer", "mesh", "checkpoint", "hooks"):
    if not isinstance(saved[section], Mapping):
      return f"config.{section} is not a section"
  groups = sorted(set(saved["optimizer"]) - set(GROUPS) - {FIT})
  if groups:
    return f"config.optimizer.{groups[0]} is not a parameter group"
  return None


def resume_differences(saved: Mapping[str, Any], config: Config,
                       recorded: Mapping[str, Any] | None = None, *,
                       allowed: Iterable[str] | None = None,
                       against: str = "checkpoint") -> list[str]:
  """``config.key=value (checkpoint: value)`` for each key that may not change on resume.

  ``saved``: the checkpoint's recorded config, in today's layout (:func:`earlier_layout`
  is None). ``recorded``: what the run trains when it is not all in ``config`` (a
  :func:`orthojax.train.fit` run: its model and optimizer objects, described by
  :mod:`orthojax.train.fingerprint`); default ``config.to_dict()``. ``allowed``: the keys
  that may differ, ``fnmatch`` patterns (default :data:`RESUMABLE_KEYS`, with
  :data:`LENGTH_KEYS` under a constant or plateau schedule); ``against``: what ``saved``
  is called in the lines (a finished run's record is compared the same way).
  """
  recorded = config.to_dict() if recorded is None else dict(recorded)
  now, then = flatten(_with_defaults(recorded)), flatten(_with_defaults(dict(saved)))
  if allowed is None:
    allowed = RESUMABLE_KEYS + (LENGTH_KEYS if config.schedule in ("constant", "plateau")
                                else ())
  allowed = tuple(allowed)
  keys = sorted(set(now) | set(then))
  return [f"config.{k}={now.get(k)!r} ({against}: {then.get(k)!r})" for k in keys
          if now.get(k) != then.get(k)
          and not any(fnmatch.fnmatchcase(k, pattern) for pattern in allowed)]


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
