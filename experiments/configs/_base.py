"""What every config file builds on: the trainer's keys and constructor sections.

:func:`trainer` is a ConfigDict with every key of :class:`orthojax.train.Config` at its
default (``workdir`` comes from ``--workdir``), so ``--config.<key>=value`` can override
any of them. :func:`section` is a registry section with *every* keyword its constructor
takes, at the constructor's default unless given — so ``--config.optimizer.euclidean.b2=0.99``
or ``--config.optimizer.stiefel.manifold.retraction=cayley`` works for any optimizer,
manifold or model a file names (and ``--config.SECTION.name=…`` switches a section to
another constructor, :mod:`orthojax.train.overrides`). Keywords the trainer supplies (``rngs``, ``dtype``, the data's input
and output sizes, ``views``, ``mask``) are left out, as are those whose default is a
function (``kernel_init``: name one in the file, e.g. ``{"name": "orthogonal"}``).
"""

from __future__ import annotations

import inspect
from typing import Any

from ml_collections import config_dict
import ml_collections

from orthojax.train import Config
from orthojax.train import data as data_lib
from orthojax.train import registry

SUPPLIED = registry.SUPPLIED_KEYWORDS
# A keyword defaulting to None takes this type from the command line, by its annotation
# ("Any": a name such as precision="highest" or a dtype "bfloat16"; an optax
# "ScalarOrSchedule": a constant rate).
_PLACEHOLDERS = (("ScalarOrSchedule", float), ("int", int), ("float", float), ("str", str), ("bool", bool), ("Any", str))


def trainer(**keys: Any) -> ml_collections.ConfigDict:
  """Every trainer key at its default, then ``keys``."""
  tree = Config().to_dict()
  del tree["workdir"]
  tree["penalty"] = None   # an optional section: absent until set
  tree.update(keys)
  config = ml_collections.ConfigDict(tree)
  return config


def _default(param: inspect.Parameter) -> Any:
  """The keyword's default as a config value, or ``...`` to leave the keyword out."""
  default = param.default
  if default is None:
    for word, type_ in _PLACEHOLDERS:
      if word in str(param.annotation).replace("None", ""):
        return config_dict.placeholder(type_)
    return ...
  if isinstance(default, (bool, int, float, str)):
    return default
  if isinstance(default, tuple) and all(isinstance(v, (int, float, str)) for v in default):
    return default
  return ...


def section(kind: str, name: str, **keywords: Any) -> dict[str, Any]:
  """``{"name": name, <every keyword at its default>, **keywords}`` for registry ``kind``."""
  _, fn = registry.resolve_name(kind, {"name": name}, f"config.{kind}")
  out: dict[str, Any] = {"name": name}
  for key, param in registry.keywords(fn).items():
    if key in SUPPLIED or key in keywords:
      continue
    value = _default(param)
    if value is not ...:
      out[key] = value
  out.update(keywords)
  return out


def data(name: str, **options: Any) -> dict[str, Any]:
  """A data section with every option of dataset ``name`` at its default (so each can
  be overridden from the command line), ``data_dir`` empty, then ``options``."""
  return {"name": name, "data_dir": "", **data_lib.default_options(name), **options}
