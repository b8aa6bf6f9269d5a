"""The experiments' config files: every file and variant gives a valid Config, and every
keyword of every constructor can be set from a flagfile (``--config.a.b=value``)."""

from __future__ import annotations

import importlib
import inspect

import pytest
from flax import nnx

from experiments.configs import _base
from orthojax.train import registry
from orthojax.train.config import Config

VARIANTS = [
    ("train", ""), ("e1_resnet50", "bn"), ("e1_resnet50", "wn_mbn"),
    ("e1_resnet50", "gmp_imn"), ("e1_resnet50", "none"), ("e1_resnet50", "bn,smoke"),
    ("e2_vgg6", ""), ("e2_vgg6", "smoke"), ("uci", ""), ("uci", "smoke"), ("gmp_toys", ""),
    ("gmp_toys", "smoke"), ("critical_tanh", ""), ("critical_tanh", "cpu"),
    ("critical_tanh", "smoke"), ("critical_tanh", "svhn"), ("seq_mnist", ""),
    ("seq_mnist", "tfds"), ("seq_mnist", "pixel"), ("seq_mnist", "permuted"),
    ("seq_mnist", "smoke"), ("deep_linear", ""), ("deep_linear", "mnist"),
    ("deep_linear", "smoke"),
]


@pytest.mark.parametrize("name,arg", VARIANTS, ids=[f"{n}:{a}" for n, a in VARIANTS])
def test_every_config_file_and_variant_is_a_valid_config(name, arg):
  tree = importlib.import_module(f"experiments.configs.{name}").get_config(arg).to_dict()
  assert "workdir" not in tree                 # --workdir is a flag, not a config key
  config = Config.from_dict({**tree, "workdir": "/tmp/unused"})
  if config.model.get("name") == "DeepMLP" and config.model.get("q_star") is None:
    config = config.replace(model={"q_star": 0.5})   # E5 sets q* per run
  if config.model.get("name") in ("DeepLinear",) and config.model.get("depth") is None:
    config = config.replace(model={"depth": 2, "init": "orthogonal"})   # E7: per run
  config.validate()


def _settable(kind, fn):
  """The keywords a flagfile must reach: not supplied by the trainer, not ``self``."""
  return {k: p for k, p in registry.keywords(fn).items() if k not in _base.SUPPLIED}


def _ours(kind):
  for name, fn in sorted(registry.REGISTRIES[kind].items()):
    module = getattr(fn, "__module__", "") or ""
    if fn is not nnx.Sequential and module.startswith("orthojax"):
      yield name, fn


@pytest.mark.parametrize("kind", ["model", "layers", "optimizer", "manifold", "penalty"])
def test_every_keyword_of_every_constructor_can_be_set_from_a_flagfile(kind):
  """``_base.section`` writes every keyword with a plain default into the config file's
  section, so ``--config.<section>.<keyword>=value`` overrides it; a keyword whose
  value is a function or an object (``kernel_init``, ``manifold``, ``optimizer``) is a
  nested registry section the file names."""
  for name, fn in _ours(kind):
    section = _base.section(kind, name)
    for key, param in _settable(kind, fn).items():
      if key in section or param.default is inspect.Parameter.empty:
        continue   # present, or required: a file naming the constructor must give it
      assert key in registry.REGISTRIES or not isinstance(
          param.default, (bool, int, float, str, tuple, type(None))), \
          f"{kind} {name}: keyword {key!r} cannot be set from a flagfile"
