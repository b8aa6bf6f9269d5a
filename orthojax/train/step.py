"""The train state and the jitted train / eval steps (pure functions of arrays).

The model lives as an NNX ``GraphDef`` (static) plus pure-dict states:
``params`` (every ``nnx.Param``, incl. Stiefel/oblique ones) and
``model_state`` (everything else, e.g. BatchNorm / IMN running means), so the
whole :class:`TrainState` is a plain pytree of arrays — shardable by rules
and saved by Orbax as is. ``nnx.merge`` rebuilds the module inside the step.

Non-finite guard: a step whose loss or gradient norm is not finite leaves
the state unchanged (params, optimizer, statistics) and records its step in
``first_nonfinite_step``. With ``nan_policy="stop"`` every later step is
frozen too and the trainer raises with that step number before it would save
anything, so the last checkpoint stays the last good state; with ``"skip"``
training goes on and ``skipped_steps`` counts the dropped updates.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from orthojax.train import losses as losses_lib


class TrainState(NamedTuple):
  step: jax.Array                  # int32, updates applied or skipped so far
  params: Any                      # pure dict of nnx.Param values
  model_state: Any                 # pure dict of the other Variables
  opt_state: Any
  lr_scale: jax.Array              # float32 multiplier (reduce-on-plateau)
  first_nonfinite_step: jax.Array  # int32, -1 while every step was finite
  skipped_steps: jax.Array         # int32

  @classmethod
  def create(cls, params: Any, model_state: Any,
             tx: optax.GradientTransformation) -> "TrainState":
    """The state before the first step: ``tx.init(params)``, lr scale 1, no bad steps.

    No random key is carried: every model here is deterministic in training (a
    stochastic layer would take its key from ``step`` and the seed, so resume
    stays exact without one).
    """
    return cls(step=jnp.int32(0), params=params, model_state=model_state,
               opt_state=tx.init(params), lr_scale=jnp.float32(1.0), first_nonfinite_step=jnp.int32(-1),
               skipped_steps=jnp.int32(0))


def _cast(tree: Any, dtype: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      tree)


def _micro_batches(batch: Any, k: int) -> Any:
  """(B, …) → (k, B/k, …) taking every k-th example, so each micro-batch is
  spread evenly over the devices that hold the batch."""
  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    loss_fn: Callable[[jax.Array, jax.Array], jax.Array], *,
                    classification: bool, compute_dtype: Any = jnp.float32,
                    grad_accum_steps: int = 1, nan_policy: str = "stop",
                    scale_updates: bool = False, param_sharding: Any = None
                    ) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
  """``(state, batch) -> (state, metrics)`` for one optimizer update.

  Args:
    graphdef: the model's GraphDef in *train* mode.
    tx: the optimizer.
    loss_fn: per-example loss ``(outputs, targets) -> (batch,)``.
    classification: also report top-1 accuracy.
    compute_dtype: forward/backward dtype (params stay in their own dtype,
      gradients come back in it).
    grad_accum_steps: split the batch into this many micro-batches, summing
      gradients (the update equals the full-batch one up to float rounding).
    nan_policy: ``"stop"`` or ``"skip"`` (see module docstring).
    scale_updates: multiply updates by ``state.lr_scale`` (plateau schedule).
    param_sharding: the parameters' shardings (a tree like them), or None: the gradients
      enter the optimizer laid out as the parameters, so that a layout the update
      chooses inside (an owner's block of layers) does not propagate back into the
      forward and backward pass (the 1.3 B transformer on ``v5e:8x8``: 668 → 640 GiB of
      HBM traffic per chip and step). The updates are left to the compiler: pinning them
      too changed nothing there and cost ResNet-50's row-split update 9 % more bytes. The
      trainer passes it under FSDP only (``orthojax.train.program``).
  """
  if nan_policy not in ("stop", "skip"):
    raise ValueError(f"nan_policy must be 'stop' or 'skip', got {nan_policy!r}")

  def forward(params, model_state, batch):
    model = nnx.merge(graphdef, _cast(params, compute_dtype), model_state)
    outputs = model(batch["x"].astype(compute_dtype) if jnp.issubdtype(batch["x"].dtype,
                                                                          jnp.floating)
                    else batch["x"])
    per_example = loss_fn(outputs, batch["y"])
    new_model_state = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))
    metrics = {"loss": jnp.sum(per_example)}
    if classification:
      metrics["accuracy"] = jnp.sum(losses_lib.topk_correct(outputs.astype(jnp.float32),
                                                            batch["y"], 1))
    return jnp.mean(per_example), (new_model_state, metrics)

  grad_fn = jax.grad(forward, has_aux=True)

  def gradients(params, model_state, batch):
    if grad_accum_steps == 1:
      grads, (model_state, sums) = grad_fn(params, model_state, batch)
      return grads, model_state, sums
    micro = _micro_batches(batch, grad_accum_steps)

    def body(carry, mb):
      acc, model_state, sums = carry
      g, (model_state, s) = grad_fn(params, model_state, mb)
      acc = jax.tree.map(jnp.add, acc, g)
      sums = jax.tree.map(jnp.add, sums, s)
      return (acc, model_state, sums), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    first = jax.tree.map(lambda x: x[0], micro)
    sums0 = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: grad_fn(params, model_state, first)[1][1]))
    (acc, model_state, sums), _ = jax.lax.scan(body, (zeros, model_state, sums0), micro)
    grads = jax.tree.map(lambda g: g / grad_accum_steps, acc)
    return grads, model_state, sums

  def step(state: TrainState, batch: Any) -> tuple[TrainState, dict]:
    with jax.named_scope("loss_and_grad"):   # op names: the compile report's traffic split
      grads, model_state, sums = gradients(state.params, state.model_state, batch)
    if param_sharding is not None:
      grads = jax.lax.with_sharding_constraint(grads, param_sharding)
    with jax.named_scope("optimizer"):
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
    if scale_updates:
      updates = jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), updates)
    params = optax.apply_updates(state.params, updates)

    count = batch["y"].shape[0]
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
    frozen = state.first_nonfinite_step >= 0 if nan_policy == "stop" else jnp.bool_(False)
    accept = finite & ~frozen
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(accept, n, o), new, old)
    first_bad = jnp.where((state.first_nonfinite_step < 0) & ~finite, state.step,
                          state.first_nonfinite_step)
    new_state = TrainState(
        step=state.step + 1,
        params=keep(params, state.params),
        model_state=keep(model_state, state.model_state),
        opt_state=keep(opt_state, state.opt_state),
        lr_scale=state.lr_scale,
        first_nonfinite_step=first_bad.astype(jnp.int32),
        skipped_steps=state.skipped_steps + (~finite).astype(jnp.int32))
    metrics = {k: v / count for k, v in sums.items()}
    metrics["grad_norm"] = grad_norm
    return new_state, metrics

  return step


def make_eval_step(graphdef: nnx.GraphDef, loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
                   *, classification: bool, compute_dtype: Any = jnp.float32,
                   ) -> Callable[[TrainState, Any], dict]:
  """``(state, batch) -> sums`` over the batch's real (``mask == 1``) examples.

  Returns masked sums (``count``, ``loss``; ``top1``/``top5`` for
  classification; ``sq_error`` for regression) for the caller to total over
  the eval set — padding never counts.
  """

  def step(state: TrainState, batch: Any) -> dict:
    model = nnx.merge(graphdef, _cast(state.params, compute_dtype), state.model_state)
    x = batch["x"]
    outputs = model(x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x)
    outputs = outputs.astype(jnp.float32)
    mask = batch.get("mask", jnp.ones(outputs.shape[:1], jnp.float32))
    sums = {"count": jnp.sum(mask), "loss": jnp.sum(loss_fn(outputs, batch["y"]) * mask)}
    if classification:
      for k in (1, 5):
        if outputs.shape[-1] >= k:
          sums[f"top{k}"] = jnp.sum(losses_lib.topk_correct(outputs, batch["y"], k) * mask)
    else:
      sums["sq_error"] = jnp.sum(losses_lib.mse(outputs, batch["y"]) * mask)
    return sums

  return step
