"""Command-line overrides: typed values, constructors switched by name, sections created."""

from __future__ import annotations

import pytest

import orthojax as oj

from orthojax.train import data
from orthojax.train import overrides
from orthojax.train import registry
from orthojax.train.config import Config
from orthojax.train.config import ConfigError

BASE = {
    "batch_size": 128, "num_epochs": 0.0, "loss": "cross_entropy", "restore_best": False,
    "decay_boundaries": [], "final_eval_splits": [],
    "model": {"name": "DeepMLP", "depth": 4, "width": 8, "weights": "stiefel"},
    "optimizer": {
        "stiefel": {"name": "radam", "learning_rate": 1e-3, "b1": 0.9},
        "euclidean": {"name": "adam", "learning_rate": 1e-3, "b1": 0.8, "eps_root": 0.0}},
    "penalty": None,
    "mesh": {"data": -1, "fsdp": 1},
}

# As the trainer supplies them for a Stiefel model (orthojax.train.optimizers.build).
OPTIMIZER_SUPPLIED = registry.Supplied({"views": None, "mask": None,
                                        "manifold": oj.manifolds.Stiefel()})


def apply(*arguments):
  return overrides.apply_all(BASE, arguments)


@pytest.mark.parametrize("argument,key,value", [
    ("--config.batch_size=64", ("batch_size",), 64),
    ("--config.num_epochs=2", ("num_epochs",), 2.0),
    ("--config.loss=mse", ("loss",), "mse"),
    ("--config.restore_best=true", ("restore_best",), True),
    ("--config.restore_best=False", ("restore_best",), False),
    ("--noconfig.restore_best", ("restore_best",), False),
    ("--config.decay_boundaries=(0.5,0.75)", ("decay_boundaries",), [0.5, 0.75]),
    ("--config.final_eval_splits=test", ("final_eval_splits",), ["test"]),
    ("--config.optimizer.stiefel.learning_rate=3e-4", ("optimizer", "stiefel", "learning_rate"),
     3e-4),
    ("--config.mesh.fsdp=2", ("mesh", "fsdp"), 2),
    ("--config.optimizer.stiefel=none", ("optimizer", "stiefel"), None),
])
def test_a_key_the_config_has_takes_its_type(argument, key, value):
  tree = apply(argument)
  for part in key:
    tree = tree[part]
  assert tree == value and type(tree) is type(value)


def test_overrides_do_not_touch_the_input_and_apply_in_order():
  tree = apply("--config.batch_size=64", "--config.batch_size=32")
  assert tree["batch_size"] == 32 and BASE["batch_size"] == 128


def test_naming_a_constructor_refills_the_section_with_its_defaults():
  tree = apply("--config.optimizer.euclidean.name=sgd")
  # The file's learning_rate kept, adam's b1 / eps_root gone; nesterov, which adam takes
  # too, stays out as the file left it (sgd builds with its default all the same).
  assert tree["optimizer"]["euclidean"] == {"name": "sgd", "learning_rate": 1e-3}
  tree = apply("--config.optimizer.euclidean.name=adamw")
  section = tree["optimizer"]["euclidean"]
  assert section["b1"] == 0.8 and section["eps_root"] == 0.0   # the file's, adamw takes them
  assert section["weight_decay"] == 1e-4                        # adamw's default


def test_a_key_at_the_old_constructors_default_takes_the_new_default():
  """A config file writes every keyword out: radam's reorthonormalize_every=None is its
  default, not a choice, so cayley_adam keeps its own (100)."""
  tree = overrides.apply_all(
      {"optimizer": {"stiefel": {"name": "radam", "learning_rate": 1e-3, "b1": 0.9,
                                 "reorthonormalize_every": None}}},
      ["--config.optimizer.stiefel.name=cayley_adam"])
  assert tree["optimizer"]["stiefel"]["reorthonormalize_every"] == 100
  assert tree["optimizer"]["stiefel"]["learning_rate"] == 1e-3   # no default: set by the file


def test_later_overrides_set_the_new_constructors_keywords():
  tree = apply("--config.optimizer.stiefel.name=cayley_adam", "--config.optimizer.stiefel.q=0.25",
               "--config.optimizer.stiefel.iterations=3")
  section = tree["optimizer"]["stiefel"]
  assert section["name"] == "cayley_adam" and section["q"] == 0.25
  assert section["iterations"] == 3 and section["b1"] == 0.9


