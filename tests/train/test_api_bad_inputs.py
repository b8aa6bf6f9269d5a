"""Bad arguments to the Python API: one clear exception whose message names the argument
and says what would be right — fit, partition, the penalties, the optimizers."""

from __future__ import annotations

import warnings

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


def test_fit_returns_the_trained_model_and_hands_print_fn_each_line():
  lines = []
  result = fit(_Net, optax.adam(1e-2), _batches(), _CONFIG, devices=_CPU,
               print_fn=lines.append)   # print_fn(line): the line alone, no keywords
  assert lines and all(isinstance(line, str) for line in lines)
  assert isinstance(result.model, _Net)
  x = _batches(1)[0]["x"]
  want = x @ np.asarray(result.state.params["dense"]["kernel"]) + np.asarray(
      result.state.params["dense"]["bias"])
  np.testing.assert_allclose(np.asarray(result.model(x)), want, rtol=1e-5, atol=1e-5)



class _StiefelNet(nnx.Module):
  def __init__(self, rngs):
    self.w1 = oj.nn.StiefelParam(oj.manifolds.Stiefel().random(rngs.params(), (6, 3)))
    self.head = nnx.Linear(3, 2, rngs=rngs)


_P = {"w": np.eye(4, 2, dtype=np.float32), "b": np.zeros(2, np.float32)}

LIBRARY_CASES = [
    # (what is wrong, the call, exception type, the message's start)
    ("partition without transforms", lambda: oj.optim.partition(lambda p: p), ValueError,
     "partition: give at least one transform"),
    ("partition with a number", lambda: oj.optim.partition(lambda p: p, euclidean=0.1),
     TypeError, "partition: euclidean= must be an optax.GradientTransformation, got 0.1"),
    ("partition with a label left out", lambda: oj.optim.partition(
        {"w": "stiefel", "b": "euclidean"}, euclidean=optax.adam(1.0)).init(_P), ValueError,
     "partition: labels ['stiefel'] have no transform; transforms are given for "
     "['euclidean']"),
    ("penalty kind", lambda: oj.optim.add_orthogonality_penalty("foo", 1e-3), ValueError,
     "unknown penalty kind='foo'; valid names:"),
    ("penalty gain on so", lambda: oj.optim.add_orthogonality_penalty("so", 1e-3, gain=2.0),
     ValueError, "gain=2.0 only applies to kind='gain_adjusted_so'"),
    ("penalty reduction", lambda: oj.optim.add_orthogonality_penalty(
        "so", 1e-3, reduction="max"), ValueError, "reduction must be one of ('sum', 'mean')"),
    ("penalty on integers", lambda: oj.penalties.tree_penalty(
        {"w": np.ones((3, 3), np.int32)}, "so"), TypeError, "['w'] has dtype int32"),
    ("penalty on a 3-D leaf", lambda: oj.penalties.tree_penalty(
        {"w": np.ones((2, 3, 3), np.float32)}, "so"), ValueError,
     "['w'] has shape (2, 3, 3) (3 axes): its matrix view is ambiguous"),
    ("radam without a manifold", lambda: oj.optim.radam(1e-3, "stiefel"), TypeError,
     "project_to_tangent: manifold must be an orthojax.manifolds.Manifold, got 'stiefel'"),
    ("radam b1", lambda: oj.optim.radam(1e-3, oj.manifolds.Stiefel(), b1=1.5), ValueError,
     "scale_by_riemannian_adam: b1 must be in [0, 1), got 1.5"),
    ("radam on a bias", lambda: (lambda tx: tx.update(_P, tx.init(_P), _P))(
        oj.optim.radam(1e-3, oj.manifolds.Stiefel())), ValueError,
     "['b'] has shape (2,): a matrix view needs at least 2 axes"),
    ("rsgd momentum", lambda: oj.optim.rsgd(1e-3, oj.manifolds.Stiefel(), momentum=-1),
     ValueError, "riemannian_momentum: momentum must be in [0, 1), got -1"),
    ("cayley_adam q", lambda: oj.optim.cayley_adam(1e-3, q=2.0), ValueError,
     "cayley_adam: q must be in (0, 1)"),
    ("cayley_adam b1", lambda: oj.optim.cayley_adam(1e-3, b1=2.0), ValueError,
     "cayley_adam: b1 must be in [0, 1), got 2.0"),
    ("cayley_sgd momentum", lambda: oj.optim.cayley_sgd(1e-3, momentum=1.0), ValueError,
     "cayley_sgd: momentum must be in [0, 1), got 1.0"),
    ("muon beta", lambda: oj.optim.muon(1e-3, beta=2.0), ValueError,
     "muon: beta must be in [0, 1), got 2.0"),
    ("muon adam_b2", lambda: oj.optim.muon(1e-3, adam_b2=1.0), ValueError,
     "muon: adam_b2 must be in [0, 1), got 1.0"),
    ("stiefel_muon beta", lambda: oj.optim.stiefel_muon(1e-3, beta=-1.0), ValueError,
     "stiefel_muon: beta must be in [0, 1), got -1.0"),
    ("scale_by_muon beta", lambda: oj.optim.scale_by_muon(beta=float("nan")), ValueError,
     "scale_by_muon: beta must be in [0, 1), got nan"),
    ("landing lam", lambda: oj.optim.landing(1e-3, lam=-1.0), ValueError,
     "landing: lam must be > 0, got -1.0"),
    ("a GmP layer's size", lambda: oj.nn.GmPDense(-1, 3, rngs=nnx.Rngs(0)), ValueError,
     "GmPDense: in_features must be a positive integer, got -1"),
    ("a manifold layer's size", lambda: oj.nn.ManifoldLinear(4, 0, rngs=nnx.Rngs(0)),
     ValueError, "ManifoldLinear: out_features must be a positive integer, got 0"),
    ("a norm's size", lambda: oj.nn.MeanOnlyBatchNorm(-3, rngs=nnx.Rngs(0)), ValueError,
     "MeanOnlyBatchNorm: num_features must be a positive integer, got -3"),
    ("a model's classes", lambda: oj.models.ResNet(18, "bn", 0, rngs=nnx.Rngs(0)),
     ValueError, "ResNet: num_classes must be a positive integer, got 0"),
    ("a model's width", lambda: oj.models.MLP(3, -4, 2, rngs=nnx.Rngs(0)), ValueError,
     "MLP: hidden must be a positive integer, got -4"),
    ("a retraction's name", lambda: oj.manifolds.Stiefel("qrr"), ValueError,
     "Stiefel: unknown retraction='qrr'; choose one of"),
    ("muon with optax's keyword", lambda: oj.optim.muon(
        1e-3, muon_weight_dimension_numbers=None), ValueError, "muon: pass views=..."),
    ("newton_schulz steps", lambda: oj.linalg.newton_schulz(np.eye(3), steps=0), ValueError,
     "newton_schulz: steps must be >= 1, got 0"),
    ("radam ascending", lambda: oj.optim.radam(-1e-2, oj.manifolds.Stiefel()), ValueError,
     "radam: learning_rate=-0.01 must be a finite number above 0 (a negative learning rate "
     "would ascend the loss)"),
    ("muon at rate 0", lambda: oj.optim.muon(0.0), ValueError,
     "muon: learning_rate=0.0 must be a finite number above 0"),
    ("stiefel_muon at nan", lambda: oj.optim.stiefel_muon(float("nan")), ValueError,
     "stiefel_muon: learning_rate=nan must be a finite number above 0"),
    ("cayley_sgd ascending", lambda: oj.optim.cayley_sgd(-1.0), ValueError,
     "cayley_sgd: learning_rate=-1.0 must be"),
    ("landing with a string rate", lambda: oj.optim.landing("fast"), ValueError,
     "landing: learning_rate='fast'; pass a positive number or an optax schedule"),
    ("penalty rewarding non-orthogonality", lambda: oj.optim.add_orthogonality_penalty(
        "so", -1.0), ValueError,
     "add_orthogonality_penalty: strength=-1.0 must be a finite number at least 0 (a "
     "negative strength would reward what the penalty measures)"),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in LIBRARY_CASES],
                         ids=[c[0] for c in LIBRARY_CASES])
