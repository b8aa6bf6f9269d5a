"""Bad arguments to the Python API: one clear exception whose message names the argument
and says what would be right — fit, partition, the penalties, the optimizers."""

from __future__ import annotations

from flax import nnx
import jax
import numpy as np
import optax
import pytest

import orthojax as oj
from orthojax.train import Config
from orthojax.train import ConfigError
from orthojax.train import fit


class _Net(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(3, 2, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


def _batches(n=4, x_dtype=np.float32, y=lambda rng: rng.integers(0, 2, 8).astype(np.int32),
             features=3):
  rng = np.random.default_rng(0)
  return [{"x": rng.standard_normal((8, features)).astype(x_dtype), "y": y(rng)}
          for _ in range(n)]


_CONFIG = Config(batch_size=8, num_steps=4, log_every=4)
_CPU = jax.devices()[:1]
_QUIET = dict(devices=_CPU, print_fn=lambda line: None)


def _changing_features():
  return _batches(2) + _batches(2, features=5)


FIT_CASES = [
    # (what is wrong, fit's arguments, exception type, the message's start)
    ("a model instance", (_Net(nnx.Rngs(0)), optax.adam(1e-3), _batches(), _CONFIG),
     ConfigError, "model_fn: got a model instance _Net; pass a function rngs -> model"),
    ("not callable", (3, optax.adam(1e-3), _batches(), _CONFIG), ConfigError,
     "model_fn: got a int; pass a function rngs -> model"),
    ("an optimizer that is neither", (_Net, 0.1, _batches(), _CONFIG), ConfigError,
     "optimizer: got a float; pass an optax GradientTransformation"),
    ("batches without y", (_Net, optax.adam(1e-3), [{"x": np.zeros((8, 3), np.float32)}] * 2,
                           _CONFIG), ConfigError,
     "train_data: each batch is a dict {'x': float32 (batch, ...), 'y': (batch,)}; got keys "
     "['x']"),
    ("a batch that is a tuple", (_Net, optax.adam(1e-3), [(np.zeros((8, 3)),)] * 2, _CONFIG),
     ConfigError, "train_data: each batch is a dict"),
    ("float labels, cross entropy", (_Net, optax.adam(1e-3), _batches(
        y=lambda rng: rng.standard_normal(8).astype(np.float32)), _CONFIG), ConfigError,
     "config.loss='cross_entropy': train_data's y are float32 regression targets; set "
     "loss='mse' or 'mae', or give int32 class labels"),
    ("int labels, mse", (_Net, optax.adam(1e-3), _batches(), _CONFIG.replace(loss="mse")),
     ConfigError, "config.loss='mse': train_data's y are int32 class labels; set "
                  "loss='cross_entropy', or give float32 targets"),
    ("float64 features", (_Net, optax.adam(1e-3), _batches(x_dtype=np.float64), _CONFIG),
     ConfigError, "train_data: batches are {'x': float32"),
    ("int64 labels", (_Net, optax.adam(1e-3), _batches(
        y=lambda rng: rng.integers(0, 2, 8)), _CONFIG), ConfigError,
     "train_data: integer labels must be int32"),
    ("features that change mid-stream", (_Net, optax.adam(1e-3), _changing_features(),
                                         _CONFIG), ValueError,
     "train_data: batch 2 has x float32[8, 5], the first had float32[8, 3]; every batch has "
     "the first's dtypes and shapes"),
    ("epochs without a dataset", (_Net, optax.adam(1e-3), _batches(),
                                  Config(batch_size=8, num_epochs=1.0)), ConfigError,
     "num_steps: fit() trains for a number of steps"),
    ("an iterator", (_Net, optax.adam(1e-3), iter(_batches()), _CONFIG), ConfigError,
     "train_data: a one-shot iterator cannot be resumed"),
    ("no batch", (_Net, optax.adam(1e-3), [], _CONFIG), ConfigError,
     "train_data: yielded no batch"),
    ("evaluation without eval_data", (_Net, optax.adam(1e-3), _batches(),
                                      _CONFIG.replace(eval_every=2)), ConfigError,
     "eval_data: eval_every / restore_best / plateau / final_eval_splits need eval_data"),
    ("hooks at epochs", (_Net, optax.adam(1e-3), _batches(),
                         _CONFIG.replace(hooks={"epochs": (1,)})), ConfigError,
     "config.hooks.epochs: fit() has no epochs"),
]


@pytest.mark.parametrize("args, error, message", [c[1:] for c in FIT_CASES],
                         ids=[c[0] for c in FIT_CASES])
def test_fit_names_the_bad_argument(args, error, message):
  with pytest.raises(error) as e:
    fit(*args, **_QUIET)
  assert str(e.value).startswith(message), str(e.value)
  assert "\n" not in str(e.value)


def test_a_workdir_that_is_a_file_names_the_workdir(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(ConfigError) as e:
    fit(_Net, optax.adam(1e-3), _batches(), _CONFIG.replace(workdir=str(tmp_path / "file")),
        **_QUIET)
  assert str(e.value).startswith(f"workdir {tmp_path / 'file'}: cannot write there"), e.value
  assert "--workdir" not in str(e.value)


def test_fit_returns_the_trained_model_and_takes_any_print_fn():
  lines = []
  result = fit(_Net, optax.adam(1e-2), _batches(), _CONFIG, devices=_CPU,
               print_fn=lines.append)   # takes no flush=
  assert lines and all(isinstance(line, str) for line in lines)
  assert isinstance(result.model, _Net)
  x = _batches(1)[0]["x"]
  want = x @ np.asarray(result.state.params["dense"]["kernel"]) + np.asarray(
      result.state.params["dense"]["bias"])
  np.testing.assert_allclose(np.asarray(result.model(x)), want, rtol=1e-5, atol=1e-5)