@pytest.mark.parametrize("name", sorted(registry.MANIFOLD_OPTIMIZERS) + ["sgd", "adamw", "muon",
                                                                         "lion"])
def test_every_optimizer_named_from_the_file_builds(name):
  inner = (("--config.optimizer.stiefel.optimizer.name=sgd",
            "--config.optimizer.stiefel.optimizer.learning_rate=0.1")
           if name == "projected_gradient" else ())   # it wraps a Euclidean optimizer section
  tree = apply(f"--config.optimizer.stiefel.name={name}", *inner)
  assert tree["optimizer"]["stiefel"]["name"] == name
  registry.build("optimizer", tree["optimizer"]["stiefel"], "config.optimizer.stiefel",
                 OPTIMIZER_SUPPLIED, check_only=True)


@pytest.mark.parametrize("name", sorted(set(registry.MODELS) - {"Sequential"}))
def test_every_model_named_builds(name):
  tree = apply(f"--config.model.name={name}")
  supplied = registry.Supplied(dict.fromkeys(("rngs", "dtype", "in_features", "out_features",
                                              "num_classes", "input_size", "vocab_size")),
                              owned=("rngs",))
  registry.build("model", tree["model"], "config.model", supplied, check_only=True)


def test_a_section_none_in_the_file_is_created_by_its_keywords():
  tree = apply("--config.penalty.kind=so", "--config.penalty.strength=1e-3")
  penalty = tree["penalty"]
  assert penalty["name"] == "add_orthogonality_penalty"
  assert penalty["kind"] == "so" and penalty["strength"] == 1e-3
  assert penalty["gain"] == 1.0   # add_orthogonality_penalty's default
  Config.from_dict({**BASE, "penalty": penalty})   # a valid section
  registry.build("penalty", penalty, "config.penalty",
                 registry.Supplied({"mask": None, "views": None}))


def test_a_nested_section_is_created_by_naming_it():
  tree = apply("--config.optimizer.stiefel.manifold.name=Stiefel",
               "--config.optimizer.stiefel.manifold.retraction=cayley")
  manifold = tree["optimizer"]["stiefel"]["manifold"]
  assert manifold["name"] == "Stiefel" and manifold["retraction"] == "cayley"
  built = registry.build("manifold", manifold, "config.optimizer.stiefel.manifold")
  assert built.retraction == "cayley"


@pytest.mark.parametrize("value,expected", [("bf16x3", "bf16x3"), ("highest", "highest"),
                                            ("None", None)])
def test_the_precision_is_set_from_the_command_line(value, expected):
  """``precision``: one name from the manifold's section to Muon's and stiefel_muon's."""
  tree = apply("--config.optimizer.stiefel.manifold.name=Stiefel",
               f"--config.optimizer.stiefel.manifold.precision={value}",
               "--config.optimizer.euclidean.name=muon",
               f"--config.optimizer.euclidean.precision={value}")
  manifold = tree["optimizer"]["stiefel"]["manifold"]
  assert registry.build("manifold", manifold, "m").precision == expected
  assert tree["optimizer"]["euclidean"]["precision"] == expected


def test_a_bad_precision_is_one_line_naming_the_key():
  tree = apply("--config.optimizer.stiefel.manifold.name=Stiefel",
               "--config.optimizer.stiefel.manifold.precision=fp8")
  with pytest.raises(ConfigError) as e:
    registry.build("manifold", tree["optimizer"]["stiefel"]["manifold"],
                   "config.optimizer.stiefel.manifold")
  text = str(e.value)
  assert "\n" not in text and text.startswith(
      "config.optimizer.stiefel.manifold.precision='fp8': Stiefel: precision='fp8' is not a "
      "precision; use one of ('highest', 'bf16x3', 'bf16')"), text


def test_a_keyword_the_section_leaves_out_is_added():
  tree = apply("--config.optimizer.stiefel.nesterov=true",
               "--config.optimizer.stiefel.reorthonormalize_every=10")
  assert tree["optimizer"]["stiefel"]["nesterov"] is True
  assert tree["optimizer"]["stiefel"]["reorthonormalize_every"] == 10


