"""Command-line overrides of a nested config, with sections that switch constructor by name.

``--config.KEY=VALUE`` arguments are applied in order, each to the tree the
previous ones left (:func:`apply_all`):

* **A key the config has** takes the value, parsed as that key's current type:
  ``true`` / ``false`` for a bool, an int, a float, a string as typed, a
  Python literal for a tuple or list (a bare word becomes a one-element
  tuple), and ``none`` clears an optional section.
* **Naming a constructor** — ``--config.optimizer.stiefel.name=cayley_adam`` on a
  registry section (:data:`SECTIONS`: ``model``, each group of ``optimizer``
  (``optimizer.euclidean``, ``.stiefel``, ``.oblique``), ``penalty``, and nested
  ``manifold``, ``kernel_init``, ``bias_init``, ``scale_init``, ``optimizer`` sections) —
  refills the section: the new constructor's keywords at their defaults, and
  the keys the file set (those not at the old constructor's default) where the new
  constructor takes them. A keyword the old constructor takes too but the file left
  out of the section stays out (an experiment sets it per run; left out, it builds
  with its default all the same). Later
  overrides then set its keywords. Keywords whose default is None or not a
  plain value (a function, an object) are left out; the trainer supplies
  what only it knows (``rngs``, the model's ``views``, …).
* **Naming a data set** — ``--config.data.name=tfds_text`` — is the same rule: the
  data section is refilled with that set's options
  (``orthojax.train.data.default_options``) and ``data_dir``, keeping the keys the
  file set where the new set takes them; ``--config.data.tfds_name=…`` then sets one.
* **Creating a section**: a section that is None or absent in the file is
  created by naming its constructor (``--config.optimizer.oblique.name=radam``);
  a section with one constructor (``penalty``) also by setting one of its
  keywords (``--config.penalty.kind=so --config.penalty.strength=1e-3``).
* **A keyword a section leaves out** (``--config.optimizer.euclidean.nesterov=true`` on
  a section without it) is added when the section's constructor takes it.

Anything else is one line naming the override and what would be right
(:class:`~orthojax.train.config.ConfigError`). ml_collections' own override
parser (``config_flags``) sets existing keys only and cannot change a
section's constructor or create a section that is None in the file, hence this
module; the value syntax is the same.
"""

from __future__ import annotations

import ast
import copy
import difflib
from typing import Any, Mapping, MutableMapping, Sequence

from orthojax.train import data
from orthojax.train import registry
from orthojax.train.config import GROUPS
from orthojax.train.config import renamed
from orthojax.train.config import ConfigError

SECTIONS = {"model": "model", "data": "data", "penalty": "penalty",
            **{f"optimizer.{group}": "optimizer" for group in GROUPS}}
"""Sections by their dotted key, and the registry each names from (``data``: the data
sets of ``orthojax.train.data.DATASETS``). A nested key named after a registry
(``manifold``, ``kernel_init``, …) is one too."""

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_VALUES = (bool, int, float, str)   # defaults a refilled section takes
_PLAIN = _VALUES + (type(None),)    # defaults a config can hold


def split(argument: str) -> tuple[str, str]:
  """``"--config.a.b=value"`` → ``("a.b", "value")``; ``--noconfig.a.b`` sets false."""
  body = argument.lstrip("-")
  if body.startswith("noconfig.") and "=" not in body:
    return body[len("noconfig."):], "false"
  if not body.startswith("config.") or "=" not in body:
    raise ConfigError(f"{argument}: an override is --config.KEY=VALUE")
  key, value = body[len("config."):].split("=", 1)
  return key, value


def is_override(argument: str) -> bool:
  """Whether a command-line argument is a ``--config.KEY=VALUE`` override."""
  return argument.startswith(("--config.", "-config.", "--noconfig.", "-noconfig."))


