"""Losses and evaluation metrics (per-example, masked means done by the caller).

* ``cross_entropy`` — softmax cross-entropy with optional label smoothing
  ``ε``: targets ``(1 − ε)·onehot + ε/K`` (Szegedy et al. 2016), via
  ``optax.softmax_cross_entropy``.
* ``mse`` — ``Σ_j (f_j − y_j)²`` per example (summed over outputs, the
  convention the Fisher/NTK equivalence uses; one output: the squared error).
* ``mae`` — ``Σ_j |f_j − y_j|`` (the GmP code's UCI loss).
* ``topk_correct`` — 1 where the label is among the k largest logits.

Classification labels may carry trailing axes beyond the batch: a language
model's ``(batch, T)`` next-token labels with ``(batch, T, V)`` logits. The
per-example value is then the **mean over those axes** (mean token
cross-entropy in nats, fraction of tokens correct), so every loss and metric
stays ``(batch,)`` and the masked means of the trainer are token means
(every example has the same number of tokens).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

LOSSES = ("cross_entropy", "mse", "mae")


def _per_example(values: jax.Array) -> jax.Array:
  """``(batch, ...)`` -> ``(batch,)``: the mean over the trailing axes (if any)."""
  return values if values.ndim == 1 else jnp.mean(values.reshape(values.shape[0], -1), axis=-1)


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
  """Per-example softmax cross-entropy (nats).

  Args:
    logits: ``(batch, ..., K)``.
    labels: int ``(batch, ...)`` in ``[0, K)``.
    label_smoothing: ``ε`` of the smoothed targets.

  Returns:
    ``(batch,)``: the cross-entropy, averaged over the label's trailing axes.
  """
  logits = logits.astype(jnp.float32)
  if labels.ndim > 1 and not label_smoothing:
    # Integer labels: no (batch, T, V) one-hot (V = 50k at GPT-2 scale).
    return _per_example(optax.softmax_cross_entropy_with_integer_labels(
        logits, labels.astype(jnp.int32)))
  num_classes = logits.shape[-1]
  targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  return _per_example(optax.softmax_cross_entropy(logits, targets))


def _regression_residual(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  outputs = outputs.astype(jnp.float32)
  targets = jnp.reshape(targets, outputs.shape).astype(jnp.float32)
  return (outputs - targets).reshape(outputs.shape[0], -1)


def mse(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  return jnp.sum(jnp.square(_regression_residual(outputs, targets)), axis=-1)


def mae(outputs: jax.Array, targets: jax.Array) -> jax.Array:
  return jnp.sum(jnp.abs(_regression_residual(outputs, targets)), axis=-1)


def get_loss(name: str, label_smoothing: float = 0.0) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Per-example loss ``(outputs, targets) -> (batch,)`` by name."""
  if name == "cross_entropy":
    return lambda logits, labels: cross_entropy(logits, labels, label_smoothing)
  if label_smoothing:
    raise ValueError(f"--label_smoothing applies to cross_entropy only, not {name!r}")
  if name == "mse":
    return mse
  if name == "mae":
    return mae
  raise ValueError(f"unknown loss {name!r}; choose one of {LOSSES}")


def topk_correct(logits: jax.Array, labels: jax.Array, k: int) -> jax.Array:
  """Per example 1.0 where ``labels`` is among the top-``k`` logits (ties count).

  With labels ``(batch, ...)`` and logits ``(batch, ..., K)``: the fraction of
  the example's positions whose label is among its top ``k`` (``(batch,)``).
  """
  label_logit = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)
  higher = jnp.sum(logits > label_logit, axis=-1)
  return _per_example((higher < k).astype(jnp.float32))