@pytest.mark.parametrize("argument,message", [
    ("--config.batch_size=abc", "cannot set it (batch_size is an integer)"),
    ("--config.restore_best=maybe", "restore_best is a bool: true or false"),
    ("--config.num_epochs=x", "num_epochs is a number"),
    ("--config.bacth_size=3", "no such key; did you mean 'batch_size'?"),
    ("--config.optimizer.stiefel.betas=1", "radam takes no keyword 'betas'; its keywords are "
                                           "learning_rate, manifold, b1"),
    ("--config.optimizer.euclidean.name=adamm",
     "config.optimizer.euclidean.name='adamm': unknown; choose one of"),
    ("--config.optimizer.stiefel.manifold.retraction=qr",
     "config.optimizer.stiefel.manifold is not in the config; name its constructor first: "
     "--config.optimizer.stiefel.manifold.name=NAME, NAME one of Oblique, Stiefel"),
    ("--config.optimizer.oblique.learning_rate=0.1",
     "config.optimizer.oblique is not in the config; name its constructor first"),
    ("--config.optimizer.name=sgd", "the optimizer is per parameter group: "
                                    "config.optimizer.euclidean.name"),
    ("--config.euclidean_optimizer.b1=0.5", "renamed config.optimizer.euclidean.b1"),
    ("--config.model=3", "model is a section"),
    ("--config.batch_size.x=3", "config.batch_size is 128, not a section"),
    ("--config.mesh.bogus=1", "no such key"),
    ("--config.model.depth", "an override is --config.KEY=VALUE"),
])
def test_bad_overrides_are_one_line_naming_the_override(argument, message):
  with pytest.raises(ConfigError) as e:
    apply(argument)
  text = str(e.value)
  assert "\n" not in text and message in text, text
  if "=" in argument:
    assert text.startswith(argument + ": ") or text.startswith(argument.split("=")[0]), text


def test_supplied_keywords_are_never_put_into_a_refilled_section():
  tree = apply("--config.model.name=ResNet")
  assert not {"rngs", "dtype", "param_dtype", "num_classes"} & set(tree["model"])
  tree = apply("--config.optimizer.stiefel.name=muon")
  assert "views" not in tree["optimizer"]["stiefel"]


# ------------------------------------------------------------------- Data --

# A data section as experiments/configs/_base.data writes it (every option), less the key
# E8 sets per run (eval_split), with the file's own context.
TEXT = {"data": {"name": "shakespeare", "data_dir": "",
                 **{k: v for k, v in data.default_options("shakespeare").items()
                    if k != "eval_split"}, "context": 64}}


def test_naming_a_data_set_refills_the_data_section_with_its_options():
  tree = overrides.apply_all(TEXT, ["--config.data.name=tfds_text",
                                    "--config.data.tfds_name=my_text_set",
                                    "--config.data.text_key=body"])
  section = tree["data"]
  assert section["name"] == "tfds_text"
  assert section["tfds_name"] == "my_text_set" and section["text_key"] == "body"
  assert section["context"] == 64                  # the file's, tfds_text takes it
  assert section["level"] == "char"                # the default
  assert "eval_split" not in section               # left out by the file: stays out
  config = Config.from_dict(tree)
  assert data.check_options("tfds_text", config.options)["tfds_name"] == "my_text_set"


def test_a_data_set_of_another_kind_drops_the_options_it_does_not_take():
  tree = overrides.apply_all(TEXT, ["--config.data.name=mnist", "--config.data.view=pixel"])
  assert tree["data"] == {"name": "mnist", "data_dir": "",
                          **data.default_options("mnist"), "view": "pixel"}
  tree = overrides.apply_all({"data": {"name": "digits"}}, ["--config.data.flatten=true"])
  assert tree["data"] == {"name": "digits", "flatten": True}   # typed from the option


@pytest.mark.parametrize("arguments,message", [
    (("--config.data.name=tfds_text", "--config.data.text_field=body"),
     "--config.data.text_field=body: cannot set it (tfds_text takes no option 'text_field'; "
     "its options are data_dir, tfds_name, text_key, context, level, "),
    (("--config.data.tfds_name=x",), "--config.data.tfds_name=x: cannot set it (shakespeare "
                                     "takes no option 'tfds_name'; its options are data_dir, "),
    (("--config.data.name=tfds_txt",), "config.data.name='tfds_txt': unknown; choose one of "),
    (("--config.data.context=abc",), "cannot set it (context is an integer)"),
])
def test_a_bad_data_override_is_one_line_naming_it(arguments, message):
  with pytest.raises(ConfigError) as e:
    overrides.apply_all(TEXT, arguments)
  text = str(e.value)
  assert "\n" not in text and message in text, text
