"""The model zoo: the critical deep MLP starts at its fixed point from the first layer."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from orthojax.train import model_zoo
from orthojax.train.config import Config
from orthojax.train.data import DatasetInfo


@pytest.mark.parametrize("q_star", [1 / 64, 0.5])
@pytest.mark.parametrize("init", ["gaussian", "orthogonal"])
def test_critical_deep_mlp_inputs_are_scaled_to_q_star(q_star, init):
  info = DatasetInfo(name="toy", task="classification", input_shape=(16, 16), num_classes=10,
                     num_train=1, num_eval=1)
  config = Config(model="deep_mlp", depth=3, width=2000, q_star=q_star, init=init,
                  activation="tanh", num_steps=1)
  model = model_zoo.build(config, info, nnx.Rngs(0))
  mlp = model.model
  assert model.scale == pytest.approx(np.sqrt(q_star - mlp.sigma_b ** 2) / mlp.sigma_w)
  x = jax.random.normal(jax.random.key(1), (256, 16, 16))       # standardised inputs
  h = mlp.preactivations(model.scale * x.reshape(256, -1))
  # h¹ and every later layer have variance q* (finite width: ~3 % sampling error).
  np.testing.assert_allclose(np.var(np.asarray(h), axis=(1, 2)), q_star, rtol=0.06)


def test_input_scale_needs_q_star_above_bias_variance():
  with pytest.raises(ValueError, match="must exceed sigma_b"):
    model_zoo.critical_input_scale(0.01, 1.0, 0.2)
