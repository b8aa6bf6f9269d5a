"""Hooks: ``hook(step, model)`` on the schedule of ``config.hooks`` (every N steps, epochs)."""

from __future__ import annotations

import os

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from orthojax.train import data as data_lib
from orthojax.train import model_zoo
from orthojax.train import trainer
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.metrics import read_jsonl
from orthojax.train.resume import resume_differences

_BASE = Config(model={"name": "MLP", "variant": "sp", "hidden": 8}, data={"name": "digits"},
               batch_size=256, num_epochs=3.0,
               optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.1}}, log_every=100,
               seed=5, mesh={"data": 1})


class Recorder:
  """A hook recording each step it is called at and the hidden kernel it sees."""

  def __init__(self):
    self.steps, self.kernels = [], []

  def __call__(self, step, model):
    self.steps.append(step)
    self.kernels.append(np.asarray(jax.device_get(model.model.hidden.layer.kernel[...])))
    return {"kernel_norm": float(np.linalg.norm(self.kernels[-1]))}


def _train(config, tmp_path, hooks):
  workdir = str(tmp_path / "run")
  result = trainer.train(config.replace(workdir=workdir), hooks=hooks,
                         devices=jax.devices()[:1], print_fn=lambda line: None)
  return result, read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def test_hooks_run_on_the_epochs_and_step_schedule_and_see_the_model(tmp_path):
  info = data_lib.dataset_info("digits")
  per_epoch = info.num_train // _BASE.batch_size
  config = _BASE.replace(hooks={"every_steps": 4, "epochs": (0, 1, 2.5)})
  hook = Recorder()
  result, log = _train(config, tmp_path, (hook,))
  total = 3 * per_epoch
  want = sorted({0, per_epoch, round(2.5 * per_epoch)} | set(range(4, total + 1, 4)))
  assert hook.steps == want
  # Step 0 is the initial state: the model the model zoo builds from the run's seed.
  init = model_zoo.build(config, info, nnx.Rngs(config.seed))
  np.testing.assert_array_equal(hook.kernels[0], np.asarray(init.model.hidden.layer.kernel[...]))
  # The last call sees the trained parameters.
  if want[-1] == total:
    np.testing.assert_array_equal(hook.kernels[-1],
                                  np.asarray(result.state.params["model"]["hidden"]["layer"]
                                             ["kernel"]))
  logged = [r["step"] for r in log if r["split"] == "spectrum"]
  assert logged == want and all("kernel_norm" in r for r in log if r["split"] == "spectrum")


def test_no_hooks_without_a_schedule(tmp_path):
  hook = Recorder()
  _train(_BASE.replace(num_epochs=1.0), tmp_path, (hook,))
  assert hook.steps == []


@pytest.mark.parametrize("hooks, message", [
    ({"every_steps": -1}, "config.hooks.every_steps=-1: must be >= 0"),
    ({"epochs": (1, -0.5)}, "config.hooks.epochs=[1, -0.5]: epochs must be >= 0"),
    ({"every": 3}, "config.hooks.every: unknown"),
])
def test_bad_schedules_name_the_key(hooks, message):
  with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
    _BASE.replace(hooks=hooks).validate()


def test_the_old_key_names_the_new_one():
  with pytest.raises(ConfigError, match="config.spectrum_every: renamed config.hooks.every_steps"):
    Config.from_dict({"spectrum_every": 1, "num_steps": 1})


def test_the_hook_schedule_may_change_on_resume():
  saved = _BASE.replace(hooks={"every_steps": 2}).to_dict()
  assert resume_differences(saved, _BASE.replace(hooks={"every_steps": 7, "epochs": (1.0,)})) == []


def test_fit_has_no_epochs():
  with pytest.raises(ConfigError, match="config.hooks.epochs: fit.. has no epochs"):
    trainer.fit(lambda rngs: None, optax.sgd(0.1), [{"x": np.zeros((2, 3), np.float32)}],
                Config(num_steps=1, batch_size=2, hooks={"epochs": (1.0,)}))
