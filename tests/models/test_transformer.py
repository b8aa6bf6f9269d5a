"""TransformerLM: a float64 numpy reference, causality, log V, rotary, constrained matrices,
Muon against optax's, Stiefel attention on its manifold, the owner-sharded update.

Every model shares one small shape (vocab 11, 2 blocks, width 16, 2 heads, 7 tokens), so
jax compiles few distinct programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import orthojax as oj
from orthojax.models import TransformerLM
from orthojax.models._transformer import rotary

VOCAB, DEPTH, WIDTH, HEADS, T = 11, 2, 16, 2, 7


def _model(**kw):
  return TransformerLM(VOCAB, depth=DEPTH, width=WIDTH, heads=HEADS, rngs=nnx.Rngs(0), **kw)


def _tokens(seed=0, batch=3, t=T):
  return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, (batch, t)), jnp.int32)


def _randomise_gains(model, seed=1):
  """Norm gains and scales away from their initial constants, so the reference sees them."""
  rng = np.random.default_rng(seed)
  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Param) and var.get_metadata().get("matrix_view") is False:
      if var.ndim and var.shape[-1] != VOCAB and var.shape[0] != VOCAB:
        var[...] = var[...] * jnp.asarray(1 + 0.3 * rng.standard_normal(var.shape), var.dtype)


def _reference(model, tokens, largest_logits=None):
  """Logits by a float64 numpy loop: explicit causal softmax, rotary by complex numbers;
  each layer's largest ``|q·k|/√d`` appended to ``largest_logits`` if given."""
  f = lambda v: np.asarray(v[...], np.float64)
  norm = lambda x, g: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * g
  gelu = lambda x: np.asarray(jax.nn.gelu(jnp.asarray(x, jnp.float32)), np.float64)
  scale = lambda name, index: (f(model.scales[name])[index] if name in model.scales else 1.0)
  d, n = model.width, model.heads
  hd = d // n
  pos = np.arange(tokens.shape[1])
  freqs = 10_000.0 ** (-np.arange(hd // 2) / (hd // 2))
  turn = np.exp(1j * pos[:, None] * freqs[None])                       # (T, hd/2)

  def rope(x):                                                         # (B, T, n, hd)
    z = (x[..., :hd // 2] + 1j * x[..., hd // 2:]) * turn[None, :, None, :]
    return np.concatenate([z.real, z.imag], -1)

  x = f(model.embed)[np.asarray(tokens)]
  b, t = tokens.shape
  for l in range(model.depth):
    h = norm(x, f(model.attn_norm)[l])
    q, k, v = (h @ f(model.qkv)[l, i] * scale("qkv", (l, i)) for i in range(3))
    q, k, v = (a.reshape(b, t, n, hd) for a in (q, k, v))
    if model.q_norm is not None:
      q, k = norm(q, f(model.q_norm)[l]), norm(k, f(model.k_norm)[l])
    q, k = rope(q), rope(k)
    out = np.zeros_like(q)
    largest = 0.0
    for i in range(t):
      logits = np.einsum("bnh,bsnh->bns", q[:, i], k[:, :i + 1]) / np.sqrt(hd)
      largest = max(largest, np.abs(logits).max())
      p = np.exp(logits - logits.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      out[:, i] = np.einsum("bns,bsnh->bnh", p, v[:, :i + 1])
    if largest_logits is not None:
      largest_logits.append(largest)
    x = x + out.reshape(b, t, d) @ f(model.attn_out)[l] * scale("attn_out", l)
    h = norm(x, f(model.mlp_norm)[l])
    x = x + gelu(h @ f(model.mlp_in)[l] * scale("mlp_in", l)) @ f(model.mlp_out)[l] * scale(
        "mlp_out", l)
  return norm(x, f(model.final_norm)) @ f(model.head)


@pytest.mark.parametrize("kw", [
    {},
    {"qk_norm": True},
    {"stiefel": "all", "scale": "output"},
    {"stiefel": "attention", "oblique": "mlp", "remat": True},
], ids=["euclidean", "qk_norm", "stiefel-output-scales", "stiefel-attention-oblique-mlp-remat"])
def test_scanned_model_equals_a_float64_reference(kw):
  model = _model(**kw)
  _randomise_gains(model)
  tokens = _tokens()
  np.testing.assert_allclose(model(tokens), _reference(model, tokens), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("scale", ["matrix", "output"])
def test_scaling_the_matrix_or_its_output_gives_the_same_loss_and_gradients(scale, monkeypatch):
  """``x (V·s)`` (a batch with at least fan-in rows) and ``(x V)·s`` are one function: the
  loss and every gradient, the scales' included, agree to float32 rounding."""
  from orthojax.models import _transformer
  model = _model(stiefel="all", scale=scale)
  _randomise_gains(model)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tokens = _tokens()

  def loss(params):
    logits = nnx.merge(graphdef, params, rest)(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

  results = {}
  for weight in (True, False):
    monkeypatch.setattr(_transformer, "_scales_weight", lambda x, v, weight=weight: weight)
    results[weight] = jax.value_and_grad(loss)(params)
  np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               nnx.to_pure_dict(results[True][1]), nnx.to_pure_dict(results[False][1]))
  monkeypatch.undo()
  assert _transformer._scales_weight(jnp.ones((3, 7, 16)), jnp.ones((16, 64)))
  assert not _transformer._scales_weight(jnp.ones((3, 5, 64)), jnp.ones((64, 16)))


@pytest.mark.parametrize("kw", [
    {},
    {"qk_norm": True},
    {"stiefel": "attention", "scale": "output"},
    {"stiefel": "all", "scale": "matrix", "remat": True},
], ids=["euclidean", "qk_norm", "stiefel-attention-output-scales", "stiefel-matrix-scales"])
def test_attention_logits_and_query_key_norms_equal_float64_references(kw):
  """The largest logit per layer from the float64 loop above; ``‖W_q W_kᵀ‖₂`` from an SVD
  of the materialised scaled matrices."""
  model = _model(**kw)
  _randomise_gains(model)
  tokens = _tokens(seed=3)
  largest = []
  _reference(model, tokens, largest)
  np.testing.assert_allclose(model.attention_logit_max(tokens), largest, rtol=2e-4)
  qkv = np.asarray(model.qkv[...], np.float64)
  s = np.asarray(model.scales["qkv"][...], np.float64) if "qkv" in model.scales else None
  for l in range(DEPTH):
    w_q, w_k = (qkv[l, i] if s is None else qkv[l, i] * s[l, i] for i in (0, 1))
    norm = np.linalg.svd(w_q @ w_k.T, compute_uv=False)[0]
    assert model.query_key_norms()[l] == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("kw", [{}, {"qk_norm": True, "stiefel": "all"}])
def test_a_position_does_not_see_later_tokens(kw):
  model = _model(**kw)
  tokens = _tokens()
  changed = tokens.at[:, 4:].set((tokens[:, 4:] + 3) % VOCAB)
  before, after = model(tokens), model(changed)
  np.testing.assert_array_equal(before[:, :4], after[:, :4])
  assert np.abs(np.asarray(before[:, 4:] - after[:, 4:])).max() > 1e-4   # and later ones do


def test_a_uniform_model_has_loss_log_vocab():
  model = _model()
  model.head[...] = jnp.zeros_like(model.head[...])
  tokens = _tokens()
  loss = optax.softmax_cross_entropy_with_integer_labels(model(tokens), tokens).mean()
  np.testing.assert_allclose(loss, np.log(VOCAB), rtol=1e-6)


def test_rotary_scores_depend_on_the_offset_only():
  rng = np.random.default_rng(0)
  q1, k1 = (jnp.asarray(rng.standard_normal((1, 1, 1, 8)), jnp.float32) for _ in range(2))
  q = jnp.broadcast_to(q1, (1, 12, 1, 8))
  k = jnp.broadcast_to(k1, (1, 12, 1, 8))
  scores = jnp.einsum("bsnh,btnh->st", rotary(q), rotary(k))
  for offset in range(-3, 4):
    diag = np.diagonal(np.asarray(scores), offset)
    np.testing.assert_allclose(diag, diag[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(scores[0, 0], jnp.sum(q1 * k1), rtol=1e-6)   # position 0: no turn


def test_bfloat16_compute_tracks_float32():
  tokens = _tokens()
  f32 = _model()(tokens)
  bf16 = _model(dtype=jnp.bfloat16)(tokens)
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(bf16, np.float32), f32, atol=0.03)


def test_constrained_matrices_start_on_their_manifold_with_the_euclidean_second_moment():
  model = _model(stiefel="attention", oblique="mlp", scale="matrix")
  views = oj.nn.matrix_views(model)
  stiefel, oblique = oj.manifolds.Stiefel(), oj.manifolds.Oblique()
  for name in ("qkv", "attn_out"):
    assert isinstance(getattr(model, name), oj.nn.StiefelParam)
    assert float(jnp.max(stiefel.defect(getattr(model, name)[...], view=views[name]))) < 1e-5
  for name in ("mlp_in", "mlp_out"):
    assert isinstance(getattr(model, name), oj.nn.ObliqueParam)
    assert float(jnp.max(oblique.defect(getattr(model, name)[...], view=views[name]))) < 1e-5
  # s = 0.02 sqrt(max(fan_in, fan_out)), residual projections / sqrt(2L): E[W_ij^2] = std^2
  residual = 0.02 / np.sqrt(2 * DEPTH)
  for name, std in (("qkv", 0.02), ("attn_out", residual), ("mlp_in", 0.02),
                    ("mlp_out", residual)):
    v = np.asarray(getattr(model, name)[...])
    s = np.asarray(model.scales[name][...])
    np.testing.assert_allclose(s, std * np.sqrt(max(v.shape[-2:])), rtol=1e-6)
    if name in ("qkv", "attn_out"):   # Haar: E[V_ij^2] = 1/max(fan_in, fan_out) exactly
      np.testing.assert_allclose(np.mean(v ** 2) * s.reshape(-1)[0] ** 2, std ** 2, rtol=1e-5)


def test_labels_route_hidden_matrices_only():
  model = _model(stiefel="all")
  labels = nnx.to_pure_dict(oj.nn.manifold_labels(model))
  assert {k for k, v in labels.items() if v == "stiefel"} == set(TransformerLM.MATRICES)
  views = nnx.to_pure_dict(oj.nn.matrix_views(_model()))
  for name in ("embed", "head", "attn_norm", "mlp_norm", "final_norm"):
    assert views[name] is False    # Muon sends them to its AdamW branch, penalties skip them


@pytest.mark.parametrize("kw,match", [
    ({"stiefel": "head"}, "stiefel='head': the embedding and the head"),
    ({"oblique": "embed"}, "oblique='embed'"),
    ({"stiefel": "qkv", "oblique": "attention"}, "qkv is named in both"),
    ({"stiefel": "attn"}, "unknown stiefel='attn'"),
    ({"scale": "row"}, "scale"),
])
def test_bad_options_are_one_line(kw, match):
  with pytest.raises(ValueError, match=match) as e:
    _model(**kw)
  assert "\n" not in str(e.value)


def test_width_must_split_into_even_heads():
  with pytest.raises(ValueError, match="even head dimension"):
    TransformerLM(VOCAB, width=12, heads=4, rngs=nnx.Rngs(0))


def _params_and_grads(model, seed=0):
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  grads = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
      nnx.merge(nnx.graphdef(model), p, nnx.state(model, nnx.Not(nnx.Param)))(_tokens(seed)),
      _tokens(seed + 1)).mean())(params)
  return params, grads


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_muon_on_the_transformer_equals_optax_contrib_muon(dtype):
  # Ours runs optax's momentum and Newton–Schulz per same-shape bucket, in another
  # compiled program: float64 agrees to 1e-12, float32 to its rounding amplified by five
  # Newton–Schulz steps (measured 9e-6 of the largest entry).
  model = _model()
  params, grads = _params_and_grads(model)
  views = nnx.to_pure_dict(oj.nn.matrix_views(model))
  dims = {k: (None if v is False else optax.contrib.MuonDimensionNumbers(
      reduction_axis=v.reduction_axis, output_axis=v.output_axis)) for k, v in views.items()}
  rtol = {"float32": 1e-4, "float64": 1e-12}[dtype]
  with jax.enable_x64(dtype == "float64"):
    params, grads = jax.tree.map(lambda x: np.asarray(x, dtype), (params, grads))
    ours = oj.optim.muon(0.02, views=views, adam_learning_rate=3e-3)
    theirs = optax.contrib.muon(0.02, adam_learning_rate=3e-3, muon_weight_dimension_numbers=dims)
    s1, s2 = ours.init(params), theirs.init(params)
    for _ in range(2):
      u1, s1 = jax.jit(ours.update)(grads, s1, params)
      u2, s2 = jax.jit(theirs.update)(grads, s2, params)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(
          a, b, rtol=0, atol=rtol * np.abs(b).max()), u1, u2)
    assert jax.tree.structure(s1) == jax.tree.structure(s2)   # the same state, leaf for leaf
  # and the split is Muon's: the four hidden matrices orthogonalized, the rest on AdamW
  derived = oj.optim.muon_dimension_numbers(params, views)
  assert {k for k, v in derived.items() if v is not None} == set(TransformerLM.MATRICES)


def test_stiefel_attention_stays_on_its_manifold_while_it_learns():
  model = _model(stiefel="attention", qk_norm=True)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  tx = oj.optim.partition(model, stiefel=oj.optim.stiefel_muon(0.05, views=oj.nn.matrix_views(
      model)), euclidean=optax.adamw(3e-3))
  tokens = _tokens(0, batch=8, t=T + 1)

  def loss(p):
    logits = nnx.merge(graphdef, p, rest)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(p, s):
    value, g = jax.value_and_grad(loss)(p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, value

  state, first = tx.init(params), float(loss(params))
  for _ in range(30):
    params, state, value = step(params, state)
  views = nnx.to_pure_dict(oj.nn.matrix_views(model))
  stiefel = oj.manifolds.Stiefel()
  for name in ("qkv", "attn_out"):
    assert float(jnp.max(stiefel.defect(params[name], view=views[name]))) < 1e-4
  assert float(value) < 0.7 * first


@pytest.mark.parametrize("name", ["muon", "stiefel_muon"])
def test_owner_sharded_update_equals_replicated_on_8_devices(name):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  model = _model(stiefel="all") if name == "stiefel_muon" else _model()
  params, grads = _params_and_grads(model)
  views = nnx.to_pure_dict(oj.nn.matrix_views(model))
  hidden = {k: v for k, v in params.items() if k in TransformerLM.MATRICES}
  make = {"muon": lambda: oj.optim.muon(0.02, views=views),
          "stiefel_muon": lambda: oj.optim.stiefel_muon(0.02, views=views)}[name]
  if name == "stiefel_muon":
    params, grads = hidden, {k: grads[k] for k in hidden}
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",), axis_types=(AxisType.Auto,))
  replicated = make()
  sharded = oj.optim.shard_update(make(), mesh, views=views)
  rep = NamedSharding(mesh, P())
  params, grads = jax.device_put(params, rep), jax.device_put(grads, rep)

  def run(tx):
    state = jax.jit(tx.init)(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    return updates, state

  (u_rep, s_rep), (u_sh, s_sh) = run(replicated), run(sharded)
  assert any(isinstance(x, oj.optim.ShardedUpdateState) for x in jax.tree.leaves(
      s_sh, is_leaf=lambda x: isinstance(x, oj.optim.ShardedUpdateState)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), u_sh, u_rep)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
               jax.jit(oj.optim.replicated_state)(s_sh), s_rep)


def test_activations_keep_the_batch_sharding_under_fsdp():
  """The width is sharded over ``fsdp`` (``embed`` → fsdp); without the model's constraints
  the embedding hands that axis to the width and every device runs the whole batch."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  from orthojax.train import mesh as mesh_lib   # pylint: disable=g-import-not-at-top
  mesh = mesh_lib.make_mesh(data=1, fsdp=8)
  graphdef, state = nnx.split(TransformerLM(32, depth=2, width=64, heads=2, rngs=nnx.Rngs(0)))
  params = jax.device_put(nnx.to_pure_dict(state), mesh_lib.param_shardings(state, mesh))
  tokens = jax.device_put(jnp.zeros((16, 8), jnp.int32), mesh_lib.batch_sharding(mesh))
  assert params["embed"].sharding.spec == P(None, "fsdp")

  def logits(params, tokens, resolve):
    with oj.nn.sharding.activation_sharding(resolve):
      return nnx.merge(graphdef, params)(tokens)

  out = jax.jit(logits, static_argnums=2)(params, tokens, mesh_lib.activation_resolver(mesh))
  assert out.sharding.shard_shape(out.shape) == (2, 8, 32)
  unconstrained = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens)
  np.testing.assert_allclose(out, unconstrained, rtol=1e-5, atol=1e-5)


def test_activation_rules_shard_the_batch_once_and_only_where_it_divides():
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  from orthojax.train import mesh as mesh_lib   # pylint: disable=g-import-not-at-top
  resolve = mesh_lib.activation_resolver(mesh_lib.make_mesh(data=2, fsdp=4))
  assert resolve(("batch", None, None), (16, 3, 5)).spec == P(("data", "fsdp"), None, None)
  assert resolve(("batch", None, "embed"), (16, 3, 8)).spec == P(("data", "fsdp"), None, None)
  assert resolve(("batch", None, "embed"), (6, 3, 8)).spec == P(None, None, "fsdp")
  x = jnp.ones((4, 3))
  assert oj.nn.sharding.constrain(x, ("batch", None)) is x   # outside a trainer: unchanged
