"""Flags -> Config: flagfiles with a shared base, and one-line errors naming the flag."""

from __future__ import annotations

import pytest
from absl import flags

from orthojax.train import flags as flags_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError


def _parse(argv: list[str], **validate) -> Config:
  fv = flags.FlagValues()
  flags_lib.define_flags(fv)
  fv(["prog"] + argv)
  return flags_lib.config_from_flags(fv, **validate)


def test_flagfile_includes_a_base_and_later_flags_override(tmp_path):
  base = tmp_path / "base.flags"
  base.write_text("--model=resnet50\n--variant=bn\n--lr=0.1\n--num_epochs=90\n"
                  "--dataset=imagenet2012\n--batch_size=256\n")
  variant = tmp_path / "gmp.flags"
  variant.write_text(f"--flagfile={base}\n--variant=gmp_imn\n--schedule=step\n"
                     "--decay_boundaries=0.5,0.75\n--dataset_options=resize_min=256\n")
  config = _parse([f"--flagfile={variant}", "--lr=0.05"])
  assert (config.model, config.variant, config.lr, config.num_epochs) == ("resnet50", "gmp_imn",
                                                                         0.05, 90.0)
  assert config.decay_boundaries == (0.5, 0.75)
  assert config.options == {"resize_min": 256}
  assert config.batch_size == 256


BAD = [
    (["--model=resnet51", "--num_steps=1"], "--model=resnet51"),
    (["--optimizer=adagrad", "--num_steps=1"], "--optimizer=adagrad"),
    (["--lr=0", "--num_steps=1"], "--lr=0.0"),
    (["--lr=-0.1", "--num_steps=1"], "--lr=-0.1"),
    (["--batch_size=0", "--num_steps=1"], "--batch_size=0"),
    (["--num_steps=0"], "--num_steps / --num_epochs"),
    (["--num_steps=5", "--num_epochs=1"], "--num_steps / --num_epochs"),
    (["--momentum=1.0", "--num_steps=1"], "--momentum=1.0"),
    (["--schedule=linear", "--num_steps=1"], "--schedule=linear"),
    (["--schedule=step", "--num_steps=1"], "--decay_boundaries"),
    (["--schedule=step", "--decay_boundaries=1.5", "--num_steps=1"], "--decay_boundaries"),
    (["--schedule=warmup_cosine", "--num_steps=1"], "--warmup_steps"),
    (["--schedule=plateau", "--num_steps=1"], "--eval_every"),
    (["--early_stopping_patience=3", "--num_steps=1"], "--eval_every"),
    (["--loss=hinge", "--num_steps=1"], "--loss=hinge"),
    (["--loss=mse", "--label_smoothing=0.1", "--num_steps=1"], "--label_smoothing=0.1"),
    (["--optimizer=radam", "--num_steps=1"], "--optimizer=radam"),
    (["--weights=stiefel", "--optimizer=adam", "--num_steps=1"], "--weights=stiefel"),
    (["--weights=sphere", "--num_steps=1"], "--weights=sphere"),
    (["--penalty=so", "--num_steps=1"], "--penalty_strength"),
    (["--penalty=l2", "--penalty_strength=1", "--num_steps=1"], "--penalty=l2"),
    (["--compute_dtype=float16", "--num_steps=1"], "--compute_dtype=float16"),
    (["--nan_policy=ignore", "--num_steps=1"], "--nan_policy=ignore"),
    (["--checkpoint_every=10", "--num_steps=1"], "--workdir"),
    (["--grad_accum_steps=0", "--num_steps=1"], "--grad_accum_steps=0"),
    (["--restore_best", "--num_steps=1"], "--eval_every"),
    (["--final_eval_splits=test,holdout", "--num_steps=1"], "--final_eval_splits"),
    (["--dataset_options=view", "--num_steps=1"], "--dataset_options=view"),
    (["--decay_boundaries=a,b", "--num_steps=1"], "--decay_boundaries"),
    (["--batch_size=12", "--num_steps=1"], "not divisible by the 8 data-parallel devices"),
    (["--batch_size=8", "--num_steps=1"], "not divisible by the 3 processes"),
    (["--batch_size=16", "--grad_accum_steps=4", "--num_steps=1"], "--grad_accum_steps=4"),
]


@pytest.mark.parametrize("argv,fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_flag_gives_one_line_error_naming_it(argv, fragment):
  processes = 3 if "processes" in fragment else 1
  with pytest.raises(ConfigError) as info:
    _parse(argv, num_devices=8, num_processes=processes)
  message = str(info.value)
  assert fragment in message
  assert "\n" not in message


def test_good_config_passes_device_checks():
  config = _parse(["--batch_size=64", "--grad_accum_steps=2", "--num_steps=3"], num_devices=8)
  assert config.grad_accum_steps == 2
  with pytest.raises(Exception):
    config.lr = 1.0   # frozen
