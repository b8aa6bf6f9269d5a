"""Build the model a :class:`Config` names, shaped for the dataset it trains on.

The one place that maps flags (``--model``, ``--variant``, ``--depth``, …) to
:mod:`orthojax.models` constructors; models themselves know nothing of flags.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from orthojax import models
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
  """The jnp dtype of ``--compute_dtype``."""
  return jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32


def build(config: Config, info: Any, rngs: nnx.Rngs) -> nnx.Module:
  """The model for ``config`` on a dataset described by ``info`` (a ``DatasetInfo``).

  With ``--compute_dtype=bfloat16`` every layer is built with
  ``dtype=bfloat16``. Casting the parameters and inputs (as the train step
  also does) is not enough on its own: a normalisation layer left at
  ``dtype=None`` promotes its output with its float32 batch statistics, so
  every layer after the first BatchNorm would silently run in float32.
  """
  name, variant = config.model, config.variant
  dtype = None if config.compute_dtype == "float32" else compute_dtype(config)
  out = _outputs(info)
  features = math.prod(info.input_shape)
  if name.startswith("resnet"):
    variant = variant if variant != "sp" else "bn"
    if variant not in models.ResNet.NORMS:
      raise ConfigError(f"--variant={variant}: ResNet norms are {', '.join(models.ResNet.NORMS)}")
    return models.ResNet(depth=int(name[len("resnet"):]), norm=variant, num_classes=out,
                         dtype=dtype, rngs=rngs)
  if name == "vgg6":
    return models.VGG6(variant=variant, num_classes=out, dtype=dtype, rngs=rngs)
  if name == "mlp":
    return Flatten(models.MLP(features, hidden=config.width or 100, out_features=out,
                              variant=variant, activation=config.activation or "relu",
                              dtype=dtype, rngs=rngs))
  if name == "deep_mlp":
    if not config.depth or not config.width:
      raise ConfigError("--depth/--width: --model=deep_mlp needs both (e.g. 200 and 400)")
    mlp = models.DeepMLP(
        features, depth=config.depth, width=config.width, out_features=out,
        activation=config.activation or "tanh", q_star=config.q_star or None,
        init=config.init or "gaussian", weights=config.weights, dtype=dtype,
        rngs=rngs)
    scale = (critical_input_scale(config.q_star, mlp.sigma_w, mlp.sigma_b) if config.q_star
             else 1.0)
    return Flatten(mlp, scale)
  if name == "deep_linear":
    if not config.depth or not config.width:
      raise ConfigError("--depth/--width: --model=deep_linear needs both")
    return Flatten(models.DeepLinear(depth=config.depth, width=config.width,
                                     in_features=features, out_features=out,
                                     init=config.init or "gaussian", scale=config.gain,
                                     dtype=dtype, rngs=rngs))
  if name == "rnn":
    if len(info.input_shape) != 2:
      raise ConfigError(f"--model=rnn needs sequence inputs (time, features), the dataset "
                        f"gives {info.input_shape}; e.g. --dataset=mnist "
                        f"--dataset_options=view=row")
    recurrent_init = variant if variant != "sp" else "glorot"
    return models.SequenceRNN(info.input_shape[-1], hidden=config.width or 64, num_classes=out,
                              recurrent_init=recurrent_init, gain=config.gain,
                              recurrent="stiefel" if config.weights == "stiefel" else "euclidean",
                              dtype=dtype, rngs=rngs)
  raise ConfigError(f"--model={name}: unknown")


def penalty_mask(config: Config, model: nnx.Module, params: Any) -> Any:
  """Which params a soft-orthogonality penalty acts on.

  The RNN experiments (E6) regularise the recurrent kernel only; elsewhere
  every matrix-view leaf (rank ≥ 2) except GmP angles ``theta``, which are
  coordinates, not a matrix.
  """
  if config.model == "rnn":
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "recurrent_kernel" in jax.tree_util.keystr(path), params)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: len(x.shape) >= 2 and "'theta'" not in jax.tree_util.keystr(path), params)
