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

from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


class Flatten(nnx.Module):
  """``model(scale · x.reshape(batch, -1))`` — for MLP-type models on image data.

  ``scale`` (a constant, not trained) is :func:`critical_input_scale` for the
  critical deep MLP, 1 otherwise.
  """

  def __init__(self, model: nnx.Module, scale: float = 1.0):
    self.model = model
    self.scale = float(scale)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jnp.reshape(x, (x.shape[0], -1))
    return self.model(x * self.scale if self.scale != 1.0 else x)


def critical_input_scale(q_star: float, sigma_w: float, sigma_b: float) -> float:
  r"""``c = √(q* − σ_b²) / σ_w``: standardised inputs times ``c`` start at the fixed point.

  The first pre-activation ``h¹ = c·x W⁰ + b⁰`` has variance
  ``σ_w² c² E[x²] + σ_b²``, which is ``q*`` for inputs of unit mean square
  (every dataset here is standardised) — the input normalisation of
  Pennington et al. (2017) and Sokol & Park (2020), so the network is at its
  fixed point from the first layer on rather than converging to it.
  """
  if not q_star > sigma_b ** 2:
    raise ValueError(f"critical_input_scale: q*={q_star} must exceed sigma_b^2={sigma_b ** 2}")
  return math.sqrt(q_star - sigma_b ** 2) / sigma_w


def _outputs(info: Any) -> int:
  return info.num_classes if info.task == "classification" else 1


def compute_dtype(config: Config) -> Any:
  """The jnp dtype of ``config.compute_dtype``."""
  return jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32


FLAT_INPUT_MODELS = ("MLP", "DeepMLP", "DeepLinear")
"""Fully connected models: images reach them flattened (:class:`Flatten`)."""


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
  name = section["name"]
  out = _outputs(info)
  supplied = {"rngs": rngs, "num_classes": out, "out_features": out,
              "dtype": None if config.compute_dtype == "float32" else compute_dtype(config)}
  if name in FLAT_INPUT_MODELS:
    supplied["in_features"] = math.prod(info.input_shape)
  elif name == "SequenceRNN":
    if len(info.input_shape) != 2:
      raise ConfigError(f"config.model.name='SequenceRNN' needs sequence inputs (time, "
                        f"features); the dataset gives {info.input_shape}: e.g. "
                        f"config.data={{'name': 'mnist', 'view': 'row'}}")
    supplied["input_size"] = info.input_shape[-1]
  elif name != "Sequential":
    supplied["in_features"] = info.input_shape[-1]    # image channels
  model = registry.build("model", section, "config.model",
                         registry.Supplied(supplied, owned=("rngs",)))
  if name not in FLAT_INPUT_MODELS:
    return model
  scale = 1.0
  if name == "DeepMLP" and section.get("q_star"):
    scale = critical_input_scale(section["q_star"], model.sigma_w, model.sigma_b)
  return Flatten(model, scale)


def penalty_mask(config: Config, model: nnx.Module, params: Any) -> Any:
  """Which params a soft-orthogonality penalty acts on.

  The RNN experiments (E6) regularise the recurrent kernel only; elsewhere
  every matrix-view leaf (rank ≥ 2) except GmP angles ``theta``, which are
  coordinates, not a matrix.
  """
  if config.model["name"] == "SequenceRNN":
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "recurrent_kernel" in jax.tree_util.keystr(path), params)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: len(x.shape) >= 2 and "'theta'" not in jax.tree_util.keystr(path), params)