def test_the_library_names_the_bad_argument(call, error, message):
  with pytest.raises(error) as e:
    call()
  assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("tx, drifts", [
    (oj.optim.muon(1e-3), True), (optax.adam(1e-3), True),
    (oj.optim.radam(1e-3, oj.manifolds.Stiefel()), False),
    # optax.chain does not say what its links do: a chain keeps only where it is declared
    # to (what its last link does decides: scaling a retraction's step leaves the manifold).
    (oj.optim.ManifoldTransformation(
        *optax.chain(optax.clip(1.0), oj.optim.rsgd(1e-3, oj.manifolds.Stiefel()))), False),
    (optax.chain(optax.clip(1.0), oj.optim.rsgd(1e-3, oj.manifolds.Stiefel())), True),
    (optax.chain(oj.optim.rsgd(1e-3, oj.manifolds.Stiefel()), optax.scale(2.0)), True),
    (oj.optim.stiefel_muon(1e-3), False), (oj.optim.cayley_adam(1e-3), False),
    (oj.optim.landing(1e-3), False),
    (lambda mesh: oj.optim.shard_update(oj.optim.radam(1e-3), mesh), False),
    (lambda mesh: oj.optim.shard_update(oj.optim.muon(1e-3), mesh), True)],
    ids=["muon", "adam", "radam", "declared chain(clip, rsgd)", "chain(clip, rsgd)",
         "chain(rsgd, scale)", "stiefel_muon", "cayley_adam", "landing", "sharded radam",
         "sharded muon"])
def test_partition_reports_a_stiefel_leaf_sent_where_it_would_drift(tx, drifts):
  if not isinstance(tx, optax.GradientTransformation):   # sharded over two devices
    tx = tx(jax.make_mesh((2,), ("data",), devices=jax.devices()[:2]))
  model = _StiefelNet(nnx.Rngs(0))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    oj.optim.partition(model, stiefel=tx, euclidean=optax.adam(1e-3))
  messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
  if drifts:
    assert len(messages) == 1 and messages[0].startswith(
        "partition: stiefel= does not keep its leaves on the Stiefel manifold"), messages
    assert "['w1'] will drift off it" in messages[0] and "stiefel_muon" in messages[0]
  else:
    assert not messages, messages
  assert oj.optim.keeps_manifold(tx) is not drifts
