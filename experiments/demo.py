r"""Built-in demo: a deep tanh network on real digits, Euclidean vs. orthogonal training.

Runs offline in 2–3 minutes on 2 CPU cores. A ``--depth``-layer tanh MLP of
width ``--width`` classifies scikit-learn's bundled 8x8 digits (1797 images,
fixed 80/20 split). Its hidden weights, one stacked ``(depth, width, width)``
parameter viewed with ``MatrixView.stacked()``, are trained five ways:

* ``adam``        Euclidean Adam from a Gaussian init N(0, 1/width);
* ``adam+so``     the same plus the decoupled soft-orthogonality penalty
                  (Bansal et al. 2018) from an orthogonal init;
* ``radam``       Riemannian Adam on the Stiefel manifold, Cayley retraction;
* ``cayley_adam`` Li et al. (2020) Cayley Adam;
* ``landing``     Ablin & Peyré's retraction-free landing.

The input and output layers and the biases stay Euclidean (Adam), routed by
``oj.optim.partition``. The report prints, per variant, the final training
loss, test accuracy, the mean orthogonality defect ||W^T W - I||_F of the
hidden layers and the median step time.

    python -m experiments.demo [--demo_depth 32 --demo_width 64 --demo_steps 400]
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import orthojax as oj

# Prefixed: the training flags of the experiments (--depth, --lr, ...) share absl's
# global flag namespace with these when one process imports both (the test suite).
_DEPTH = flags.DEFINE_integer("demo_depth", 32, "Hidden tanh layers.", lower_bound=1)
_WIDTH = flags.DEFINE_integer("demo_width", 64, "Hidden width.", lower_bound=2)
_STEPS = flags.DEFINE_integer("demo_steps", 400, "Full-batch training steps.", lower_bound=1)
_LR = flags.DEFINE_float("demo_lr", 3e-3, "Learning rate of every variant.", lower_bound=0.0)
_PENALTY = flags.DEFINE_float("demo_penalty", 1e-2, "Strength of the SO penalty in adam+so.")
_SEED = flags.DEFINE_integer("demo_seed", 0, "Random seed.")
_VARIANTS = flags.DEFINE_list("demo_variants",
                              ["adam", "adam+so", "radam", "cayley_adam", "landing"],
                              "Which variants to train.")

_HIDDEN_VIEW = oj.linalg.MatrixView.stacked()


def load_digits(seed: int):
  """scikit-learn's bundled digits, standardised on the training split."""
  from sklearn.datasets import load_digits as sk_digits  # bundled with scikit-learn, no download
  x, y = sk_digits(return_X_y=True)
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = x[order].astype(np.float32), y[order]
  split = int(0.8 * len(x))
  mean, std = x[:split].mean(0), x[:split].std(0) + 1e-6
  x = (x - mean) / std
  return (x[:split], y[:split]), (x[split:], y[split:])


def init_params(key, depth, width, in_dim, classes, orthogonal):
  k_in, k_h, k_out = jax.random.split(key, 3)
  if orthogonal:
    hidden = oj.manifolds.Stiefel().random(k_h, (depth, width, width), view=_HIDDEN_VIEW)
  else:
    hidden = jax.random.normal(k_h, (depth, width, width)) / jnp.sqrt(width)
  return {
      "w_in": jax.random.normal(k_in, (in_dim, width)) / jnp.sqrt(in_dim),
      "hidden": hidden,
      "b_hidden": jnp.zeros((depth, width)),
      "w_out": jax.random.normal(k_out, (width, classes)) / jnp.sqrt(width),
  }


def forward(params, x):
  h = jnp.tanh(x @ params["w_in"])

  def layer(h, wb):
    w, b = wb
    return jnp.tanh(h @ w + b), None

  h, _ = jax.lax.scan(layer, h, (params["hidden"], params["b_hidden"]))
  return h @ params["w_out"]


def loss_fn(params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()


def make_optimizer(variant: str, lr: float, penalty: float):
  labels = lambda p: {k: ("stiefel" if k == "hidden" else "euclidean") for k in p}
  views = {"hidden": _HIDDEN_VIEW}
  if variant == "adam":
    return optax.adam(lr)
  if variant == "adam+so":
    return optax.chain(
        oj.optim.add_orthogonality_penalty("so", penalty, mask=lambda p: {k: k == "hidden" for k in p},
                                           views=lambda p: {k: _HIDDEN_VIEW if k == "hidden" else None
                                                            for k in p}),
        optax.adam(lr))
  manifold_tx = {
      # Cayley steps preserve W^T W only up to rounding, which accumulates:
      # re-orthonormalize every 100 steps (see oj.optim.retract).
      "radam": lambda: oj.optim.radam(lr, oj.manifolds.Stiefel("cayley"), views=views,
                                      reorthonormalize_every=100),
      "cayley_adam": lambda: oj.optim.cayley_adam(lr, views=views),
      "landing": lambda: oj.optim.landing(10 * lr, views=views),
  }
  if variant not in manifold_tx:
    raise ValueError(f"--variants: unknown variant {variant!r}; choose from "
                     f"{['adam', 'adam+so', *manifold_tx]}")
  return oj.optim.partition(labels, stiefel=manifold_tx[variant](), euclidean=optax.adam(lr))


def train(variant, data, depth, width, steps, lr, penalty, seed):
  (x_tr, y_tr), (x_te, y_te) = data
  params = init_params(jax.random.PRNGKey(seed), depth, width, x_tr.shape[1], 10,
                       orthogonal=variant != "adam")
  tx = make_optimizer(variant, lr, penalty)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params, x_tr, y_tr)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    params, opt_state, loss = step(params, opt_state)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
  if not np.isfinite(float(loss)):
    raise FloatingPointError(f"{variant}: loss became {float(loss)} during training")
  acc = float(jnp.mean(jnp.argmax(forward(params, x_te), -1) == y_te))
  defect = float(jnp.mean(oj.manifolds.Stiefel().defect(params["hidden"], view=_HIDDEN_VIEW)))
  return dict(loss=float(loss_fn(params, x_tr, y_tr)), acc=acc, defect=defect,
              step_ms=1e3 * float(np.median(times[1:] if len(times) > 1 else times)))


def main(argv):
  del argv
  data = load_digits(_SEED.value)
  print(f"digits: {len(data[0][0])} train / {len(data[1][0])} test; tanh MLP depth {_DEPTH.value}, "
        f"width {_WIDTH.value}; {_STEPS.value} full-batch steps; devices: {jax.devices()}")
  rows = []
  for variant in _VARIANTS.value:
    r = train(variant, data, _DEPTH.value, _WIDTH.value, _STEPS.value, _LR.value, _PENALTY.value,
              _SEED.value)
    rows.append((variant, r))
    print(f"  {variant:12s} train loss {r['loss']:.4f}  test acc {r['acc']:.3f}  "
          f"defect {r['defect']:.2e}  {r['step_ms']:.2f} ms/step", flush=True)
  print("\n| variant | train loss | test accuracy | mean defect ‖WᵀW − I‖_F | ms/step |")
  print("|---|---|---|---|---|")
  for variant, r in rows:
    print(f"| {variant} | {r['loss']:.4f} | {r['acc']:.3f} | {r['defect']:.2e} | {r['step_ms']:.2f} |")


if __name__ == "__main__":
  app.run(main)