def apply_all(tree: Mapping[str, Any], arguments: Sequence[str]) -> dict[str, Any]:
  """A copy of ``tree`` with each ``--config.KEY=VALUE`` of ``arguments`` applied in order.

  Raises:
    ConfigError: one line naming the override (``--config.a.b=value: …``).
  """
  out = copy.deepcopy(dict(tree))
  for argument in arguments:
    key, text = split(argument)
    try:
      apply(out, key, text)
    except ConfigError as e:
      raise ConfigError(f"--config.{key}={text}: {e}") from None
  return out


def apply(tree: MutableMapping[str, Any], key: str, text: str) -> None:
  """Set ``tree``'s dotted ``key`` from the command-line text ``text`` (module docstring).

  Raises:
    ConfigError: why the key cannot be set, without the override (``apply_all`` adds it).
  """
  path = key.split(".")
  if not all(path):
    raise ConfigError("an empty key; keys are dotted names, e.g. batch_size")
  if renamed(key):
    raise ConfigError(f"cannot set it ({renamed(key)})")
  if path[0] == "optimizer" and len(path) > 1 and path[1] not in GROUPS:
    raise ConfigError(f"cannot set it (the optimizer is per parameter group: "
                      f"config.optimizer.euclidean.{'.'.join(path[1:])}, or .stiefel / "
                      f".oblique for manifold parameters)")
  parent = _parent(tree, path, creating=path[-1] == "name")
  last = path[-1]
  kind = _kind(path[:-1])
  if kind is not None and last == "name":
    _refill(parent, kind, text, "config." + ".".join(path[:-1]))
  elif last in parent:
    parent[last] = _parse(parent[last], text, last)
  elif kind is not None:
    name = parent.get("name", registry.DEFAULT_NAMES.get(kind))
    accepted = _keys(kind, name, "config." + ".".join(path[:-1]))
    if last not in accepted:
      noun = "option" if kind == "data" else "keyword"
      settable = [k for k in accepted if k not in registry.SUPPLIED_KEYWORDS]
      raise ConfigError(f"cannot set it ({name} takes no {noun} {last!r}; its {noun}s are "
                        f"{', '.join(settable)})")
    parent[last] = _parse(accepted[last], text, last)
  else:
    raise ConfigError(_no_such_key(parent, last))


def _names(kind: str) -> list[str]:
  """The names a section of ``kind`` may give."""
  return sorted(data.DATASETS if kind == "data" else registry.REGISTRIES[kind])


def _keys(kind: str, name: str | None, key: str) -> dict[str, Any]:
  """The keys a ``kind`` section naming ``name`` may hold, in order, each with its default
  (``inspect.Parameter.empty`` where there is none): a constructor's keywords, or a data
  set's options and ``data_dir``.

  Raises:
    ConfigError: ``name`` is missing or unknown (the message lists the choices).
  """
  if kind != "data":
    _, fn = registry.resolve_name(kind, {} if name is None else {"name": name}, key)
    return {k: p.default for k, p in registry.keywords(fn).items()}
  if name not in data.DATASETS:
    state = "missing" if name is None else f"{name!r}: unknown"
    raise ConfigError(f"{key}.name{'' if name is None else '='}{state}; choose one of "
                      f"{', '.join(_names(kind))}")
  return {"data_dir": "", **data.default_options(name)}


def _kind(path: Sequence[str]) -> str | None:
  """The registry a section at ``path`` names from, or None for a plain section."""
  if not path:
    return None
  if ".".join(path) in SECTIONS:
    return SECTIONS[".".join(path)]
  if len(path) > 2 or (len(path) == 2 and path[0] != "optimizer"):
    return path[-1] if path[-1] in registry.REGISTRIES and path[-1] != "layers" else None
  return None


