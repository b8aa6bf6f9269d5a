"""Training end to end on every tfds-backed dataset builder, with tfds mocked.

Each case trains a few steps on 8 simulated devices through the real input
pipeline (tfds → tf.data → per-process numpy → global arrays) and evaluates
every example of the eval split once; the loss must be finite and the model
must have changed. No checkpoints here: tfds' mock patches the file-system
calls Orbax uses (checkpoints are tested on real files in test_trainer.py).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx

from orthojax.train import data
from orthojax.train import model_zoo
from orthojax.train import trainer
from orthojax.train.config import Config
from tests.train.data._mock import imagenet_like
from tests.train.data._mock import numbered_mock

# (dataset, options, model overrides); images go through a small MLP or RNN so
# that the cases test the pipelines, not the convolutions (tests/models does;
# ImageNet's train augmentation runs at a small image size).
CASES = [
    ("cifar10", {}, {"name": "MLP", "hidden": 16}),
    ("svhn_cropped", {}, {"name": "MLP", "hidden": 16}),
    ("mnist", {"view": "row"}, {"name": "SequenceRNN", "hidden": 16}),
    ("imagenet_resized/32x32", {}, {"name": "MLP", "hidden": 16}),
    ("imagenet2012", {"image_size": 32, "min_scale": 36, "max_scale": 48, "eval_resize": 36},
     {"name": "MLP", "hidden": 16}),
]


@pytest.mark.parametrize("dataset,options,model", CASES, ids=[c[0] for c in CASES])
def test_trains_and_evaluates_on_mocked_tfds(dataset, options, model):
  streamed = dataset.startswith("imagenet")
  mock = lambda: (numbered_mock(32, imagenet_like) if streamed
                  else tfds.testing.mock_data(num_examples=48))
  config = Config(data={"name": dataset, **options}, batch_size=8, num_steps=3,
                  optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.01, "momentum": 0.9}},
                  log_every=1, seed=1, model=model)
  with mock():
    result = trainer.train(config, print_fn=lambda line: None)
  assert result.final_step == 3
  assert np.isfinite(result.train_metrics["loss"]) and np.isfinite(result.eval_metrics["loss"])
  assert result.eval_metrics["examples"] > 0
  assert 0.0 <= result.eval_metrics["top1"] <= 1.0
  # The update did something: some parameter differs from the initialisation.
  with mock():
    info = data.dataset_info(dataset, **options)
  init = nnx.to_pure_dict(nnx.state(model_zoo.build(config, info, nnx.Rngs(config.seed)),
                                    nnx.Param))
  changed = jax.tree.leaves(jax.tree.map(
      lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), result.state.params, init))
  assert any(changed)
