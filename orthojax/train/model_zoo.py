"""Build the model ``config.model`` names, shaped for the dataset it trains on.

``config.model`` is a registry section (:mod:`orthojax.train.registry`): its ``name`` is a
constructor of :mod:`orthojax.models` (or ``Sequential`` of layer sections) and its other
keys are that constructor's keywords, unchanged. This module supplies what the data
decides — input and output sizes, ``dtype``, ``rngs`` — and flattens images for the
fully connected models.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import orthojax as oj
from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


class Flatten(nnx.Module):
  """``model(scale · x.reshape(batch, -1))`` — for the models whose ``INPUT`` is ``"flat"``.

  ``scale`` (a constant, not trained) is the model's ``input_scale`` where it has one
  (:attr:`orthojax.models.DeepMLP.input_scale`, the critical input scale), else 1.
  """

  def __init__(self, model: nnx.Module, scale: float = 1.0):
    self.model = model
    self.scale = float(scale)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jnp.reshape(x, (x.shape[0], -1))
    return self.model(x * self.scale if self.scale != 1.0 else x)


def _outputs(info: Any) -> int:
  return info.num_classes if info.task == "classification" else 1


def compute_dtype(config: Config) -> Any:
  """The jnp dtype of ``config.compute_dtype``."""
  return jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32


def input_kind(name: str) -> str | None:
  """How the model ``name`` takes data, from its ``INPUT`` attribute: ``"flat"``,
  ``"sequence"``, ``"tokens"`` or ``"image"`` (None: a ``Sequential`` model, which sizes
  itself)."""
  _, fn = registry.resolve_name("model", {"name": name}, "config.model")
  return None if fn is nnx.Sequential else getattr(fn, "INPUT", "image")


def build(config: Config, info: Any, rngs: nnx.Rngs) -> nnx.Module:
  """The model of ``config.model`` on a dataset described by ``info`` (a ``DatasetInfo``).

  With ``config.compute_dtype='bfloat16'`` every layer is built with
  ``dtype=bfloat16``. Casting the parameters and inputs (as the train step
  also does) is not enough on its own: a normalisation layer left at
  ``dtype=None`` promotes its output with its float32 batch statistics, so
  every layer after the first BatchNorm would silently run in float32.

  Raises:
    ConfigError: one line naming the ``config.model`` key.
  """
  section = dict(config.model)
  kind = input_kind(section.get("name"))
  out = _outputs(info)
  supplied = {"rngs": rngs, "num_classes": out, "out_features": out,
              "dtype": None if config.compute_dtype == "float32" else compute_dtype(config)}
  if kind == "flat":
    supplied["in_features"] = math.prod(info.input_shape)
  elif kind == "sequence":
    if len(info.input_shape) != 2:
      raise ConfigError(f"config.model.name={section['name']!r} needs sequence inputs (time, "
                        f"features); the dataset gives {info.input_shape}: e.g. "
                        f"config.data={{'name': 'mnist', 'view': 'row'}}")
    supplied["input_size"] = info.input_shape[-1]
  elif kind == "tokens":
    if len(info.input_shape) != 1:
      raise ConfigError(f"config.model.name={section['name']!r} needs token windows "
                        f"(context,); the dataset gives {info.input_shape}: e.g. "
                        f"config.data={{'name': 'shakespeare', 'context': 256}}")
    vocab = section.get("vocab_size")
    if vocab is not None and vocab < info.num_classes:
      raise ConfigError(f"config.model.vocab_size={vocab}: the data has {info.num_classes} "
                        f"tokens; leave it out (the data's) or give at least that many")
    supplied["vocab_size"] = info.num_classes
  elif kind == "image":
    supplied["in_features"] = info.input_shape[-1]    # image channels
  model = registry.build("model", section, "config.model",
                         registry.Supplied(supplied, owned=("rngs",)))
  if kind != "flat":
    return model
  try:
    scale = getattr(model, "input_scale", 1.0)
  except ValueError as e:
    raise ConfigError(f"config.model.q_star={section.get('q_star')!r}: {e}") from None
  return Flatten(model, scale)


def views_by_path(tree: Any) -> dict[Any, Any]:
  """``{key path: matrix view}`` of :func:`orthojax.nn.matrix_views` (a view, None: infer,
  False: not a matrix), keyed as ``jax.tree_util.tree_flatten_with_path`` keys the pure
  params of the same model."""
  is_view = lambda v: v is None or v is False or oj.linalg.is_view(v)
  views = oj.nn.matrix_views(tree)
  if isinstance(views, nnx.State):
    views = views.to_pure_dict()
  return dict(jax.tree_util.tree_flatten_with_path(views, is_leaf=is_view)[0])


def axes_by_path(tree: Any) -> dict[Any, tuple[str | None, ...]]:
  """``{key path: logical axis names}`` the Variables of ``tree`` record
  (:mod:`orthojax.nn.sharding`), keyed as :func:`views_by_path`; a Variable that records
  none has no entry."""
  recorded = {}
  for path, v in jax.tree_util.tree_flatten_with_path(
      nnx.state(tree, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
    names = v.get_metadata().get("out_sharding")
    if names is not None:
      recorded[path] = tuple(names)
  return recorded


def penalty_mask(model: nnx.Module, params: Any) -> Any:
  """Which params a soft-orthogonality penalty acts on.

  Those the model's ``PENALIZED`` attribute names (:attr:`orthojax.models.SequenceRNN.PENALIZED`:
  the recurrent kernel only); without one, every leaf of rank ≥ 2 that is a matrix — not
  those whose metadata says otherwise (``matrix_view=False``: GmP's angles, stacked
  biases and scales; :func:`orthojax.nn.matrix_views`).
  """
  names = getattr(model, "PENALIZED", None)
  if names is not None:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: any(f"'{n}'" in jax.tree_util.keystr(path) for n in names), params)
  views = views_by_path(model)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: len(x.shape) >= 2 and views.get(path) is not False, params)