def _parent(tree: MutableMapping[str, Any], path: Sequence[str], creating: bool
            ) -> MutableMapping[str, Any]:
  """The section holding ``path[-1]``; a None or absent registry section on the way is
  created when the override names its constructor or the section has only one."""
  node = tree
  for depth, part in enumerate(path[:-1]):
    here = path[:depth + 1]
    value = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(value, Mapping):
      node = value
      continue
    kind = _kind(here)
    dotted = "config." + ".".join(here)
    if part in node and value is not None:
      raise ConfigError(f"cannot set it ({dotted} is {value!r}, not a section)")
    if kind is None:
      raise ConfigError(_no_such_key(node, part) if part not in node else
                        f"cannot set it ({dotted} is None in the config file)")
    naming = creating and depth == len(path) - 2
    default = registry.DEFAULT_NAMES.get(kind)
    if not naming and default is None:
      names = _names(kind)
      choices = (f"one of {', '.join(names)}" if len(names) <= 12 else
                 f"from the {len(names)} that --config_help lists")
      raise ConfigError(f"cannot set it ({dotted} is not in the config; name its constructor "
                        f"first: --{dotted}.name=NAME, NAME {choices})")
    node[part] = {} if naming else _filled(kind, default, {})
    node = node[part]
  return node


def _filled(kind: str, name: str, old: Mapping[str, Any],
            left_out: Sequence[str] = ()) -> dict[str, Any]:
  """``name``'s section, keys in its signature's (options') order: ``old``'s value where
  ``name`` takes the key, else the plain non-None default unless the key is ``left_out``."""
  out = {"name": name}
  for k, default in _keys(kind, name, f"config.{kind}").items():
    if k in old:
      out[k] = old[k]
    elif (isinstance(default, _VALUES) and k not in registry.SUPPLIED_KEYWORDS
          and k not in left_out):
      out[k] = default
  return out


def _refill(section: MutableMapping[str, Any], kind: str, name: str, key: str) -> None:
  """Switch ``section`` to constructor ``name``. The keys that carry over are those the
  file set: a key at the old constructor's own default (a config file writes every
  keyword out) gives way to the new constructor's default. A key the old constructor
  takes but the section leaves out was left out on purpose (E8 sets ``data.eval_split``
  per run and refuses it in the config): it is not added back."""
  _keys(kind, name, key)   # unknown: the list of choices
  old, left_out = dict(section), []
  if "name" in old:
    try:
      unset = _keys(kind, old["name"], key)
    except ConfigError:   # the file's own name is unknown: keep all it set
      unset = {}
    left_out = [k for k in unset if k not in old]
    old = {k: v for k, v in old.items() if k == "name" or k not in unset
           or not isinstance(unset[k], _PLAIN) or unset[k] != v}
  section.clear()
  section.update(_filled(kind, name, old, left_out))


def _parse(current: Any, text: str, key: str) -> Any:
  """``text`` as a value of ``current``'s type (a literal where there is none)."""
  if isinstance(current, bool):
    if text.lower() in _TRUE:
      return True
    if text.lower() in _FALSE:
      return False
    raise ConfigError(f"cannot set it ({key} is a bool: true or false)")
  if isinstance(current, int):
    try:
      return int(text)
    except ValueError:
      raise ConfigError(f"cannot set it ({key} is an integer)") from None
  if isinstance(current, float):
    try:
      return float(text)
    except ValueError:
      raise ConfigError(f"cannot set it ({key} is a number)") from None
  if isinstance(current, str):
    return text
  if isinstance(current, Mapping):
    if text.lower() == "none":
      return None
    raise ConfigError(f"cannot set it ({key} is a section: set its keys, "
                      f"--config.…{key}.KEY=VALUE, or none to clear it)")
  value = _literal(text)
  if isinstance(current, (tuple, list)):
    if not isinstance(value, (tuple, list)):
      value = (value,)
    return type(current)(value)
  return value


def _literal(text: str) -> Any:
  """A Python literal (``1e-3``, ``(0.5, 0.75)``, ``None``), ``none`` as None, else the text."""
  if text.lower() == "none":
    return None
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _no_such_key(section: Mapping[str, Any], key: str) -> str:
  hint = difflib.get_close_matches(key, [str(k) for k in section], n=1)
  return ("cannot set it (the config has no such key" +
          (f"; did you mean {hint[0]!r}?)" if hint else ")"))
