"""Argument checks shared by the orthojax layers, initializers, models and diagnostics."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def check_choice(value: Any, choices: Sequence[Any], argname: str, *, where: str | None = None,
                 also: str | None = None) -> Any:
  """``value`` if it is one of ``choices``; otherwise a ValueError that names all three.

  The one message format of every "pick a name" argument in orthojax::

    [where: ]unknown <argname>=<value!r>; valid: [<choices>][ or <also>]

  Example::

    >>> check_choice("qr", ("cayley", "expm"), "parametrization", where="OrthogonalDense")
    Traceback (most recent call last):
      ...
    ValueError: OrthogonalDense: unknown parametrization='qr'; valid: ['cayley', 'expm']

  Args:
    value: the argument as given.
    choices: the valid values (names, or e.g. ResNet depths).
    argname: the argument's name, as the caller spells it.
    where: the function or class that takes it, to prefix the message.
    also: what else the argument accepts besides ``choices`` (e.g. "a callable").

  Returns:
    ``value``, unchanged.

  Raises:
    ValueError: ``value`` is not one of ``choices``.
  """
  try:
    valid = value in choices
  except (TypeError, ValueError):  # e.g. an array, whose == is elementwise
    valid = False
  if not valid:
    prefix = f"{where}: " if where else ""
    suffix = f" or {also}" if also else ""
    raise ValueError(f"{prefix}unknown {argname}={value!r}; valid: {list(choices)}{suffix}")
  return value


def check_positive_int(value: Any, argname: str, *, where: str | None = None) -> int:
  """``value`` as an int if it is a positive integer (not a bool); otherwise a ValueError
  naming the argument (``[where: ]<argname> must be a positive integer, got <value!r>``)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
    prefix = f"{where}: " if where else ""
    raise ValueError(f"{prefix}{argname} must be a positive integer, got {value!r}")
  return int(value)
