"""The Flax ImageNet example's ResNet recipe, written as a throughput baseline.

The throughput suite's target is orthojax's ResNet-50 training step at least
as fast as the Flax ImageNet example's recipe on the same device and batch.
This module rebuilds that recipe from its published description (our
own code; nothing is copied) so both run side by side in one process:

* model: Linen ResNet v1.5 (stride on the 3×3 conv of a bottleneck), convs
  without bias, ``BatchNorm(momentum=0.9, epsilon=1e-5)`` with the last BN
  scale of each residual branch initialised to zero, a 7×7/2 stem and a
  3×3/2 max pool, global average pooling and a Dense classifier; every layer
  computes in ``dtype`` (bfloat16 for "half precision"), parameters and
  BatchNorm statistics stay float32, logits are cast back to float32;
* loss: softmax cross-entropy on one-hot labels plus
  ``weight_decay / 2 · Σ ‖w‖²`` over the parameters with ≥ 2 axes
  (weight_decay 1e-4);
* optimizer: SGD with Nesterov momentum 0.9 and a warmup + cosine schedule;
* step: one jitted function returning the new parameters, BatchNorm
  statistics and optimizer state, with loss and accuracy as metrics.

Reference: the Flax ImageNet example (``examples/imagenet`` in
github.com/google/flax), and K. He et al., "Deep Residual Learning for Image
Recognition", CVPR 2016 (the architecture).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

STAGES = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _add_shortcut(x, y, strides, conv, norm):
  """``ReLU(shortcut(x) + y)``; a 1×1 conv + BN projection where the shapes differ."""
  if x.shape != y.shape:
    x = norm()(conv(y.shape[-1], (1, 1), strides)(x))
  return nn.relu(x + y)


class _Block(nn.Module):
  """Fields shared by both residual blocks."""
  filters: int
  strides: int
  conv: Any
  norm: Any


class _Basic(_Block):

  @nn.compact
  def __call__(self, x):
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(x)))
    y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters, (3, 3))(y))
    return _add_shortcut(x, y, self.strides, self.conv, self.norm)


class _Bottleneck(_Block):

  @nn.compact
  def __call__(self, x):
    y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
    y = self.norm(scale_init=nn.initializers.zeros)(self.conv(4 * self.filters, (1, 1))(y))
    return _add_shortcut(x, y, self.strides, self.conv, self.norm)


class ResNet(nn.Module):
  """Linen ResNet-18/34/50/101 as in the Flax ImageNet example."""

  stages: Sequence[int]
  bottleneck: bool
  num_classes: int = 1000
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype, padding="SAME")
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, dtype=self.dtype)
    x = conv(64, (7, 7), (2, 2), padding=[(3, 3), (3, 3)])(x)
    x = nn.relu(norm()(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    block = _Bottleneck if self.bottleneck else _Basic
    for i, count in enumerate(self.stages):
      for j in range(count):
        strides = 2 if i > 0 and j == 0 else 1
        x = block(64 * 2 ** i, strides, conv, norm)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
    return x.astype(jnp.float32)


def resnet(depth: int, num_classes: int = 1000, dtype: Any = jnp.bfloat16) -> ResNet:
  if depth not in STAGES:
    raise ValueError(f"depth must be one of {sorted(STAGES)}, got {depth}")
  return ResNet(STAGES[depth], bottleneck=depth >= 50, num_classes=num_classes, dtype=dtype)


def optimizer(batch_size: int, steps_per_epoch: int = 5004, num_epochs: int = 100,
              warmup_epochs: int = 5) -> optax.GradientTransformation:
  """Nesterov SGD, base lr 0.1 per 256 images, linear warmup then cosine decay."""
  peak = 0.1 * batch_size / 256
  lr = optax.warmup_cosine_decay_schedule(0.0, peak, warmup_epochs * steps_per_epoch,
                                          num_epochs * steps_per_epoch)
  return optax.sgd(lr, momentum=0.9, nesterov=True)


def init(model: ResNet, tx: optax.GradientTransformation, image_size: int,
         seed: int = 0) -> tuple[Any, Any, Any]:
  """``(params, batch_stats, opt_state)``."""
  x = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = jax.jit(functools.partial(model.init, train=False))(jax.random.key(seed), x)
  return variables["params"], variables["batch_stats"], tx.init(variables["params"])


def make_train_step(model: ResNet, tx: optax.GradientTransformation, weight_decay: float = 1e-4):
  """``(params, batch_stats, opt_state, x, y) -> (params, batch_stats, opt_state, metrics)``."""

  def step(params, batch_stats, opt_state, x, y):
    def loss_fn(params):
      logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                    train=True, mutable=["batch_stats"])
      one_hot = jax.nn.one_hot(y, logits.shape[-1])
      loss = jnp.mean(optax.softmax_cross_entropy(logits, one_hot))
      l2 = sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params) if p.ndim > 1)
      return loss + 0.5 * weight_decay * l2, (logits, updates["batch_stats"])

    (loss, (logits, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}
    return params, new_stats, opt_state, metrics

  return step
